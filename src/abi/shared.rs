//! What every export of the C ABI shares: the status codes, a failure and its last-error
//! message, the panic guard ([`guarded`]), rate-limited reports, the process-wide instance and
//! its fork handlers, and the conversions of C values. The exports themselves are in the files
//! beside this one, by group; `abi/mod.rs` re-exports them.

pub(super) use std::cell::RefCell;
pub(super) use std::ffi::{CStr, CString, c_char, c_int, c_void};
pub(super) use std::panic::{AssertUnwindSafe, catch_unwind};
pub(super) use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

pub(super) use once_cell::sync::{Lazy, OnceCell};
pub(super) use parking_lot::Mutex;

pub(super) use crate::allocator::{MAX_DEVICES, TorchArena};
pub(super) use crate::arena::{PoolId, ReclaimReport, format_size};
pub(super) use crate::config::Config;
pub(super) use crate::device::{DevPtr, DeviceError, StreamId};
pub(super) use crate::error::{Error, PointerFault};
pub(super) use crate::stats::DeviceStats;

/// The target of the C ABI's log records, kept from before this code moved to this file: the
/// Python package hands it on as `record.target`, so it is part of the interface.
const LOG_TARGET: &str = "torch_arena::abi";

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

/// `torch_arena_reclaim_report` in the header: the arena's own [`ReclaimReport`] (`#[repr(C)]`).
pub type TorchArenaReclaimReport = ReclaimReport;

// ---------------------------------------------------------------------------------------------
// Failures, the panic guard and the last error.

/// A failed call: its status code and its message.
pub(super) struct Failure {
    pub(super) code: c_int,
    pub(super) msg: String,
    /// Already logged where it was found: the caller's generic report is skipped.
    pub(super) logged: bool,
}

impl Failure {
    pub(super) fn new(code: c_int, msg: impl Into<String>) -> Self {
        Failure {
            code,
            msg: msg.into(),
            logged: false,
        }
    }

    pub(super) fn logged(mut self, logged: bool) -> Self {
        self.logged = logged;
        self
    }

    pub(super) fn invalid(msg: impl Into<String>) -> Self {
        Failure::new(TORCH_ARENA_ERR_INVALID_ARGUMENT, msg)
    }

    /// `e`, with `context` (the call and its arguments) in front of its message.
    pub(super) fn with_context(e: &Error, context: &str) -> Self {
        Failure::new(error_code(e), format!("{context}: {e}"))
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::new(error_code(&e), e.to_string())
    }
}

pub(super) fn error_code(e: &Error) -> c_int {
    match e {
        Error::OutOfMemory(_) | Error::Device(DeviceError::OutOfMemory) => TORCH_ARENA_ERR_OOM,
        Error::Config(_) => TORCH_ARENA_ERR_CONFIG,
        Error::BadPointer(..) => TORCH_ARENA_ERR_BAD_POINTER,
        Error::BadDevice(_) => TORCH_ARENA_ERR_BAD_DEVICE,
        Error::Device(_) | Error::Trace(_) => TORCH_ARENA_ERR_OTHER,
    }
}

pub(super) type Outcome<T> = std::result::Result<T, Failure>;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}
pub(super) static LAST_ERROR_GLOBAL: Mutex<String> = Mutex::new(String::new());

/// Store `msg` as this thread's last error and as the process-wide most recent one.
pub(super) fn set_last_error(msg: &str) {
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
pub(super) fn last_error() -> String {
    let mine = LAST_ERROR
        .try_with(|slot| slot.try_borrow().map(|s| s.clone()).unwrap_or_default())
        .unwrap_or_default();
    if mine.is_empty() {
        LAST_ERROR_GLOBAL.lock().clone()
    } else {
        mine
    }
}

pub(super) fn clear_last_error() {
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
pub(super) fn quiet_panics() {
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

pub(super) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
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
pub(super) fn guarded<T>(
    name: &str,
    f: impl FnOnce() -> Outcome<T>,
) -> std::result::Result<T, c_int> {
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
            tracing::error!(
                target: LOG_TARGET,
                "{msg}");
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
pub(super) fn status(name: &str, f: impl FnOnce() -> Outcome<()>) -> c_int {
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
pub(super) unsafe fn copy_out(text: &str, buf: *mut c_char, cap: usize) -> usize {
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
pub(super) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Outcome<&'a str> {
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
pub(super) struct Reporter {
    pub(super) name: &'static str,
    pub(super) error: bool,
    pub(super) count: AtomicU64,
}

impl Reporter {
    /// Reported at `warn`.
    pub(super) const fn warn(name: &'static str) -> Self {
        Reporter {
            name,
            error: false,
            count: AtomicU64::new(0),
        }
    }

    /// Reported at `error`.
    pub(super) const fn error(name: &'static str) -> Self {
        Reporter {
            name,
            error: true,
            count: AtomicU64::new(0),
        }
    }

    pub(super) fn report(&self, msg: &str) {
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= 10 || n.is_multiple_of(1000) {
            let more = if n == 10 {
                " (further ones of this kind: every 1000th is shown)"
            } else {
                ""
            };
            let name = self.name;
            if self.error {
                tracing::error!(
                target: LOG_TARGET,
                "{name} #{n}: {msg}{more}");
            } else {
                tracing::warn!(
                target: LOG_TARGET,
                "{name} #{n}: {msg}{more}");
            }
        }
    }
}

pub(super) static WARN_UNKNOWN_POINTER: Reporter = Reporter::warn("bad free (unknown pointer)");
pub(super) static WARN_DOUBLE_FREE: Reporter = Reporter::warn("bad free (double free)");
pub(super) static WARN_SIZE_MISMATCH: Reporter = Reporter::warn("bad free (size mismatch)");
pub(super) static WARN_FREE_FAILED: Reporter = Reporter::warn("free failed");
pub(super) static WARN_RECORD_STREAM: Reporter = Reporter::warn("record_stream (unknown pointer)");
pub(super) static WARN_HOOK: Reporter = Reporter::warn("hook failed");
pub(super) static WARN_OOM: Reporter = Reporter::warn("out of memory");
pub(super) static ERROR_MALLOC: Reporter = Reporter::error("malloc failed");
pub(super) static ERROR_DEVICE_OPEN: Reporter = Reporter::error("device open failed");

/// Frees that failed (any reason), counted at the boundary.
pub(super) static BAD_FREES: AtomicU64 = AtomicU64::new(0);

/// Count and log a failed free, under the category of its pointer fault (`None`: the free failed
/// for another reason).
pub(super) fn warn_free(fail: &Failure, fault: Option<PointerFault>) {
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
pub(super) fn hook(name: &str, f: impl FnOnce() -> Outcome<()>) {
    let _ = guarded(name, || {
        f().inspect_err(|fail| {
            if !fail.logged {
                WARN_HOOK.report(&fail.msg)
            }
        })
    });
}

/// Devices already announced at `info` ("opened device 0 ...").
pub(super) static DEVICE_SEEN: [AtomicBool; MAX_DEVICES] =
    [const { AtomicBool::new(false) }; MAX_DEVICES];

/// After a call on `device` that returned `r`: announce the device (once) when it is open, and
/// when the call failed with a device error before the device could be opened, log that at
/// `error` (rate-limited). Returns whether `r`'s error was logged. On the hot path (the device
/// announced, `r` Ok) this is one relaxed load.
#[inline]
pub(super) fn watch_device<T>(inst: &TorchArena, device: c_int, r: &crate::Result<T>) -> bool {
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
pub(super) fn watch_device_slow(
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
                target: LOG_TARGET,
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
pub(super) fn reclaim_text(r: &ReclaimReport) -> String {
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
// The process-wide instance.

pub(super) struct Installed {
    pub(super) arena: TorchArena,
    /// The configuration text it was built from, and where that came from.
    pub(super) conf: String,
    pub(super) source: &'static str,
}

pub(super) static INSTANCE: OnceCell<Installed> = OnceCell::new();
/// A bad `TORCH_ARENA_CONF`, remembered so that every later call fails the same way.
pub(super) static ENV_ERROR: OnceCell<Error> = OnceCell::new();
/// The device count PyTorch passed to the init hook (-1: not called).
pub(super) static DEVICE_COUNT: AtomicI32 = AtomicI32::new(-1);

/// The instance, created from `TORCH_ARENA_CONF` on first use. A bad `TORCH_ARENA_CONF` is
/// logged once, when first found; the failures returned for it are marked logged.
#[inline]
pub(super) fn instance() -> Outcome<&'static TorchArena> {
    if let Some(i) = INSTANCE.get() {
        return Ok(&i.arena);
    }
    make_instance()
}

/// [`instance`] before the instance is made (or when `TORCH_ARENA_CONF` was bad).
#[cold]
fn make_instance() -> Outcome<&'static TorchArena> {
    if let Some(e) = ENV_ERROR.get() {
        return Err(Failure::from(e.clone()).logged(true));
    }
    let text = crate::allocator::conf_from_env().unwrap_or_default();
    let mut installed_now = false;
    let made = init_instance(|| {
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
                tracing::error!(
                target: LOG_TARGET,
                "{e}");
            }
            Err(Failure::from(e.clone()).logged(true))
        }
    }
}

/// `INSTANCE.get_or_try_init(make)`, with the fork handlers registered first and under
/// `fork::OPENING`, so a fork child never finds the instance half made.
pub(super) fn init_instance<E>(
    make: impl FnOnce() -> std::result::Result<Installed, E>,
) -> std::result::Result<&'static Installed, E> {
    if let Some(i) = INSTANCE.get() {
        return Ok(i);
    }
    crate::fork::install(fork_prepare, fork_release);
    let _opening = crate::fork::OPENING.lock();
    INSTANCE.get_or_try_init(make)
}

/// Stat key names, in the order of `torch_arena_stats` (`statistics.rs`), as static C strings.
pub(super) static STAT_KEYS: Lazy<Vec<CString>> = Lazy::new(|| {
    crate::stats::keys::key_names()
        .into_iter()
        .map(|k| CString::new(k).expect("stat keys contain no NUL"))
        .collect()
});

/// Builds [`STAT_KEYS`] (and the key table under it) if no call has yet, or waits for the thread
/// building it: before a fork (`fork_prepare`).
pub(super) fn force_statics() {
    Lazy::force(&STAT_KEYS);
}

/// Before `fork()` (`crate::fork`, after `OPENING`): every lock of the instance, then the
/// process-wide leaves (the last error, the log queue).
pub(super) fn fork_prepare() {
    // A lazily built static that another thread is building at the fork would stay half-built
    // in the child, and the child's first use would wait for it forever (the Python package
    // asks for the stat keys on its first memory_stats()): finish building them first. Building
    // takes no lock of ours.
    force_statics();
    if let Some(i) = INSTANCE.get() {
        i.arena.fork_prepare();
    }
    crate::fork::hold(&LAST_ERROR_GLOBAL);
    crate::log::fork_prepare();
}

/// After `fork()`, in the parent (`child` false) or the child: gives back what [`fork_prepare`]
/// took, in reverse order.
pub(super) fn fork_release(child: bool) {
    // SAFETY: each was taken by `fork_prepare` on this thread, just before the fork (the
    // instance cannot have been installed since: that needs `OPENING`, held around both).
    unsafe {
        crate::log::fork_release(child);
        crate::fork::release(&LAST_ERROR_GLOBAL, child);
        if let Some(i) = INSTANCE.get() {
            i.arena.fork_release(child);
        }
    }
}

/// The configuration just installed, at `info` (the text) and `debug` (every setting).
pub(super) fn log_configured(i: &Installed) {
    if i.conf.is_empty() {
        tracing::info!(
                target: LOG_TARGET,
                "configured from {}: \"\" (the defaults)", i.source);
    } else {
        tracing::info!(
                target: LOG_TARGET,
                "configured from {}: {:?}", i.source, i.conf);
    }
    tracing::debug!(
                target: LOG_TARGET,
                "configuration: {:?}", i.arena.config());
}

pub(super) fn parse_conf(text: &str, what: &str) -> Outcome<Config> {
    Config::parse(text)
        .map_err(|e| Failure::new(TORCH_ARENA_ERR_CONFIG, format!("{what}({text:?}): {e}")))
}

pub(super) fn stream_id(stream: *mut c_void) -> StreamId {
    stream as usize as StreamId
}

pub(super) fn dev_ptr(ptr: *mut c_void) -> DevPtr {
    ptr as usize as DevPtr
}

// ---------------------------------------------------------------------------------------------
// The C++ shim's entry points: static libraries are linked only when referenced, so take their
// addresses here to keep them (and their exports) in the cdylib.

unsafe extern "C-unwind" {
    pub(super) fn torch_arena_malloc(
        size: usize,
        device: c_int,
        stream: *mut c_void,
    ) -> *mut c_void;
    pub(super) fn torch_arena_free(
        ptr: *mut c_void,
        size: usize,
        device: c_int,
        stream: *mut c_void,
    );
}

pub(super) type MallocFn = unsafe extern "C-unwind" fn(usize, c_int, *mut c_void) -> *mut c_void;
pub(super) type FreeFn = unsafe extern "C-unwind" fn(*mut c_void, usize, c_int, *mut c_void);

#[used]
pub(super) static KEEP_SHIM: (MallocFn, FreeFn) = (torch_arena_malloc, torch_arena_free);
