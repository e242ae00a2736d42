//! The values every layer of the allocation stack passes: a [`Request`] going down, a [`Block`]
//! coming back, and the [`PoolId`] of a private pool with the [`PoolCall`]s made on it. A leaf: the arena, the layers around it
//! (`resource`), the tracker and the lab all use these, and it uses nothing of theirs.

use crate::device::{DevPtr, StreamId};

/// A PyTorch `MempoolId_t`: `std::pair<unsigned long long, unsigned long long>`.
pub type PoolId = (u64, u64);

/// One allocation request, as it goes down the stack.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// Bytes requested (> 0).
    pub size: u64,
    pub stream: StreamId,
    /// A private pool (CUDA graph capture), or general memory.
    pub pool: Option<PoolId>,
    /// The allocation site, captured before any lock (0: none).
    pub site: u32,
    /// The site's text, for a recorder that has not seen it yet (read before any lock too).
    pub site_label: Option<String>,
}

/// A block handed out by a [`Resource`](crate::resource::Resource) (the arena's `alloc`): where,
/// how large (the size class or the 512-byte rounding of the request), and its number among this
/// arena's allocations (rising in the order the arena's lock handed blocks out, so a layer above
/// can order allocations without a counter of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub ptr: DevPtr,
    pub size: u64,
    pub seq: u64,
}

/// A call on a private pool: PyTorch's `beginAllocateToPool`, `endAllocateToPool` and
/// `releasePool` (the capture filter stays in the C++ shim).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolCall {
    Begin,
    End,
    Release,
}
