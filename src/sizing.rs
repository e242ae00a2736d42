//! PyTorch's sizing rules for its native caching allocator (`c10/cuda/CUDACachingAllocator.cpp`:
//! `kMinBlockSize`, `kSmallSize`, `kSmallBuffer`, `kMinLargeAlloc`, `kRoundLarge`, `round_size`,
//! `get_allocation_size`): how a request is rounded and how large a segment it would take. One
//! leaf that both sides use: the arena prices its growth against what native would have paid
//! (`arena::accounting`), and the lab emulates native on a trace (`torch_arena_lab::native`).

/// `kMinBlockSize`: every block is a multiple of this.
pub const MIN_BLOCK: u64 = 512;
/// `kSmallSize`: the largest request of the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// `kSmallBuffer`: the size of small-pool segments.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// `kMinLargeAlloc`: requests below this take a `large_segment_size` segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// `kRoundLarge`: larger segments are rounded up to this.
pub const ROUND_LARGE: u64 = 2 << 20;
/// Default `large_segment_size` (formerly `kLargeBuffer`).
pub const LARGE_SEGMENT: u64 = 20 << 20;

/// `round_size` under PyTorch's default settings: at least 512 bytes, a multiple of 512
/// (the lab's `NativeOptions::round_size` applies `roundup_power2_divisions`).
pub fn round_size(size: u64) -> u64 {
    if size < MIN_BLOCK {
        MIN_BLOCK
    } else {
        size.div_ceil(MIN_BLOCK) * MIN_BLOCK
    }
}

/// `get_allocation_size`: the cudaMalloc size for a (rounded) request.
pub fn allocation_size(size: u64, large_segment_size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        large_segment_size
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}
