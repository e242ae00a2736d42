//! The C ABI: every `extern "C"` export of the cdylib, and nothing else.
//!
//! This module owns the process-wide [`TorchArena`](crate::TorchArena) instance, the last-error
//! slots and the translation between C values (raw pointers, `int` status codes, NUL-terminated
//! strings) and the Rust API. All allocator logic lives in [`TorchArena`](crate::TorchArena); each
//! export here is a thin wrapper. The public header `cpp_shim/torch_arena.h` documents every symbol
//! for C callers; the C++ shim (`cpp_shim/shim.cpp`) holds the two functions PyTorch calls,
//! `torch_arena_malloc` and `torch_arena_free`, which turn [`torch_arena_try_malloc`]'s status into
//! a C++ exception, and the three pool hooks of CUDA graph capture, which call
//! [`torch_arena_pool_begin`], [`torch_arena_pool_end`], [`torch_arena_pool_release`] and
//! [`torch_arena_try_malloc_pool`].
//!
//! # The no-panic invariant
//!
//! A Rust panic must never cross the FFI boundary: PyTorch calls these functions from C++ on any
//! thread, and an unwinding panic would abort the Python process. Every export runs its body
//! inside [`std::panic::catch_unwind`] (through `shared::guarded`); a caught panic becomes
//! [`TORCH_ARENA_ERR_PANIC`] (or the export's documented failure value) and a last-error message.
//! Null out-pointers are reported as [`TORCH_ARENA_ERR_INVALID_ARGUMENT`], never dereferenced.
//!
//! # Status codes
//!
//! `int`-returning calls return [`TORCH_ARENA_OK`] (0) on success and a nonzero code with the
//! last error set on failure. [`torch_arena_try_malloc`] narrows them to 0 / 1 / 2.
//!
//! # Last error
//!
//! Each failure stores its message in a thread-local slot and in a process-wide copy of the most
//! recent one. [`torch_arena_last_error`] reads the calling thread's message, or the process-wide
//! one when this thread has none (PyTorch frees from autograd threads; Python reads from its own).
//!
//! # Logging
//!
//! Every export first calls [`crate::log::init`] (one atomic load once done), which installs the
//! crate's `tracing` subscriber and reads `TORCH_ARENA_LOG`. Problems this module already
//! reports go out as `tracing` events: bad frees, unknown `record_stream` pointers, failed hooks
//! and out-of-memory returned to PyTorch at `warn`, rate-limited per kind (the first 10, then
//! every 1000th); a bad `TORCH_ARENA_CONF` (once), a device that cannot be opened (the driver is
//! missing or fails) and other allocation failures at `error`; the configuration and each
//! device when it is first seen open at `info`, once; `empty_cache` / `defragment` reports at
//! `debug`. Where they go (stderr, or the queue the Python package drains) is
//! [`crate::log`]'s business; the `torch_arena_*log*` exports below expose it.

mod configure;
mod graph_pool;
mod hooks;
mod logging;
mod malloc;
mod oom;
mod shared;
mod statistics;
mod tracking;

pub use self::configure::*;
pub use self::graph_pool::*;
pub use self::hooks::*;
pub use self::logging::*;
pub use self::malloc::*;
pub use self::oom::*;
pub use self::shared::{
    OOM_PREFIX, TORCH_ARENA_ERR_BAD_DEVICE, TORCH_ARENA_ERR_BAD_POINTER, TORCH_ARENA_ERR_CONFIG,
    TORCH_ARENA_ERR_INVALID_ARGUMENT, TORCH_ARENA_ERR_OOM, TORCH_ARENA_ERR_OTHER,
    TORCH_ARENA_ERR_PANIC, TORCH_ARENA_OK, TorchArenaReclaimReport,
};
pub use self::statistics::*;
pub use self::tracking::*;

#[cfg(test)]
mod tests {
    use super::shared::*;

    #[test]
    fn a_panic_becomes_an_error_code_and_a_message() {
        let code = status("test_export", || panic!("boom {}", 42));
        assert_eq!(code, TORCH_ARENA_ERR_PANIC);
        let msg = last_error();
        assert!(
            msg.contains("panic in test_export") && msg.contains("boom 42"),
            "{msg}"
        );
    }

    /// A caught panic reaches the last error and the log, never the host's stderr as a
    /// "thread panicked" message with a backtrace. Run in a child process, whose stderr is real.
    #[test]
    fn a_caught_panic_prints_no_panic_message() {
        if std::env::var_os("TORCH_ARENA_TEST_PANIC_CHILD").is_some() {
            let code = status("quiet_export", || panic!("quiet boom"));
            assert_eq!(code, TORCH_ARENA_ERR_PANIC);
            assert!(last_error().contains("quiet boom at src/abi/mod.rs:"));
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "abi::tests::a_caught_panic_prints_no_panic_message",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TORCH_ARENA_TEST_PANIC_CHILD", "1")
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let text = format!("{}{err}", String::from_utf8_lossy(&out.stdout));
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "the child ran no test: {text}");
        assert!(!err.contains("panicked at"), "{err}");
        assert!(!err.contains("stack backtrace"), "{err}");
        assert!(
            err.contains("panic in quiet_export: quiet boom"),
            "logged: {err}"
        );
    }

    #[test]
    fn copy_out_truncates_at_a_char_boundary() {
        let mut buf = [0x7f as c_char; 4];
        let n = unsafe { copy_out("aé€", buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, "aé€".len());
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(s.to_str().unwrap(), "aé");
        assert_eq!(unsafe { copy_out("xyz", std::ptr::null_mut(), 0) }, 3);
    }

    #[test]
    fn sizes_are_formatted_like_pytorch() {
        assert_eq!(format_size(512), "512 bytes");
        assert_eq!(format_size(3 << 10), "3.00 KiB");
        assert_eq!(format_size(20 << 20), "20.00 MiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
    }
}
