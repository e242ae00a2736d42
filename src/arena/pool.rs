//! The private pools' records (what a pool holds; its id, `PoolId`, is in `block.rs`); what the
//! arena does with them is in `capture.rs`.

/// One private pool.
#[derive(Debug, Default)]
pub(super) struct PoolEntry {
    /// Captures (or `use_mem_pool` blocks) that began on this pool and have not released it.
    pub(super) use_count: u32,
    /// Between `begin_pool` and `end_pool`.
    pub(super) recording: bool,
    /// Every use released: the pool's memory goes back to general use as it becomes free.
    pub(super) released: bool,
    /// The pool's states, one per stream that allocated in it.
    pub(super) states: Vec<u32>,
}

/// What a pool holds, for tests and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolInfo {
    pub use_count: u32,
    pub recording: bool,
    pub released: bool,
    /// Stream states of the pool (streams that allocated in it and are not retired).
    pub states: u32,
    /// Pages mapped in the pool's address ranges (its memory, in use or cached for it).
    pub mapped_pages: u64,
    /// Of those, pages holding live blocks or slabs.
    pub used_pages: u64,
}
