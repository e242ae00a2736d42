//! The arena (stub: being written).
mod report;
pub use report::*;

use std::sync::Arc;
use crate::config::Config;
use crate::device::{Device, DevPtr, StreamId};
use crate::error::{Error, Result};
use crate::stats::DeviceStats;

pub struct Arena { _dev: Arc<dyn Device> }

impl Arena {
    pub fn new(dev: Arc<dyn Device>, _conf: &Config) -> Result<Arena> { Ok(Arena { _dev: dev }) }
    pub fn malloc(&self, _size: u64, _stream: StreamId) -> Result<DevPtr> { Err(Error::OutOfMemory("CUDA out of memory. Tried to allocate (stub)".into())) }
    pub fn free(&self, _ptr: DevPtr, _size: Option<u64>, _stream: StreamId) -> Result<()> { Ok(()) }
    pub fn owns(&self, _ptr: DevPtr) -> bool { false }
    pub fn record_stream(&self, _ptr: DevPtr, _stream: StreamId) -> Result<()> { Ok(()) }
    pub fn base_alloc(&self, ptr: DevPtr) -> Result<(DevPtr, u64)> { Ok((ptr, 0)) }
    pub fn empty_cache(&self) -> Result<ReclaimReport> { Ok(ReclaimReport::default()) }
    pub fn defragment(&self) -> Result<ReclaimReport> { Ok(ReclaimReport::default()) }
    pub fn set_memory_fraction(&self, _f: f64) -> Result<()> { Ok(()) }
    pub fn stats(&self) -> DeviceStats { DeviceStats::new() }
    pub fn extras(&self) -> ArenaExtras { ArenaExtras::default() }
    pub fn reset_peak_stats(&self) {}
    pub fn reset_accumulated_stats(&self) {}
}
