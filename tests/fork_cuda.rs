//! `fork()` on the CUDA path (issue 37, item 1), over the fake driver: a CUDA context does not
//! survive `fork()`, so in the child every request for device memory is refused with an error
//! that says so and what to do (as PyTorch's "Cannot re-initialize CUDA in forked subprocess"),
//! and a free of a block inherited from the parent succeeds without any driver call. The parent
//! goes on as before. Its own binary: the process-wide instance, the fake driver and fork.

#[path = "fixtures/fakecuda.rs"]
mod fakecuda;

use std::ffi::{CString, c_int, c_void};
use std::ptr;
use std::time::{Duration, Instant};

use torch_arena::abi::*;

fn alloc(size: usize, stream: usize) -> Result<*mut c_void, c_int> {
    let mut p = ptr::null_mut();
    // SAFETY: `p` is a valid out pointer.
    let rc = unsafe { torch_arena_try_malloc(size, 0, stream as *mut c_void, &mut p) };
    if rc == TORCH_ARENA_OK { Ok(p) } else { Err(rc) }
}

fn last_error() -> String {
    let mut buf = vec![0u8; 4096];
    // SAFETY: a valid buffer.
    let n = unsafe { torch_arena_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    String::from_utf8_lossy(&buf[..n.min(buf.len() - 1)]).into_owned()
}

/// The child's checks; its exit status says which failed (0: none).
fn child(fake: &fakecuda::Fake, inherited: *mut c_void, cached: *mut c_void) -> c_int {
    let calls = fake.count("cuCtxGetCurrent");
    // A size the cache could serve without the driver: refused all the same.
    if alloc(4 << 20, 7).is_ok() {
        return 2;
    }
    let e = last_error();
    if !(e.contains("forked child") && e.contains("'spawn'")) {
        return 3;
    }
    if torch_arena_try_free(inherited, 4 << 20, 0, 7 as *mut c_void) != TORCH_ARENA_OK {
        return 4;
    }
    if torch_arena_try_free(cached, 1000, 0, 7 as *mut c_void) != TORCH_ARENA_OK {
        return 5;
    }
    torch_arena_empty_cache();
    if fake.count("cuCtxGetCurrent") != calls {
        return 6; // a driver call was made in the child
    }
    0
}

#[test]
fn a_forked_child_refuses_cuda_work_and_frees_what_it_inherited_harmlessly() {
    let (_g, fake) = fakecuda::session();
    fake.set_capacity(256 << 20);
    let conf = CString::new("device:cuda").unwrap();
    // SAFETY: a NUL-terminated string.
    assert_eq!(
        unsafe { torch_arena_configure(conf.as_ptr()) },
        TORCH_ARENA_OK
    );
    let inherited = alloc(4 << 20, 7).unwrap();
    let cached = alloc(1000, 7).unwrap();
    let freed = alloc(4 << 20, 7).unwrap();
    assert_eq!(
        torch_arena_try_free(freed, 4 << 20, 0, 7 as *mut c_void),
        TORCH_ARENA_OK
    );

    // SAFETY: the child runs only `child` and `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(|| child(fake, inherited, cached)).unwrap_or(9);
        // SAFETY: leaving the child without the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    let start = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the child hung");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(libc::WIFEXITED(status), "child died: {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child's check that failed"
    );

    // The parent is untouched: its blocks are still its own, and CUDA work goes on.
    let again = alloc(4 << 20, 7).unwrap();
    for (p, size) in [(inherited, 4 << 20), (cached, 1000), (again, 4 << 20)] {
        assert_eq!(
            torch_arena_try_free(p, size, 0, 7 as *mut c_void),
            TORCH_ARENA_OK
        );
    }
}
