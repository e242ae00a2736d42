//! `fork()` while other threads are inside the allocator.
//!
//! Only the forking thread lives on in the child; a lock another thread held at that moment
//! stays held there for good, and the child's next call that takes it hangs (DataLoader workers
//! fork by default, and a worker's garbage collector frees the tensors it inherited). So the
//! process-wide instance registers `pthread_atfork` handlers ([`install`]) that take every lock
//! of ours before the fork, in the lock order (`ARCHITECTURE.md`), and give them back in the
//! parent and in the child once it has run; in the child no lock is then held, and the state
//! behind each is whole (no thread was inside it).
//!
//! The order, outermost first: [`OPENING`] (held while a lazily made part of the instance is
//! made: the instance, a device's arena, a device's tracking, so no child sees one half made),
//! the trace file's registry and recorder, each open arena and its device (the simulated
//! device's state), the tracker (its step lock, then its leaf locks), the last error, the log
//! queue. A thread holding one of these never waits for anything the forking thread holds (no
//! lock of ours is held while waiting for the GIL), so the handler's wait is bounded.
//!
//! In the child, [`in_child`] is true: a CUDA context does not survive `fork()`, so the CUDA
//! device refuses every driver call with [`crate::device::DeviceError::ForkedChild`] and frees
//! of blocks inherited from the parent succeed without touching anything; the simulated device
//! goes on working.
//!
//! Locks are given back in the child by resetting their word, not by unlocking: a parking_lot
//! unlock with waiters parked (threads of the parent, gone in the child) would take a lock of
//! parking_lot's own wait table, which one of those threads may have held at the fork.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use parking_lot::Mutex;

static CHILD: AtomicBool = AtomicBool::new(false);

/// Whether this process is a fork child of one where the allocator was in use.
#[inline]
pub fn in_child() -> bool {
    CHILD.load(Ordering::Relaxed)
}

/// Held while a lazily made part of the instance is being made (see the module documentation);
/// outermost in the lock order, so take it with no lock of ours held.
pub static OPENING: Mutex<()> = Mutex::new(());

/// The handlers of [`install`]: `prepare` takes every lock of the instance, `release(child)`
/// gives them back.
struct Handlers {
    prepare: fn(),
    release: fn(bool),
}

static HANDLERS: once_cell::sync::OnceCell<Handlers> = once_cell::sync::OnceCell::new();

/// Registers the process's fork handlers, once (later calls do nothing): `prepare` runs before
/// every `fork()` after [`OPENING`] is taken, `release(false)` in the parent and
/// `release(true)` in the child after it, before [`OPENING`] is given back.
pub fn install(prepare: fn(), release: fn(bool)) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = HANDLERS.set(Handlers { prepare, release });
        // SAFETY: three `extern "C" fn()` that never unwind (a panic in one aborts).
        let rc = unsafe {
            libc::pthread_atfork(Some(before_fork), Some(in_parent), Some(in_forked_child))
        };
        if rc != 0 {
            tracing::warn!("pthread_atfork failed ({rc}): a fork under load may hang the child");
        }
    });
}

extern "C" fn before_fork() {
    hold(&OPENING);
    if let Some(h) = HANDLERS.get() {
        (h.prepare)();
    }
}

extern "C" fn in_parent() {
    if let Some(h) = HANDLERS.get() {
        (h.release)(false);
    }
    // SAFETY: held since `before_fork`, on this thread.
    unsafe { release(&OPENING, false) };
}

extern "C" fn in_forked_child() {
    CHILD.store(true, Ordering::Relaxed);
    if let Some(h) = HANDLERS.get() {
        (h.release)(true);
    }
    // SAFETY: as above.
    unsafe { release(&OPENING, true) };
}

/// Locks `m` for a fork and keeps it locked past this call (see [`release`]).
pub fn hold<T: ?Sized>(m: &Mutex<T>) {
    std::mem::forget(m.lock());
}

/// Gives back a lock [`hold`] took. In the child the lock word is reset to unlocked with no
/// waiters (the waiters were threads of the parent).
///
/// # Safety
/// `m` must be held by [`hold`] on this thread (in the child: on the thread that forked), and
/// given back once.
pub unsafe fn release<T: ?Sized>(m: &Mutex<T>, child: bool) {
    if child {
        // parking_lot's raw mutex is one `AtomicU8`, its state (0: unlocked, no waiters), and
        // nothing else: a struct of one byte whose only field is that byte.
        const _: () = assert!(
            size_of::<parking_lot::RawMutex>() == 1 && align_of::<parking_lot::RawMutex>() == 1
        );
        // SAFETY: as the assertion shows, the raw mutex is exactly its `AtomicU8` state; an
        // atomic store through a shared reference is interior mutability. No other thread
        // exists in the child.
        unsafe {
            let raw: &parking_lot::RawMutex = m.raw();
            let state = &*(raw as *const parking_lot::RawMutex).cast::<AtomicU8>();
            state.store(0, Ordering::Release);
        }
    } else {
        // SAFETY: held by this thread through a forgotten guard (the caller's contract).
        unsafe { m.force_unlock() };
    }
}
