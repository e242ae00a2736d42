//! Statistics with the keys and meanings of `torch.cuda.memory_stats()` (torch 2.11, 122 keys).
//!
//! The arena keeps one [`DeviceStats`] per device, beside the structures it counts, and updates it
//! under its own lock. Pools: `small_pool` = size-class slabs, `large_pool` = page ranges.

pub mod keys;
pub mod report;
pub mod summary;

/// Index into a [`StatArray`]: the order of PyTorch's `StatType` (AGGREGATE, SMALL_POOL, LARGE_POOL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    Small = 1,
    Large = 2,
}

/// One statistic, updated the way PyTorch updates its `Stat`:
/// increase → current += n, peak = max(peak, current), allocated += n;
/// decrease → current -= n, freed += n.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    #[inline]
    pub fn increase(&mut self, n: i64) {
        self.current += n;
        self.allocated += n;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }

    #[inline]
    pub fn decrease(&mut self, n: i64) {
        self.current -= n;
        self.freed += n;
    }

    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// How many [`Stat`]s a [`DeviceStats`] holds: nine arrays of three, and the two oversize ones.
pub const STATS: usize = 29;

/// Each [`StatArray`]'s place in the order of [`DeviceStats::currents`]: array `a`'s `all` is
/// statistic `3 * a`, its small and large pools the two after it.
pub mod place {
    pub const ALLOCATION: u32 = 0;
    pub const SEGMENT: u32 = 1;
    pub const ACTIVE: u32 = 2;
    pub const INACTIVE_SPLIT: u32 = 3;
    pub const ALLOCATED_BYTES: u32 = 4;
    pub const RESERVED_BYTES: u32 = 5;
    pub const ACTIVE_BYTES: u32 = 6;
    pub const INACTIVE_SPLIT_BYTES: u32 = 7;
    pub const REQUESTED_BYTES: u32 = 8;
}

/// The `all` statistics of the arrays at `places` ([`place`]), as a mask over the order of
/// [`DeviceStats::currents`] (bit `k` for statistic `k`).
pub const fn all_mask(places: &[u32]) -> u32 {
    let mut m = 0;
    let mut i = 0;
    while i < places.len() {
        m |= 1 << (3 * places[i]);
        i += 1;
    }
    m
}

/// `all` (a mask from [`all_mask`]) with the same arrays' `pool` statistics.
#[inline]
pub const fn with_pool(all: u32, pool: Pool) -> u32 {
    all | all << pool as u32
}

/// `[all, small_pool, large_pool]`, updated together: a change to a pool also changes `all`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    #[inline]
    pub fn increase(&mut self, pool: Pool, n: i64) {
        self.0[0].increase(n);
        self.0[pool as usize].increase(n);
    }

    #[inline]
    pub fn decrease(&mut self, pool: Pool, n: i64) {
        self.0[0].decrease(n);
        self.0[pool as usize].decrease(n);
    }

    /// `n` moves from pool `from` to pool `to`. PyTorch updates every stat of a pool and the
    /// aggregate together, so `all.{current,allocated,freed}` always equal the pools' sums, and
    /// the aggregate counts one page created as one allocation however often it moves. Both
    /// hold: `from` takes back its allocation of `n` (current and allocated less `n`, so
    /// `current == allocated - freed` still) and `to` allocates it; the aggregate is unchanged.
    /// Only when `from` counted less than `n` allocated since `reset_accumulated` does the move
    /// count as a free in `from`, and as both halves in the aggregate.
    #[inline]
    pub fn transfer(&mut self, from: Pool, to: Pool, n: i64) {
        let f = &mut self.0[from as usize];
        f.current -= n;
        if f.allocated >= n {
            f.allocated -= n;
        } else {
            f.freed += n;
            self.0[0].allocated += n;
            self.0[0].freed += n;
        }
        self.0[to as usize].increase(n);
    }

    /// `n` leaves for another part of the device (another shard of the arena), which counts it
    /// with [`StatArray::increase`]: as [`StatArray::transfer`]'s `from` half, taking back its
    /// allocation, so that the parts' sums count it once.
    #[inline]
    pub fn give(&mut self, pool: Pool, n: i64) {
        for s in [0, pool as usize] {
            let s = &mut self.0[s];
            s.current -= n;
            if s.allocated >= n {
                s.allocated -= n;
            } else {
                s.freed += n;
            }
        }
    }

    pub fn all(&self) -> &Stat {
        &self.0[0]
    }

    pub fn pool(&self, pool: Pool) -> &Stat {
        &self.0[pool as usize]
    }
}

/// Everything `torch.cuda.memory_stats()` reports for one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Client allocations live.
    pub allocation: StatArray,
    /// Physical pages held (our "segments"): small_pool = pages backing slabs, large_pool = the rest.
    pub segment: StatArray,
    /// Allocations live or freed but still awaiting stream events (record_stream).
    pub active: StatArray,
    /// Partially used pages: free space that cannot be released while a live allocation shares it.
    pub inactive_split: StatArray,
    /// Block bytes handed out (request rounded to its size class or to 512 B).
    pub allocated_bytes: StatArray,
    /// Physical bytes held.
    pub reserved_bytes: StatArray,
    /// Bytes in active blocks.
    pub active_bytes: StatArray,
    /// Free bytes inside partially used pages.
    pub inactive_split_bytes: StatArray,
    /// Bytes the client asked for.
    pub requested_bytes: StatArray,
    /// Allocations of at least `max_split_size` bytes (never, with no max split size).
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size` bytes (never, with no max split size).
    pub oversize_segments: Stat,
    /// Times a request could not be met at once and the cache was flushed before retrying.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors returned to the client.
    pub num_ooms: i64,
    /// Times every stream was synchronised to free memory.
    pub num_sync_all_streams: i64,
    /// Physical pages created (cuMemCreate), or plain cuMemAlloc calls.
    pub num_device_alloc: i64,
    /// Physical pages released (cuMemRelease), or plain cuMemFree calls.
    pub num_device_free: i64,
    /// PyTorch's `max_split_size` (we never stop splitting: `i64::MAX`, as PyTorch reports SIZE_MAX).
    pub max_split_size: i64,
}

impl DeviceStats {
    pub fn new() -> Self {
        DeviceStats {
            max_split_size: i64::MAX,
            ..Default::default()
        }
    }

    /// Every [`Stat`], in the order of [`DeviceStats::currents`].
    fn stats_mut(&mut self) -> impl Iterator<Item = &mut Stat> {
        let (arrays, oversize) = (
            [
                &mut self.allocation,
                &mut self.segment,
                &mut self.active,
                &mut self.inactive_split,
                &mut self.allocated_bytes,
                &mut self.reserved_bytes,
                &mut self.active_bytes,
                &mut self.inactive_split_bytes,
                &mut self.requested_bytes,
            ],
            [&mut self.oversize_allocations, &mut self.oversize_segments],
        );
        arrays
            .into_iter()
            .flat_map(|a| a.0.iter_mut())
            .chain(oversize)
    }

    #[inline]
    fn arrays(&self) -> [&StatArray; 9] {
        [
            &self.allocation,
            &self.segment,
            &self.active,
            &self.inactive_split,
            &self.allocated_bytes,
            &self.reserved_bytes,
            &self.active_bytes,
            &self.inactive_split_bytes,
            &self.requested_bytes,
        ]
    }

    fn stats(&self) -> impl Iterator<Item = &Stat> {
        self.arrays()
            .into_iter()
            .flat_map(|a| a.0.iter())
            .chain([&self.oversize_allocations, &self.oversize_segments])
    }

    /// The current value of every [`Stat`], in one order ([`STATS`] of them).
    #[inline]
    pub fn currents(&self) -> [i64; STATS] {
        self.each(|s| s.current)
    }

    /// `f(k, stat)` of every [`Stat`], `k` its place in the order of [`DeviceStats::currents`].
    /// Plain field reads, as the shards' requests read them on every request (an iterator chain
    /// here cost a third of a request: `bench/threads`).
    #[inline]
    fn visit(&self, mut f: impl FnMut(usize, &Stat)) {
        for (i, a) in self.arrays().into_iter().enumerate() {
            f(3 * i, &a.0[0]);
            f(3 * i + 1, &a.0[1]);
            f(3 * i + 2, &a.0[2]);
        }
        f(27, &self.oversize_allocations);
        f(28, &self.oversize_segments);
    }

    /// `f` of every [`Stat`], in the order of [`DeviceStats::currents`].
    #[inline]
    fn each(&self, f: impl Fn(&Stat) -> i64) -> [i64; STATS] {
        let mut out = [0; STATS];
        self.visit(|k, s| out[k] = f(s));
        out
    }

    /// `f(k, current)` of every [`Stat`], `k` its place in [`DeviceStats::currents`], read in
    /// place: the shards' requests call this on every request, and building the array first
    /// cost them 29 stores and 29 loads more (`bench/instructions`).
    #[inline]
    pub fn each_current(&self, mut f: impl FnMut(usize, i64)) {
        self.visit(|k, s| f(k, s.current));
    }

    /// The peak of every [`Stat`], in the order of [`DeviceStats::currents`].
    pub fn peaks(&self) -> [i64; STATS] {
        self.each(|s| s.peak)
    }

    /// Every peak from `peaks` (in the order of [`DeviceStats::currents`]).
    pub fn set_peaks(&mut self, peaks: &[i64; STATS]) {
        for (s, &p) in self.stats_mut().zip(peaks) {
            s.peak = p;
        }
    }

    /// Add `other`'s current values, totals and counters to these (the statistics of several
    /// parts of one device: each part's own peaks say nothing of the whole's, and are left).
    pub fn fold(&mut self, other: &DeviceStats) {
        for (s, o) in self.stats_mut().zip(other.stats()) {
            s.current += o.current;
            s.allocated += o.allocated;
            s.freed += o.freed;
        }
        self.num_alloc_retries += other.num_alloc_retries;
        self.num_ooms += other.num_ooms;
        self.num_sync_all_streams += other.num_sync_all_streams;
        self.num_device_alloc += other.num_device_alloc;
        self.num_device_free += other.num_device_free;
    }

    /// `reset_peak_memory_stats`: every peak becomes the current value.
    pub fn reset_peak(&mut self) {
        self.stats_mut().for_each(Stat::reset_peak);
    }

    /// `reset_accumulated_memory_stats`: allocated/freed totals and the scalar counters go to zero.
    pub fn reset_accumulated(&mut self) {
        self.stats_mut().for_each(Stat::reset_accumulated);
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums_hold(a: &StatArray) {
        let [all, small, large] = a.0;
        assert_eq!(all.current, small.current + large.current, "{a:?}");
        assert_eq!(all.allocated, small.allocated + large.allocated, "{a:?}");
        assert_eq!(all.freed, small.freed + large.freed, "{a:?}");
        for s in a.0 {
            assert_eq!(s.current, s.allocated - s.freed, "{a:?}");
        }
    }

    /// `each_current` reads the values `currents` lists, in its order, each once.
    #[test]
    fn each_current_is_currents_in_place() {
        let mut st = DeviceStats::new();
        for (k, s) in st.stats_mut().enumerate() {
            s.current = 1000 + k as i64;
        }
        let mut seen = Vec::new();
        st.each_current(|k, v| seen.push((k, v)));
        let want: Vec<_> = st.currents().into_iter().enumerate().collect();
        assert_eq!(seen, want);
        assert_eq!(seen.len(), STATS);
    }

    /// The places name the arrays where `currents` has them: raising one array's pool raises
    /// exactly the statistics its mask names.
    #[test]
    fn places_name_the_arrays_in_the_order_of_currents() {
        type Field = fn(&mut DeviceStats) -> &mut StatArray;
        let fields: [(u32, Field); 9] = [
            (place::ALLOCATION, |s| &mut s.allocation),
            (place::SEGMENT, |s| &mut s.segment),
            (place::ACTIVE, |s| &mut s.active),
            (place::INACTIVE_SPLIT, |s| &mut s.inactive_split),
            (place::ALLOCATED_BYTES, |s| &mut s.allocated_bytes),
            (place::RESERVED_BYTES, |s| &mut s.reserved_bytes),
            (place::ACTIVE_BYTES, |s| &mut s.active_bytes),
            (place::INACTIVE_SPLIT_BYTES, |s| &mut s.inactive_split_bytes),
            (place::REQUESTED_BYTES, |s| &mut s.requested_bytes),
        ];
        for (at, field) in fields {
            for pool in [Pool::Small, Pool::Large] {
                let mut st = DeviceStats::new();
                field(&mut st).increase(pool, 7);
                let changed = st
                    .currents()
                    .iter()
                    .enumerate()
                    .filter(|&(_, &v)| v != 0)
                    .fold(0u32, |m, (k, _)| m | 1 << k);
                assert_eq!(
                    changed,
                    with_pool(all_mask(&[at]), pool),
                    "array {at}, {pool:?}"
                );
            }
        }
        assert_eq!(
            all_mask(&[place::ALLOCATION, place::REQUESTED_BYTES]),
            1 | 1 << 24
        );
    }

    /// A page that moves is one allocation in `all`, and `all` stays the pools' sum, also when
    /// the pool it leaves was reset since it counted the page.
    #[test]
    fn a_transfer_keeps_all_the_sum_of_the_pools() {
        let mut a = StatArray::default();
        a.increase(Pool::Large, 2);
        a.transfer(Pool::Large, Pool::Small, 2);
        sums_hold(&a);
        assert_eq!((a.all().allocated, a.all().current), (2, 2));
        a.transfer(Pool::Small, Pool::Large, 2);
        a.decrease(Pool::Large, 2);
        sums_hold(&a);
        assert_eq!((a.all().allocated, a.all().freed), (2, 2));

        let mut b = StatArray::default();
        b.increase(Pool::Large, 2);
        b.0.iter_mut().for_each(Stat::reset_accumulated);
        b.transfer(Pool::Large, Pool::Small, 2);
        let [all, small, large] = b.0;
        assert_eq!(all.current, small.current + large.current);
        assert_eq!(all.allocated, small.allocated + large.allocated);
        assert_eq!(all.freed, small.freed + large.freed);
        assert_eq!(all.current, 2);
    }
}
