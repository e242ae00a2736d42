//! memory_summary (stub: being written).
use crate::arena::ArenaExtras;
use super::DeviceStats;
pub fn memory_summary(_device: i32, _stats: &DeviceStats, _extras: &ArenaExtras, _abbreviated: bool) -> String { String::new() }
