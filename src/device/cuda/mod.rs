//! The CUDA driver device: [`CudaDevice`] implements [`Device`] with the CUDA driver API.
//!
//! This module owns everything that touches `libcuda`: loading it, initialising the driver once
//! per process and the translation of driver results into [`DeviceError`]s (`driver.rs`), the
//! primary context of each device and the [`Device`] calls (this file). Nothing else in the crate
//! calls the driver.
//!
//! Invariants:
//! - **Never panic, never unwind into C.** Every `cudarc::driver::sys::cu*` wrapper panics when the
//!   library or the symbol is missing, and its return type is a Rust enum, so a result code the
//!   bindings do not list (a newer driver may add some) would be undefined behaviour. We therefore
//!   use cudarc only to find and load the library (`sys::is_culib_present`, `sys::culib`, with its
//!   list of candidate names) and for the C types (`CUmemAllocationProp`, `CUcontext`, ...), and
//!   resolve each entry point ourselves, once, into a function pointer that returns the raw `int`.
//!   A missing required symbol is an error at init, a missing optional one a fallback. The init
//!   runs under `catch_unwind` as well, in case the loader itself panics.
//! - **The driver is loaded at run time**, never linked: a machine without a GPU (CI, the replay
//!   CLI) loads this crate fine and gets [`DeviceError::NoDriver`] from [`CudaDevice::open`], with
//!   a hint to use `TORCH_ARENA_CONF=device:sim`. The init result (success or that error) is
//!   computed once and reused by every later `open`. A toolkit *stub* `libcuda.so` (every call
//!   returns `CUDA_ERROR_STUB_LIBRARY`, 34) is caught by `cuInit`/`cuDriverGetVersion` and is
//!   also `NoDriver`.
//! - **The device's primary context is current for every driver call.** PyTorch calls the hooks from
//!   any thread, which may have no current context or another device's. Each method makes our
//!   primary context current if it is not, and puts the thread's previous context back when the
//!   call is done (so PyTorch's idea of the current device is never changed behind its back). The
//!   primary context is the one the CUDA runtime, hence PyTorch, uses, so pointers are shared.
//!   It is retained in `open` and released in `Drop`.
//! - Every driver-like call of the [`Device`] trait is counted in [`DriverCounters`], failed calls
//!   included (one count per driver call made), so the counters can be checked against the fake
//!   driver's own counts in tests.
//!
//! Why the `cuda-12080` bindings: with dynamic loading the feature only picks the Rust types and
//! the symbol names; every name we resolve (`cuMemAlloc_v2`, `cuMemGetInfo_v2`,
//! `cuEventDestroy_v2`, `cuDevicePrimaryCtxRelease_v2`, the VMM calls) exists in CUDA 12.x drivers
//! and in driver 580 (CUDA 13.0), which keeps the 12.x entry points. 13.2+ bindings turn
//! `CUmemLocation` into a union, and the "from build system" feature needs `nvcc` at build time.
//!
//! Tests drive this file without a GPU through a fake `libcuda.so.1` (`tests/fixtures/fakecuda.c`,
//! built by `build.rs`), see `tests/cuda_device.rs`.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use std::ptr;

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys;

use crate::device::*;

mod driver;

pub use driver::driver_version;
use driver::*;

/// A raw `CUresult`. Kept as an integer: see the module invariants.
// ---- counters ---------------------------------------------------------------------------------

#[derive(Default)]
struct Counters {
    address_reserve: AtomicU64,
    address_free: AtomicU64,
    mem_create: AtomicU64,
    mem_release: AtomicU64,
    mem_map: AtomicU64,
    mem_unmap: AtomicU64,
    set_access: AtomicU64,
    mem_alloc: AtomicU64,
    mem_free: AtomicU64,
    event_create: AtomicU64,
    event_destroy: AtomicU64,
    event_record: AtomicU64,
    event_query: AtomicU64,
    event_synchronize: AtomicU64,
    stream_synchronize: AtomicU64,
    device_synchronize: AtomicU64,
    mem_get_info: AtomicU64,
    set_access_handles: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self) -> DriverCounters {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DriverCounters {
            address_reserve: g(&self.address_reserve),
            address_free: g(&self.address_free),
            mem_create: g(&self.mem_create),
            mem_release: g(&self.mem_release),
            mem_map: g(&self.mem_map),
            mem_unmap: g(&self.mem_unmap),
            set_access: g(&self.set_access),
            mem_alloc: g(&self.mem_alloc),
            mem_free: g(&self.mem_free),
            event_create: g(&self.event_create),
            event_destroy: g(&self.event_destroy),
            event_record: g(&self.event_record),
            event_query: g(&self.event_query),
            event_synchronize: g(&self.event_synchronize),
            stream_synchronize: g(&self.stream_synchronize),
            device_synchronize: g(&self.device_synchronize),
            mem_get_info: g(&self.mem_get_info),
            set_access_handles: g(&self.set_access_handles),
            // Bytes are counted where the lab prices them (the sim, the native emulation).
            ..DriverCounters::default()
        }
    }
}

// ---- the device -------------------------------------------------------------------------------

/// One CUDA device, seen through its primary context. Thread-safe.
pub struct CudaDevice {
    drv: &'static Driver,
    device: sys::CUdevice,
    /// The retained primary context (`CUcontext` as an integer, so the struct is Send + Sync).
    ctx: usize,
    info: DeviceInfo,
    counters: Counters,
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: c_int = 2;

/// Puts the thread's previous context back when a call that had to switch is done, and its
/// previous stream capture mode.
struct CtxGuard {
    restore: Option<(unsafe extern "C" fn(sys::CUcontext) -> CuResult, usize)>,
    /// The thread's capture mode before the call switched it to relaxed.
    mode: Option<(FnInt, c_int)>,
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if let Some((exchange, mut prev)) = self.mode {
            // SAFETY: puts back the mode `ctx()` read; a valid pointer to an int.
            let rc = unsafe { exchange(&mut prev) };
            if rc != CUDA_SUCCESS {
                tracing::warn!(
                    code = rc,
                    "cuThreadExchangeStreamCaptureMode could not restore the thread's capture mode"
                );
            }
        }
        if let Some((set_current, prev)) = self.restore {
            // SAFETY: `prev` was the thread's current context (or null) a moment ago.
            let rc = unsafe { set_current(prev as sys::CUcontext) };
            if rc != CUDA_SUCCESS {
                tracing::warn!(
                    code = rc,
                    "cuCtxSetCurrent could not restore the previous context"
                );
            }
        }
    }
}

impl CudaDevice {
    /// Opens device `ordinal`: initialises the driver (once per process), retains the device's
    /// primary context and reads the [`DeviceInfo`].
    ///
    /// Errors: [`DeviceError::NoDriver`] when no usable driver is loaded (library missing, toolkit
    /// stub, `cuInit` failure), [`DeviceError::Driver`] for a bad ordinal or a failing query.
    pub fn open(ordinal: i32) -> DeviceResult<CudaDevice> {
        if crate::fork::in_child() {
            return Err(DeviceError::ForkedChild);
        }
        let drv = Driver::get()?;
        let api = &drv.api;

        let mut device: sys::CUdevice = 0;
        // SAFETY: plain driver call; `device` is a valid out pointer.
        let rc = unsafe { (api.device_get)(&mut device, ordinal) };
        if rc != CUDA_SUCCESS {
            let mut count: c_int = 0;
            // SAFETY: as above.
            let count_rc = unsafe { (api.device_get_count)(&mut count) };
            let count = if count_rc == CUDA_SUCCESS {
                format!("cuDeviceGetCount reports {count} device(s), numbered 0..{count}")
            } else {
                format!("cuDeviceGetCount failed too ({})", drv.describe(count_rc))
            };
            return Err(DeviceError::Driver {
                call: "cuDeviceGet",
                code: rc,
                message: format!(
                    "no CUDA device with ordinal {ordinal}: {count} ({})",
                    drv.describe(rc)
                ),
            });
        }

        let mut ctx: sys::CUcontext = ptr::null_mut();
        // SAFETY: as above.
        drv.check("cuDevicePrimaryCtxRetain", unsafe {
            (api.primary_ctx_retain)(&mut ctx, device)
        })?;
        // From here on, dropping `dev` releases the context, also on the error paths below.
        let mut dev = CudaDevice {
            drv,
            device,
            ctx: ctx as usize,
            info: DeviceInfo {
                ordinal,
                name: String::new(),
                total_bytes: 0,
                granularity: DEFAULT_GRANULARITY,
                vmm: false,
            },
            counters: Counters::default(),
        };
        dev.info = dev.read_info(ordinal)?;
        Ok(dev)
    }

    fn read_info(&self, ordinal: i32) -> DeviceResult<DeviceInfo> {
        let api = &self.drv.api;
        let _ctx = self.ctx()?;

        let name = api
            .device_get_name
            .and_then(|f| {
                let mut buf = [0 as c_char; 256];
                // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within it.
                let rc = unsafe { f(buf.as_mut_ptr(), buf.len() as c_int - 1, self.device) };
                (rc == CUDA_SUCCESS).then(|| {
                    // SAFETY: the last byte was never written, so the string is NUL-terminated.
                    unsafe { CStr::from_ptr(buf.as_ptr()) }
                        .to_string_lossy()
                        .into_owned()
                })
            })
            .unwrap_or_else(|| format!("CUDA device {ordinal}"));

        let total_bytes = match api.device_total_mem {
            Some(f) => {
                let mut bytes = 0usize;
                // SAFETY: plain driver call.
                self.drv
                    .check("cuDeviceTotalMem_v2", unsafe { f(&mut bytes, self.device) })?;
                bytes as u64
            }
            None => self.mem_get_info()?.1,
        };

        let vmm_attribute = api.device_get_attribute.and_then(|f| {
            let mut value: c_int = 0;
            let attr =
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
                    as c_int;
            // SAFETY: plain driver call.
            (unsafe { f(&mut value, attr, self.device) } == CUDA_SUCCESS).then_some(value != 0)
        });
        let mut vmm = api.vmm.is_some() && vmm_attribute.unwrap_or(false);

        let mut granularity = DEFAULT_GRANULARITY;
        if let (true, Some(v)) = (vmm, &api.vmm) {
            let prop = self.alloc_prop();
            let mut g = 0usize;
            // SAFETY: `prop` is a valid allocation property for this device.
            let rc = unsafe {
                (v.granularity)(
                    &mut g,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
                )
            };
            if rc == CUDA_SUCCESS && g.is_power_of_two() {
                granularity = g as u64;
            } else {
                tracing::warn!(
                    code = rc,
                    granularity = g,
                    "cuMemGetAllocationGranularity failed; using plain cuMemAlloc segments"
                );
                vmm = false;
            }
        }

        Ok(DeviceInfo {
            ordinal,
            name,
            total_bytes,
            granularity,
            vmm,
        })
    }

    /// The driver version the process runs with (e.g. 13000).
    pub fn driver_version(&self) -> i32 {
        self.drv.version
    }

    /// The device's primary context, as an integer (`CUcontext`).
    pub fn context(&self) -> usize {
        self.ctx
    }

    /// Makes the primary context current on the calling thread if it is not, and switches the
    /// thread to relaxed stream capture mode, until the returned guard is dropped (which restores
    /// both).
    ///
    /// Relaxed mode, as PyTorch's `cudaMallocMaybeCapturing` does around `cudaMalloc`: while any
    /// thread captures a CUDA graph in global mode (`torch.cuda.graph`'s default), the driver
    /// refuses "potentially unsafe" calls from every thread in global mode (memory creation,
    /// mapping and freeing, event queries) and invalidates the capture. Our memory calls are
    /// safe during capture because the arena never unmaps or releases memory a graph may replay
    /// (a private pool's pages stay pinned until its release) and never records, queries or
    /// synchronises on a capturing stream. What conflicts with capture in any mode (syncing a
    /// capturing stream or the device, querying a captured event) the arena avoids itself.
    fn ctx(&self) -> DeviceResult<CtxGuard> {
        if crate::fork::in_child() {
            return Err(DeviceError::ForkedChild);
        }
        let api = &self.drv.api;
        let mut cur: sys::CUcontext = ptr::null_mut();
        // SAFETY: plain driver call.
        self.drv.check("cuCtxGetCurrent", unsafe {
            (api.ctx_get_current)(&mut cur)
        })?;
        let mut guard = CtxGuard {
            restore: None,
            mode: None,
        };
        if cur as usize != self.ctx {
            // SAFETY: our retained primary context.
            self.drv.check("cuCtxSetCurrent", unsafe {
                (api.ctx_set_current)(self.ctx as sys::CUcontext)
            })?;
            guard.restore = Some((api.ctx_set_current, cur as usize));
        }
        if let Some(exchange) = api.exchange_capture_mode {
            let mut mode = CAPTURE_MODE_RELAXED;
            // SAFETY: a valid pointer to an int holding a valid mode.
            let rc = unsafe { exchange(&mut mode) };
            self.drv.check("cuThreadExchangeStreamCaptureMode", rc)?;
            guard.mode = Some((exchange, mode));
        }
        Ok(guard)
    }

    fn vmm_api(&self, call: &str) -> DeviceResult<&VmmApi> {
        match (&self.drv.api.vmm, self.info.vmm) {
            (Some(v), true) => Ok(v),
            _ => Err(DeviceError::Misuse(format!(
                "{call} called on CUDA device {} which has no virtual memory management support; \
                 use alloc_plain",
                self.info.ordinal
            ))),
        }
    }

    /// Pinned device memory on this device, no shareable handle.
    fn alloc_prop(&self) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.device,
            },
            win32HandleMetaData: ptr::null_mut::<c_void>(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if crate::fork::in_child() {
            return; // the parent's context, not ours to release
        }
        // SAFETY: balances the retain in `open`.
        let rc = unsafe { (self.drv.api.primary_ctx_release)(self.device) };
        if rc != CUDA_SUCCESS {
            tracing::warn!(
                device = self.info.ordinal,
                error = %self.drv.describe(rc),
                "cuDevicePrimaryCtxRelease_v2 failed"
            );
        }
    }
}

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_get_info(&self) -> DeviceResult<(u64, u64)> {
        let _ctx = self.ctx()?;
        let (mut free, mut total) = (0usize, 0usize);
        bump(&self.counters.mem_get_info);
        // SAFETY: plain driver call.
        self.drv.check("cuMemGetInfo_v2", unsafe {
            (self.drv.api.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    fn reserve(&self, size: u64, align: u64) -> DeviceResult<DevPtr> {
        let v = self.vmm_api("reserve")?;
        let _ctx = self.ctx()?;
        let mut va: sys::CUdeviceptr = 0;
        bump(&self.counters.address_reserve);
        // SAFETY: plain driver call.
        let rc = unsafe { (v.address_reserve)(&mut va, size as usize, align as usize, 0, 0) };
        // Address space spent is out of memory to the caller, as for cuMemCreate.
        self.drv.check_alloc("cuMemAddressReserve", rc)?;
        Ok(va)
    }

    fn free_address(&self, va: DevPtr, size: u64) -> DeviceResult<()> {
        let v = self.vmm_api("free_address")?;
        let _ctx = self.ctx()?;
        bump(&self.counters.address_free);
        // SAFETY: plain driver call; the driver validates the range.
        self.drv.check("cuMemAddressFree", unsafe {
            (v.address_free)(va, size as usize)
        })
    }

    fn create_page(&self, size: u64) -> DeviceResult<PageHandle> {
        let v = self.vmm_api("create_page")?;
        let _ctx = self.ctx()?;
        let prop = self.alloc_prop();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        bump(&self.counters.mem_create);
        // SAFETY: `prop` is valid for this device.
        let rc = unsafe { (v.create)(&mut handle, size as usize, &prop, 0) };
        self.drv.check_alloc("cuMemCreate", rc)?;
        Ok(PageHandle(handle))
    }

    fn release_page(&self, page: PageHandle) -> DeviceResult<()> {
        let v = self.vmm_api("release_page")?;
        let _ctx = self.ctx()?;
        bump(&self.counters.mem_release);
        // SAFETY: plain driver call; the driver validates the handle.
        self.drv
            .check("cuMemRelease", unsafe { (v.release)(page.0) })
    }

    fn map_run(&self, va: DevPtr, handles: &[Piece]) -> Result<(), MapRunError> {
        let fail = |error| MapRunError { error, mapped: 0 };
        let v = self.vmm_api("map").map_err(fail)?;
        let _ctx = self.ctx().map_err(fail)?;
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.device,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        map_run_with(
            &mut (),
            va,
            handles,
            |_, at, piece| {
                bump(&self.counters.mem_map);
                // SAFETY: plain driver call; the driver validates the range, the offset and the
                // handle.
                let rc = unsafe {
                    (v.map)(
                        at,
                        piece.size as usize,
                        piece.offset as usize,
                        piece.page.0,
                        0,
                    )
                };
                self.drv.check("cuMemMap", rc)
            },
            // One grant for everything mapped: access is per range, not per handle. After a
            // failed cuMemMap this makes the handles mapped so far usable, so nothing is undone.
            |_, at, len, handles| {
                bump(&self.counters.set_access);
                self.counters
                    .set_access_handles
                    .fetch_add(handles, Ordering::Relaxed);
                // SAFETY: one valid access descriptor over a range mapped just above.
                let rc = unsafe { (v.set_access)(at, len as usize, &access, 1) };
                self.drv.check("cuMemSetAccess", rc)
            },
            |_, at, len| {
                bump(&self.counters.mem_unmap);
                // SAFETY: the range was mapped just above, handle by handle.
                let rc = unsafe { (v.unmap)(at, len as usize) };
                if rc != CUDA_SUCCESS {
                    tracing::error!(
                        va = at,
                        size = len,
                        error = %self.drv.describe(rc),
                        "cuMemUnmap failed while undoing a mapping whose cuMemSetAccess failed"
                    );
                }
                rc == CUDA_SUCCESS
            },
        )
    }

    fn unmap(&self, va: DevPtr, size: u64) -> DeviceResult<()> {
        let v = self.vmm_api("unmap")?;
        let _ctx = self.ctx()?;
        bump(&self.counters.mem_unmap);
        // SAFETY: plain driver call; the driver validates the range.
        self.drv
            .check("cuMemUnmap", unsafe { (v.unmap)(va, size as usize) })
    }

    fn alloc_plain(&self, size: u64) -> DeviceResult<DevPtr> {
        let _ctx = self.ctx()?;
        let mut ptr: sys::CUdeviceptr = 0;
        bump(&self.counters.mem_alloc);
        // SAFETY: plain driver call.
        let rc = unsafe { (self.drv.api.mem_alloc)(&mut ptr, size as usize) };
        self.drv.check_alloc("cuMemAlloc_v2", rc)?;
        Ok(ptr)
    }

    fn free_plain(&self, ptr: DevPtr) -> DeviceResult<()> {
        let _ctx = self.ctx()?;
        bump(&self.counters.mem_free);
        // SAFETY: plain driver call; the driver validates the pointer.
        self.drv
            .check("cuMemFree_v2", unsafe { (self.drv.api.mem_free)(ptr) })
    }

    fn create_event(&self) -> DeviceResult<EventHandle> {
        let _ctx = self.ctx()?;
        let mut ev: sys::CUevent = ptr::null_mut();
        bump(&self.counters.event_create);
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint;
        // SAFETY: plain driver call.
        self.drv.check("cuEventCreate", unsafe {
            (self.drv.api.event_create)(&mut ev, flags)
        })?;
        Ok(EventHandle(ev as usize as u64))
    }

    fn destroy_event(&self, event: EventHandle) -> DeviceResult<()> {
        let _ctx = self.ctx()?;
        bump(&self.counters.event_destroy);
        // SAFETY: the handle came from `create_event`; the driver rejects unknown ones.
        let rc = unsafe { (self.drv.api.event_destroy)(event.0 as usize as sys::CUevent) };
        self.drv.check("cuEventDestroy_v2", rc)
    }

    fn record_event(&self, event: EventHandle, stream: StreamId) -> DeviceResult<()> {
        let _ctx = self.ctx()?;
        bump(&self.counters.event_record);
        // SAFETY: as above; `stream` is the cudaStream_t PyTorch passed (0 = legacy default).
        let rc = unsafe {
            (self.drv.api.event_record)(
                event.0 as usize as sys::CUevent,
                stream as usize as sys::CUstream,
            )
        };
        self.drv.check("cuEventRecord", rc)
    }

    fn query_event(&self, event: EventHandle) -> DeviceResult<bool> {
        let _ctx = self.ctx()?;
        bump(&self.counters.event_query);
        // SAFETY: as above.
        match unsafe { (self.drv.api.event_query)(event.0 as usize as sys::CUevent) } {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            rc => Err(self.drv.error("cuEventQuery", rc)),
        }
    }

    fn synchronize_event(&self, event: EventHandle) -> DeviceResult<()> {
        let _ctx = self.ctx()?;
        bump(&self.counters.event_synchronize);
        // SAFETY: as above.
        let rc = unsafe { (self.drv.api.event_synchronize)(event.0 as usize as sys::CUevent) };
        self.drv.check("cuEventSynchronize", rc)
    }

    fn synchronize_stream(&self, stream: StreamId) -> DeviceResult<()> {
        let _ctx = self.ctx()?;
        bump(&self.counters.stream_synchronize);
        // SAFETY: as in `record_event`.
        let rc = unsafe { (self.drv.api.stream_synchronize)(stream as usize as sys::CUstream) };
        self.drv.check("cuStreamSynchronize", rc)
    }

    fn synchronize(&self) -> DeviceResult<()> {
        let _ctx = self.ctx()?;
        bump(&self.counters.device_synchronize);
        // SAFETY: plain driver call.
        self.drv.check("cuCtxSynchronize", unsafe {
            (self.drv.api.ctx_synchronize)()
        })
    }

    fn counters(&self) -> DriverCounters {
        self.counters.snapshot()
    }

    fn is_capturing(&self, stream: StreamId) -> DeviceResult<bool> {
        let Some(f) = self.drv.api.stream_is_capturing else {
            // A driver without capture (CUDA < 10) has no capturing stream.
            return Ok(false);
        };
        let _ctx = self.ctx()?;
        let mut status: c_int = 0;
        // SAFETY: as in `record_event`; a valid out pointer.
        let rc = unsafe { f(stream as usize as sys::CUstream, &mut status) };
        self.drv.check("cuStreamIsCapturing", rc)?;
        // CU_STREAM_CAPTURE_STATUS_ACTIVE = 1, _INVALIDATED = 2: either way the stream is still
        // in a capture sequence, and the same calls are refused on it.
        Ok(status != 0)
    }
}
