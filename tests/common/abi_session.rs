//! The process-wide allocator behind the C exports, shared by the tests that call them
//! in-process: one lock so tests never overlap, and one configuration (a host-backed simulated
//! device) installed before first use.

use std::ffi::{CString, c_char};
use std::sync::{Mutex, MutexGuard, Once};

use torch_arena::abi::*;

pub const CONF: &str = "device:sim,sim_capacity_mb:256,sim_backing:True";

/// Take the lock; the first caller installs [`CONF`].
pub fn session() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    static CONFIGURE: Once = Once::new();
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    CONFIGURE.call_once(|| {
        let conf = CString::new(CONF).unwrap();
        let rc = unsafe { torch_arena_configure(conf.as_ptr()) };
        assert_eq!(rc, TORCH_ARENA_OK, "configure({CONF}): {}", last_error());
    });
    guard
}

/// The last error, read the way a C caller would (size first, then the text), checking the
/// snprintf contract on the way.
pub fn last_error() -> String {
    let n = unsafe { torch_arena_last_error(std::ptr::null_mut(), 0) };
    let mut buf = vec![0x55u8; n + 1];
    let m = unsafe { torch_arena_last_error(buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    assert_eq!(m, n);
    assert_eq!(buf[n], 0, "not NUL-terminated");
    String::from_utf8(buf[..n].to_vec()).unwrap()
}
