//! The flat key space of `torch.cuda.memory_stats()` (torch 2.11): names, order and values.
//!
//! This file owns the mapping from a [`DeviceStats`] to the 122 `(key, value)` pairs PyTorch's
//! Python layer returns: the 9 stat arrays × {all, small_pool, large_pool} × {current, peak,
//! allocated, freed}, the 2 single stats `oversize_allocations` / `oversize_segments` × the same 4
//! fields, and the 6 scalars. Keys are joined with `.` and sorted the way Python sorts `str`
//! (by code point; every key is ASCII, so byte order), because torch returns a sorted
//! `OrderedDict`.
//!
//! # `max_split_size`
//!
//! PyTorch keeps `max_split_size` as an `int64_t` set with
//! `static_cast<int64_t>(max_split_size())`, so its "no limit" value `SIZE_MAX` reaches Python as
//! **`-1`** (that is what `torch.cuda.memory_stats()["max_split_size"]` shows by default).
//! [`DeviceStats`] stores "no limit" as `i64::MAX`; this module reports it as `-1`, exactly as
//! torch does, so the Python layer passes every value through unchanged. Any other value is
//! reported as stored.

use once_cell::sync::Lazy;

use super::{DeviceStats, Stat, StatArray};

/// Number of keys `torch.cuda.memory_stats()` returns in torch 2.11.
pub const NUM_KEYS: usize = 122;

/// What `max_split_size` reports when there is no limit (`static_cast<int64_t>(SIZE_MAX)`).
pub const NO_MAX_SPLIT_SIZE: i64 = -1;

/// Where a key's value lives in [`DeviceStats`].
#[derive(Clone, Copy)]
enum Source {
    /// One of the 9 stat arrays; `pool` indexes `[all, small_pool, large_pool]`.
    Array {
        array: ArrayFn,
        pool: usize,
        field: FieldFn,
    },
    /// `oversize_allocations` / `oversize_segments`.
    Single { stat: StatFn, field: FieldFn },
    /// A scalar counter.
    Scalar(ScalarFn),
}

impl Source {
    fn read(self, s: &DeviceStats) -> i64 {
        match self {
            Source::Array { array, pool, field } => field(&array(s).0[pool]),
            Source::Single { stat, field } => field(stat(s)),
            Source::Scalar(f) => f(s),
        }
    }
}

type ArrayFn = fn(&DeviceStats) -> &StatArray;
type StatFn = fn(&DeviceStats) -> &Stat;
type FieldFn = fn(&Stat) -> i64;
type ScalarFn = fn(&DeviceStats) -> i64;

const ARRAYS: [(&str, ArrayFn); 9] = [
    ("allocation", |s| &s.allocation),
    ("segment", |s| &s.segment),
    ("active", |s| &s.active),
    ("inactive_split", |s| &s.inactive_split),
    ("allocated_bytes", |s| &s.allocated_bytes),
    ("reserved_bytes", |s| &s.reserved_bytes),
    ("active_bytes", |s| &s.active_bytes),
    ("inactive_split_bytes", |s| &s.inactive_split_bytes),
    ("requested_bytes", |s| &s.requested_bytes),
];

/// `statArrayToDict` order: AGGREGATE, SMALL_POOL, LARGE_POOL (the indices of [`StatArray`]).
const POOLS: [&str; 3] = ["all", "small_pool", "large_pool"];

const SINGLES: [(&str, StatFn); 2] = [
    ("oversize_allocations", |s| &s.oversize_allocations),
    ("oversize_segments", |s| &s.oversize_segments),
];

const FIELDS: [(&str, FieldFn); 4] = [
    ("current", |s| s.current),
    ("peak", |s| s.peak),
    ("allocated", |s| s.allocated),
    ("freed", |s| s.freed),
];

const SCALARS: [(&str, ScalarFn); 6] = [
    ("num_alloc_retries", |s| s.num_alloc_retries),
    ("num_ooms", |s| s.num_ooms),
    ("max_split_size", |s| {
        if s.max_split_size == i64::MAX {
            NO_MAX_SPLIT_SIZE
        } else {
            s.max_split_size
        }
    }),
    ("num_sync_all_streams", |s| s.num_sync_all_streams),
    ("num_device_alloc", |s| s.num_device_alloc),
    ("num_device_free", |s| s.num_device_free),
];

/// Every key with where its value lives, sorted by key.
static TABLE: Lazy<Vec<(String, Source)>> = Lazy::new(|| {
    let mut t = Vec::with_capacity(NUM_KEYS);
    for (name, array) in ARRAYS {
        for (pool, pool_name) in POOLS.iter().enumerate() {
            for (field_name, field) in FIELDS {
                t.push((
                    format!("{name}.{pool_name}.{field_name}"),
                    Source::Array { array, pool, field },
                ));
            }
        }
    }
    for (name, stat) in SINGLES {
        for (field_name, field) in FIELDS {
            t.push((
                format!("{name}.{field_name}"),
                Source::Single { stat, field },
            ));
        }
    }
    for (name, f) in SCALARS {
        t.push((name.to_string(), Source::Scalar(f)));
    }
    t.sort_by(|a, b| a.0.cmp(&b.0));
    debug_assert_eq!(t.len(), NUM_KEYS);
    t
});

/// All 122 `(key, value)` pairs of `torch.cuda.memory_stats()`, sorted by key as torch returns
/// them. `max_split_size` is `-1` when there is no limit (see the module docs).
pub fn flatten(stats: &DeviceStats) -> Vec<(String, i64)> {
    TABLE
        .iter()
        .map(|(k, src)| (k.clone(), src.read(stats)))
        .collect()
}

/// The 122 key names, in the order of [`flatten`].
pub fn key_names() -> Vec<String> {
    TABLE.iter().map(|(k, _)| k.clone()).collect()
}

/// The value of one key, as [`flatten`] reports it; `None` for a name torch does not have.
pub fn get(stats: &DeviceStats, key: &str) -> Option<i64> {
    TABLE
        .binary_search_by(|(k, _)| k.as_str().cmp(key))
        .ok()
        .map(|i| TABLE[i].1.read(stats))
}
