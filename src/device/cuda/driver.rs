//! Loading the CUDA driver and calling it: the entry points resolved once per process into
//! function pointers that return the raw `int` (see the invariants in `cuda/mod.rs`), the driver's
//! result codes turned into [`DeviceError`]s with the driver's own names and texts, and the
//! primary context's retain and release. The device itself ([`super::CudaDevice`]) calls the
//! driver only through [`Driver`].

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::device::*;

/// A raw `CUresult`. Kept as an integer: see the module invariants.
pub(super) type CuResult = c_int;

pub(super) const CUDA_SUCCESS: CuResult = 0;
pub(super) const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub(super) const CUDA_ERROR_STUB_LIBRARY: CuResult = 34;
pub(super) const CUDA_ERROR_NOT_READY: CuResult = 600;

/// Used when the driver reports no granularity (VMM unsupported): the usual 2 MiB.
pub(super) const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// A few result names, for when `cuGetErrorName` itself fails (a stub library) or is missing.
pub(super) const KNOWN_ERRORS: &[(CuResult, &str)] = &[
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (35, "CUDA_ERROR_INSUFFICIENT_DRIVER"),
    (36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"),
    (46, "CUDA_ERROR_DEVICES_UNAVAILABLE"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (600, "CUDA_ERROR_NOT_READY"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

// ---- the driver entry points ------------------------------------------------------------------

pub(super) type FnInt = unsafe extern "C" fn(*mut c_int) -> CuResult;
pub(super) type FnErrStr = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;

/// The virtual memory management calls (CUDA 10.2+). All or none.
pub(super) struct VmmApi {
    pub(super) address_reserve: unsafe extern "C" fn(
        *mut sys::CUdeviceptr,
        usize,
        usize,
        sys::CUdeviceptr,
        u64,
    ) -> CuResult,
    pub(super) address_free: unsafe extern "C" fn(sys::CUdeviceptr, usize) -> CuResult,
    pub(super) create: unsafe extern "C" fn(
        *mut sys::CUmemGenericAllocationHandle,
        usize,
        *const sys::CUmemAllocationProp,
        u64,
    ) -> CuResult,
    pub(super) release: unsafe extern "C" fn(sys::CUmemGenericAllocationHandle) -> CuResult,
    pub(super) map: unsafe extern "C" fn(
        sys::CUdeviceptr,
        usize,
        usize,
        sys::CUmemGenericAllocationHandle,
        u64,
    ) -> CuResult,
    pub(super) set_access: unsafe extern "C" fn(
        sys::CUdeviceptr,
        usize,
        *const sys::CUmemAccessDesc,
        usize,
    ) -> CuResult,
    pub(super) unmap: unsafe extern "C" fn(sys::CUdeviceptr, usize) -> CuResult,
    pub(super) granularity: unsafe extern "C" fn(
        *mut usize,
        *const sys::CUmemAllocationProp,
        sys::CUmemAllocationGranularity_flags,
    ) -> CuResult,
}

/// Every entry point we call, resolved once from the library cudarc loaded.
pub(super) struct Api {
    pub(super) device_get: unsafe extern "C" fn(*mut sys::CUdevice, c_int) -> CuResult,
    pub(super) device_get_count: FnInt,
    pub(super) device_get_name:
        Option<unsafe extern "C" fn(*mut c_char, c_int, sys::CUdevice) -> CuResult>,
    pub(super) device_total_mem:
        Option<unsafe extern "C" fn(*mut usize, sys::CUdevice) -> CuResult>,
    /// The attribute is passed as a plain int, so no enum value can be out of range.
    pub(super) device_get_attribute:
        Option<unsafe extern "C" fn(*mut c_int, c_int, sys::CUdevice) -> CuResult>,
    pub(super) primary_ctx_retain:
        unsafe extern "C" fn(*mut sys::CUcontext, sys::CUdevice) -> CuResult,
    pub(super) primary_ctx_release: unsafe extern "C" fn(sys::CUdevice) -> CuResult,
    pub(super) ctx_get_current: unsafe extern "C" fn(*mut sys::CUcontext) -> CuResult,
    pub(super) ctx_set_current: unsafe extern "C" fn(sys::CUcontext) -> CuResult,
    pub(super) ctx_synchronize: unsafe extern "C" fn() -> CuResult,
    pub(super) mem_alloc: unsafe extern "C" fn(*mut sys::CUdeviceptr, usize) -> CuResult,
    pub(super) mem_free: unsafe extern "C" fn(sys::CUdeviceptr) -> CuResult,
    pub(super) mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult,
    pub(super) event_create: unsafe extern "C" fn(*mut sys::CUevent, c_uint) -> CuResult,
    pub(super) event_destroy: unsafe extern "C" fn(sys::CUevent) -> CuResult,
    pub(super) event_record: unsafe extern "C" fn(sys::CUevent, sys::CUstream) -> CuResult,
    pub(super) event_query: unsafe extern "C" fn(sys::CUevent) -> CuResult,
    pub(super) event_synchronize: unsafe extern "C" fn(sys::CUevent) -> CuResult,
    pub(super) stream_synchronize: unsafe extern "C" fn(sys::CUstream) -> CuResult,
    /// `cuStreamIsCapturing` (CUDA 10+): whether a stream is being captured into a graph.
    pub(super) stream_is_capturing:
        Option<unsafe extern "C" fn(sys::CUstream, *mut c_int) -> CuResult>,
    /// `cuThreadExchangeStreamCaptureMode` (CUDA 10.1+): the calling thread's capture mode.
    pub(super) exchange_capture_mode: Option<FnInt>,
    pub(super) get_error_name: Option<FnErrStr>,
    pub(super) get_error_string: Option<FnErrStr>,
    pub(super) vmm: Option<VmmApi>,
}

/// The initialised driver, shared by every [`CudaDevice`] of the process.
pub(super) struct Driver {
    pub(super) api: Api,
    pub(super) version: i32,
}

/// Looks `name` (NUL-terminated) up in the library cudarc loaded. `None` when it is absent.
///
/// # Safety
/// `T` must be the function pointer type of the symbol's C signature, and the library must have
/// been found (`sys::is_culib_present`), otherwise `sys::culib` panics.
pub(super) unsafe fn symbol<T: Copy>(name: &'static [u8]) -> Option<T> {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: the caller guarantees T matches the symbol; the library lives for the whole process
    // (cudarc keeps it in a static and never closes it), so the pointer stays valid.
    unsafe { sys::culib().get::<T>(name).ok().map(|s| *s) }
}

/// A required symbol, or a `NoDriver` error naming it.
macro_rules! required {
    ($name:literal) => {
        // SAFETY: the field's type spells out the C signature of the named entry point.
        match unsafe { symbol(concat!($name, "\0").as_bytes()) } {
            Some(f) => f,
            None => {
                return Err(DeviceError::NoDriver(format!(
                    "the loaded libcuda has no {} entry point: the NVIDIA driver is too old or not a \
                     driver (CUDA 12 or newer is needed)",
                    $name
                )));
            }
        }
    };
}

/// An optional symbol.
macro_rules! optional {
    ($name:literal) => {
        // SAFETY: as for `required!`.
        unsafe { symbol(concat!($name, "\0").as_bytes()) }
    };
}

pub(super) fn error_name(get_name: Option<FnErrStr>, code: CuResult) -> String {
    if let Some(f) = get_name {
        let mut s: *const c_char = ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static NUL-terminated string or fails.
        if unsafe { f(code, &mut s) } == CUDA_SUCCESS && !s.is_null() {
            // SAFETY: checked non-null; the driver's strings are static and NUL-terminated.
            return unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
        }
    }
    match KNOWN_ERRORS.iter().find(|(c, _)| *c == code) {
        Some((_, n)) => (*n).to_string(),
        None => format!("CUDA_ERROR_{code}"),
    }
}

pub(super) fn error_text(get_string: Option<FnErrStr>, code: CuResult) -> Option<String> {
    let f = get_string?;
    let mut s: *const c_char = ptr::null();
    // SAFETY: as in `error_name`.
    if unsafe { f(code, &mut s) } == CUDA_SUCCESS && !s.is_null() {
        // SAFETY: as in `error_name`.
        return Some(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned());
    }
    None
}

/// "CUDA_ERROR_X: text" for `code`, using the driver's strings where it can.
pub(super) fn describe(
    get_name: Option<FnErrStr>,
    get_string: Option<FnErrStr>,
    code: CuResult,
) -> String {
    let name = error_name(get_name, code);
    match error_text(get_string, code) {
        Some(text) => format!("{name}: {text}"),
        None => name,
    }
}

pub(super) fn no_driver_at_init(
    call: &str,
    code: CuResult,
    get_name: Option<FnErrStr>,
    get_string: Option<FnErrStr>,
) -> DeviceError {
    let mut why = format!(
        "{call} failed with CUDA error {code} ({})",
        describe(get_name, get_string, code)
    );
    if code == CUDA_ERROR_STUB_LIBRARY {
        why.push_str(
            ": the libcuda found first is the CUDA toolkit's stub (e.g. .../lib64/stubs/libcuda.so on \
             LD_LIBRARY_PATH), not the NVIDIA driver; remove the stubs directory from the library path",
        );
    }
    why.push_str("; use TORCH_ARENA_CONF=device:sim to run without a GPU");
    DeviceError::NoDriver(why)
}

impl Driver {
    /// Loads the library, resolves the entry points, runs `cuInit(0)` and `cuDriverGetVersion`.
    pub(super) fn load() -> DeviceResult<Driver> {
        // SAFETY: is_culib_present only tries to dlopen the candidate names.
        if !unsafe { sys::is_culib_present() } {
            return Err(DeviceError::NoDriver(
                "libcuda.so.1 not found: no NVIDIA driver library is on the library search path \
                 (tried libcuda.so, libcuda.so.1 and the other names cudarc knows); install the \
                 NVIDIA driver, or use TORCH_ARENA_CONF=device:sim"
                    .into(),
            ));
        }
        let get_error_name: Option<FnErrStr> = optional!("cuGetErrorName");
        let get_error_string: Option<FnErrStr> = optional!("cuGetErrorString");
        let init: unsafe extern "C" fn(c_uint) -> CuResult = required!("cuInit");
        let driver_get_version: FnInt = required!("cuDriverGetVersion");

        // SAFETY: plain driver calls with valid arguments.
        let rc = unsafe { init(0) };
        if rc != CUDA_SUCCESS {
            return Err(no_driver_at_init(
                "cuInit(0)",
                rc,
                get_error_name,
                get_error_string,
            ));
        }
        let mut version: c_int = 0;
        // SAFETY: as above.
        let rc = unsafe { driver_get_version(&mut version) };
        if rc != CUDA_SUCCESS {
            return Err(no_driver_at_init(
                "cuDriverGetVersion",
                rc,
                get_error_name,
                get_error_string,
            ));
        }

        let vmm = match (
            optional!("cuMemAddressReserve"),
            optional!("cuMemAddressFree"),
            optional!("cuMemCreate"),
            optional!("cuMemRelease"),
            optional!("cuMemMap"),
            optional!("cuMemSetAccess"),
            optional!("cuMemUnmap"),
            optional!("cuMemGetAllocationGranularity"),
        ) {
            (
                Some(address_reserve),
                Some(address_free),
                Some(create),
                Some(release),
                Some(map),
                Some(set_access),
                Some(unmap),
                Some(granularity),
            ) => Some(VmmApi {
                address_reserve,
                address_free,
                create,
                release,
                map,
                set_access,
                unmap,
                granularity,
            }),
            _ => None,
        };

        let api = Api {
            device_get: required!("cuDeviceGet"),
            device_get_count: required!("cuDeviceGetCount"),
            device_get_name: optional!("cuDeviceGetName"),
            device_total_mem: optional!("cuDeviceTotalMem_v2"),
            device_get_attribute: optional!("cuDeviceGetAttribute"),
            primary_ctx_retain: required!("cuDevicePrimaryCtxRetain"),
            primary_ctx_release: required!("cuDevicePrimaryCtxRelease_v2"),
            ctx_get_current: required!("cuCtxGetCurrent"),
            ctx_set_current: required!("cuCtxSetCurrent"),
            ctx_synchronize: required!("cuCtxSynchronize"),
            mem_alloc: required!("cuMemAlloc_v2"),
            mem_free: required!("cuMemFree_v2"),
            mem_get_info: required!("cuMemGetInfo_v2"),
            event_create: required!("cuEventCreate"),
            event_destroy: required!("cuEventDestroy_v2"),
            event_record: required!("cuEventRecord"),
            event_query: required!("cuEventQuery"),
            event_synchronize: required!("cuEventSynchronize"),
            stream_synchronize: required!("cuStreamSynchronize"),
            stream_is_capturing: optional!("cuStreamIsCapturing"),
            exchange_capture_mode: optional!("cuThreadExchangeStreamCaptureMode"),
            get_error_name,
            get_error_string,
            vmm,
        };
        Ok(Driver { api, version })
    }

    /// The process-wide driver: initialised by the first call, the result reused afterwards.
    pub(super) fn get() -> DeviceResult<&'static Driver> {
        static DRIVER: OnceLock<DeviceResult<Driver>> = OnceLock::new();
        DRIVER
            .get_or_init(|| {
                catch_unwind(AssertUnwindSafe(Driver::load)).unwrap_or_else(|panic| {
                    let what = panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| panic.downcast_ref::<&str>().copied())
                        .unwrap_or("(no message)");
                    Err(DeviceError::NoDriver(format!(
                        "loading libcuda failed: {what}; install the NVIDIA driver, or use \
                         TORCH_ARENA_CONF=device:sim"
                    )))
                })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    pub(super) fn describe(&self, code: CuResult) -> String {
        describe(self.api.get_error_name, self.api.get_error_string, code)
    }

    pub(super) fn error(&self, call: &'static str, code: CuResult) -> DeviceError {
        DeviceError::Driver {
            call,
            code,
            message: self.describe(code),
        }
    }

    pub(super) fn check(&self, call: &'static str, code: CuResult) -> DeviceResult<()> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self.error(call, code))
        }
    }

    /// Like `check`, but CUDA_ERROR_OUT_OF_MEMORY becomes [`DeviceError::OutOfMemory`].
    pub(super) fn check_alloc(&self, call: &'static str, code: CuResult) -> DeviceResult<()> {
        match code {
            CUDA_SUCCESS => Ok(()),
            CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory),
            _ => Err(self.error(call, code)),
        }
    }
}

/// The driver version (e.g. 12080, 13000), initialising the driver if needed. An error says why
/// no driver is usable.
pub fn driver_version() -> DeviceResult<i32> {
    Driver::get().map(|d| d.version)
}
