//! Configuration, the last error and the version.

use super::shared::*;

// ---------------------------------------------------------------------------------------------
// Configuration and errors.

/// Install the configuration `conf` (`TORCH_ARENA_CONF` grammar) before first use.
/// Returns 0, or `TORCH_ARENA_ERR_CONFIG` for a bad text (nothing is installed) or when the
/// allocator is already initialised with a different configuration (the same one is accepted).
///
/// # Safety
/// `conf` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_configure(conf: *const c_char) -> c_int {
    status("torch_arena_configure", || {
        // SAFETY: the caller's contract.
        let text = unsafe { c_str(conf, "torch_arena_configure") }?;
        let parsed = parse_conf(text, "torch_arena_configure")?;
        let mut installed_now = false;
        let inst = init_instance(|| {
            // try_new: a `trace` file that cannot be created is a configuration error.
            TorchArena::try_new(parsed.clone()).map(|arena| {
                installed_now = true;
                Installed {
                    arena,
                    conf: text.to_string(),
                    source: "torch_arena_configure",
                }
            })
        })
        .map_err(|e| {
            Failure::new(
                TORCH_ARENA_ERR_CONFIG,
                format!("torch_arena_configure({text:?}): {e}"),
            )
        })?;
        if installed_now {
            log_configured(inst);
            Ok(())
        } else if inst.arena.config() == &parsed {
            Ok(())
        } else {
            Err(Failure::new(
                TORCH_ARENA_ERR_CONFIG,
                format!(
                    "torch_arena_configure({text:?}): torch-arena is already initialised with \
                     {:?} (from {}), and its configuration cannot change once initialised; call \
                     torch_arena_configure before the first allocation, or set TORCH_ARENA_CONF",
                    inst.conf, inst.source
                ),
            ))
        }
    })
}

/// The configuration in force, every key spelled out (`device:sim,...,cpu_tensors:False`), into
/// `buf` (snprintf style). 0 when torch-arena is not initialised yet (last error says so):
/// nothing is decided until `torch_arena_configure` or the first allocation.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_config(buf: *mut c_char, cap: usize) -> usize {
    let text = guarded("torch_arena_config", || match INSTANCE.get() {
        Some(i) => Ok(i.arena.config().to_string()),
        None => Err(Failure::new(
            TORCH_ARENA_ERR_OTHER,
            "torch_arena_config: torch-arena is not initialised yet (no configure call and no \
             allocation so far)"
                .to_string(),
        )),
    });
    // SAFETY: the caller's contract.
    unsafe { copy_out(text.as_deref().unwrap_or(""), buf, cap) }
}

/// Validate `conf` without installing it: 0, or `TORCH_ARENA_ERR_CONFIG` with the reason.
///
/// # Safety
/// `conf` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_check_config(conf: *const c_char) -> c_int {
    status("torch_arena_check_config", || {
        // SAFETY: the caller's contract.
        let text = unsafe { c_str(conf, "torch_arena_check_config") }?;
        parse_conf(text, "torch_arena_check_config").map(drop)
    })
}

/// Copy the last error message (this thread's, else the process's most recent) into `buf`,
/// NUL-terminated and truncated to `cap` bytes; returns its full length (snprintf style).
/// `buf` may be NULL with `cap` 0 to ask for the length.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_last_error(buf: *mut c_char, cap: usize) -> usize {
    guarded("torch_arena_last_error", || {
        let text = last_error();
        // SAFETY: the caller's contract.
        Ok(unsafe { copy_out(&text, buf, cap) })
    })
    .unwrap_or(0)
}

/// Forget the last error, of this thread and of the process.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_clear_last_error() {
    let _ = guarded("torch_arena_clear_last_error", || {
        clear_last_error();
        Ok(())
    });
}

/// The crate version, a static NUL-terminated string.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_version() -> *const c_char {
    static VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(s) => s,
            Err(_) => c"unknown",
        };
    VERSION.as_ptr()
}

// ---------------------------------------------------------------------------------------------
