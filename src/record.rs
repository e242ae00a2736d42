//! The plugin's side of the `torch-arena-trace` text format: the [`Recorder`] behind
//! `trace:PATH`, which appends one line per allocation and free while the program runs.
//! Reading, converting and writing whole traces is the lab's (`torch_arena_lab::format`);
//! the format itself is specified in `docs/trace-format.md`.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::device::{DevPtr, StreamId};
use crate::error::{Error, Result};

/// The target of the recorder's log records, kept from before this code moved to this file: the
/// Python package hands it on as `record.target`, so it is part of the interface.
const LOG_TARGET: &str = "torch_arena::trace::format";

/// The first word of every file.
pub const MAGIC: &str = "torch-arena-trace";
/// The newest version this build reads and the one it writes.
pub const VERSION: u32 = 1;
/// Bytes a [`Recorder`] buffers before writing to its file.
pub const RECORDER_BUFFER: usize = 256 << 10;

/// Replaces line breaks so a text field (a site, a trace's name) stays on its line.
pub fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

struct RecState {
    path: PathBuf,
    /// `None` once a write failed: recording has stopped.
    out: Option<BufWriter<File>>,
    start: Instant,
    /// Site ids whose `site ID TEXT` line is written.
    sites: std::collections::HashSet<u32>,
}

impl RecState {
    fn record(&mut self, line: std::fmt::Arguments<'_>) {
        let Some(out) = self.out.as_mut() else { return };
        if let Err(e) = out.write_fmt(line) {
            self.stop(e);
        }
    }

    fn flush(&mut self) {
        let Some(out) = self.out.as_mut() else { return };
        if let Err(e) = out.flush() {
            self.stop(e);
        }
    }

    /// Stops recording after a write error, saying so once.
    fn stop(&mut self, e: io::Error) {
        tracing::warn!(
                target: LOG_TARGET,
                "trace recording to {} stopped: {e}; allocations go on, unrecorded",
            self.path.display()
        );
        if let Some(out) = self.out.take() {
            // The buffer holds bytes the file did not take; drop them without retrying.
            let _ = out.into_parts();
        }
    }

    fn now_us(&self) -> u128 {
        self.start.elapsed().as_micros()
    }
}

/// Every open recorder, flushed by one `atexit` handler (the process-wide allocator is a static
/// that never drops).
static REGISTRY: Mutex<Vec<std::sync::Weak<Mutex<RecState>>>> = Mutex::new(Vec::new());
static ATEXIT: Once = Once::new();

extern "C" fn flush_all_at_exit() {
    // Never unwind out of an atexit handler.
    let _ = std::panic::catch_unwind(flush_all);
}

/// Flushes every open recorder. A recorder another thread holds for more than 100 ms is skipped
/// (its thread may be gone at exit).
pub fn flush_all() {
    let Some(list) = REGISTRY.try_lock_for(Duration::from_millis(100)) else {
        return;
    };
    for rec in list.iter().filter_map(|w| w.upgrade()) {
        if let Some(mut r) = rec.try_lock_for(Duration::from_millis(100)) {
            r.flush();
        }
    }
}

/// Before `fork()` (`crate::fork`): holds the registry, then `rec`'s lock (the recorder comes
/// first in the allocator's lock order).
pub fn fork_prepare(rec: Option<&Recorder>) {
    crate::fork::hold(&REGISTRY);
    if let Some(r) = rec {
        crate::fork::hold(&r.state);
    }
}

/// After `fork()`: gives back what [`fork_prepare`] held. In the child, `rec` stops recording
/// and drops its buffer unwritten: the lines buffered there are the parent's to write, and the
/// file is the parent's record (a child that wrote to it would write them twice and mix its own
/// allocations in).
///
/// # Safety
/// Once after each [`fork_prepare`] with the same `rec`, on the same thread.
pub unsafe fn fork_release(rec: Option<&Recorder>, child: bool) {
    if let Some(r) = rec {
        if child {
            // SAFETY: this thread holds the lock (the caller's contract); no other thread exists.
            let st = unsafe { &mut *r.state.data_ptr() };
            if let Some(out) = st.out.take() {
                // `into_parts` hands back the buffer without writing it; the child's copy of
                // the descriptor closes.
                drop(out.into_parts());
            }
        }
        // SAFETY: as above.
        unsafe { crate::fork::release(&r.state, child) };
    }
    // SAFETY: as above.
    unsafe { crate::fork::release(&REGISTRY, child) };
}

/// Records allocations and frees to a `torch-arena-trace` file, for the plugin's `trace:PATH`.
///
/// Memory is bounded: lines go through a 256 KiB buffer, written out when full, on [`flush`],
/// when the recorder drops and at process exit. A write error (disk full) never reaches the
/// allocation: it is logged once and recording stops. Times are microseconds since
/// [`Recorder::create`].
///
/// [`flush`]: Recorder::flush
pub struct Recorder {
    state: Arc<Mutex<RecState>>,
}

/// The recorder held locked, so that an allocator operation and its record are one step for
/// every other thread: a pointer freed on one thread and handed out again on another is recorded
/// free first.
pub struct RecorderGuard<'a> {
    state: parking_lot::MutexGuard<'a, RecState>,
}

impl Recorder {
    /// Creates (truncates) `path` and writes the header. The file is a plain text file (not
    /// gzip, whatever its name: a crash must leave a readable prefix).
    pub fn create(path: impl AsRef<std::path::Path>) -> Result<Recorder> {
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path).map_err(|e| {
            Error::Trace(format!("cannot create trace file {}: {e}", path.display()))
        })?;
        let mut out = BufWriter::with_capacity(RECORDER_BUFFER, file);
        writeln!(
            out,
            "{MAGIC} {VERSION}\n# recorded by torch-arena {} (pid {})\nkind fresh",
            env!("CARGO_PKG_VERSION"),
            std::process::id()
        )
        .and_then(|_| out.flush())
        .map_err(|e| Error::Trace(format!("cannot write trace file {}: {e}", path.display())))?;
        let state = Arc::new(Mutex::new(RecState {
            path,
            out: Some(out),
            start: Instant::now(),
            sites: Default::default(),
        }));
        {
            let mut list = REGISTRY.lock();
            list.retain(|w| w.strong_count() > 0);
            list.push(Arc::downgrade(&state));
        }
        ATEXIT.call_once(|| {
            // SAFETY: registering a plain `extern "C" fn()` that never unwinds.
            unsafe { libc::atexit(flush_all_at_exit) };
        });
        Ok(Recorder { state })
    }

    /// The file being written.
    pub fn path(&self) -> PathBuf {
        self.state.lock().path.clone()
    }

    /// Whether lines are still being recorded (false after a write error).
    pub fn is_recording(&self) -> bool {
        self.state.lock().out.is_some()
    }

    /// Holds the recorder for one allocator operation and its record.
    pub fn lock(&self) -> RecorderGuard<'_> {
        RecorderGuard {
            state: self.state.lock(),
        }
    }

    /// Records an allocation of `size` bytes at `ptr`.
    pub fn alloc(&self, ptr: DevPtr, size: u64, stream: StreamId, device: i32) {
        self.lock().alloc(ptr, size, stream, device);
    }

    /// Records the free of the allocation at `ptr`.
    pub fn free(&self, ptr: DevPtr, size: u64, stream: StreamId, device: i32) {
        self.lock().free(ptr, size, stream, device);
    }

    /// Whether site `id`'s text is already in the file (0, "unknown", always is).
    pub fn knows_site(&self, id: u32) -> bool {
        id == 0 || self.state.lock().sites.contains(&id)
    }

    /// Writes out everything buffered.
    pub fn flush(&self) {
        self.state.lock().flush();
    }
}

impl RecorderGuard<'_> {
    /// Records an allocation of `size` bytes at `ptr`.
    pub fn alloc(&mut self, ptr: DevPtr, size: u64, stream: StreamId, device: i32) {
        let t = self.state.now_us();
        self.state
            .record(format_args!("a {ptr:#x} {size} {stream} {device} {t}\n"));
    }

    /// Records an allocation made at site `site` (0 = unknown). A site never defined by
    /// [`RecorderGuard::define_site`] is recorded as unknown, so the file always reads back.
    pub fn alloc_at(&mut self, ptr: DevPtr, size: u64, stream: StreamId, device: i32, site: u32) {
        if site == 0 || !self.state.sites.contains(&site) {
            return self.alloc(ptr, size, stream, device);
        }
        let t = self.state.now_us();
        self.state.record(format_args!(
            "a {ptr:#x} {size} {stream} {device} {t} {site}\n"
        ));
    }

    /// Writes the `site ID TEXT` line of `id` once (later calls for the same id do nothing).
    pub fn define_site(&mut self, id: u32, text: &str) {
        if id != 0 && self.state.sites.insert(id) {
            let text = one_line(text);
            let text = if text.trim().is_empty() {
                "?"
            } else {
                text.as_str()
            };
            self.state.record(format_args!("site {id} {text}\n"));
        }
    }

    /// Records the free of the allocation at `ptr`.
    pub fn free(&mut self, ptr: DevPtr, size: u64, stream: StreamId, device: i32) {
        let t = self.state.now_us();
        self.state
            .record(format_args!("f {ptr:#x} {size} {stream} {device} {t}\n"));
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.state.lock().flush();
    }
}
