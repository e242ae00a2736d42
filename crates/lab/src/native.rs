//! PyTorch's native caching allocator, emulated on a trace (rules from
//! `reference/pytorch-pluggable-allocator.md` §6).
//!
//! What is modelled: `round_size` (512-byte multiples, at least 512), the small pool (requests
//! up to 1 MiB, 2 MiB segments) and the large pool (1–10 MiB requests take a `large_segment_size`
//! segment, larger ones their size rounded up to 2 MiB), best fit in (stream, size, address)
//! order on the same stream only, the `max_split_size` rules, `should_split` (small pool:
//! remainder ≥ 512 B; large pool: request < `max_split_size` and remainder > 1 MiB), merging
//! with free neighbours of the same segment on free, and the OOM path: a failed cudaMalloc
//! (capacity exceeded) releases oversize cached blocks (with `max_split_size`), then every
//! unsplit cached segment, and retries; then the event is the OOM. Expandable segments: one
//! growable segment per (stream, pool) mapped in chunks of 2 MiB (small) / `large_segment_size`
//! (large), the lowest free run first; fully free chunks are unmapped on OOM.
//!
//! Driver calls (for the cost model, `reference/vmm-costs.md`): without expandable segments a
//! new segment is one `cudaMalloc` (counted as `cuMemAlloc`) and a released one one `cudaFree`
//! (`cuMemFree`). With expandable segments, as `ExpandableSegment` does: one
//! `cuMemAddressReserve` per segment; growing by n chunks is n `cuMemCreate` + n `cuMemMap` and
//! one `cuMemSetAccess` for the range; unmapping a free run is one `cuStreamSynchronize` (PyTorch
//! waits for the stream first), then n `cuMemUnmap` + n `cuMemRelease`. cudaFree synchronises the
//! device and the unmap path synchronises its stream: under a GPU lag each release episode (one
//! pass of the OOM path that gives memory back) stalls the host for the lag, the time the newest
//! queued work needs to finish. Events for cross-stream frees are not modelled (no
//! `record_stream`), so the emulation counts no event calls.
//!
//! Settings ([`NativeOptions`], parsed from `PYTORCH_CUDA_ALLOC_CONF` text in `native_conf.rs`):
//! `roundup_power2_divisions` in `round_size`; `max_non_split_rounding_mb`; a memory fraction
//! (`per_process_memory_fraction`), which caps what `alloc_block` may reserve at the fraction of
//! the device; and with it `garbage_collection_threshold`: `garbage_collect_cached_blocks` runs
//! before each miss goes to the driver and frees old unsplit large-pool segments (their age
//! counted in searches of the pool since they joined it) until reserved is back under the
//! threshold.
//!
//! Not modelled: `record_stream` deferral (frees are immediate), CUDA graphs and private pools.
//!
//! Cost: O(log n) per event (ordered sets of free blocks) except on the OOM path (which walks the
//! cached blocks once) and, with expandable segments, a miss that searches the unmapped runs of one
//! segment (few in practice).

use std::collections::{BTreeSet, HashMap};

use super::replay::{Point, ReplayResult, Replayed, SeriesBuilder, Timing};
use crate::model::{Op, Trace};
use std::cell::RefCell;
use torch_arena::arena::GrowthCounts;
use torch_arena::block::Request;
use torch_arena::device::DriverCounters;
use torch_arena::device::{DevPtr, StreamId};
use torch_arena::error::{Error, Result};
use torch_arena::resource::Resource;

pub use super::native_conf::NativeOptions;

pub use torch_arena::sizing::{
    LARGE_SEGMENT, MIN_BLOCK, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
    allocation_size, round_size,
};

/// What the emulated native allocator did: the replay's figures (the same type as the arena's,
/// reached through `Deref`: `peak_reserved`, `steps`, `calls`, `modelled_driver_s`, ...) and the
/// emulation's own counts.
#[derive(Clone, Debug)]
pub struct NativeResult {
    pub replay: ReplayResult,
    pub peak_allocated: u64,
    /// Index of the event that ran out of memory, if any.
    pub oom_event: Option<usize>,
    /// Segments created (cudaMalloc calls, or chunk mappings with expandable segments).
    pub segments_created: u64,
    /// Segments released (cudaFree calls, or chunk unmappings) on the OOM path.
    pub segments_released: u64,
    /// Times the OOM path released cached segments and retried (`num_alloc_retries`).
    pub alloc_retries: u64,
    /// Reserved bytes after the last event.
    pub final_reserved: u64,
}

impl std::ops::Deref for NativeResult {
    type Target = ReplayResult;
    fn deref(&self) -> &ReplayResult {
        &self.replay
    }
}

const NONE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Allocated,
    /// Mapped and free: in its pool's free set.
    Free,
    /// Address space of an expandable segment with no memory behind it.
    Unmapped,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    ptr: u64,
    size: u64,
    state: State,
    prev: u32,
    next: u32,
    seg: u32,
    /// Its pool's `get_free_block` count when it last joined the pool (`gc_count_base`): its
    /// age for garbage collection is how many searches it has sat through since.
    gc_base: u64,
}

#[derive(Debug)]
struct Segment {
    stream: u64,
    small: bool,
    expandable: bool,
    base: u64,
    /// Expandable only: the unmapped blocks, in address order.
    unmapped: BTreeSet<(u64, u32)>,
}

/// Free mapped blocks of one pool, in PyTorch's order: (stream, size, address).
type FreeSet = BTreeSet<(u64, u64, u64, u32)>;

/// The emulated `DeviceCachingAllocator` of one device.
struct Native<'a> {
    opts: &'a NativeOptions,
    blocks: Vec<Block>,
    spare: Vec<u32>,
    segs: Vec<Segment>,
    /// [large, small].
    pools: [FreeSet; 2],
    /// `get_free_blocks_call_count` of each pool, counted only while garbage collection is on.
    free_searches: [u64; 2],
    expandable: HashMap<(u64, bool), u32>,
    next_va: u64,
    reserved: u64,
    allocated: u64,
    peak_reserved: u64,
    peak_allocated: u64,
    created: u64,
    released: u64,
    retries: u64,
    /// Driver calls made, by kind.
    calls: DriverCounters,
    /// Release episodes (cudaFree or a synchronised unmap), each a host wait under a GPU lag.
    syncs: u64,
    /// The GPU lag of the replay (for the stall of each release episode).
    lag_ns: u64,
    /// The most reserved since `take_peak_reserved`.
    step_peak: u64,
    /// Bytes requested by live allocations, and the most ever (the replay's requests, not
    /// rounded): what `growth` classifies by.
    requested: u64,
    requested_high: u64,
    /// Segments (or expandable chunks) created, by whether their request took the bytes
    /// requested to a new peak.
    growth: GrowthCounts,
    /// Blocks handed out so far (`Block::seq` of the last).
    handed: u64,
}

impl<'a> Native<'a> {
    fn new(opts: &'a NativeOptions) -> Self {
        Native {
            opts,
            blocks: Vec::new(),
            spare: Vec::new(),
            segs: Vec::new(),
            pools: [FreeSet::new(), FreeSet::new()],
            free_searches: [0; 2],
            expandable: HashMap::new(),
            next_va: 1 << 40,
            reserved: 0,
            allocated: 0,
            peak_reserved: 0,
            peak_allocated: 0,
            created: 0,
            released: 0,
            retries: 0,
            calls: DriverCounters::default(),
            syncs: 0,
            lag_ns: 0,
            step_peak: 0,
            requested: 0,
            requested_high: 0,
            growth: GrowthCounts::default(),
            handed: 0,
        }
    }

    fn max_split(&self) -> u64 {
        self.opts.max_split_size.unwrap_or(u64::MAX)
    }

    fn chunk(&self, small: bool) -> u64 {
        if small {
            SMALL_BUFFER
        } else {
            self.opts.large_segment_size
        }
    }

    fn new_block(&mut self, b: Block) -> u32 {
        torch_arena::slots::reuse_or_push(&mut self.blocks, &mut self.spare, b)
    }

    fn key(&self, i: u32) -> (u64, u64, u64, u32) {
        let b = &self.blocks[i as usize];
        (self.segs[b.seg as usize].stream, b.size, b.ptr, i)
    }

    fn pool_of(&self, i: u32) -> usize {
        self.segs[self.blocks[i as usize].seg as usize].small as usize
    }

    fn pool_insert(&mut self, i: u32) {
        let (k, p) = (self.key(i), self.pool_of(i));
        self.blocks[i as usize].gc_base = self.free_searches[p];
        self.pools[p].insert(k);
    }

    fn pool_remove(&mut self, i: u32) {
        let (k, p) = (self.key(i), self.pool_of(i));
        self.pools[p].remove(&k);
    }

    fn add_reserved(&mut self, bytes: u64) {
        self.reserved += bytes;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        self.step_peak = self.step_peak.max(self.reserved);
    }

    /// A release episode begins unless one already did since the last allocation: cudaFree
    /// synchronises the device, so the first release waits for the GPU and the rest do not.
    fn sync_once(&mut self, in_episode: &mut bool) {
        if !*in_episode {
            *in_episode = true;
            self.syncs += 1;
        }
    }

    /// `malloc`: the block for a request of `req` bytes on `stream`, or `None` on OOM.
    fn malloc(&mut self, req: u64, stream: u64) -> Option<u32> {
        let size = self.opts.round_size(req);
        let small = size <= SMALL_SIZE;
        if let Some(b) = self.get_free_block(size, stream, small) {
            self.pool_remove(b);
            return Some(self.alloc_found(b, size));
        }
        let mut episode = false;
        if self.opts.garbage_collection() {
            self.garbage_collect(&mut episode);
        }
        let b = self.alloc_block(size, stream, small).or_else(|| {
            if self.release_available_cached_blocks(size, stream, small, &mut episode) {
                self.alloc_block(size, stream, small)
            } else {
                None
            }
        });
        let b = b.or_else(|| {
            self.release_cached_blocks(&mut episode);
            self.retries += 1;
            self.alloc_block(size, stream, small)
        })?;
        Some(self.alloc_found(b, size))
    }

    /// Best fit on the same stream, with the `max_split_size` rejections. Counts the search for
    /// garbage collection's ages while that is on.
    fn get_free_block(&mut self, size: u64, stream: u64, small: bool) -> Option<u32> {
        if self.opts.garbage_collection() {
            self.free_searches[small as usize] += 1;
        }
        let &(s, bsize, _, i) = self.pools[small as usize]
            .range((stream, size, 0, 0)..)
            .next()?;
        let max_split = self.max_split();
        if s != stream
            || (size < max_split && bsize >= max_split)
            || (size >= max_split && bsize >= size.saturating_add(self.opts.max_non_split_rounding))
        {
            return None;
        }
        Some(i)
    }

    /// Hands out block `i` (not in a free set) for `size` bytes, splitting off the rest if
    /// `should_split` says so.
    fn alloc_found(&mut self, i: u32, size: u64) -> u32 {
        let b = self.blocks[i as usize];
        let seg = &self.segs[b.seg as usize];
        let remaining = b.size - size;
        let split = if seg.small || seg.expandable {
            remaining >= MIN_BLOCK
        } else {
            size < self.max_split() && remaining > SMALL_SIZE
        };
        if split {
            debug_assert!(
                b.state == State::Free,
                "a block found in a free set is free"
            );
            let rest = self.split_off(i, size);
            self.pool_insert(rest);
        }
        let blk = &mut self.blocks[i as usize];
        blk.state = State::Allocated;
        self.allocated += blk.size;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        i
    }

    /// `free_block`: merge with free neighbours of the same segment, back to the pool.
    fn free(&mut self, i: u32) {
        self.allocated -= self.blocks[i as usize].size;
        self.blocks[i as usize].state = State::Free;
        self.insert_free(i);
    }

    /// Block `i` (free, in no set) merges with its free neighbours; the result joins its pool
    /// and is returned (merges keep the leftmost block).
    fn insert_free(&mut self, mut i: u32) -> u32 {
        let prev = self.blocks[i as usize].prev;
        if prev != NONE && self.blocks[prev as usize].state == State::Free {
            self.pool_remove(prev);
            self.absorb_next(prev);
            i = prev;
        }
        let next = self.blocks[i as usize].next;
        if next != NONE && self.blocks[next as usize].state == State::Free {
            self.pool_remove(next);
            self.absorb_next(i);
        }
        self.pool_insert(i);
        i
    }

    /// Block `i` takes over its next block (both out of every set).
    fn absorb_next(&mut self, i: u32) {
        let n = self.blocks[i as usize].next;
        let nb = self.blocks[n as usize];
        let b = &mut self.blocks[i as usize];
        b.size += nb.size;
        b.next = nb.next;
        if nb.next != NONE {
            self.blocks[nb.next as usize].prev = i;
        }
        self.spare.push(n);
    }

    /// `alloc_block`: a new segment (cudaMalloc), or a mapping of an expandable segment.
    fn alloc_block(&mut self, size: u64, stream: u64, small: bool) -> Option<u32> {
        if self.opts.expandable_segments {
            return self.alloc_expandable(size, stream, small);
        }
        let len = allocation_size(size, self.opts.large_segment_size);
        if self.reserved + len > self.opts.limit() {
            return None;
        }
        self.add_reserved(len);
        self.created += 1;
        self.calls.mem_alloc += 1;
        self.calls.mem_alloc_bytes += len;
        let seg = self.segs.len() as u32;
        self.segs.push(Segment {
            stream,
            small,
            expandable: false,
            base: self.next_va,
            unmapped: BTreeSet::new(),
        });
        let b = self.new_block(Block {
            ptr: self.next_va,
            size: len,
            state: State::Free,
            prev: NONE,
            next: NONE,
            seg,
            gc_base: 0,
        });
        self.next_va += len.div_ceil(ROUND_LARGE) * ROUND_LARGE;
        Some(b)
    }

    fn is_whole_segment(&self, i: u32) -> bool {
        let b = &self.blocks[i as usize];
        b.prev == NONE && b.next == NONE && !self.segs[b.seg as usize].expandable
    }

    /// cudaFree of a whole cached segment.
    fn release_segment(&mut self, i: u32, episode: &mut bool) {
        self.sync_once(episode);
        self.pool_remove(i);
        self.reserved -= self.blocks[i as usize].size;
        self.released += 1;
        self.calls.mem_free += 1;
        self.calls.mem_free_bytes += self.blocks[i as usize].size;
        self.spare.push(i);
    }

    /// `release_available_cached_blocks`: with `max_split_size`, free cached oversize segments
    /// of this stream: the smallest one that covers the request, else the largest ones until
    /// their sum does.
    fn release_available_cached_blocks(
        &mut self,
        size: u64,
        stream: u64,
        small: bool,
        episode: &mut bool,
    ) -> bool {
        let Some(max_split) = self.opts.max_split_size else {
            return false;
        };
        let want = size.max(max_split);
        let pool = small as usize;
        let one = self.pools[pool]
            .range((stream, want, 0, 0)..(stream, u64::MAX, u64::MAX, u32::MAX))
            .map(|k| k.3)
            .find(|&i| self.is_whole_segment(i));
        if let Some(i) = one {
            self.release_segment(i, episode);
            return true;
        }
        let candidates: Vec<u32> = self.pools[pool]
            .range((stream, max_split, 0, 0)..(stream, want, 0, 0))
            .rev()
            .map(|k| k.3)
            .filter(|&i| self.is_whole_segment(i))
            .collect();
        let mut total = 0;
        for i in candidates {
            if total >= want {
                break;
            }
            total += self.blocks[i as usize].size;
            self.release_segment(i, episode);
        }
        total >= want
    }

    /// `release_cached_blocks`: free every unsplit cached segment and unmap every fully free
    /// chunk of the expandable segments.
    fn release_cached_blocks(&mut self, episode: &mut bool) {
        let free: Vec<u32> = self.pools.iter().flatten().map(|k| k.3).collect();
        for i in free {
            if self.is_whole_segment(i) {
                self.release_segment(i, episode);
            } else if self.segs[self.blocks[i as usize].seg as usize].expandable {
                self.unmap_free_chunks(i, episode);
            }
        }
    }

    /// `garbage_collect_cached_blocks`, before a miss goes to the driver: once reserved passes
    /// `threshold × allowed maximum`, free the unsplit cached segments of the large pool that
    /// are at least as old as their average (age: searches of the pool since the block joined
    /// it), in the pool's order, and again with the survivors' average, until the excess is
    /// reclaimed or nothing more goes. Expandable segments' blocks count towards the average and
    /// are never freed, as in PyTorch.
    fn garbage_collect(&mut self, episode: &mut bool) {
        let threshold = (self.opts.garbage_collection_threshold * self.opts.limit() as f64) as u64;
        if self.reserved <= threshold {
            return;
        }
        let target = self.reserved - threshold;
        let age = |n: &Self, i: u32| n.free_searches[0] - n.blocks[i as usize].gc_base;
        let unsplit = |n: &Self, i: u32| {
            let b = &n.blocks[i as usize];
            b.prev == NONE && b.next == NONE
        };
        let mut candidates: Vec<u32> = self.pools[0].iter().map(|k| k.3).collect();
        candidates.retain(|&i| unsplit(self, i));
        let mut total_age: u64 = candidates.iter().map(|&i| age(self, i)).sum();
        let mut count = candidates.len() as u64;
        let (mut reclaimed, mut freed) = (0u64, true);
        while reclaimed < target && freed && count > 0 {
            let average = total_age as f64 / count as f64;
            freed = false;
            for i in std::mem::take(&mut candidates) {
                let expandable = self.segs[self.blocks[i as usize].seg as usize].expandable;
                if !expandable && age(self, i) as f64 >= average {
                    freed = true;
                    reclaimed += self.blocks[i as usize].size;
                    total_age -= age(self, i);
                    count -= 1;
                    self.release_segment(i, episode);
                } else {
                    candidates.push(i);
                }
            }
        }
    }

    /// Expandable: a request on (stream, pool) maps the lowest run of free or unmapped space
    /// that holds it.
    fn alloc_expandable(&mut self, size: u64, stream: u64, small: bool) -> Option<u32> {
        let seg = self.expandable_segment(stream, small);
        let chunk = self.chunk(small);
        // The lowest run: starts at an unmapped block (or the free block just before it) and
        // goes on through free and unmapped blocks up to the next allocated one.
        let mut start = None;
        for &(_, u) in &self.segs[seg as usize].unmapped {
            let prev = self.blocks[u as usize].prev;
            let first = if prev != NONE && self.blocks[prev as usize].state == State::Free {
                prev
            } else {
                u
            };
            let (mut total, mut cur) = (0u64, first);
            while cur != NONE && self.blocks[cur as usize].state != State::Allocated {
                total += self.blocks[cur as usize].size;
                if total >= size {
                    start = Some(first);
                    break;
                }
                cur = self.blocks[cur as usize].next;
            }
            if start.is_some() {
                break;
            }
        }
        let start = start?;
        let start_ptr = self.blocks[start as usize].ptr;
        // Map what the request needs, chunk by chunk.
        let (mut acc, mut cur) = (0u64, start);
        while acc < size {
            let b = self.blocks[cur as usize];
            if b.state == State::Unmapped {
                let len = b.size.min((size - acc).div_ceil(chunk) * chunk);
                if self.reserved + len > self.opts.limit() {
                    return None;
                }
                // The mapped part merges into its free neighbours; merges keep the leftmost block.
                cur = self.map(cur, len);
                acc = self.blocks[cur as usize].ptr + self.blocks[cur as usize].size - start_ptr;
            } else {
                acc += b.size;
            }
            cur = self.blocks[cur as usize].next;
            if cur == NONE {
                break;
            }
        }
        // Every merge kept the leftmost block: `start` now spans the run.
        let first = start;
        if self.blocks[first as usize].size < size || self.blocks[first as usize].ptr != start_ptr {
            return None;
        }
        self.pool_remove(first);
        Some(first)
    }

    /// Maps the first `len` bytes of unmapped block `u`; returns the free block that holds them.
    fn map(&mut self, u: u32, len: u64) -> u32 {
        let b = self.blocks[u as usize];
        let seg = b.seg as usize;
        self.segs[seg].unmapped.remove(&(b.ptr, u));
        if len < b.size {
            let rest = self.new_block(Block {
                ptr: b.ptr + len,
                size: b.size - len,
                state: State::Unmapped,
                prev: u,
                next: b.next,
                seg: b.seg,
                gc_base: 0,
            });
            if b.next != NONE {
                self.blocks[b.next as usize].prev = rest;
            }
            self.blocks[u as usize].next = rest;
            self.blocks[u as usize].size = len;
            self.segs[seg].unmapped.insert((b.ptr + len, rest));
        }
        self.blocks[u as usize].state = State::Free;
        self.add_reserved(len);
        let chunks = len / self.chunk(self.segs[seg].small);
        self.created += chunks;
        // One handle per chunk, each created and mapped; one cuMemSetAccess for the range.
        self.calls.mem_create += chunks;
        self.calls.mem_create_bytes += len;
        self.calls.mem_map += chunks;
        self.calls.set_access += 1;
        self.calls.set_access_handles += chunks;
        self.insert_free(u)
    }

    /// Unmaps the whole chunks inside free block `i` of an expandable segment.
    fn unmap_free_chunks(&mut self, i: u32, episode: &mut bool) {
        let b = self.blocks[i as usize];
        let seg = b.seg as usize;
        let (base, chunk) = (self.segs[seg].base, self.chunk(self.segs[seg].small));
        let lo = base + (b.ptr - base).div_ceil(chunk) * chunk;
        let hi = base + (b.ptr + b.size - base) / chunk * chunk;
        if hi <= lo {
            return;
        }
        self.pool_remove(i);
        self.reserved -= hi - lo;
        self.released += (hi - lo) / chunk;
        // PyTorch synchronises the stream, then unmaps and releases each handle.
        self.sync_once(episode);
        self.calls.stream_synchronize += 1;
        self.calls.mem_unmap += (hi - lo) / chunk;
        self.calls.mem_release += (hi - lo) / chunk;
        self.calls.mem_release_bytes += hi - lo;
        // Cut [ptr, lo) | [lo, hi) | [hi, end).
        let mut mid = i;
        if lo > b.ptr {
            mid = self.split_off(i, lo - b.ptr);
            self.pool_insert(i);
        }
        if hi < b.ptr + b.size {
            let tail = self.split_off(mid, hi - lo);
            self.pool_insert(tail);
        }
        self.blocks[mid as usize].state = State::Unmapped;
        // Merge with unmapped neighbours.
        let mut u = mid;
        let prev = self.blocks[u as usize].prev;
        if prev != NONE && self.blocks[prev as usize].state == State::Unmapped {
            self.segs[seg]
                .unmapped
                .remove(&(self.blocks[prev as usize].ptr, prev));
            self.absorb_next(prev);
            u = prev;
        }
        let next = self.blocks[u as usize].next;
        if next != NONE && self.blocks[next as usize].state == State::Unmapped {
            self.segs[seg]
                .unmapped
                .remove(&(self.blocks[next as usize].ptr, next));
            self.absorb_next(u);
        }
        self.segs[seg]
            .unmapped
            .insert((self.blocks[u as usize].ptr, u));
    }

    /// Cuts block `i` (in no set) after `len` bytes; returns the new right part (same state).
    fn split_off(&mut self, i: u32, len: u64) -> u32 {
        let b = self.blocks[i as usize];
        let r = self.new_block(Block {
            ptr: b.ptr + len,
            size: b.size - len,
            state: b.state,
            prev: i,
            next: b.next,
            seg: b.seg,
            gc_base: 0,
        });
        if b.next != NONE {
            self.blocks[b.next as usize].prev = r;
        }
        let blk = &mut self.blocks[i as usize];
        blk.size = len;
        blk.next = r;
        r
    }

    /// The growable segment of (stream, pool), created on first use: address space of 9/8 of
    /// the device, all unmapped.
    fn expandable_segment(&mut self, stream: u64, small: bool) -> u32 {
        if let Some(&s) = self.expandable.get(&(stream, small)) {
            return s;
        }
        let chunk = self.chunk(small);
        let va = (self.opts.capacity / 8 * 9).div_ceil(chunk).max(1) * chunk;
        let seg = self.segs.len() as u32;
        let base = self.next_va.div_ceil(chunk) * chunk;
        let b = self.new_block(Block {
            ptr: base,
            size: va,
            state: State::Unmapped,
            prev: NONE,
            next: NONE,
            seg,
            gc_base: 0,
        });
        let mut unmapped = BTreeSet::new();
        unmapped.insert((base, b));
        self.segs.push(Segment {
            stream,
            small,
            expandable: true,
            base,
            unmapped,
        });
        self.next_va = base + va;
        self.calls.address_reserve += 1;
        self.expandable.insert((stream, small), seg);
        seg
    }
}

/// The emulation as a layer of the allocation stack ([`Resource`]), for the replay loop: the
/// "pointer" of a block it hands out is the emulation's block index (a handle: nothing is read
/// or written there), its number the count of allocations so far.
struct Emulated<'a>(RefCell<Native<'a>>);

impl Resource for Emulated<'_> {
    fn alloc(&self, req: &Request) -> Result<torch_arena::block::Block> {
        let n = &mut *self.0.borrow_mut();
        let (size, stream) = (req.size, req.stream);
        let before = (
            n.created,
            n.calls.mem_alloc_bytes + n.calls.mem_create_bytes,
        );
        let got = n.malloc(size, stream);
        let now = (
            n.created,
            n.calls.mem_alloc_bytes + n.calls.mem_create_bytes,
        );
        if got.is_some() {
            n.requested = n.requested.saturating_add(size);
        }
        if now.0 > before.0 {
            let g = match n.requested <= n.requested_high {
                true => &mut n.growth.below_peak,
                false => &mut n.growth.at_peak,
            };
            g.handles += now.0 - before.0;
            g.bytes += now.1.saturating_sub(before.1);
        }
        n.requested_high = n.requested_high.max(n.requested);
        match got {
            Some(b) => {
                n.handed += 1;
                Ok(torch_arena::block::Block {
                    ptr: b as u64,
                    size: n.blocks[b as usize].size,
                    seq: n.handed,
                })
            }
            None => Err(Error::OutOfMemory(format!(
                "the emulated native allocator cannot allocate {size} bytes on stream {stream}"
            ))),
        }
    }

    fn free(&self, b: DevPtr, size: u64, _stream: StreamId) -> Result<()> {
        let n = &mut *self.0.borrow_mut();
        n.requested = n.requested.saturating_sub(size);
        n.free(b as u32);
        Ok(())
    }

    fn reserved(&self) -> u64 {
        self.0.borrow().reserved
    }
}

impl Replayed for Emulated<'_> {
    fn allocated(&self) -> u64 {
        self.0.borrow().allocated
    }

    fn take_peak_reserved(&self) -> u64 {
        let n = &mut *self.0.borrow_mut();
        std::mem::replace(&mut n.step_peak, n.reserved)
    }

    fn counters(&self) -> DriverCounters {
        self.0.borrow().calls
    }

    fn stall_ns(&self) -> u64 {
        let n = self.0.borrow();
        n.syncs.saturating_mul(n.lag_ns)
    }

    fn growth(&self) -> Option<GrowthCounts> {
        Some(self.0.borrow().growth)
    }

    fn advance_to(&self, _now_ns: u64) {}

    fn gpu_use(&self, _b: DevPtr, _size: u64, _stream: StreamId, _due_ns: u64) {}
}

/// Emulate the native allocator on `trace`, one pass and no GPU lag. Frees of ids never
/// allocated are skipped; an allocation that cannot be met ends the emulation (`oom_event`).
/// `Err` only for a trace the replay loop refuses (an id allocated twice while live).
pub fn simulate(trace: &Trace, opts: &NativeOptions) -> Result<NativeResult> {
    simulate_timed(trace, opts, &Timing::default(), &mut |_, _| {})
}

/// Emulate the native allocator on `trace` under `timing` (steps, GPU lag, driver costs), in the
/// same replay loop as the arena's.
pub fn simulate_timed(
    trace: &Trace,
    opts: &NativeOptions,
    timing: &Timing,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<NativeResult> {
    let mut n = Native::new(opts);
    n.lag_ns = timing.gpu_lag_ns;
    let emulated = Emulated(RefCell::new(n));
    let replay = super::replay::run(trace, &emulated, timing, opts.series_points, progress)?;
    let n = emulated.0.into_inner();
    Ok(NativeResult {
        oom_event: replay.oom.as_ref().map(|o| o.event),
        replay,
        peak_allocated: n.peak_allocated,
        segments_created: n.created,
        segments_released: n.released,
        alloc_retries: n.retries,
        final_reserved: n.reserved,
    })
}

/// The native reserved bytes the trace itself recorded, as plot points (`None` if not recorded).
pub fn recorded_series(trace: &Trace, points: usize) -> Option<Vec<Point>> {
    let native = trace.native.as_ref()?;
    let mut series = SeriesBuilder::new(trace.events.len(), points);
    let mut changes = native.changes.iter().peekable();
    let (mut reserved, mut requested) = (native.initial, 0u64);
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    for (i, e) in trace.events.iter().enumerate() {
        while let Some(&&(at, bytes)) = changes.peek() {
            if at > i {
                break;
            }
            reserved = bytes;
            changes.next();
        }
        match e.op {
            Op::Alloc => {
                sizes.insert(e.id, e.size);
                requested = requested.saturating_add(e.size);
            }
            Op::Free => {
                if let Some(s) = sizes.remove(&e.id) {
                    requested = requested.saturating_sub(s);
                }
            }
        }
        series.push(i, requested, reserved, 0);
    }
    Some(series.finish())
}
