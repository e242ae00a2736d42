//! Which part of a per-device structure serves each stream.
//!
//! The arena's shards (`arena::shared`) and the tracker's live-table groups (`track`) both give
//! each stream its own part, so that threads working on different streams touch different locks
//! and cache lines: a structure split by pointer instead has every thread write every part, and
//! each request then waits for cache lines another core wrote last (the threads issue). Both ask
//! a [`Router`] for the stream's number and take it modulo their number of parts, so the `i`th
//! stream in order of first use is in part `i % N` of each.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
}
