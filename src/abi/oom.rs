//! The out-of-memory observer: set by the Python package, called before an OOM is returned.

use super::shared::*;

// ---------------------------------------------------------------------------------------------
// The out-of-memory observer.

/// `size_t observer(int device, size_t size, char* buf, size_t cap)`: called at each
/// out-of-memory error, before it is returned (and thrown to PyTorch), with no lock of ours held.
/// It may write a line into `buf` (at most `cap` bytes, NUL not needed) and returns its length;
/// that line is appended to the error's message. The Python package sets one that writes a
/// memory snapshot and names the file (PyTorch's OOM-observer recipe, which a pluggable
/// allocator cannot use).
pub type OomObserver = unsafe extern "C" fn(c_int, usize, *mut c_char, usize) -> usize;

/// The observer, as a function address (0: none).
static OOM_OBSERVER: AtomicUsize = AtomicUsize::new(0);

/// Most bytes of an observer's line appended to an out-of-memory message.
const OOM_NOTE_CAP: usize = 4096;

/// Set (or, with NULL, clear) the out-of-memory observer. Always 0.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_set_oom_observer(observer: Option<OomObserver>) -> c_int {
    OOM_OBSERVER.store(observer.map_or(0, |f| f as usize), Ordering::Release);
    TORCH_ARENA_OK
}

/// Let the observer (if any) add its line to an out-of-memory failure. A panic in it, or a line
/// that is not UTF-8, adds nothing: the OOM is never hidden behind the observer.
pub(super) fn observe_oom(device: c_int, size: usize, mut fail: Failure) -> Failure {
    let addr = OOM_OBSERVER.load(Ordering::Acquire);
    if addr == 0 {
        return fail;
    }
    // SAFETY: only `torch_arena_set_oom_observer` stores here, from an `OomObserver`.
    let observer: OomObserver = unsafe { std::mem::transmute::<usize, OomObserver>(addr) };
    let mut buf = vec![0u8; OOM_NOTE_CAP];
    let n = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `buf` is valid for `OOM_NOTE_CAP` bytes of writes.
        unsafe { observer(device, size, buf.as_mut_ptr().cast::<c_char>(), buf.len()) }
    }))
    .unwrap_or(0)
    .min(buf.len());
    if let Ok(note) = std::str::from_utf8(&buf[..n])
        && !note.trim().is_empty()
    {
        fail.msg = format!("{}\n{}", fail.msg, note.trim_end());
    }
    fail
}
