//! Logging: where the crate's `tracing` events go.
//!
//! This module owns the process-wide log level, a minimal [`tracing::Subscriber`] installed as
//! the global default the first time the C ABI is used ([`init`], called by every export), and
//! the bounded queue of [`Record`]s that the Python package drains into Python's `logging`.
//!
//! # Level
//!
//! One process-wide level: `off`, `error`, `warn`, `info`, `debug` or `trace` (as integers 0..=5,
//! see [`ERROR`] .. [`TRACE`]), read once from the environment variable `TORCH_ARENA_LOG`
//! (case-insensitive; unset or empty: `warn`, so a process is quiet except for warnings and
//! errors; a bad value: `warn`, plus one warning naming the value and the accepted ones) and
//! changed at run time with [`set_level`] (`torch_arena_set_log_level`). Events below the level
//! are discarded before they are formatted: the subscriber's `max_level_hint` is the level, and
//! [`set_level`] rebuilds `tracing`'s interest cache, so a disabled `debug!` costs one relaxed
//! atomic load at its call site.
//!
//! # Delivery: exactly one destination at a time
//!
//! - **Detached** (the default): each event at or above the level is written at once to stderr
//!   as one line, `torch-arena: warning: <message>` (`error`, `warning`, `info`, `debug`,
//!   `trace`), so a plain C++ or Python process sees warnings with no setup.
//! - **Attached** ([`attach`]`(true)`, `torch_arena_log_attach(1)`, done by the Python package
//!   when it takes over): events become [`Record`]s in a bounded in-memory queue
//!   ([`QUEUE_CAP`] records; when full, the oldest is dropped and counted in [`dropped`]) and
//!   nothing is written to stderr. The consumer pops them with [`drain_into`]
//!   (`torch_arena_log_drain`), one line per record, `LEVEL\tTARGET\tMESSAGE\n`.
//!
//! Records go to one place only, so nothing is shown twice: what was printed before a consumer
//! attached is not replayed to it. A consumer should detach (after a last drain) when it stops,
//! e.g. at interpreter exit, so that events from later frees reach stderr again.
//!
//! # Why delivery never calls out
//!
//! Events are emitted on whatever thread runs a hook (autograd workers included), with or without
//! the GIL, and some are emitted while an arena lock is held (the device layer logs from inside
//! driver calls the arena makes under its lock). If delivery took the GIL or called into Python,
//! a Python thread holding the GIL and waiting for that arena lock (every tensor free takes it)
//! would deadlock the process. So delivery does only two things: push onto the queue under a
//! short leaf mutex that is never held while calling anything else, or one `write` to stderr.
//! Python pulls the records later, from its own thread, holding no arena lock. Delivery never
//! panics outward either: the subscriber's body runs under `catch_unwind`.
//!
//! # Size bounds
//!
//! A record's message is cut to [`MAX_MESSAGE_BYTES`] of escaped text and its target to
//! [`MAX_TARGET_BYTES`], so every line is at most [`MAX_LINE_BYTES`] long and a drain buffer of
//! [`DRAIN_CAP`] (4096) bytes always has room for at least one record.

use std::collections::VecDeque;
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record as SpanValues};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// Nothing is logged.
pub const OFF: u8 = 0;
/// Errors only.
pub const ERROR: u8 = 1;
/// Warnings and errors (the default).
pub const WARN: u8 = 2;
/// Configuration and device facts, once each.
pub const INFO: u8 = 3;
/// Maintenance reports (empty_cache, defragment).
pub const DEBUG: u8 = 4;
/// Everything.
pub const TRACE: u8 = 5;

/// The level when `TORCH_ARENA_LOG` is unset, empty or bad.
pub const DEFAULT_LEVEL: u8 = WARN;
/// The environment variable read by [`init`].
pub const ENV_VAR: &str = "TORCH_ARENA_LOG";
/// The level names [`parse_level`] accepts (case-insensitive; `warning` is taken for `warn`).
pub const ACCEPTED_LEVELS: &str = "error, warn, info, debug, trace, off";

/// Records the queue holds; a push beyond it drops the oldest.
pub const QUEUE_CAP: usize = 1024;
/// A record's message is cut to this many bytes of escaped text (suffix included).
pub const MAX_MESSAGE_BYTES: usize = 3000;
/// A record's target is cut to this many bytes of escaped text (suffix included).
pub const MAX_TARGET_BYTES: usize = 200;
/// The longest line [`drain_into`] writes for one record: `ERROR\t` + target + `\t` + message +
/// `\n`.
pub const MAX_LINE_BYTES: usize = 5 + 1 + MAX_TARGET_BYTES + 1 + MAX_MESSAGE_BYTES + 1;
/// A drain buffer this large (NUL included) always has room for at least one record.
pub const DRAIN_CAP: usize = 4096;

const _: () = assert!(MAX_LINE_BYTES < DRAIN_CAP);

/// What replaces the cut-off tail of a truncated message or target.
const TRUNCATED: &str = "... [truncated]";

static LEVEL: AtomicU8 = AtomicU8::new(DEFAULT_LEVEL);
static ATTACHED: AtomicBool = AtomicBool::new(false);
static INIT: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);
static SEQ: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The leaf lock: held only to push or pop records, never while calling anything else.
static QUEUE: Mutex<VecDeque<Record>> = Mutex::new(VecDeque::new());

/// Before `fork()` (`crate::fork`): holds the queue (a leaf, the last lock in the lock order: any
/// other may be held while logging).
pub fn fork_prepare() {
    crate::fork::hold(&QUEUE);
}

/// After `fork()`: gives back what [`fork_prepare`] held.
///
/// # Safety
/// Once after each [`fork_prepare`], on the same thread.
pub unsafe fn fork_release(child: bool) {
    // SAFETY: the caller's contract.
    unsafe { crate::fork::release(&QUEUE, child) };
}

// ---------------------------------------------------------------------------------------------
// Levels.

/// The level named `text` (case-insensitive, surrounding spaces ignored), or `None`.
pub fn parse_level(text: &str) -> Option<u8> {
    match text.trim().to_ascii_lowercase().as_str() {
        "off" => Some(OFF),
        "error" => Some(ERROR),
        "warn" | "warning" => Some(WARN),
        "info" => Some(INFO),
        "debug" => Some(DEBUG),
        "trace" => Some(TRACE),
        _ => None,
    }
}

/// `"OFF"`, `"ERROR"`, `"WARN"`, `"INFO"`, `"DEBUG"`, `"TRACE"` (the `LEVEL` column of a line).
pub fn level_name(level: u8) -> &'static str {
    match level {
        OFF => "OFF",
        ERROR => "ERROR",
        WARN => "WARN",
        INFO => "INFO",
        DEBUG => "DEBUG",
        _ => "TRACE",
    }
}

/// The word of a stderr line: `torch-arena: <word>: <message>`.
fn stderr_word(level: u8) -> &'static str {
    match level {
        ERROR => "error",
        WARN => "warning",
        INFO => "info",
        DEBUG => "debug",
        _ => "trace",
    }
}

fn level_of(level: &Level) -> u8 {
    match *level {
        Level::ERROR => ERROR,
        Level::WARN => WARN,
        Level::INFO => INFO,
        Level::DEBUG => DEBUG,
        Level::TRACE => TRACE,
    }
}

fn filter_of(level: u8) -> LevelFilter {
    match level {
        OFF => LevelFilter::OFF,
        ERROR => LevelFilter::ERROR,
        WARN => LevelFilter::WARN,
        INFO => LevelFilter::INFO,
        DEBUG => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// The current level, 0 (off) ..= 5 (trace).
pub fn level() -> u8 {
    LEVEL.load(Ordering::Relaxed)
}

/// Set the level by name (see [`parse_level`]); returns it. A bad name changes nothing and gives
/// a message naming it and the accepted ones.
pub fn set_level(text: &str) -> Result<u8, String> {
    let level = parse_level(text).ok_or_else(|| {
        format!(
            "{text:?} is not a torch-arena log level: expected one of {ACCEPTED_LEVELS} \
             (case-insensitive)"
        )
    })?;
    LEVEL.store(level, Ordering::Relaxed);
    // The subscriber's max_level_hint changed: recompute tracing's global maximum and the
    // interest of every call site.
    tracing::callsite::rebuild_interest_cache();
    Ok(level)
}

/// The level for the value of `TORCH_ARENA_LOG` (`None`: unset), and the warning to give when
/// the value is not a level.
fn level_from_env(value: Option<&str>) -> (u8, Option<String>) {
    match value {
        None => (DEFAULT_LEVEL, None),
        Some(v) if v.trim().is_empty() => (DEFAULT_LEVEL, None),
        Some(v) => match parse_level(v) {
            Some(level) => (level, None),
            None => (
                DEFAULT_LEVEL,
                Some(format!(
                    "{ENV_VAR}={v:?} is not a log level: expected one of {ACCEPTED_LEVELS} \
                     (case-insensitive); using warn"
                )),
            ),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Installation and delivery switches.

/// Read `TORCH_ARENA_LOG` and install the subscriber as `tracing`'s global default, once per
/// process; later calls cost one atomic load. When another global subscriber was installed first
/// (only possible when this crate is linked as a Rust library into a program that set its own),
/// events go to that one and this module stays idle (see [`installed`]).
pub fn init() {
    if INIT.is_completed() {
        return;
    }
    INIT.call_once_force(|_| {
        let value = std::env::var_os(ENV_VAR).map(|v| v.to_string_lossy().into_owned());
        let (level, warning) = level_from_env(value.as_deref());
        LEVEL.store(level, Ordering::Relaxed);
        let installed = tracing::subscriber::set_global_default(ArenaSubscriber).is_ok();
        INSTALLED.store(installed, Ordering::Relaxed);
        if let Some(w) = warning {
            tracing::warn!("{w}");
        }
    });
}

/// Whether this module's subscriber is `tracing`'s global default (false before [`init`]).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// `true`: a consumer takes over delivery (records go to the queue only); `false`: back to
/// stderr. Records already queued stay there until drained.
pub fn attach(attached: bool) {
    ATTACHED.store(attached, Ordering::Relaxed);
}

/// Whether a consumer is attached.
pub fn attached() -> bool {
    ATTACHED.load(Ordering::Relaxed)
}

/// Records dropped so far because the queue was full.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Records waiting in the queue.
pub fn queued() -> usize {
    QUEUE.lock().len()
}

// ---------------------------------------------------------------------------------------------
// Records.

/// One event, as queued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Monotonic over the process (gaps: records dropped, or emitted while detached).
    pub seq: u64,
    /// 1 (error) ..= 5 (trace).
    pub level: u8,
    /// The event's target: the module path that emitted it, e.g. `torch_arena::abi`.
    pub target: String,
    /// The message, then the event's other fields as ` key=value` (values in `Debug` form).
    pub message: String,
    /// Length in bytes of [`Record::line`].
    len: usize,
}

impl Record {
    fn new(level: u8, target: &str, message: &str) -> Record {
        let target = truncate_escaped(target, MAX_TARGET_BYTES);
        let message = truncate_escaped(message, MAX_MESSAGE_BYTES);
        let len = level_name(level).len() + escaped_len(&target) + escaped_len(&message) + 3;
        Record {
            seq: SEQ.fetch_add(1, Ordering::Relaxed),
            level,
            target,
            message,
            len,
        }
    }

    /// `LEVEL\tTARGET\tMESSAGE\n`, with `\` tab, newline and carriage return in the target and
    /// the message escaped as `\\`, `\t`, `\n`, `\r`. At most [`MAX_LINE_BYTES`] bytes.
    pub fn line(&self) -> String {
        let mut s = String::with_capacity(self.len);
        s.push_str(level_name(self.level));
        s.push('\t');
        push_escaped(&mut s, &self.target);
        s.push('\t');
        push_escaped(&mut s, &self.message);
        s.push('\n');
        s
    }
}

fn escape(c: char) -> Option<&'static str> {
    match c {
        '\\' => Some("\\\\"),
        '\t' => Some("\\t"),
        '\n' => Some("\\n"),
        '\r' => Some("\\r"),
        _ => None,
    }
}

fn escaped_len(s: &str) -> usize {
    s.chars()
        .map(|c| escape(c).map_or(c.len_utf8(), str::len))
        .sum()
}

fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        match escape(c) {
            Some(e) => out.push_str(e),
            None => out.push(c),
        }
    }
}

/// `s`, cut at a character boundary so that its escaped form, [`TRUNCATED`] included, fits in
/// `max` bytes; `s` itself when it already fits.
fn truncate_escaped(s: &str, max: usize) -> String {
    if escaped_len(s) <= max {
        return s.to_string();
    }
    let budget = max - TRUNCATED.len();
    let mut used = 0;
    let mut end = 0;
    for (i, c) in s.char_indices() {
        let n = escape(c).map_or(c.len_utf8(), str::len);
        if used + n > budget {
            break;
        }
        used += n;
        end = i + c.len_utf8();
    }
    let mut out = String::with_capacity(end + TRUNCATED.len());
    out.push_str(&s[..end]);
    out.push_str(TRUNCATED);
    out
}

/// Deliver one event that passed the level: to the queue when attached, else to stderr.
fn deliver(level: u8, target: &str, message: &str) {
    if attached() {
        let record = Record::new(level, target, message);
        let mut q = QUEUE.lock();
        if q.len() >= QUEUE_CAP {
            q.pop_front();
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(record);
    } else {
        let mut line = String::with_capacity(message.len() + 32);
        line.push_str("torch-arena: ");
        line.push_str(stderr_word(level));
        line.push_str(": ");
        for c in message.chars() {
            match c {
                '\n' => line.push_str("\\n"),
                '\r' => line.push_str("\\r"),
                c => line.push(c),
            }
        }
        line.push('\n');
        // One write of the whole line; never eprintln!, which panics when stderr is closed.
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// Pop as many whole records as fit into `buf` (its last byte is kept for a NUL), write them as
/// lines ([`Record::line`]) followed by a NUL, and return the number of bytes written (0: the
/// queue is empty). When even the first record does not fit, nothing is popped, `buf[0]` (if any)
/// is set to NUL, and its line length is returned, which is then `>= buf.len()` (snprintf style:
/// a buffer of that length + 1 holds it). A buffer of [`DRAIN_CAP`] bytes always holds one.
pub fn drain_into(buf: &mut [u8]) -> usize {
    let room = buf.len().saturating_sub(1);
    let mut taken = Vec::new();
    let mut used = 0;
    {
        let mut q = QUEUE.lock();
        while let Some(r) = q.front() {
            if used + r.len > room {
                if taken.is_empty() {
                    let need = r.len;
                    drop(q);
                    if let Some(b) = buf.first_mut() {
                        *b = 0;
                    }
                    return need;
                }
                break;
            }
            used += r.len;
            taken.extend(q.pop_front());
        }
    }
    // Serialise outside the lock.
    let mut at = 0;
    for r in &taken {
        let line = r.line();
        buf[at..at + line.len()].copy_from_slice(line.as_bytes());
        at += line.len();
    }
    if let Some(b) = buf.get_mut(at) {
        *b = 0;
    }
    at
}

/// Pop every queued record (for Rust callers and tests).
pub fn drain_records() -> Vec<Record> {
    QUEUE.lock().drain(..).collect()
}

// ---------------------------------------------------------------------------------------------
// The subscriber.

/// Events only (spans are ignored), filtered by [`level`], delivered by [`deliver`].
struct ArenaSubscriber;

impl Subscriber for ArenaSubscriber {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // The level changes at run time: ask `enabled` every time (cheap), never cache.
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && level_of(metadata.level()) <= level()
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(filter_of(level()))
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Never called: `enabled` is false for spans. Ids must be nonzero.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &SpanValues<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        // A panic in a field's Debug impl must not unwind into the code that logged.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let meta = event.metadata();
            let level = level_of(meta.level());
            if level > self::level() {
                return;
            }
            let mut fields = Fields::default();
            event.record(&mut fields);
            if !fields.extra.is_empty() {
                if !fields.message.is_empty() {
                    fields.message.push(' ');
                }
                fields.message.push_str(&fields.extra);
            }
            deliver(level, meta.target(), &fields.message);
        }));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Collects an event's `message` and its other fields as `key=value`.
#[derive(Default)]
struct Fields {
    message: String,
    extra: String,
}

impl Fields {
    fn field(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name().starts_with("log.") {
            return;
        }
        if !self.extra.is_empty() {
            self.extra.push(' ');
        }
        let _ = write!(self.extra, "{}={value:?}", field.name());
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.field(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.field(field, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_case_insensitively() {
        assert_eq!(parse_level("DeBuG"), Some(DEBUG));
        assert_eq!(parse_level(" warning "), Some(WARN));
        assert_eq!(parse_level("off"), Some(OFF));
        assert_eq!(parse_level("loud"), None);
        assert_eq!(parse_level(""), None);
    }

    #[test]
    fn the_environment_value_falls_back_to_warn_with_a_warning() {
        assert_eq!(level_from_env(None), (WARN, None));
        assert_eq!(level_from_env(Some("")), (WARN, None));
        assert_eq!(level_from_env(Some("TRACE")), (TRACE, None));
        let (level, warning) = level_from_env(Some("loud"));
        assert_eq!(level, WARN);
        let w = warning.unwrap();
        assert!(w.contains("\"loud\"") && w.contains(ACCEPTED_LEVELS), "{w}");
    }

    #[test]
    fn truncation_respects_the_escaped_length_and_char_boundaries() {
        let tabs = "\t".repeat(5000);
        let cut = truncate_escaped(&tabs, MAX_MESSAGE_BYTES);
        assert!(cut.ends_with(TRUNCATED));
        assert!(escaped_len(&cut) <= MAX_MESSAGE_BYTES);
        assert!(escaped_len(&cut) > MAX_MESSAGE_BYTES - TRUNCATED.len() - 2);
        let euros = "€".repeat(2000);
        let cut = truncate_escaped(&euros, 100);
        assert!(cut.len() <= 100 && cut.ends_with(TRUNCATED), "{cut}");
        assert_eq!(truncate_escaped("short", 100), "short");
    }

    #[test]
    fn a_line_escapes_separators_and_its_length_is_known() {
        let r = Record::new(WARN, "t::m", "a\tb\nc\\d");
        assert_eq!(r.line(), "WARN\tt::m\ta\\tb\\nc\\\\d\n");
        assert_eq!(r.line().len(), r.len);
        let long = Record::new(ERROR, &"x".repeat(1000), &"\n".repeat(10_000));
        assert_eq!(long.line().len(), long.len);
        assert!(long.len <= MAX_LINE_BYTES);
    }
}
