//! The C ABI: every `extern "C"` export of the cdylib, and nothing else.
//!
//! This module owns the process-wide [`TorchArena`] instance, the last-error slots and the
//! translation between C values (raw pointers, `int` status codes, NUL-terminated strings) and the
//! Rust API. All allocator logic lives in [`TorchArena`]; each export here is a thin wrapper.
//! The public header `cpp_shim/torch_arena.h` documents every symbol for C callers; the C++ shim
//! (`cpp_shim/shim.cpp`) holds the two functions PyTorch calls, `torch_arena_malloc` and
//! `torch_arena_free`, which turn [`torch_arena_try_malloc`]'s status into a C++ exception, and
//! the three pool hooks of CUDA graph capture, which call [`torch_arena_pool_begin`],
//! [`torch_arena_pool_end`], [`torch_arena_pool_release`] and [`torch_arena_try_malloc_pool`].
//!
//! # The no-panic invariant
//!
//! A Rust panic must never cross the FFI boundary: PyTorch calls these functions from C++ on any
//! thread, and an unwinding panic would abort the Python process. Every export runs its body
//! inside [`std::panic::catch_unwind`] (through [`guarded`]); a caught panic becomes
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

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use once_cell::sync::{Lazy, OnceCell};
use parking_lot::Mutex;

use crate::allocator::{MAX_DEVICES, TorchArena};
use crate::arena::{PoolId, ReclaimReport, format_size};
use crate::config::Config;
use crate::device::{DevPtr, DeviceError, StreamId};
use crate::error::{Error, PointerFault};
use crate::stats::DeviceStats;

// ---------------------------------------------------------------------------------------------
// Status codes (mirrored as `TORCH_ARENA_*` macros in cpp_shim/torch_arena.h).

/// Success.
pub const TORCH_ARENA_OK: c_int = 0;
/// The request could not be met: the message starts with "CUDA out of memory. Tried to allocate".
pub const TORCH_ARENA_ERR_OOM: c_int = 1;
/// Any other failure (a device/driver error, an internal error).
pub const TORCH_ARENA_ERR_OTHER: c_int = 2;
/// A bad configuration (`TORCH_ARENA_CONF` or `torch_arena_configure`), or a configuration change
/// after the allocator was initialised.
pub const TORCH_ARENA_ERR_CONFIG: c_int = 3;
/// A pointer torch-arena never returned, a double free, or a size that differs from the request.
pub const TORCH_ARENA_ERR_BAD_POINTER: c_int = 4;
/// A device ordinal outside what was configured.
pub const TORCH_ARENA_ERR_BAD_DEVICE: c_int = 5;
/// A NULL out-pointer or string, a too-small buffer, an out-of-range value.
pub const TORCH_ARENA_ERR_INVALID_ARGUMENT: c_int = 6;
/// A panic inside torch-arena was caught at the boundary (a bug; the process can go on).
pub const TORCH_ARENA_ERR_PANIC: c_int = 7;

/// The first words of every out-of-memory message (what PyTorch and the libraries above it match).
pub const OOM_PREFIX: &str = "CUDA out of memory. Tried to allocate";

/// `torch_arena_reclaim_report` in the header: what `defragment` / `empty_cache` recovered.
/// Field for field the same as [`ReclaimReport`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TorchArenaReclaimReport {
    pub slabs_released: u64,
    pub pages_unmapped: u64,
    pub pages_released: u64,
    pub bytes_recovered: u64,
    pub bytes_released: u64,
}

impl From<ReclaimReport> for TorchArenaReclaimReport {
    fn from(r: ReclaimReport) -> Self {
        TorchArenaReclaimReport {
            slabs_released: r.slabs_released,
            pages_unmapped: r.pages_unmapped,
            pages_released: r.pages_released,
            bytes_recovered: r.bytes_recovered,
            bytes_released: r.bytes_released,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Failures, the panic guard and the last error.

/// A failed call: its status code and its message.
struct Failure {
    code: c_int,
    msg: String,
    /// Already logged where it was found: the caller's generic report is skipped.
    logged: bool,
}

impl Failure {
    fn new(code: c_int, msg: impl Into<String>) -> Self {
        Failure {
            code,
            msg: msg.into(),
            logged: false,
        }
    }

    fn logged(mut self, logged: bool) -> Self {
        self.logged = logged;
        self
    }

    fn invalid(msg: impl Into<String>) -> Self {
        Failure::new(TORCH_ARENA_ERR_INVALID_ARGUMENT, msg)
    }

    /// `e`, with `context` (the call and its arguments) in front of its message.
    fn with_context(e: &Error, context: &str) -> Self {
        Failure::new(error_code(e), format!("{context}: {e}"))
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::new(error_code(&e), e.to_string())
    }
}

fn error_code(e: &Error) -> c_int {
    match e {
        Error::OutOfMemory(_) | Error::Device(DeviceError::OutOfMemory) => TORCH_ARENA_ERR_OOM,
        Error::Config(_) => TORCH_ARENA_ERR_CONFIG,
        Error::BadPointer(..) => TORCH_ARENA_ERR_BAD_POINTER,
        Error::BadDevice(_) => TORCH_ARENA_ERR_BAD_DEVICE,
        Error::Device(_) | Error::Trace(_) => TORCH_ARENA_ERR_OTHER,
    }
}

type Outcome<T> = std::result::Result<T, Failure>;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}
static LAST_ERROR_GLOBAL: Mutex<String> = Mutex::new(String::new());

/// Store `msg` as this thread's last error and as the process-wide most recent one.
fn set_last_error(msg: &str) {
    // try_with: a hook may run from a thread-local destructor, after this slot is gone.
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut s) = slot.try_borrow_mut() {
            s.clear();
            s.push_str(msg);
        }
    });
    let mut g = LAST_ERROR_GLOBAL.lock();
    g.clear();
    g.push_str(msg);
}

/// This thread's last error, else the process-wide most recent one ("" when none).
fn last_error() -> String {
    let mine = LAST_ERROR
        .try_with(|slot| slot.try_borrow().map(|s| s.clone()).unwrap_or_default())
        .unwrap_or_default();
    if mine.is_empty() {
        LAST_ERROR_GLOBAL.lock().clone()
    } else {
        mine
    }
}

fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut s) = slot.try_borrow_mut() {
            s.clear();
        }
    });
    LAST_ERROR_GLOBAL.lock().clear();
}

thread_local! {
    /// How many exports this thread is inside: a panic there is caught by [`guarded`].
    static IN_EXPORT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Where the last caught panic happened (" at file:line"), for [`guarded`]'s message.
    static PANIC_AT: std::cell::Cell<Option<String>> = const { std::cell::Cell::new(None) };
}

/// Install, once, a panic hook that keeps panics inside our exports off the host's stderr: the
/// host (PyTorch) did nothing wrong, and [`guarded`] turns the panic into the last error and a
/// log line. Panics anywhere else (the host's own Rust code, if any) go to the hook that was
/// there before, unchanged.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let ours = IN_EXPORT.try_with(|d| d.get() > 0).unwrap_or(false);
            if ours {
                let at = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let _ = PANIC_AT.try_with(|p| p.set(Some(at)));
            } else {
                previous(info);
            }
        }));
    });
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

/// Run `f` so that nothing unwinds out of it: a [`Failure`] is recorded as the last error and
/// returned as its code; a panic becomes [`TORCH_ARENA_ERR_PANIC`] with a message naming `name`.
/// Every export passes through here, so this is also where logging is initialised.
fn guarded<T>(name: &str, f: impl FnOnce() -> Outcome<T>) -> std::result::Result<T, c_int> {
    quiet_panics();
    let depth = IN_EXPORT.with(|d| {
        d.set(d.get() + 1);
        d.get()
    });
    let run = catch_unwind(AssertUnwindSafe(|| {
        crate::log::init();
        match f() {
            Ok(v) => Ok(v),
            Err(fail) => {
                set_last_error(&fail.msg);
                Err(fail.code)
            }
        }
    }));
    IN_EXPORT.with(|d| d.set(depth - 1));
    match run {
        Ok(r) => r,
        Err(payload) => {
            let at = PANIC_AT.with(|p| p.take()).unwrap_or_default();
            let msg = format!(
                "torch-arena internal error: panic in {name}: {}{at}. This is a bug in \
                 torch-arena; the call failed and the process can go on",
                panic_text(&*payload)
            );
            tracing::error!("{msg}");
            // Dropping the payload or recording may themselves panic: contain that too.
            let _ = catch_unwind(AssertUnwindSafe(move || {
                drop(payload);
                set_last_error(&msg);
            }));
            Err(TORCH_ARENA_ERR_PANIC)
        }
    }
}

/// [`guarded`] for `int`-returning exports.
fn status(name: &str, f: impl FnOnce() -> Outcome<()>) -> c_int {
    match guarded(name, f) {
        Ok(()) => TORCH_ARENA_OK,
        Err(code) => code,
    }
}

/// Copy `text` into `buf` (capacity `cap`, NUL included) snprintf style: truncated at a UTF-8
/// boundary, always NUL-terminated when `cap > 0`; returns the full length in bytes.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
unsafe fn copy_out(text: &str, buf: *mut c_char, cap: usize) -> usize {
    if !buf.is_null() && cap > 0 {
        let mut n = text.len().min(cap - 1);
        while !text.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: the caller guarantees `cap` writable bytes at `buf`; n + 1 <= cap.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    text.len()
}

/// A C string argument as `&str`.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that outlives the call.
unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Outcome<&'a str> {
    if p.is_null() {
        return Err(Failure::invalid(format!(
            "{what}: the string argument is NULL"
        )));
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| {
        Failure::new(
            TORCH_ARENA_ERR_CONFIG,
            format!("{what}: the string is not valid UTF-8"),
        )
    })
}

// ---------------------------------------------------------------------------------------------
// Rate-limited reports (bad frees, out of memory, errors from the void hooks).

/// One kind of problem, logged through `tracing` for the first 10 occurrences, then every 1000th,
/// each line numbered ("bad free (double free) #3: ...").
struct Reporter {
    name: &'static str,
    error: bool,
    count: AtomicU64,
}

impl Reporter {
    /// Reported at `warn`.
    const fn warn(name: &'static str) -> Self {
        Reporter {
            name,
            error: false,
            count: AtomicU64::new(0),
        }
    }

    /// Reported at `error`.
    const fn error(name: &'static str) -> Self {
        Reporter {
            name,
            error: true,
            count: AtomicU64::new(0),
        }
    }

    fn report(&self, msg: &str) {
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= 10 || n.is_multiple_of(1000) {
            let more = if n == 10 {
                " (further ones of this kind: every 1000th is shown)"
            } else {
                ""
            };
            let name = self.name;
            if self.error {
                tracing::error!("{name} #{n}: {msg}{more}");
            } else {
                tracing::warn!("{name} #{n}: {msg}{more}");
            }
        }
    }
}

static WARN_UNKNOWN_POINTER: Reporter = Reporter::warn("bad free (unknown pointer)");
static WARN_DOUBLE_FREE: Reporter = Reporter::warn("bad free (double free)");
static WARN_SIZE_MISMATCH: Reporter = Reporter::warn("bad free (size mismatch)");
static WARN_FREE_FAILED: Reporter = Reporter::warn("free failed");
static WARN_RECORD_STREAM: Reporter = Reporter::warn("record_stream (unknown pointer)");
static WARN_HOOK: Reporter = Reporter::warn("hook failed");
static WARN_OOM: Reporter = Reporter::warn("out of memory");
static ERROR_MALLOC: Reporter = Reporter::error("malloc failed");
static ERROR_DEVICE_OPEN: Reporter = Reporter::error("device open failed");

/// Frees that failed (any reason), counted at the boundary.
static BAD_FREES: AtomicU64 = AtomicU64::new(0);

/// Count and log a failed free, under the category of its pointer fault (`None`: the free failed
/// for another reason).
fn warn_free(fail: &Failure, fault: Option<PointerFault>) {
    BAD_FREES.fetch_add(1, Ordering::Relaxed);
    if fail.logged {
        return;
    }
    let kind = match fault {
        Some(PointerFault::SizeMismatch) => &WARN_SIZE_MISMATCH,
        Some(PointerFault::Freed) => &WARN_DOUBLE_FREE,
        Some(PointerFault::Unknown | PointerFault::Interior) => &WARN_UNKNOWN_POINTER,
        None => &WARN_FREE_FAILED,
    };
    kind.report(&fail.msg);
}

/// For hooks that return nothing (PyTorch ignores their outcome): record and log a failure.
fn hook(name: &str, f: impl FnOnce() -> Outcome<()>) {
    let _ = guarded(name, || {
        f().inspect_err(|fail| {
            if !fail.logged {
                WARN_HOOK.report(&fail.msg)
            }
        })
    });
}

/// Devices already announced at `info` ("opened device 0 ...").
static DEVICE_SEEN: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];

/// After a call on `device` that returned `r`: announce the device (once) when it is open, and
/// when the call failed with a device error before the device could be opened, log that at
/// `error` (rate-limited). Returns whether `r`'s error was logged. On the hot path (the device
/// announced, `r` Ok) this is one relaxed load.
#[inline]
fn watch_device<T>(inst: &TorchArena, device: c_int, r: &crate::Result<T>) -> bool {
    let Some(seen) = usize::try_from(device)
        .ok()
        .and_then(|d| DEVICE_SEEN.get(d))
    else {
        return false;
    };
    if r.is_ok() && seen.load(Ordering::Relaxed) {
        return false;
    }
    watch_device_slow(inst, device, seen, r.as_ref().err())
}

#[cold]
fn watch_device_slow(
    inst: &TorchArena,
    device: c_int,
    seen: &AtomicBool,
    err: Option<&Error>,
) -> bool {
    match inst.open_arenas().find(|(d, _)| *d == device) {
        Some((_, arena)) => {
            if !seen.swap(true, Ordering::Relaxed) {
                let dev = arena.device();
                let info = dev.info();
                tracing::info!(
                    "opened device {device} ({}): {} of memory, allocation granularity {}, {}",
                    info.name,
                    format_size(info.total_bytes),
                    format_size(info.granularity),
                    if info.vmm {
                        "virtual memory management (VMM) supported"
                    } else {
                        "no virtual memory management: plain cuMemAlloc segments"
                    }
                );
            }
            false
        }
        None => match err {
            Some(e @ Error::Device(_)) => {
                ERROR_DEVICE_OPEN.report(&format!("could not open device {device}: {e}"));
                true
            }
            _ => false,
        },
    }
}

/// A reclaim report as one log line.
fn reclaim_text(r: &ReclaimReport) -> String {
    format!(
        "{} empty slabs dissolved, {} idle pages unmapped, {} pages released to the driver; {} \
         made available, {} given back",
        r.slabs_released,
        r.pages_unmapped,
        r.pages_released,
        format_size(r.bytes_recovered),
        format_size(r.bytes_released)
    )
}

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
fn observe_oom(device: c_int, size: usize, mut fail: Failure) -> Failure {
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

// ---------------------------------------------------------------------------------------------
// The process-wide instance.

struct Installed {
    arena: TorchArena,
    /// The configuration text it was built from, and where that came from.
    conf: String,
    source: &'static str,
}

static INSTANCE: OnceCell<Installed> = OnceCell::new();
/// A bad `TORCH_ARENA_CONF`, remembered so that every later call fails the same way.
static ENV_ERROR: OnceCell<Error> = OnceCell::new();
/// The device count PyTorch passed to the init hook (-1: not called).
static DEVICE_COUNT: AtomicI32 = AtomicI32::new(-1);

/// The instance, created from `TORCH_ARENA_CONF` on first use. A bad `TORCH_ARENA_CONF` is
/// logged once, when first found; the failures returned for it are marked logged.
fn instance() -> Outcome<&'static TorchArena> {
    if let Some(i) = INSTANCE.get() {
        return Ok(&i.arena);
    }
    if let Some(e) = ENV_ERROR.get() {
        return Err(Failure::from(e.clone()).logged(true));
    }
    let text = crate::allocator::conf_from_env().unwrap_or_default();
    let mut installed_now = false;
    let made = INSTANCE.get_or_try_init(|| {
        TorchArena::from_env().map(|arena| {
            installed_now = true;
            Installed {
                arena,
                conf: text.clone(),
                source: "TORCH_ARENA_CONF",
            }
        })
    });
    match made {
        Ok(i) => {
            if installed_now {
                log_configured(i);
            }
            Ok(&i.arena)
        }
        Err(e) => {
            let mut first = false;
            let e = ENV_ERROR.get_or_init(|| {
                first = true;
                Error::Config(format!("invalid TORCH_ARENA_CONF={text:?}: {e}"))
            });
            if first {
                tracing::error!("{e}");
            }
            Err(Failure::from(e.clone()).logged(true))
        }
    }
}

/// The configuration just installed, at `info` (the text) and `debug` (every setting).
fn log_configured(i: &Installed) {
    if i.conf.is_empty() {
        tracing::info!("configured from {}: \"\" (the defaults)", i.source);
    } else {
        tracing::info!("configured from {}: {:?}", i.source, i.conf);
    }
    tracing::debug!("configuration: {:?}", i.arena.config());
}

fn parse_conf(text: &str, what: &str) -> Outcome<Config> {
    Config::parse(text)
        .map_err(|e| Failure::new(TORCH_ARENA_ERR_CONFIG, format!("{what}({text:?}): {e}")))
}

fn stream_id(stream: *mut c_void) -> StreamId {
    stream as usize as StreamId
}

fn dev_ptr(ptr: *mut c_void) -> DevPtr {
    ptr as usize as DevPtr
}

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
        let inst = INSTANCE
            .get_or_try_init(|| {
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

/// The configuration in force, every key spelled out (`device:sim,...,leak_age:0`), into `buf`
/// (snprintf style). 0 when torch-arena is not initialised yet (last error says so): nothing is
/// decided until `torch_arena_configure` or the first allocation.
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

/// Like [`torch_arena_try_malloc`], from private pool `(id0, id1)` (a PyTorch `MempoolId_t`),
/// which must be recording (between `torch_arena_pool_begin` and `torch_arena_pool_end`). The
/// C++ shim calls this for the allocations whose stream a capture's filter accepts.
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
                WARN_OOM.report(&fail.msg);
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

// ---------------------------------------------------------------------------------------------
// PyTorch's optional hooks.

/// `set_init_fn`: `void(int device_count)`. Records the count and reads the configuration (a bad
/// one is reported here, at CUDA init, and again on every allocation); opens no device.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_init(device_count: c_int) {
    hook("torch_arena_init", || {
        DEVICE_COUNT.store(device_count, Ordering::Relaxed);
        instance().map(drop)
    });
}

/// `set_reset_fn`: `void(void)`, called by `torch.cuda.empty_cache()`.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_empty_cache() {
    hook("torch_arena_empty_cache", || {
        let r = instance()?.empty_cache()?;
        tracing::debug!("empty_cache (reset hook): {}", reclaim_text(&r));
        Ok(())
    });
}

/// `set_memory_fraction_fn`: `void(double fraction, int device)`.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_set_memory_fraction(fraction: f64, device: c_int) {
    hook("torch_arena_set_memory_fraction", || {
        let inst = instance()?;
        let r = inst.set_memory_fraction(fraction, device);
        let logged = watch_device(inst, device, &r);
        r.map_err(|e| {
            Failure::with_context(
                &e,
                &format!("torch_arena_set_memory_fraction({fraction}, {device})"),
            )
            .logged(logged)
        })
    });
}

/// `set_record_stream_fn`: `void(void* ptr, cudaStream_t stream)`.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    hook("torch_arena_record_stream", || {
        instance()?
            .record_stream(dev_ptr(ptr), stream_id(stream))
            .map_err(|e| {
                let fail = Failure::with_context(
                    &e,
                    &format!("torch_arena_record_stream(ptr={ptr:p}, stream={stream:p})"),
                );
                if fail.code == TORCH_ARENA_ERR_BAD_POINTER {
                    WARN_RECORD_STREAM.report(&fail.msg);
                    fail.logged(true)
                } else {
                    fail
                }
            })
    });
}

/// `set_base_alloc_fn`: `void*(void* ptr, size_t* size)`. The base pointer of the allocation that
/// contains `ptr`, its size written to `*size`. An unknown pointer gives `ptr` and size 0, with
/// the last error set.
///
/// # Safety
/// `size` is NULL or valid for one `size_t` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_base_alloc(ptr: *mut c_void, size: *mut usize) -> *mut c_void {
    let r = guarded("torch_arena_base_alloc", || {
        if !size.is_null() {
            // SAFETY: non-null, valid by the caller's contract.
            unsafe { *size = 0 };
        }
        let (base, len) = instance()?.base_alloc(dev_ptr(ptr)).map_err(|e| {
            Failure::with_context(&e, &format!("torch_arena_base_alloc(ptr={ptr:p})"))
        })?;
        if size.is_null() {
            return Err(Failure::invalid(format!(
                "torch_arena_base_alloc(ptr={ptr:p}): size is NULL"
            )));
        }
        // SAFETY: as above.
        unsafe { *size = len as usize };
        Ok(base as usize as *mut c_void)
    });
    r.unwrap_or(ptr)
}

// ---------------------------------------------------------------------------------------------
// Private pools (CUDA graph capture). PyTorch's three pool hooks are C++ functions in the shim
// (cpp_shim/shim.cpp): begin takes a std::function the shim keeps and evaluates on every
// allocation; these are what the shim calls with the pool id split into its two halves.

/// [`status`] for calls whose caller discards the outcome (the shim's pool hooks): a failure is
/// also logged at `warn`, rate-limited, as a failed hook is.
fn logged_status(name: &str, f: impl FnOnce() -> Outcome<()>) -> c_int {
    status(name, || {
        f().inspect_err(|fail| {
            if !fail.logged {
                WARN_HOOK.report(&fail.msg)
            }
        })
    })
}

/// `beginAllocateToPool(device, (id0, id1), filter)` less the filter: pool `(id0, id1)` of
/// `device` is created (or shared, a use more) and recording. Fails if it is recording already.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_pool_begin(device: c_int, id0: u64, id1: u64) -> c_int {
    logged_status("torch_arena_pool_begin", || {
        let inst = instance()?;
        inst.begin_pool(device, (id0, id1)).map_err(|e| {
            Failure::with_context(
                &e,
                &format!("torch_arena_begin_allocate_to_pool(device={device}, id=({id0}, {id1}))"),
            )
        })
    })
}

/// `endAllocateToPool(device, (id0, id1))`: the pool stops recording and keeps its memory.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_pool_end(device: c_int, id0: u64, id1: u64) -> c_int {
    logged_status("torch_arena_pool_end", || {
        let inst = instance()?;
        inst.end_pool(device, (id0, id1)).map_err(|e| {
            Failure::with_context(
                &e,
                &format!("torch_arena_end_allocate_to_pool(device={device}, id=({id0}, {id1}))"),
            )
        })
    })
}

/// `releasePool(device, (id0, id1))`: one use of the pool ends; with none left its memory
/// returns to general use as it becomes free (after a device synchronisation proves its graphs
/// no longer run).
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_pool_release(device: c_int, id0: u64, id1: u64) -> c_int {
    logged_status("torch_arena_pool_release", || {
        let inst = instance()?;
        inst.release_pool(device, (id0, id1)).map_err(|e| {
            Failure::with_context(
                &e,
                &format!("torch_arena_release_pool(device={device}, id=({id0}, {id1}))"),
            )
        })
    })
}

/// `torch_arena_pool_info` in the header: what a private pool holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TorchArenaPoolInfo {
    pub use_count: u32,
    pub recording: u32,
    pub released: u32,
    pub states: u32,
    pub mapped_pages: u64,
    pub used_pages: u64,
}

/// What pool `(id0, id1)` of `device` holds, into `*out`. Returns 0, or
/// `TORCH_ARENA_ERR_BAD_POINTER` for a pool the device does not know (never begun, or released
/// and wholly given back; `*out` is zeroed).
///
/// # Safety
/// `out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_pool_info(
    device: c_int,
    id0: u64,
    id1: u64,
    out: *mut TorchArenaPoolInfo,
) -> c_int {
    status("torch_arena_pool_info", || {
        if out.is_null() {
            return Err(Failure::invalid("torch_arena_pool_info: out is NULL"));
        }
        let arena = instance()?.arena(device)?;
        let info = arena.pool_info((id0, id1));
        let v = info.map_or_else(TorchArenaPoolInfo::default, |i| TorchArenaPoolInfo {
            use_count: i.use_count,
            recording: i.recording as u32,
            released: i.released as u32,
            states: i.states,
            mapped_pages: i.mapped_pages,
            used_pages: i.used_pages,
        });
        // SAFETY: checked non-null; valid by the caller's contract.
        unsafe { *out = v };
        match info {
            Some(_) => Ok(()),
            None => Err(Failure::new(
                TORCH_ARENA_ERR_BAD_POINTER,
                format!("torch_arena_pool_info: device {device} has no pool ({id0}, {id1})"),
            )),
        }
    })
}

/// Whether `ptr` lies in the memory of a private pool of `device`: 1 (its id to `*id0`,
/// `*id1` when they are not NULL), 0 (not in a pool, or not ours), or a negative status code.
///
/// # Safety
/// `id0` and `id1` are NULL or valid for one write each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_pool_of(
    ptr: *mut c_void,
    device: c_int,
    id0: *mut u64,
    id1: *mut u64,
) -> c_int {
    let r = guarded("torch_arena_pool_of", || {
        let arena = instance()?.arena(device)?;
        Ok(arena.pool_of(dev_ptr(ptr)))
    });
    match r {
        Ok(Some((a, b))) => {
            // SAFETY: each is NULL or valid by the caller's contract.
            unsafe {
                if !id0.is_null() {
                    *id0 = a;
                }
                if !id1.is_null() {
                    *id1 = b;
                }
            }
            1
        }
        Ok(None) => 0,
        Err(code) => -code,
    }
}

// ---------------------------------------------------------------------------------------------
// Queries for the Python package.

/// Stat key names, in the order of [`stats_flatten`], as static C strings.
static STAT_KEYS: Lazy<Vec<CString>> = Lazy::new(|| {
    stats_key_names()
        .into_iter()
        .map(|k| CString::new(k).expect("stat keys contain no NUL"))
        .collect()
});

/// The stat key list (sorted, as `torch.cuda.memory_stats()` orders it).
fn stats_key_names() -> Vec<String> {
    crate::stats::keys::key_names()
}

/// `(key, value)` pairs of `stats`, in [`stats_key_names`] order.
fn stats_flatten(stats: &DeviceStats) -> Vec<(String, i64)> {
    crate::stats::keys::flatten(stats)
}

/// Number of `memory_stats` keys (122), or -1 on an internal error.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_stats_count() -> i64 {
    guarded("torch_arena_stats_count", || Ok(STAT_KEYS.len() as i64)).unwrap_or(-1)
}

/// Key `i` (0-based, sorted order) as a static NUL-terminated string; NULL when out of range.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_stats_key(i: i64) -> *const c_char {
    guarded("torch_arena_stats_key", || {
        usize::try_from(i)
            .ok()
            .and_then(|i| STAT_KEYS.get(i))
            .map(|k| k.as_ptr())
            .ok_or_else(|| {
                Failure::invalid(format!(
                    "torch_arena_stats_key({i}): expected 0..{}",
                    STAT_KEYS.len()
                ))
            })
    })
    .unwrap_or(std::ptr::null())
}

/// Fill `values[0..count)` with device `device`'s statistics in key order. `n` must be at least
/// `torch_arena_stats_count()`; entries past the count are left alone.
///
/// # Safety
/// `values` is NULL or valid for `n` `int64_t` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_stats(device: c_int, values: *mut i64, n: usize) -> c_int {
    status("torch_arena_stats", || {
        let count = STAT_KEYS.len();
        if values.is_null() {
            return Err(Failure::invalid("torch_arena_stats: values is NULL"));
        }
        if n < count {
            return Err(Failure::invalid(format!(
                "torch_arena_stats: the buffer holds {n} values, {count} are needed (torch_arena_stats_count)"
            )));
        }
        let inst = instance()?;
        let r = inst.stats(device);
        watch_device(inst, device, &r);
        let flat = stats_flatten(&r?);
        if flat.len() != count
            || flat
                .iter()
                .zip(STAT_KEYS.iter())
                .any(|((k, _), key)| k.as_bytes() != key.as_bytes())
        {
            return Err(Failure::new(
                TORCH_ARENA_ERR_OTHER,
                "torch-arena internal error: the flattened stats do not match the key list",
            ));
        }
        // SAFETY: non-null and valid for n >= count writes by the caller's contract.
        let out = unsafe { std::slice::from_raw_parts_mut(values, count) };
        for (slot, (_, v)) in out.iter_mut().zip(flat) {
            *slot = v;
        }
        Ok(())
    })
}

/// `memory_summary()` text of `device` into `buf` (snprintf style: NUL-terminated, truncated to
/// `cap`, full length returned). 0 means failure (last error set; `buf` gets "").
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_summary(
    device: c_int,
    abbreviated: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    let text = guarded("torch_arena_summary", || {
        let inst = instance()?;
        let r = inst.summary(device, abbreviated != 0);
        watch_device(inst, device, &r);
        Ok(r?)
    });
    // SAFETY: the caller's contract.
    unsafe { copy_out(text.as_deref().unwrap_or(""), buf, cap) }
}

/// `reset_peak_memory_stats(device)`: 0 or an error code.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_reset_peak_stats(device: c_int) -> c_int {
    status("torch_arena_reset_peak_stats", || {
        let inst = instance()?;
        let r = inst.reset_peak_stats(device);
        watch_device(inst, device, &r);
        Ok(r?)
    })
}

/// `reset_accumulated_memory_stats(device)`: 0 or an error code.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_reset_accumulated_stats(device: c_int) -> c_int {
    status("torch_arena_reset_accumulated_stats", || {
        let inst = instance()?;
        let r = inst.reset_accumulated_stats(device);
        watch_device(inst, device, &r);
        Ok(r?)
    })
}

/// Return empty slabs and idle ranges of `device` to the page pool; what was recovered goes to
/// `*out`. 0 or an error code (`out` NULL: `TORCH_ARENA_ERR_INVALID_ARGUMENT`, nothing done).
///
/// # Safety
/// `out` is NULL or valid for one `torch_arena_reclaim_report` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_defragment(
    device: c_int,
    out: *mut TorchArenaReclaimReport,
) -> c_int {
    status("torch_arena_defragment", || {
        if out.is_null() {
            return Err(Failure::invalid("torch_arena_defragment: out is NULL"));
        }
        let inst = instance()?;
        let r = inst.defragment(device);
        watch_device(inst, device, &r);
        let r = r?;
        tracing::debug!("defragment(device {device}): {}", reclaim_text(&r));
        // SAFETY: non-null, valid by the caller's contract.
        unsafe { *out = r.into() };
        Ok(())
    })
}

/// `empty_cache` on every open device, saying what was recovered in `*out`. 0 or an error code.
///
/// # Safety
/// `out` is NULL or valid for one `torch_arena_reclaim_report` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_empty_cache_report(
    out: *mut TorchArenaReclaimReport,
) -> c_int {
    status("torch_arena_empty_cache_report", || {
        if out.is_null() {
            return Err(Failure::invalid(
                "torch_arena_empty_cache_report: out is NULL",
            ));
        }
        let r = instance()?.empty_cache()?;
        tracing::debug!("empty_cache: {}", reclaim_text(&r));
        // SAFETY: non-null, valid by the caller's contract.
        unsafe { *out = r.into() };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Tracking: steps, tags, sites and the JSON reports (see `crate::track`).

/// A device ordinal for the reports: 0..MAX_DEVICES (the device need not be open).
fn report_device(device: c_int, what: &str) -> Outcome<()> {
    if usize::try_from(device).is_ok_and(|d| d < MAX_DEVICES) {
        Ok(())
    } else {
        Err(Failure::new(
            TORCH_ARENA_ERR_BAD_DEVICE,
            format!("{what}: device {device} is out of range: expected 0..{MAX_DEVICES}"),
        ))
    }
}

/// A JSON report into `buf` (snprintf style); 0 on failure with the last error set.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
unsafe fn json_out(
    name: &str,
    device: c_int,
    buf: *mut c_char,
    cap: usize,
    make: impl FnOnce(&TorchArena) -> Outcome<String>,
) -> usize {
    let text = guarded(name, || {
        report_device(device, name)?;
        make(instance()?)
    });
    match text {
        // SAFETY: the caller's contract.
        Ok(t) => unsafe { copy_out(&t, buf, cap) },
        Err(_) => {
            // SAFETY: as above.
            unsafe { copy_out("", buf, cap) };
            0
        }
    }
}

/// Advance the process-wide step (every site's live bytes are recorded at the boundary); returns
/// the new step (steps start at 0, so the first call returns 1). 0 on failure (last error set).
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_step() -> u64 {
    guarded("torch_arena_step", || Ok(instance()?.tracker().step())).unwrap_or(0)
}

/// The current step (0 before the first `torch_arena_step`; also 0 on failure).
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_current_step() -> u64 {
    guarded("torch_arena_current_step", || {
        Ok(instance()?.tracker().current_step())
    })
    .unwrap_or(0)
}

/// Push `tag` on the calling thread's tag stack: new allocations made on this thread carry its innermost
/// tag (tags are per thread, so two threads' labels never swap). 0, or
/// `TORCH_ARENA_ERR_INVALID_ARGUMENT` (NULL), `TORCH_ARENA_ERR_CONFIG` (not UTF-8).
///
/// # Safety
/// `tag` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_tag_push(tag: *const c_char) -> c_int {
    status("torch_arena_tag_push", || {
        // SAFETY: the caller's contract.
        let text = unsafe { c_str(tag, "torch_arena_tag_push") }?;
        instance()?.tracker().tag_push(text);
        Ok(())
    })
}

/// Pop the calling thread's innermost tag. 0, or `TORCH_ARENA_ERR_INVALID_ARGUMENT` when its stack is
/// empty.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_tag_pop() -> c_int {
    status("torch_arena_tag_pop", || {
        if instance()?.tracker().tag_pop() {
            Ok(())
        } else {
            Err(Failure::invalid(
                "torch_arena_tag_pop: the tag stack is empty (more pops than pushes)",
            ))
        }
    })
}

/// Change site capture at run time: `mode` as the `sites` key (`none`, `python`, `native`,
/// `all`), one allocation in `every` (>= 1), requests of at least `min_bytes`. 0, or
/// `TORCH_ARENA_ERR_CONFIG` (bad mode or `every` 0; nothing changes),
/// `TORCH_ARENA_ERR_INVALID_ARGUMENT` (NULL mode).
///
/// # Safety
/// `mode` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_set_sites(
    mode: *const c_char,
    every: u64,
    min_bytes: u64,
) -> c_int {
    status("torch_arena_set_sites", || {
        // SAFETY: the caller's contract.
        let text = unsafe { c_str(mode, "torch_arena_set_sites") }?;
        let m = crate::config::SitesMode::parse(text).ok_or_else(|| {
            Failure::new(
                TORCH_ARENA_ERR_CONFIG,
                format!(
                    "torch_arena_set_sites({text:?}, {every}, {min_bytes}): bad mode {text:?}: \
                     expected none, python, native or all"
                ),
            )
        })?;
        if every == 0 {
            return Err(Failure::new(
                TORCH_ARENA_ERR_CONFIG,
                format!(
                    "torch_arena_set_sites({text:?}, 0, {min_bytes}): every must be >= 1 (1 = \
                     every allocation)"
                ),
            ));
        }
        instance()?.tracker().set_sites(m, every, min_bytes);
        Ok(())
    })
}

/// Live allocations of `device` as JSON (schema in docs/tracking-abi.md), snprintf style: the full
/// length is returned; 0 = failure (last error set).
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_live_json(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: the caller's contract.
    unsafe {
        json_out("torch_arena_live_json", device, buf, cap, |i| {
            Ok(i.tracker().live_json(device))
        })
    }
}

/// Leak report of `device` as JSON: sites growing after `warmup` steps, and (with `age_steps`
/// > 0) live allocations at least that old. snprintf style; 0 = failure.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_leaks_json(
    device: c_int,
    warmup: u64,
    age_steps: u64,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: the caller's contract.
    unsafe {
        json_out("torch_arena_leaks_json", device, buf, cap, |i| {
            Ok(i.tracker().leaks_json(device, warmup, age_steps))
        })
    }
}

/// Segments and blocks of `device` as JSON (PyTorch snapshot schema). snprintf style; 0 =
/// failure.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_layout_json(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: the caller's contract.
    unsafe {
        json_out("torch_arena_layout_json", device, buf, cap, |i| {
            let layout = i.layout(device)?;
            Ok(crate::track::layout_json(device, &layout))
        })
    }
}

/// Start (`enabled` nonzero: the ring is cleared) or stop recording the history ring of at most
/// `max_entries` entries per device (0 = 100000). 0 or an error code.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_history_enable(enabled: c_int, max_entries: u64) -> c_int {
    status("torch_arena_history_enable", || {
        instance()?
            .tracker()
            .history_enable(enabled != 0, max_entries);
        Ok(())
    })
}

/// The history ring of `device` as JSON, oldest first. snprintf style; 0 = failure.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_history_json(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: the caller's contract.
    unsafe {
        json_out("torch_arena_history_json", device, buf, cap, |i| {
            Ok(i.tracker().history_json(device))
        })
    }
}

// ---------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------
// The C++ shim's entry points: static libraries are linked only when referenced, so take their
// addresses here to keep them (and their exports) in the cdylib.

unsafe extern "C-unwind" {
    fn torch_arena_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void;
    fn torch_arena_free(ptr: *mut c_void, size: usize, device: c_int, stream: *mut c_void);
}

type MallocFn = unsafe extern "C-unwind" fn(usize, c_int, *mut c_void) -> *mut c_void;
type FreeFn = unsafe extern "C-unwind" fn(*mut c_void, usize, c_int, *mut c_void);

#[used]
static KEEP_SHIM: (MallocFn, FreeFn) = (torch_arena_malloc, torch_arena_free);

#[cfg(test)]
mod tests {
    use super::*;

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
            assert!(last_error().contains("quiet boom at src/abi.rs:"));
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
