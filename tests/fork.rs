//! `fork()` while other threads are inside the allocator (issue 37, item 1): the child must never
//! inherit a lock of ours held, and on the simulated device it keeps working.
//!
//! Threads hammer every locked part of the process-wide instance through the C exports (malloc
//! and free on two streams and two devices, the live table's JSON, statistics, steps, tags,
//! history, the log queue, the trace recorder, the last error) while the main thread forks
//! again and again. Each child allocates, frees an allocation it inherited, reads every report,
//! and exits (`_exit`: no test harness, no atexit in the child); the parent waits for each with
//! a deadline, and a child that misses it is killed and the test fails. Its own binary: the
//! process-wide instance and fork.

use std::ffi::{CString, c_char, c_int, c_void};
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use torch_arena::abi::*;

const FORKS: usize = 60;
const THREADS: usize = 4;
/// How long a child may take: its work is a few microseconds; a hang is forever.
const CHILD_DEADLINE: Duration = Duration::from_secs(20);

fn alloc(size: usize, device: c_int, stream: usize) -> Option<*mut c_void> {
    let mut p = ptr::null_mut();
    // SAFETY: `p` is a valid out pointer.
    let rc = unsafe { torch_arena_try_malloc(size, device, stream as *mut c_void, &mut p) };
    (rc == TORCH_ARENA_OK).then_some(p)
}

fn free(p: *mut c_void, size: usize, device: c_int, stream: usize) -> c_int {
    torch_arena_try_free(p, size, device, stream as *mut c_void)
}

/// The JSON reports and statistics: `false` when one fails.
fn reports(device: c_int) -> bool {
    let mut buf = vec![0 as c_char; 1 << 16];
    let mut values = vec![0i64; torch_arena_stats_count() as usize];
    // SAFETY: every buffer is valid for the length given.
    unsafe {
        torch_arena_live_json(device, buf.as_mut_ptr(), buf.len()) > 0
            && torch_arena_history_json(device, buf.as_mut_ptr(), buf.len()) > 0
            && torch_arena_leaks_json(device, 0, 1, buf.as_mut_ptr(), buf.len()) > 0
            && torch_arena_stats(device, values.as_mut_ptr(), values.len()) == TORCH_ARENA_OK
            && torch_arena_summary(device, 1, buf.as_mut_ptr(), buf.len()) > 0
    }
}

/// One worker: allocations of every kind held a little while, and the other calls in between.
fn hammer(id: usize, stop: &AtomicBool) {
    let tag = CString::new(format!("worker{id}")).unwrap();
    let sizes = [256usize, 4000, 70_000, 3 << 20, 25 << 20];
    let mut held: Vec<(*mut c_void, usize, c_int, usize)> = Vec::new();
    let mut i = 0usize;
    let mut log = vec![0 as c_char; 4096];
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let (size, device, stream) = (sizes[i % sizes.len()], (i % 2) as c_int, 1 + (i / 7) % 3);
        if let Some(p) = alloc(size, device, stream) {
            held.push((p, size, device, stream));
        }
        if held.len() > 8 {
            let (p, size, device, stream) = held.remove(i % held.len());
            assert_eq!(free(p, size, device, stream), TORCH_ARENA_OK);
        }
        match i % 16 {
            0 => assert!(reports(device)),
            // SAFETY: a NUL-terminated tag.
            1 => assert_eq!(
                unsafe { torch_arena_tag_push(tag.as_ptr()) },
                TORCH_ARENA_OK
            ),
            2 => assert_eq!(torch_arena_tag_pop(), TORCH_ARENA_OK),
            3 => {
                torch_arena_step();
            }
            4 => {
                // A bad free: the last error and the rate-limited warning (the log queue).
                free(0x10 as *mut c_void, 8, device, stream);
            }
            5 => {
                // SAFETY: a valid buffer.
                unsafe { torch_arena_log_drain(log.as_mut_ptr(), log.len()) };
            }
            6 if id == 0 && i % 256 == 6 => torch_arena_empty_cache(),
            _ => {}
        }
    }
    for (p, size, device, stream) in held {
        assert_eq!(free(p, size, device, stream), TORCH_ARENA_OK);
    }
}

/// The child's work; its exit status says what failed (0: nothing).
fn child(inherited: *mut c_void) -> c_int {
    let Some(p) = alloc(5 << 20, 0, 1) else {
        return 2;
    };
    if free(p, 5 << 20, 0, 1) != TORCH_ARENA_OK {
        return 3;
    }
    // Freed here only: the parent keeps its own copy.
    if free(inherited, 1 << 20, 1, 2) != TORCH_ARENA_OK {
        return 4;
    }
    if !(reports(0) && reports(1)) {
        return 5;
    }
    torch_arena_step();
    0
}

/// Waits for `pid` until the deadline; kills it past that. Its exit status, or `None` on a hang.
fn wait_with_deadline(pid: libc::pid_t) -> Option<c_int> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid failed");
        if r == pid {
            assert!(
                libc::WIFEXITED(status),
                "child {pid} died: status {status:#x}"
            );
            return Some(libc::WEXITSTATUS(status));
        }
        if start.elapsed() > CHILD_DEADLINE {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_child_forked_under_load_never_inherits_a_held_lock() {
    let trace = std::env::temp_dir().join(format!("torch-arena-fork-{}.trace", std::process::id()));
    let conf = CString::new(format!(
        "device:sim,sim_devices:2,sim_capacity_mb:2048,leaks:True,trace:{}",
        trace.display()
    ))
    .unwrap();
    // SAFETY: NUL-terminated strings.
    unsafe {
        assert_eq!(torch_arena_configure(conf.as_ptr()), TORCH_ARENA_OK);
        let debug = CString::new("debug").unwrap();
        assert_eq!(torch_arena_set_log_level(debug.as_ptr()), TORCH_ARENA_OK);
    }
    torch_arena_log_attach(1);
    assert_eq!(torch_arena_history_enable(1, 4096), TORCH_ARENA_OK);

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..THREADS)
        .map(|id| {
            let stop = stop.clone();
            std::thread::spawn(move || hammer(id, &stop))
        })
        .collect();

    let mut hung = 0;
    let mut failed = Vec::new();
    for _ in 0..FORKS {
        let inherited = alloc(1 << 20, 1, 2).expect("the parent allocates");
        // SAFETY: the child runs only `child` and `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = std::panic::catch_unwind(|| child(inherited)).unwrap_or(9);
            // SAFETY: leaving the child without running the parent's atexit handlers.
            unsafe { libc::_exit(code) };
        }
        match wait_with_deadline(pid) {
            None => hung += 1,
            Some(0) => {}
            Some(code) => failed.push(code),
        }
        assert_eq!(free(inherited, 1 << 20, 1, 2), TORCH_ARENA_OK);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let _ = std::fs::remove_file(&trace);
    assert_eq!(
        hung, 0,
        "{hung} of {FORKS} children hung (killed after {CHILD_DEADLINE:?})"
    );
    assert!(failed.is_empty(), "children failed with {failed:?}");

    // The parent goes on as before: everything freed, the arenas consistent.
    for device in 0..2 {
        let mut values = vec![0i64; torch_arena_stats_count() as usize];
        // SAFETY: a valid buffer.
        let rc = unsafe { torch_arena_stats(device, values.as_mut_ptr(), values.len()) };
        assert_eq!(rc, TORCH_ARENA_OK);
    }
    let p = alloc(1000, 0, 0).unwrap();
    assert_eq!(free(p, 1000, 0, 0), TORCH_ARENA_OK);
}
