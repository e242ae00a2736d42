//! What the shards of one device's arena share: the bytes they hold (for the limit), which
//! stream each serves, and, once more than one has served, the device's peaks.
//!
//! Each stream's requests go to one shard ([`Router`]): an `Inner` behind its own lock, with its
//! own regions, heaps, slabs, page pool and statistics. Work on one stream therefore never waits
//! for another stream's (the threads issue); what must be device-wide is here:
//! - the limit: every shard creates physical memory only through [`Shared::try_reserve`], so
//!   the bytes all shards hold never pass it, whatever the shards do at once;
//! - `memory_stats()`: while one shard has served, its statistics are the device's, exactly as
//!   with one lock. Once a second one serves, the device's current values, totals and counters
//!   are the sums of the shards' (each exact, read with every shard locked), and its peaks are
//!   [`Peaks`]': the highest sum of the shards' values at the ends of their requests, kept with
//!   no lock in the common case (see there).

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering, fence};

use once_cell::sync::OnceCell;

use parking_lot::Mutex;

use crate::device::StreamId;
use crate::route::Router;
use crate::stats::{DeviceStats, STATS};

thread_local! {
    /// The number this thread's last allocation or free took (`Arena::number_operations`).
    static LAST_NUMBER: Cell<u64> = const { Cell::new(0) };
}

/// The number this thread's last allocation or free took, while operations are numbered
/// (`Arena::number_operations`): the order in which the arena did them, across threads and
/// shards.
pub fn last_number() -> u64 {
    LAST_NUMBER.with(Cell::get)
}

/// Shards per arena: streams beyond this many share them (stream `i` in order of first use
/// goes to shard `i % SHARDS`).
pub(super) const SHARDS: usize = crate::route::MIN_PARTS;
/// Every statistic, as a mask over the order of [`DeviceStats::currents`].
const ALL: u32 = (1 << STATS) - 1;

/// Readings of the other shards' publication counts before [`Peaks`]' slow path settles for a
/// bound (each takes a fence and a load per shard, and a whole reading of a shard that
/// published). The bound is not exact, so it is a last resort: with 8 readings (of the values,
/// before the counts), the first reading of the slow path found no instant 19 to 86 times in a
/// run of `peaks_keep_the_bounds_between_statistics` (8 threads on this VM's 2 cores), and the
/// peaks broke the bounds between statistics in most runs; the slow path is rare, and a reading
/// of the counts is short.
const SETTLE_ROUNDS: usize = 1 << 14;

pub(super) struct Shared {
    /// Physical bytes all shards hold (the sum of their `reserved_bytes`), for the limit: on a
    /// cache line of its own, as it changes with every handle created or released while the
    /// fields after it are read by every request.
    reserved: Padded<AtomicU64>,
    /// More than one shard has served a request: the device's peaks are `peaks`'.
    multi: AtomicBool,
    pub(super) peaks: Peaks,
    /// Blocks shard 0 had numbered when a second shard first served (`Inner::block`).
    seq_base: AtomicU64,
    router: Router,
    /// Times a thread took a shard of its own for a stream (`Arena::steered`).
    own_shards: AtomicU64,
    /// While a trace is recorded: the count each allocation and free takes its number from,
    /// under its shard's lock (`Arena::number_operations`).
    numbers: OnceCell<Arc<AtomicU64>>,
}

impl Shared {
    pub(super) fn new() -> Shared {
        Shared {
            reserved: Padded(AtomicU64::new(0)),
            multi: AtomicBool::new(false),
            peaks: Peaks::new(),
            seq_base: AtomicU64::new(0),
            router: Router::new(),
            own_shards: AtomicU64::new(0),
            numbers: OnceCell::new(),
        }
    }

    /// Physical bytes all shards hold.
    #[inline]
    pub(super) fn reserved(&self) -> u64 {
        self.reserved.0.load(Ordering::Relaxed)
    }

    /// Count `bytes` more held if that keeps the total within `limit`: the one way a shard may
    /// create physical memory. Says whether it did.
    pub(super) fn try_reserve(&self, bytes: u64, limit: u64) -> bool {
        self.reserved
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |held| {
                held.checked_add(bytes).filter(|&total| total <= limit)
            })
            .is_ok()
    }

    /// `bytes` no longer held (released, or a creation that failed after `try_reserve`).
    pub(super) fn unreserve(&self, bytes: u64) {
        let before = self.reserved.0.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(
            before >= bytes,
            "unreserving {bytes} of {before} bytes held"
        );
    }

    #[inline]
    pub(super) fn multi(&self) -> bool {
        self.multi.load(Ordering::Acquire)
    }

    /// From now on the device's peaks are kept by [`Peaks`], starting from `first` (shard 0's
    /// statistics, which were the device's) and `blocks` (the blocks shard 0 numbered). Its
    /// caller holds shard 0's lock, so no request is half counted.
    pub(super) fn go_multi(&self, first: &DeviceStats, blocks: u64) {
        self.peaks.start(first);
        self.seq_base.store(blocks, Ordering::Relaxed);
        self.multi.store(true, Ordering::Release);
    }

    #[inline]
    pub(super) fn seq_base(&self) -> u64 {
        self.seq_base.load(Ordering::Relaxed)
    }

    /// Whether `stream` is served by shard 0 while it serves alone (the usual case, checked
    /// first on every request).
    #[inline]
    pub(super) fn alone(&self, stream: StreamId) -> bool {
        !self.multi() && self.router.first(stream)
    }

    /// From now on each allocation and free takes the next number of `numbers` (unless they
    /// already take them from a count: that one stays).
    pub(super) fn number_operations(&self, numbers: Arc<AtomicU64>) {
        let _ = self.numbers.set(numbers);
    }

    /// An allocation or free is done (under its shard's lock): while operations are numbered,
    /// it takes the next number, for this thread's [`last_number`].
    #[inline]
    pub(super) fn number_this(&self) {
        if let Some(n) = self.numbers.get() {
            let n = n.fetch_add(1, Ordering::Relaxed);
            LAST_NUMBER.with(|c| c.set(n));
        }
    }

    /// A thread took a shard of its own for a stream.
    pub(super) fn note_own_shard(&self) {
        self.own_shards.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn own_shards(&self) -> u64 {
        self.own_shards.load(Ordering::Relaxed)
    }

    /// The shard serving this thread's requests on `stream`: the stream's, or this thread's own
    /// for it once it kept meeting another thread there (`route::contended`).
    #[inline]
    pub(super) fn shard_of(&self, stream: StreamId) -> usize {
        self.router.part(stream, SHARDS)
    }
}

/// The device's peaks while several shards serve, with no lock in the common case.
///
/// Each shard publishes the current value of every statistic at the end of each request
/// (`published`, two buffers in turn: [`Slot::read`]), and may raise a value up to its *allowance*
/// (`allow`) without asking anyone. The allowances of all shards add up to at most the device's
/// peak (`board`), so while every shard is within its own, the device's total is within its peak
/// and no new peak can go unnoticed. A request that ends above its shard's allowance takes the
/// board's lock, adds the other shards' published values (read until they hold still: `over`) to
/// its own to find the device's total, raises the peak to it if higher, and takes a new allowance:
/// the peak less the others' allowances, or, where that is not enough, the others' slack too (each
/// keeps what it holds; one that had grown meanwhile either finds itself over its allowance at its
/// own request's end and does the same, or is seen grown when its value is read again).
///
/// Why this is exact: a shard whose value rose publishes and then reads its allowance, and a
/// shard that lowers another's allowance stores it and then reads the other's published value
/// again, each with a sequentially consistent fence between; so of two such shards at least one
/// sees the other's write (Dekker's pattern), and every total the shards' values reach at the
/// ends of their requests is either within the peak or added by the request that made it. A
/// value that fell is published with no fence: until it is seen, the shards count the value
/// before, which held until that request's end. Totals inside a request (a page created and
/// given back in one failed request) are its shard's own peaks. `peaks_model.rs` checks the
/// protocol over every interleaving on a machine with store buffers; the first version of
/// `over`, which lowered the others' allowances without reading their values again, missed
/// peaks there (a shard that rose within its old allowance while it was lowered).
pub(super) struct Peaks {
    slots: Box<[Slot]>,
    board: Mutex<[i64; STATS]>,
}

/// One shard's published values and allowances, on cache lines of their own.
#[repr(align(128))]
struct Slot {
    /// Twice the publications this shard has finished, plus one while it publishes (a sequence
    /// lock over two buffers: see [`Slot::read`]).
    publications: AtomicU64,
    /// Publication `m`'s values are in buffer `m % 2`: while the shard writes the next one, the
    /// last one finished stays whole in the other, so that a reader need not wait for a
    /// publication to end (its shard's thread may be descheduled in the middle of one).
    published: [[AtomicI64; STATS]; 2],
    allow: [AtomicI64; STATS],
}

impl Peaks {
    fn new() -> Peaks {
        Peaks {
            slots: (0..SHARDS)
                .map(|_| Slot {
                    publications: AtomicU64::new(0),
                    published: std::array::from_fn(|_| std::array::from_fn(|_| AtomicI64::new(0))),
                    allow: std::array::from_fn(|_| AtomicI64::new(0)),
                })
                .collect(),
            board: Mutex::new([0; STATS]),
        }
    }

    /// Shard 0's statistics were the device's: its values, and all the slack, are shard 0's.
    fn start(&self, first: &DeviceStats) {
        let mut board = self.board.lock();
        let (currents, peaks) = (first.currents(), first.peaks());
        *board = peaks;
        for k in 0..STATS {
            self.slots[0].latest()[k].store(currents[k], Ordering::Relaxed);
            self.slots[0].allow[k].store(peaks[k], Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
    }

    /// Shard `i`'s request ended, its values now `stats`', `rising` the statistics an update
    /// raised since its last publication (bits in the order of [`DeviceStats::currents`]; a
    /// superset of those now above what it published). Only this shard writes its published
    /// values (under its lock), so they are what its last request left: all are published, and
    /// only what rose can be over the allowance (a value that fell stays under it, as it was).
    /// With nothing raised, no fence: a shard that reads the older, higher value meanwhile
    /// counts a total that held until this request's end. The values are stored between two
    /// raises of the shard's publication count (a sequence lock), so that [`Peaks::over`] reads
    /// each shard's values whole, from one publication: what holds between statistics at the end
    /// of a request (an `all` the sum of its pools) holds in what it reads.
    ///
    /// The shard says what it raised (`Inner::rising`: set before a malloc, where
    /// `accounting.rs` counts a handle, and where it derives the inactive-split figures) rather
    /// than this comparing each value with the one it published: comparing all 29 was a load, a
    /// compare and a shift each, about 150 instructions a request, and with a branch each (an
    /// earlier form) about six mispredictions a request, since which of them changed follows no
    /// pattern a predictor learns; comparing the six inactive-split ones alone was about 35
    /// (`bench/instructions full/1000/2/arena`: 2,786.6 instructions a pair with them compared
    /// here, 2,724.0 without).
    #[inline]
    pub(super) fn request_ended(&self, i: usize, stats: &DeviceStats, rising: u32) {
        let slot = &self.slots[i];
        let n = slot.publications.load(Ordering::Relaxed);
        // The last one finished, and the buffer of this one.
        let (was, next) = (
            &slot.published[(n / 2) as usize % 2],
            &slot.published[(n / 2 + 1) as usize % 2],
        );
        slot.publications
            .store(n.wrapping_add(1), Ordering::Relaxed);
        // Release stores: each stays after the ones before it, the count's too (on x86 a plain
        // store).
        stats.each_current(|k, now| {
            debug_assert!(
                rising >> k & 1 == 1 || now <= was[k].load(Ordering::Relaxed),
                "statistic {k} rose to {now} and was not named as raised ({rising:#x})"
            );
            next[k].store(now, Ordering::Release);
        });
        slot.publications
            .store(n.wrapping_add(2), Ordering::Release);
        if rising == 0 {
            return;
        }
        fence(Ordering::SeqCst);
        // This shard's own values, as just published (only it writes them).
        let end = |k: usize| next[k].load(Ordering::Relaxed);
        // Any over at all first, with a branch per statistic: a request is almost never over
        // (2,841 of 1.36 million requests of the pairs benchmark's two threads), so the branch
        // is predicted, and the loop is shorter than one that builds the mask (10
        // instructions a statistic, not 13).
        let mut left = rising & ALL;
        while left != 0 {
            let k = left.trailing_zeros() as usize;
            left &= left - 1;
            if end(k) > slot.allow[k].load(Ordering::Relaxed) {
                self.over_some(i, rising);
                return;
            }
        }
    }

    /// Shard `i`'s request ended over its allowance for some of the statistics in `rising`.
    #[cold]
    #[inline(never)]
    fn over_some(&self, i: usize, rising: u32) {
        let slot = &self.slots[i];
        let latest = slot.latest();
        let end = |k: usize| latest[k].load(Ordering::Relaxed);
        let mut over = 0u32;
        for k in bits(rising & ALL) {
            over |= u32::from(end(k) > slot.allow[k].load(Ordering::Relaxed)) << k;
        }
        self.over(i, over, &std::array::from_fn(end));
    }

    /// Shard `i` ended a request above its allowance for the statistics in `over`.
    ///
    /// The others' values (all of them) are read until a reading of their publication counts after
    /// a fence finds none finished since ([`Peaks::settle`]): each then held its values from when
    /// they were read to that reading, so all of them did at the fence before it, and every peak is
    /// raised to the total then. Every peak, at one instant: raising each statistic's at an instant
    /// of its own let a shard's request count in one statistic's total and not yet in another's,
    /// and an `all` peak came out above its pools' together (`arena_threads`, about one run in ten;
    /// `peaks_keep_the_bounds_between_statistics`). Where the others' slack is taken, one whose
    /// value rose after it was read may have checked its old allowance (else it is over its new one
    /// and waits for this lock): after the allowances are lowered, a fence and a reading again,
    /// until none changed, each changed one keeping what it holds now. Past [`SETTLE_ROUNDS`]
    /// readings each other shard gets the highest allowance it has had since (what it may have
    /// checked) and the peak takes them all: a bound, never short (with one buffer per slot, a
    /// thread descheduled mid-publication made this happen 12 to 20 times in 2 s of the C ABI's 4
    /// threads; with two, none). What the peak then leaves free is shared among the shards that
    /// serve, so that they do not come back here in turn with each rise (with 4 threads, 24,492
    /// times where it was 71,160 in one run of the pairs benchmark). `peaks_model.rs` checks this
    /// protocol, one statistic at a time, over every interleaving.
    #[cold]
    fn over(&self, i: usize, over: u32, end: &[i64; STATS]) {
        let mut board = self.board.lock();
        let others = || (0..self.slots.len()).filter(move |&j| j != i);
        let allow = |j: usize, k: usize| &self.slots[j].allow[k];
        let mut seen = Seen::default();
        let settled = self.settle(i, &mut seen, |_, _| {});
        if settled {
            raise(&mut board, end, &seen.values);
        }
        let mut slack = 0u32;
        for k in bits(over) {
            if !settled {
                // No instant found: the bound below, never short.
                slack |= 1 << k;
                continue;
            }
            let allowed: i64 = others().map(|j| allow(j, k).load(Ordering::Relaxed)).sum();
            if board[k] - allowed < end[k] {
                slack |= 1 << k;
            }
        }
        if slack != 0 {
            // Take the others' slack: each keeps the allowance of what it holds.
            // The highest allowance each has had since (what it may have checked).
            let mut high = [[0i64; STATS]; SHARDS];
            for j in others() {
                for k in bits(slack) {
                    // Allowances change only under the board's lock: no other writer races.
                    high[j][k] = allow(j, k).load(Ordering::Relaxed).max(seen.values[j][k]);
                    allow(j, k).store(seen.values[j][k], Ordering::Relaxed);
                }
            }
            let settled = self.settle(i, &mut seen, |j, now| {
                for k in bits(slack) {
                    high[j][k] = high[j][k].max(now[k]);
                    allow(j, k).store(now[k], Ordering::Relaxed);
                }
            });
            if settled {
                raise(&mut board, end, &seen.values);
            } else {
                for j in others() {
                    for k in bits(slack) {
                        allow(j, k).store(high[j][k], Ordering::Relaxed);
                    }
                }
                fence(Ordering::SeqCst);
                seen.values = high;
            }
            // The shards that serve: shard 0 (the first) and those that have published. One
            // that never served needs no room to rise, and sharing with all 8 left the 2 that
            // served with a quarter of the room each, and 8 times the trips here (105,270
            // against 13,187 in 2 s of the C ABI's 2 threads).
            let serving =
                |j: usize| j == 0 || self.slots[j].publications.load(Ordering::Relaxed) != 0;
            let sharers = 1 + others().filter(|&j| serving(j)).count() as i64;
            for k in bits(slack) {
                let mut allowed: i64 = others().map(|j| seen.values[j][k]).sum();
                board[k] = board[k].max(end[k] + allowed);
                // What the peak leaves free is shared among the shards that serve (a raise,
                // safe whether or not the other sees it), so that one just held to its value
                // does not come straight back here with its next rise.
                let share = (board[k] - end[k] - allowed) / sharers;
                if share > 0 {
                    for j in others().filter(|&j| serving(j)) {
                        allow(j, k).store(seen.values[j][k] + share, Ordering::Relaxed);
                        allowed += share;
                    }
                }
                allow(i, k).store(board[k] - allowed, Ordering::Relaxed);
            }
        }
        for k in bits(over & !slack) {
            let allowed: i64 = others().map(|j| allow(j, k).load(Ordering::Relaxed)).sum();
            allow(i, k).store(board[k] - allowed, Ordering::Relaxed);
        }
    }

    /// Read the others' (not `i`'s) publication counts after a fence, and the last publication of
    /// each that finished one since `seen` (whole: [`Slot::read`]), until a reading finds none
    /// finished since: each then held the values in `seen` from when they were read to this reading
    /// (one under way has not ended its request), so all of them did at the fence before it. Each
    /// newly read one goes to `seen` and to `changed`. Says whether a reading found none finished
    /// within [`SETTLE_ROUNDS`]. Counts, not values: a shard whose value rose and fell back between
    /// two readings (a malloc and its free) shows the same value but did not hold it in between,
    /// and a reading of the counts alone is short, so a quiet moment is easier to find.
    fn settle(
        &self,
        i: usize,
        seen: &mut Seen,
        mut changed: impl FnMut(usize, &[i64; STATS]),
    ) -> bool {
        for _ in 0..SETTLE_ROUNDS {
            fence(Ordering::SeqCst);
            let mut any = false;
            for (j, slot) in self.slots.iter().enumerate().filter(|&(j, _)| j != i) {
                // A publication under way is not a change: until it ends, its shard's request
                // has not, and the values before it are the ones it holds.
                if slot.publications.load(Ordering::Acquire) & !1 == seen.counts[j] {
                    continue;
                }
                any = true;
                let mut now = [0i64; STATS];
                if let Some(count) = slot.read(&mut now) {
                    (seen.values[j], seen.counts[j]) = (now, count);
                    changed(j, &now);
                }
            }
            if !any {
                return true;
            }
        }
        false
    }

    /// The device's peaks. Called with every shard locked (no request under way).
    pub(super) fn peaks(&self) -> [i64; STATS] {
        *self.board.lock()
    }

    /// `reset_peak_memory_stats`: every peak becomes the device's total, and every shard's
    /// allowance what it holds. Called with every shard locked, `currents` theirs.
    pub(super) fn reset(&self, currents: &[[i64; STATS]]) {
        let mut board = self.board.lock();
        *board = [0; STATS];
        for (slot, c) in self.slots.iter().zip(currents) {
            for k in 0..STATS {
                slot.latest()[k].store(c[k], Ordering::Relaxed);
                slot.allow[k].store(c[k], Ordering::Relaxed);
                board[k] += c[k];
            }
        }
        fence(Ordering::SeqCst);
    }
}

impl Slot {
    /// The values of the last publication finished, into `values`, and its count (twice its
    /// number); `None` where the shard began the publication after it meanwhile, which writes
    /// the buffer read (the reading may mix two). One under way does not disturb the reading:
    /// it writes the other buffer.
    fn read(&self, values: &mut [i64; STATS]) -> Option<u64> {
        let before = self.publications.load(Ordering::Acquire);
        let done = before / 2;
        for (v, p) in values.iter_mut().zip(&self.published[done as usize % 2]) {
            *v = p.load(Ordering::Acquire);
        }
        let after = self.publications.load(Ordering::Acquire);
        (after <= 2 * done + 2).then_some(2 * done)
    }

    /// The buffer of the last publication finished. Only for the slot's own shard, under its
    /// lock, or with every shard locked: no publication is under way then.
    fn latest(&self) -> &[AtomicI64; STATS] {
        let n = self.publications.load(Ordering::Relaxed);
        &self.published[(n / 2) as usize % 2]
    }
}

/// What [`Peaks::over`] last read of the other shards: their values and publication counts.
struct Seen {
    values: [[i64; STATS]; SHARDS],
    counts: [u64; SHARDS],
}

impl Default for Seen {
    /// Nothing read yet: odd counts, which no finished publication has.
    fn default() -> Seen {
        Seen {
            values: [[0; STATS]; SHARDS],
            counts: [u64::MAX; SHARDS],
        }
    }
}

/// Every peak raised to the device's total at the instant `others` were read (the requesting
/// shard's own values `end`, and `others`' zero where they are the requesting shard's row:
/// never read, left zero).
fn raise(board: &mut [i64; STATS], end: &[i64; STATS], others: &[[i64; STATS]; SHARDS]) {
    for k in 0..STATS {
        let total = end[k] + others.iter().map(|v| v[k]).sum::<i64>();
        board[k] = board[k].max(total);
    }
}

/// The indices of the bits set in `mask`.
fn bits(mut mask: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let k = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            k
        })
    })
}

/// A value on cache lines of its own (two: adjacent-line prefetch pairs them).
#[repr(align(128))]
struct Padded<T>(T);

#[cfg(test)]
mod tests {
    use super::*;

    /// The peaks keep what holds between statistics at the end of every request: an `all`
    /// peak is at most its pools' peaks together, allocated bytes' at most active bytes'.
    #[test]
    fn peaks_keep_the_bounds_between_statistics() {
        use crate::stats::{Pool, all_mask, place, with_pool};
        for round in 0..20u64 {
            let peaks = Peaks::new();
            let first = DeviceStats::new();
            peaks.start(&first);
            let go = std::sync::Barrier::new(SHARDS);
            std::thread::scope(|scope| {
                for i in 0..SHARDS {
                    let (peaks, go) = (&peaks, &go);
                    scope.spawn(move || {
                        let mut st = DeviceStats::new();
                        let mut held: Vec<(Pool, i64)> = Vec::new();
                        let mut rising = 0;
                        let mut x = (round * 31 + i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                        go.wait();
                        for _ in 0..20_000 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            if held.len() < 4 && (x & 1 == 0 || held.is_empty()) {
                                let pool = if x & 2 == 0 { Pool::Small } else { Pool::Large };
                                let n = 1 + (x >> 8) as i64 % 5;
                                st.active_bytes.increase(pool, n);
                                st.allocated_bytes.increase(pool, n);
                                rising = with_pool(
                                    all_mask(&[place::ACTIVE_BYTES, place::ALLOCATED_BYTES]),
                                    pool,
                                );
                                held.push((pool, n));
                            } else {
                                let (pool, n) = held.swap_remove((x >> 4) as usize % held.len());
                                st.allocated_bytes.decrease(pool, n);
                                st.active_bytes.decrease(pool, n);
                            }
                            peaks.request_ended(i, &st, std::mem::take(&mut rising));
                        }
                    });
                }
            });
            let p = peaks.peaks();
            // Arrays 4 and 6 of `currents`' order: allocated and active bytes (all, small, large).
            for a in [4, 6] {
                let (all, small, large) = (p[3 * a], p[3 * a + 1], p[3 * a + 2]);
                assert!(
                    all <= small + large,
                    "round {round}, array {a}: all {all} > {small} + {large}"
                );
            }
            assert!(p[12] <= p[18], "allocated {} over active {}", p[12], p[18]);
        }
    }

    /// A reading while a shard publishes finds its last publication finished, whole: the one
    /// under way writes the other buffer (a thread descheduled in the middle of a publication
    /// held every other shard's slow path until it ran again, which then settled for a bound).
    #[test]
    fn a_reading_during_a_publication_finds_the_last_one_whole() {
        use crate::stats::Pool;
        let peaks = Peaks::new();
        let mut st = DeviceStats::new();
        st.allocated_bytes.increase(Pool::Large, 5);
        peaks.request_ended(1, &st, ALL);
        let slot = &peaks.slots[1];
        assert_eq!(slot.publications.load(Ordering::Relaxed), 2);
        // The next publication half written: its count odd, some of its values stored.
        slot.publications.store(3, Ordering::Relaxed);
        let next = &slot.published[0];
        next[12].store(99, Ordering::Relaxed);
        let mut values = [0; STATS];
        assert_eq!(
            slot.read(&mut values),
            Some(2),
            "the last one finished: the first"
        );
        // Array 4 (allocated bytes): all, small, large.
        assert_eq!(&values[12..15], &[5, 0, 5]);
    }

    /// The room a peak leaves goes to the shards that serve, none to those that never did.
    #[test]
    fn the_room_under_the_peak_goes_to_the_shards_that_serve() {
        use crate::stats::Pool;
        let peaks = Peaks::new();
        let first = DeviceStats::new();
        peaks.start(&first);
        let bytes = |n| {
            let mut st = DeviceStats::new();
            st.allocated_bytes.increase(Pool::Large, n);
            st
        };
        // Shard 0 rises to 100 and falls to 20; shard 1 then rises to 90 (over its allowance
        // of 0): the peak, 110, leaves 0 free; then shard 0 falls to 0 and shard 1 rises to 95.
        peaks.request_ended(0, &bytes(100), ALL);
        peaks.request_ended(0, &bytes(20), 0);
        peaks.request_ended(1, &bytes(90), ALL);
        peaks.request_ended(0, &bytes(0), 0);
        peaks.request_ended(1, &bytes(95), ALL);
        assert_eq!(peaks.board.lock()[12], 110);
        // 15 free: 7 each to shards 0 and 1 (the rounding left unassigned goes to shard 1).
        let allow = |j: usize| peaks.slots[j].allow[12].load(Ordering::Relaxed);
        assert_eq!((allow(0), allow(1)), (7, 103));
        for j in 2..SHARDS {
            assert_eq!(allow(j), 0, "shard {j} never served");
        }
    }

    #[test]
    fn the_limit_holds_for_every_reservation() {
        let s = Shared::new();
        assert!(s.try_reserve(6, 10));
        assert!(!s.try_reserve(5, 10));
        assert!(s.try_reserve(4, 10));
        assert!(!s.try_reserve(u64::MAX, u64::MAX), "no wrap past u64::MAX");
        s.unreserve(4);
        assert_eq!(s.reserved(), 6);
    }
}
