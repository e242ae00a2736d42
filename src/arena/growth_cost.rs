//! What the arena's growth has cost so far, against native's ([`GrowthTime`]); counted by
//! `accounting.rs`, weighed by `growth.rs`.

use crate::device::costs::DriverCosts;

/// The modelled driver time of the arena's growth so far, beside what PyTorch's allocator would
/// have spent growing for the same requests, both priced at the lab's default latencies
/// ([`DriverCosts::default`], measured on an H200). What the arena weighs when a large block
/// takes the bytes requested to a new peak (`Inner::ahead_spare`): a handle costs more than a
/// cudaMalloc of the same bytes under about 360 MiB (a create, a map and a grant against one
/// call), so while its growth has cost more than native's would have, the arena grows ahead in
/// fewer, larger handles; once it costs less, it grows by what is asked and keeps the bytes.
///
/// Native's side is an estimate from the requests the arena grew for, with PyTorch's segment
/// sizes (`sizing::allocation_size`, which the lab's emulation uses too): a request of 10 MiB or
/// more (PyTorch's `kMinLargeAlloc`) is one cudaMalloc of its size rounded to 2 MiB; smaller
/// requests share PyTorch's segments (20 MiB for 1–10 MiB, 2 MiB for small ones), so they count
/// the bytes created for them at the price per byte of such a segment. A request the arena
/// serves with no new memory counts nothing on either side, though native might have grown
/// there: the estimate errs towards growing ahead. All of it is counted where memory is created,
/// off the path of a request that creates none.
#[derive(Clone, Debug)]
pub(super) struct GrowthTime {
    pub(super) prices: DriverCosts,
    /// Microseconds of the arena's creates, maps, grants (or plain cudaMallocs) and reservations.
    pub(super) ours_us: f64,
    /// Microseconds of the cudaMallocs PyTorch's allocator would have made.
    pub(super) native_us: f64,
    /// The request (`Inner::tick`) whose cudaMalloc `native_us` counted last: a large request
    /// that creates several handles counts once.
    pub(super) counted_request: u64,
}

impl GrowthTime {
    pub(super) fn new() -> GrowthTime {
        GrowthTime {
            prices: DriverCosts::default(),
            ours_us: 0.0,
            native_us: 0.0,
            counted_request: 0,
        }
    }
}
