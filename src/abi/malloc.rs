//! malloc / free, called by the C++ shim (`torch_arena_try_malloc*`, `torch_arena_try_free`).

use super::oom::observe_oom;
use super::shared::*;

// malloc / free, called by the C++ shim.

/// Allocate `size` bytes on `device` for `stream`; the pointer goes to `*out` (NULL for size 0).
/// Returns 0, 1 (out of memory: the last error starts with "CUDA out of memory. Tried to
/// allocate") or 2 (any other failure, `out` NULL included).
///
/// # Safety
/// `out` is NULL or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_try_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract is ours.
    unsafe { try_malloc_in(size, device, stream, out, None) }
}

/// Like [`torch_arena_try_malloc`], from private pool `(id0, id1)` (a PyTorch `MempoolId_t`)
/// while it records (between `torch_arena_pool_begin` and `torch_arena_pool_end`). The C++ shim
/// calls this for the allocations whose stream a capture's filter accepts. For a pool that is
/// not recording it serves general memory (the capture ended first), as the header says.
///
/// # Safety
/// `out` is NULL or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_try_malloc_pool(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    id0: u64,
    id1: u64,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract is ours.
    unsafe { try_malloc_in(size, device, stream, out, Some((id0, id1))) }
}

/// The body of both try_malloc exports.
///
/// # Safety
/// `out` is NULL or valid for one pointer write.
unsafe fn try_malloc_in(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    out: *mut *mut c_void,
    pool: Option<PoolId>,
) -> c_int {
    let r = guarded("torch_arena_malloc", || {
        if out.is_null() {
            return Err(Failure::new(
                TORCH_ARENA_ERR_OTHER,
                "torch_arena_try_malloc: out is NULL",
            ));
        }
        let context =
            || format!("torch_arena_malloc(size={size}, device={device}, stream={stream:p})");
        let inst = instance().map_err(|f| {
            Failure::new(f.code, format!("{}: {}", context(), f.msg)).logged(f.logged)
        })?;
        let r = match pool {
            None => inst.malloc(size, device, stream_id(stream)),
            Some(p) => inst.malloc_pool(size, device, stream_id(stream), p),
        };
        let logged = watch_device(inst, device, &r);
        let ptr = r.map_err(|e| {
            let fail = match e {
                Error::OutOfMemory(m) if m.starts_with(OOM_PREFIX) => {
                    Failure::new(TORCH_ARENA_ERR_OOM, m)
                }
                Error::OutOfMemory(m) => Failure::new(
                    TORCH_ARENA_ERR_OOM,
                    format!("{OOM_PREFIX} {}. {m}", format_size(size as u64)),
                ),
                Error::Device(DeviceError::OutOfMemory) => Failure::new(
                    TORCH_ARENA_ERR_OOM,
                    format!(
                        "{OOM_PREFIX} {}. The device is out of memory (device {device})",
                        format_size(size as u64)
                    ),
                ),
                e => Failure::with_context(&e, &context()),
            };
            let fail = if fail.code == TORCH_ARENA_ERR_OOM {
                observe_oom(device, size, fail)
            } else {
                fail
            };
            if fail.code == TORCH_ARENA_ERR_OOM {
                // One line: the observer's note is on a line of its own in the error, which the
                // log would print as a literal `\n` (it escapes line breaks in a record).
                WARN_OOM.report(&fail.msg.replace('\n', " "));
            } else if !logged {
                ERROR_MALLOC.report(&fail.msg);
            }
            fail.logged(true)
        })?;
        if ptr == 0 && size != 0 {
            return Err(Failure::new(
                TORCH_ARENA_ERR_OTHER,
                format!("{}: the arena returned NULL", context()),
            ));
        }
        // SAFETY: checked non-null; valid for a write by the caller's contract.
        unsafe { *out = ptr as usize as *mut c_void };
        Ok(())
    });
    match r {
        Ok(()) => TORCH_ARENA_OK,
        Err(TORCH_ARENA_ERR_OOM) => TORCH_ARENA_ERR_OOM,
        Err(_) => TORCH_ARENA_ERR_OTHER,
    }
}

/// Free `ptr` (NULL: no-op). A pointer never returned, a double free or a size mismatch returns
/// `TORCH_ARENA_ERR_BAD_POINTER` (other failures their code), changes nothing, is recorded as the
/// last error (naming the pointer) and logged at `warn`, rate-limited. Never unwinds.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_try_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    status("torch_arena_free", || {
        let context = || {
            format!(
                "torch_arena_free(ptr={ptr:p}, size={size}, device={device}, stream={stream:p})"
            )
        };
        let (fail, fault) = match instance() {
            Err(f) => (
                Failure::new(f.code, format!("{}: {}", context(), f.msg)).logged(f.logged),
                None,
            ),
            Ok(a) => match a.free(dev_ptr(ptr), size, device, stream_id(stream)) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let fault = match e {
                        Error::BadPointer(fault, _) => Some(fault),
                        _ => None,
                    };
                    (Failure::with_context(&e, &context()), fault)
                }
            },
        };
        warn_free(&fail, fault);
        Err(fail)
    })
}

/// Frees that failed so far (bad pointers, double frees, size mismatches, other errors).
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_bad_free_count() -> u64 {
    BAD_FREES.load(Ordering::Relaxed)
}
