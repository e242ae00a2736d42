//! The simulated device (stub: being written).
use super::*;
use crate::config::Config;

#[derive(Clone, Debug)]
pub struct SimConfig { pub ordinal: i32, pub capacity: u64, pub granularity: u64, pub backing: bool, pub vmm: bool }
impl SimConfig {
    pub fn from_conf(conf: &Config, ordinal: i32) -> SimConfig {
        SimConfig { ordinal, capacity: conf.sim_capacity_mb << 20, granularity: conf.sim_granularity_kb << 10, backing: conf.sim_backing, vmm: conf.sim_vmm }
    }
}
pub struct SimDevice { info: DeviceInfo }
impl SimDevice {
    pub fn new(c: SimConfig) -> DeviceResult<SimDevice> {
        Ok(SimDevice { info: DeviceInfo { ordinal: c.ordinal, name: "sim".into(), total_bytes: c.capacity, granularity: c.granularity, vmm: c.vmm } })
    }
}
impl Device for SimDevice {
    fn info(&self) -> &DeviceInfo { &self.info }
    fn mem_get_info(&self) -> DeviceResult<(u64, u64)> { Ok((0, 0)) }
    fn reserve(&self, _s: u64, _a: u64) -> DeviceResult<DevPtr> { Err(DeviceError::OutOfMemory) }
    fn free_address(&self, _v: DevPtr, _s: u64) -> DeviceResult<()> { Ok(()) }
    fn create_page(&self, _s: u64) -> DeviceResult<PageHandle> { Err(DeviceError::OutOfMemory) }
    fn release_page(&self, _p: PageHandle) -> DeviceResult<()> { Ok(()) }
    fn map(&self, _v: DevPtr, _s: u64, _p: PageHandle) -> DeviceResult<()> { Ok(()) }
    fn unmap(&self, _v: DevPtr, _s: u64) -> DeviceResult<()> { Ok(()) }
    fn alloc_plain(&self, _s: u64) -> DeviceResult<DevPtr> { Err(DeviceError::OutOfMemory) }
    fn free_plain(&self, _p: DevPtr) -> DeviceResult<()> { Ok(()) }
    fn create_event(&self) -> DeviceResult<EventHandle> { Ok(EventHandle(1)) }
    fn destroy_event(&self, _e: EventHandle) -> DeviceResult<()> { Ok(()) }
    fn record_event(&self, _e: EventHandle, _s: StreamId) -> DeviceResult<()> { Ok(()) }
    fn query_event(&self, _e: EventHandle) -> DeviceResult<bool> { Ok(true) }
    fn synchronize_event(&self, _e: EventHandle) -> DeviceResult<()> { Ok(()) }
    fn synchronize_stream(&self, _s: StreamId) -> DeviceResult<()> { Ok(()) }
    fn synchronize(&self) -> DeviceResult<()> { Ok(()) }
    fn counters(&self) -> DriverCounters { DriverCounters::default() }
}
