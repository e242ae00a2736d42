//! The CUDA driver device (stub: being written).
use super::*;
pub struct CudaDevice;
impl CudaDevice {
    pub fn open(_ordinal: i32) -> DeviceResult<CudaDevice> { Err(DeviceError::NoDriver("stub".into())) }
}
impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo { unreachable_info() }
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

fn unreachable_info() -> &'static DeviceInfo { unimplemented!() }
