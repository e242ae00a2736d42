//! Synthetic traces. (Skeleton: the API; the body is being written.)

use super::Trace;

/// A trace on which the native allocator's policy runs out of memory at `capacity` while the
/// arena fits.
pub fn adversarial(capacity: u64) -> Trace {
    let _ = capacity;
    todo!("adversarial trace")
}

/// RMM's RANDOM_ALLOCATIONS_BENCH workload: `n` allocations, sizes uniform in [1, max_size],
/// 73 % allocate per step.
pub fn rmm_random(n: usize, max_size: u64, seed: u64) -> Trace {
    let _ = (n, max_size, seed);
    todo!("rmm random")
}
