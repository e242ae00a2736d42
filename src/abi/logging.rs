//! Logging exports (see `crate::log`).

use super::shared::*;

// Logging (see `crate::log`).

/// Set the log level by name: `error`, `warn`, `info`, `debug`, `trace` or `off`
/// (case-insensitive). 0, `TORCH_ARENA_ERR_CONFIG` for another name (the last error names it and
/// the accepted ones; the level is unchanged), `TORCH_ARENA_ERR_INVALID_ARGUMENT` for NULL.
///
/// # Safety
/// `level` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_set_log_level(level: *const c_char) -> c_int {
    status("torch_arena_set_log_level", || {
        // SAFETY: the caller's contract.
        let text = unsafe { c_str(level, "torch_arena_set_log_level") }?;
        crate::log::set_level(text).map(drop).map_err(|why| {
            Failure::new(
                TORCH_ARENA_ERR_CONFIG,
                format!("torch_arena_set_log_level({text:?}): {why}"),
            )
        })
    })
}

/// The log level: 0 off, 1 error, 2 warn, 3 info, 4 debug, 5 trace (not a status code).
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_log_level() -> c_int {
    guarded("torch_arena_log_level", || {
        Ok(c_int::from(crate::log::level()))
    })
    .unwrap_or(-1)
}

/// Nonzero: a consumer takes over delivery (records go to the queue, nothing to stderr);
/// 0: back to stderr (records already queued stay until drained).
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_log_attach(attached: c_int) {
    let _ = guarded("torch_arena_log_attach", || {
        crate::log::attach(attached != 0);
        Ok(())
    });
}

/// Pop as many whole queued records as fit into `buf` (`cap` bytes, a NUL included), one line
/// each, `LEVEL\tTARGET\tMESSAGE\n`, and return the bytes written (< `cap`; 0: empty). When the
/// first record alone does not fit, nothing is popped and its length is returned (>= `cap`).
/// `cap` >= 4096 always fits a record. `buf` may be NULL with `cap` 0 (a probe: 0 when empty).
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_log_drain(buf: *mut c_char, cap: usize) -> usize {
    guarded("torch_arena_log_drain", || {
        let out: &mut [u8] = if buf.is_null() || cap == 0 {
            &mut []
        } else {
            // SAFETY: non-null and valid for `cap` writes by the caller's contract.
            unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), cap) }
        };
        Ok(crate::log::drain_into(out))
    })
    .unwrap_or(0)
}

/// Records dropped so far because the queue (1024 records) was full.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_log_dropped() -> u64 {
    guarded("torch_arena_log_dropped", || Ok(crate::log::dropped())).unwrap_or(0)
}
