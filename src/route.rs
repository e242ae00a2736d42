//! Which part of a per-device structure serves each stream.
//!
//! The arena's shards (`arena::shared`) and the tracker's live-table groups (`track`) both give
//! each stream its own part, so that threads working on different streams touch different locks
//! and cache lines: a structure split by pointer instead has every thread write every part, and
//! each request then waits for cache lines another core wrote last (the threads issue). Both ask
//! a [`Router`] for the stream's number and take it modulo their number of parts, so the `i`th
//! stream in order of first use is in part `i % N` of each.
//!
//! Threads that allocate on one stream at once (an inference server's workers, a benchmark's)
//! would all wait on that stream's part. A thread that keeps finding its part locked by another
//! ([`contended`]: [`STEER_AFTER`] times within [`STEER_WINDOW`]) gets a part of its own for that
//! stream, [`own_offset`] parts on from the stream's; every structure routed here follows it.
//! Threads that share a stream but take turns (PyTorch's main thread in forward, its autograd
//! thread in backward) rarely meet at the lock and keep sharing the stream's part, and with it
//! the memory one frees and the other reuses.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::device::StreamId;

/// Streams remembered in order of first use; later ones are numbered by a hash of their handle
/// (so one stream always gets the same number).
pub(crate) const ROUTED: usize = 64;

/// Each stream's number: the first [`ROUTED`] streams in order of first use; read with no lock
/// (a request's stream is almost always among the first few).
pub(crate) struct Router {
    ids: [AtomicU64; ROUTED],
    known: AtomicUsize,
    claim: Mutex<()>,
}

impl Router {
    pub(crate) fn new() -> Router {
        Router {
            ids: std::array::from_fn(|_| AtomicU64::new(0)),
            known: AtomicUsize::new(0),
            claim: Mutex::new(()),
        }
    }

    /// Whether `stream` is the first stream seen.
    #[inline]
    pub(crate) fn first(&self, stream: StreamId) -> bool {
        self.known.load(Ordering::Acquire) >= 1 && self.ids[0].load(Ordering::Relaxed) == stream
    }

    /// `stream`'s number: its place in order of first use among the first [`ROUTED`], else a
    /// hash of its handle. The caller takes it modulo its number of parts.
    #[inline]
    pub(crate) fn number(&self, stream: StreamId) -> usize {
        let known = self.known.load(Ordering::Acquire);
        for (i, id) in self.ids[..known].iter().enumerate() {
            if id.load(Ordering::Relaxed) == stream {
                return i;
            }
        }
        self.claim(stream)
    }

    /// The part of `parts` (at least [`MIN_PARTS`]) that serves this thread's requests on
    /// `stream`: the stream's, or this thread's own for it ([`own_offset`]).
    #[inline]
    pub(crate) fn part(&self, stream: StreamId, parts: usize) -> usize {
        debug_assert!(parts >= MIN_PARTS);
        (self.number(stream) % parts + own_offset(stream)) % parts
    }

    #[cold]
    fn claim(&self, stream: StreamId) -> usize {
        let _g = self.claim.lock();
        let known = self.known.load(Ordering::Relaxed);
        for (i, id) in self.ids[..known].iter().enumerate() {
            if id.load(Ordering::Relaxed) == stream {
                return i;
            }
        }
        if known < ROUTED {
            self.ids[known].store(stream, Ordering::Relaxed);
            // Release: a reader that sees the count sees the id stored before it.
            self.known.store(known + 1, Ordering::Release);
            return known;
        }
        // Fibonacci hashing: stream handles are pointers, their low bits alike.
        (stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize
    }
}

/// Parts of every structure routed here: a thread's own part is 1 to `MIN_PARTS - 1` parts on
/// from its stream's, so never the stream's own.
pub(crate) const MIN_PARTS: usize = 8;

/// Contended requests, within [`STEER_WINDOW`] of the first, after which a thread takes a part of
/// its own for the stream: a rate of meetings (640 a second) that only threads working on the
/// stream at the same time reach. Measured with the pairs benchmark's two threads on one stream:
/// about 4,000 contended requests a second each (few, since a waiter spins in bursts of up to
/// 50 µs and the holder runs on meanwhile), so one moves 16 to 28 ms after the first; threads
/// that take turns meet only where one's work ends and the other's begins.
pub(crate) const STEER_AFTER: u32 = 64;
/// See [`STEER_AFTER`].
pub(crate) const STEER_WINDOW: Duration = Duration::from_millis(100);

/// Whether any thread has a part of its own (read on every routed request: while none has, no
/// thread-local is read).
static STEERING: AtomicBool = AtomicBool::new(false);
/// Own parts handed out so far (the next one's offset follows from it).
static STEERED: AtomicUsize = AtomicUsize::new(0);

/// What this thread knows of its contention and its own part (for one stream at a time: a
/// thread that moves for another stream goes back to the first's part).
#[derive(Clone, Copy)]
struct Steer {
    /// The stream this thread has a part of its own for, `offset` parts on from the stream's
    /// (0: none, the stream's own).
    stream: StreamId,
    offset: usize,
    /// The stream whose contended requests are being counted, how many, since when, and the
    /// own parts handed out by then ([`STEERED`]).
    counting: StreamId,
    contended: u32,
    since: Option<Instant>,
    steered: usize,
    /// A stream whose part this thread went back to when its own ran out of memory
    /// ([`go_home`]): it is not moved off it again.
    stays: Option<StreamId>,
}

thread_local! {
    static STEER: Cell<Steer> = const {
        Cell::new(Steer {
            stream: 0,
            offset: 0,
            counting: 0,
            contended: 0,
            since: None,
            steered: 0,
            stays: None,
        })
    };
}

/// How many parts on from `stream`'s own this thread's requests on `stream` go: 0 unless this
/// thread was steered off it ([`contended`]). The caller adds it to the stream's number.
#[inline]
pub(crate) fn own_offset(stream: StreamId) -> usize {
    if !STEERING.load(Ordering::Relaxed) {
        return 0;
    }
    steered_offset(stream)
}

fn steered_offset(stream: StreamId) -> usize {
    STEER.with(|s| {
        let s = s.get();
        if s.stream == stream { s.offset } else { 0 }
    })
}

/// A request of this thread on `stream` found its part locked by another thread: counted, and
/// once that has happened [`STEER_AFTER`] times within [`STEER_WINDOW`], this thread's requests
/// on `stream` go to a part of their own from now on (another one if it already had one: three
/// threads on one stream). Says whether it moved.
#[cold]
pub(crate) fn contended(stream: StreamId) -> bool {
    contended_at(stream, Instant::now(), STEERED.load(Ordering::Relaxed))
}

/// [`contended`] at `now`, when `steered` own parts have been handed out.
fn contended_at(stream: StreamId, now: Instant, steered: usize) -> bool {
    STEER.with(|cell| {
        let mut s = cell.get();
        if s.stays == Some(stream) {
            return false;
        }
        // Counting starts over when another thread has moved since it began: of two threads
        // that keep meeting, the one that gets there first moves, and the other keeps the
        // stream's part (and the memory cached there).
        let fresh = s.counting != stream
            || s.steered != steered
            || s.since
                .is_none_or(|t| now.saturating_duration_since(t) > STEER_WINDOW);
        if fresh {
            (s.counting, s.contended, s.since, s.steered) = (stream, 0, Some(now), steered);
        }
        s.contended += 1;
        let moved = s.contended >= STEER_AFTER;
        if moved {
            move_on(&mut s, stream);
        }
        cell.set(s);
        moved
    })
}

/// This thread's requests on `stream` go to a part of their own from now on, as if it had kept
/// meeting another thread there ([`contended`]); for tests that need it to happen when they say.
pub(crate) fn steer(stream: StreamId) {
    STEER.with(|cell| {
        let mut s = cell.get();
        move_on(&mut s, stream);
        cell.set(s);
    })
}

/// This thread's own part for `stream` ran out of memory: its requests on `stream` go to the
/// stream's part again, for good. At the limit two threads on one stream need one place to
/// find each other's freed memory (pages a live block pins are lent only within a part), as
/// when they shared it from the start.
#[cold]
pub(crate) fn go_home(stream: StreamId) {
    STEER.with(|cell| {
        let mut s = cell.get();
        if s.stream == stream {
            s.offset = 0;
        }
        s.stays = Some(stream);
        cell.set(s);
    })
}

fn move_on(s: &mut Steer, stream: StreamId) {
    let was = if s.stream == stream { s.offset } else { 0 };
    s.stream = stream;
    s.offset = next_offset(was);
    (s.contended, s.since) = (0, None);
    STEERING.store(true, Ordering::Relaxed);
}

/// The offset of the next own part: 1 to `MIN_PARTS - 1` in turn, not `was`.
fn next_offset(was: usize) -> usize {
    loop {
        let n = 1 + STEERED.fetch_add(1, Ordering::Relaxed) % (MIN_PARTS - 1);
        if n != was {
            return n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_numbered_in_order_of_first_use_and_keep_their_number() {
        let r = Router::new();
        let streams: Vec<u64> = (0..ROUTED as u64 + 40)
            .map(|i| 0x7f00_0000 + i * 64)
            .collect();
        let first: Vec<usize> = streams.iter().map(|&s| r.number(s)).collect();
        for (i, &n) in first.iter().enumerate().take(ROUTED) {
            assert_eq!(n, i);
        }
        let again: Vec<usize> = streams.iter().rev().map(|&s| r.number(s)).collect();
        assert_eq!(first, again.into_iter().rev().collect::<Vec<_>>());
        assert!(r.first(streams[0]) && !r.first(streams[1]));
        // Stream 0 (the legacy default stream) is a stream like any other.
        assert_eq!(Router::new().number(0), 0);
    }

    #[test]
    fn a_thread_that_keeps_meeting_another_at_its_stream_gets_a_part_of_its_own() {
        // A thread of its own: the steering is per thread.
        std::thread::spawn(|| {
            let (stream, other) = (0x7f00_1000, 0x7f00_2000);
            let now = Instant::now();
            let contended = |s| contended_at(s, now, 0);
            assert_eq!(own_offset(stream), 0);
            for _ in 1..STEER_AFTER {
                assert!(!contended(stream));
            }
            // Counting another stream starts over.
            assert!(!contended(other));
            for _ in 1..STEER_AFTER {
                assert!(!contended(stream));
            }
            assert!(contended(stream));
            let first = own_offset(stream);
            assert!((1..MIN_PARTS).contains(&first), "{first}");
            assert_eq!(own_offset(other), 0, "only the contended stream moves");
            // Contended again on its own part: it moves on, never back to the stream's.
            for _ in 1..STEER_AFTER {
                assert!(!contended(stream));
            }
            assert!(contended(stream));
            let second = own_offset(stream);
            assert!((1..MIN_PARTS).contains(&second) && second != first);
            // Out of memory there, it goes back to the stream's part and stays.
            go_home(stream);
            assert_eq!(own_offset(stream), 0);
            assert!((0..STEER_AFTER * 2).all(|_| !contended(stream)));
            assert_eq!(own_offset(stream), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn meetings_spread_out_in_time_do_not_move_a_thread() {
        std::thread::spawn(|| {
            let stream = 0x7f00_3000;
            let start = Instant::now();
            for window in 0..3 {
                // Just over a window after the first meeting of the last count.
                let now = start + (STEER_WINDOW + Duration::from_nanos(1)) * window;
                for _ in 1..STEER_AFTER {
                    assert!(!contended_at(stream, now, 0));
                }
            }
            assert_eq!(own_offset(stream), 0);
            // Nor do meetings counted across another thread's move: it may have ended them.
            let now = start + STEER_WINDOW * 10;
            for _ in 1..STEER_AFTER {
                assert!(!contended_at(stream, now, 0));
            }
            assert!(!contended_at(stream, now, 1));
            assert_eq!(own_offset(stream), 0);
            // The same number of meetings within one window moves it.
            let moved = (0..STEER_AFTER).any(|_| contended_at(stream, now, 1));
            assert!(moved && own_offset(stream) != 0);
        })
        .join()
        .unwrap();
    }
}
