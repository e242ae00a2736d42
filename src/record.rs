//! The plugin's side of the `torch-arena-trace` text format: the [`Recorder`] behind
//! `trace:PATH`, which appends one line per allocation and free while the program runs.
//! Reading, converting and writing whole traces is the lab's (`torch_arena_lab::format`);
//! the format itself is specified in `docs/trace-format.md`.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

/// Lines a thread's buffer holds before that thread merges every buffer into the file.
const MERGE_LINES: usize = 4096;
/// Buffers the lines wait in, a thread's chosen by its number: threads recording at once take
/// different locks (up to this many).
const BUFFERS: usize = 16;
/// Lines held back behind a number not yet buffered (an operation done but not yet recorded by
/// its thread) before they are written anyway, in their numbers' order.
const HELD_MAX: usize = 1 << 16;

/// What a line says: an allocation or a free.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Alloc,
    Free,
}

/// One line waiting to be written: its operation's number (the arena's order), and its fields.
#[derive(Clone, Copy)]
struct Line {
    number: u64,
    op: Op,
    ptr: DevPtr,
    size: u64,
    stream: StreamId,
    device: i32,
    time_us: u64,
    site: u32,
}

/// The file and what has been written to it (behind the recorder's one lock, which only the
/// thread that merges takes).
struct RecState {
    path: PathBuf,
    /// `None` once a write failed: recording has stopped.
    out: Option<BufWriter<File>>,
    /// The number of the next line to write: lines up to it have been written.
    next: u64,
    /// Lines taken from the buffers but not written: each behind a number not yet buffered.
    held: Vec<Line>,
    /// The last time written: times never go backwards in the file (a line's time is taken when
    /// its thread buffers it, just after its operation).
    last_us: u64,
    /// Sites whose `site ID TEXT` line is written.
    written: std::collections::HashSet<u32>,
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

    /// Writes `l` (its site's text first where the file has not had it; a site with no text, never
    /// defined, as unknown, so the file always reads back).
    fn write(&mut self, l: &Line, sites: &Mutex<std::collections::HashMap<u32, String>>) {
        let t = l.time_us.max(self.last_us);
        self.last_us = t;
        let Line {
            ptr,
            size,
            stream,
            device,
            site,
            ..
        } = *l;
        match l.op {
            Op::Free => self.record(format_args!("f {ptr:#x} {size} {stream} {device} {t}\n")),
            Op::Alloc if site == 0 => {
                self.record(format_args!("a {ptr:#x} {size} {stream} {device} {t}\n"))
            }
            Op::Alloc => {
                if !self.written.contains(&site) {
                    let Some(text) = sites.lock().get(&site).cloned() else {
                        return self.write(&Line { site: 0, ..*l }, sites);
                    };
                    self.written.insert(site);
                    self.record(format_args!("site {site} {text}\n"));
                }
                self.record(format_args!(
                    "a {ptr:#x} {size} {stream} {device} {t} {site}\n"
                ));
            }
        }
    }
}

/// What every handle of one recorder shares.
struct RecShared {
    state: Mutex<RecState>,
    buffers: Box<[Mutex<Vec<Line>>]>,
    /// The count operations are numbered from: the arenas' (`Arena::number_operations`), and
    /// this recorder's own for lines recorded without an arena's number.
    numbers: Arc<AtomicU64>,
    /// Each site's text, once defined (written to the file before the first line using it).
    sites: Mutex<std::collections::HashMap<u32, String>>,
    start: Instant,
}

impl RecShared {
    fn now_us(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Buffers `l` in this thread's buffer; merges every buffer into the file when that one is
    /// full and no other thread is merging.
    fn push(&self, l: Line) {
        let full = {
            let mut b = self.buffers[this_thread() % BUFFERS].lock();
            b.push(l);
            b.len() >= MERGE_LINES
        };
        if full && let Some(mut st) = self.state.try_lock() {
            self.merge(&mut st, false);
        }
    }

    /// Takes every buffer's lines and writes, in their numbers' order, those with no number
    /// missing before them (all of them when `all`, or when too many are held back).
    fn merge(&self, st: &mut RecState, all: bool) {
        let mut lines = std::mem::take(&mut st.held);
        for b in self.buffers.iter() {
            lines.append(&mut b.lock());
        }
        lines.sort_unstable_by_key(|l| l.number);
        let force = all || lines.len() > HELD_MAX;
        let mut written = 0;
        for l in &lines {
            if !force && l.number > st.next {
                break;
            }
            st.write(l, &self.sites);
            st.next = st.next.max(l.number + 1);
            written += 1;
        }
        lines.drain(..written);
        st.held = lines;
    }
}

/// This thread's number among those that recorded (for its buffer).
fn this_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: Cell<Option<usize>> = const { Cell::new(None) };
    }
    MINE.with(|m| match m.get() {
        Some(n) => n,
        None => {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            m.set(Some(n));
            n
        }
    })
}

/// Every open recorder, flushed by one `atexit` handler (the process-wide allocator is a static
/// that never drops).
static REGISTRY: Mutex<Vec<std::sync::Weak<RecShared>>> = Mutex::new(Vec::new());
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
        if let Some(mut st) = rec.state.try_lock_for(Duration::from_millis(100)) {
            if rec
                .buffers
                .iter()
                .all(|b| b.try_lock_for(Duration::from_millis(100)).is_some())
            {
                rec.merge(&mut st, true);
            }
            st.flush();
        }
    }
}

/// Before `fork()` (`crate::fork`): holds the registry, then `rec`'s lock and its buffers' (the
/// recorder comes first in the allocator's lock order).
pub fn fork_prepare(rec: Option<&Recorder>) {
    crate::fork::hold(&REGISTRY);
    if let Some(r) = rec {
        crate::fork::hold(&r.shared.state);
        for b in r.shared.buffers.iter() {
            crate::fork::hold(b);
        }
    }
}

/// After `fork()`: gives back what [`fork_prepare`] held. In the child, `rec` stops recording
/// and drops its buffers unwritten: the lines buffered there are the parent's to write, and the
/// file is the parent's record (a child that wrote to it would write them twice and mix its own
/// allocations in).
///
/// # Safety
/// Once after each [`fork_prepare`] with the same `rec`, on the same thread.
pub unsafe fn fork_release(rec: Option<&Recorder>, child: bool) {
    if let Some(r) = rec {
        if child {
            // SAFETY: this thread holds the locks (the caller's contract); no other thread exists.
            let st = unsafe { &mut *r.shared.state.data_ptr() };
            if let Some(out) = st.out.take() {
                // `into_parts` hands back the buffer without writing it; the child's copy of
                // the descriptor closes.
                drop(out.into_parts());
            }
            st.held.clear();
            for b in r.shared.buffers.iter() {
                // SAFETY: as above.
                unsafe { &mut *b.data_ptr() }.clear();
            }
        }
        for b in r.shared.buffers.iter() {
            // SAFETY: as above.
            unsafe { crate::fork::release(b, child) };
        }
        // SAFETY: as above.
        unsafe { crate::fork::release(&r.shared.state, child) };
    }
    // SAFETY: as above.
    unsafe { crate::fork::release(&REGISTRY, child) };
}

/// Records allocations and frees to a `torch-arena-trace` file, for the plugin's `trace:PATH`.
///
/// Threads record with no lock in common: each line goes to a buffer of the thread's (one of
/// 16) with its operation's number, which the arena gave it under its shard's lock
/// (`Arena::number_operations`, so lines are in the order the arena did the operations: a free
/// on one thread comes before the allocation that reuses its address on another). The thread
/// whose buffer fills merges every buffer into the file in the numbers' order, holding back
/// lines behind a number not buffered yet. Memory is bounded: a buffer is merged once it holds
/// 4,096 lines, at most 65,536 are held back behind a gap, and the file's buffer of 256 KiB is
/// written out when full, on [`flush`], when the recorder drops and at process exit. A write
/// error (disk full) never reaches the allocation: it is logged once and recording stops.
/// Times are microseconds since [`Recorder::create`], never decreasing in the file.
///
/// [`flush`]: Recorder::flush
pub struct Recorder {
    shared: Arc<RecShared>,
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
        let shared = Arc::new(RecShared {
            state: Mutex::new(RecState {
                path,
                out: Some(out),
                next: 0,
                held: Vec::new(),
                last_us: 0,
                written: Default::default(),
            }),
            buffers: (0..BUFFERS).map(|_| Mutex::new(Vec::new())).collect(),
            numbers: Arc::new(AtomicU64::new(0)),
            sites: Mutex::new(Default::default()),
            start: Instant::now(),
        });
        {
            let mut list = REGISTRY.lock();
            list.retain(|w| w.strong_count() > 0);
            list.push(Arc::downgrade(&shared));
        }
        ATEXIT.call_once(|| {
            // SAFETY: registering a plain `extern "C" fn()` that never unwinds.
            unsafe { libc::atexit(flush_all_at_exit) };
        });
        Ok(Recorder { shared })
    }

    /// The file being written.
    pub fn path(&self) -> PathBuf {
        self.shared.state.lock().path.clone()
    }

    /// Whether lines are still being recorded (false after a write error).
    pub fn is_recording(&self) -> bool {
        self.shared.state.lock().out.is_some()
    }

    /// The count to number operations from: give it to every arena whose operations are
    /// recorded here (`Arena::number_operations`), and record each with the number it took
    /// (`arena::last_number`).
    pub fn numbers(&self) -> Arc<AtomicU64> {
        self.shared.numbers.clone()
    }

    /// Records an allocation of `size` bytes at `ptr`, numbered now.
    pub fn alloc(&self, ptr: DevPtr, size: u64, stream: StreamId, device: i32) {
        self.alloc_at(ptr, size, stream, device, 0);
    }

    /// Records an allocation made at site `site` (0 = unknown), numbered now. A site never
    /// defined by [`Recorder::define_site`] is written as unknown, so the file always reads
    /// back.
    pub fn alloc_at(&self, ptr: DevPtr, size: u64, stream: StreamId, device: i32, site: u32) {
        let number = self.shared.numbers.fetch_add(1, Ordering::Relaxed);
        self.alloc_numbered(number, ptr, size, stream, device, site);
    }

    /// Records an allocation that took `number` ([`Recorder::numbers`]).
    pub fn alloc_numbered(
        &self,
        number: u64,
        ptr: DevPtr,
        size: u64,
        stream: StreamId,
        device: i32,
        site: u32,
    ) {
        self.shared.push(Line {
            number,
            op: Op::Alloc,
            ptr,
            size,
            stream,
            device,
            time_us: self.shared.now_us(),
            site,
        });
    }

    /// Records the free of the allocation at `ptr`, numbered now.
    pub fn free(&self, ptr: DevPtr, size: u64, stream: StreamId, device: i32) {
        let number = self.shared.numbers.fetch_add(1, Ordering::Relaxed);
        self.free_numbered(number, ptr, size, stream, device);
    }

    /// Records a free that took `number` ([`Recorder::numbers`]).
    pub fn free_numbered(
        &self,
        number: u64,
        ptr: DevPtr,
        size: u64,
        stream: StreamId,
        device: i32,
    ) {
        self.shared.push(Line {
            number,
            op: Op::Free,
            ptr,
            size,
            stream,
            device,
            time_us: self.shared.now_us(),
            site: 0,
        });
    }

    /// Gives site `id` its text (the first text given stays; written to the file once, before
    /// the first line that names it).
    pub fn define_site(&self, id: u32, text: &str) {
        if id == 0 {
            return;
        }
        self.shared.sites.lock().entry(id).or_insert_with(|| {
            let text = one_line(text);
            match text.trim().is_empty() {
                true => "?".to_string(),
                false => text,
            }
        });
    }

    /// Whether site `id` has its text (0, "unknown", always has).
    pub fn knows_site(&self, id: u32) -> bool {
        id == 0 || self.shared.sites.lock().contains_key(&id)
    }

    /// Writes out everything recorded so far.
    pub fn flush(&self) {
        let mut st = self.shared.state.lock();
        self.shared.merge(&mut st, true);
        st.flush();
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(path: &std::path::Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("a ") || l.starts_with("f "))
            .map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" "))
            .collect()
    }

    /// Lines are written in their numbers' order, whichever thread buffered them when, and
    /// those behind a number not yet buffered wait for it (all go out on `flush`).
    #[test]
    fn lines_go_out_in_their_numbers_order_and_wait_behind_a_gap() {
        let dir = std::env::temp_dir().join(format!("torch-arena-rec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("order.trace");
        let r = Recorder::create(&p).unwrap();
        // Another thread's lines (another buffer), numbered 1 and 4; this one's 0, 2 and 5.
        std::thread::scope(|s| {
            s.spawn(|| {
                r.free_numbered(1, 0x1000, 512, 0, 0);
                r.alloc_numbered(4, 0x3000, 512, 0, 0, 0);
            });
        });
        r.alloc_numbered(0, 0x1000, 512, 0, 0, 0);
        r.alloc_numbered(2, 0x1000, 1024, 0, 0, 0);
        r.alloc_numbered(5, 0x4000, 512, 0, 0, 0);
        let merged = |r: &Recorder| {
            let mut st = r.shared.state.lock();
            r.shared.merge(&mut st, false);
            st.flush();
        };
        merged(&r);
        // 3 is missing: 0 to 2 are written, 4 and 5 wait.
        assert_eq!(ops(&p), ["a 0x1000", "f 0x1000", "a 0x1000"]);
        r.free_numbered(3, 0x1000, 1024, 0, 0);
        merged(&r);
        assert_eq!(
            ops(&p),
            [
                "a 0x1000", "f 0x1000", "a 0x1000", "f 0x1000", "a 0x3000", "a 0x4000"
            ]
        );
        // A gap that is never filled holds nothing back past a flush.
        r.alloc_numbered(8, 0x5000, 512, 0, 0, 0);
        merged(&r);
        assert_eq!(ops(&p).len(), 6);
        r.flush();
        assert_eq!(ops(&p).len(), 7);
        drop(r);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
