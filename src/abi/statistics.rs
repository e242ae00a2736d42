//! Statistics, the summary text and reclaim reports.

use super::shared::*;

// Queries for the Python package.

/// `(key, value)` pairs of `stats`, in `STAT_KEYS` order (sorted, as `torch.cuda.memory_stats()` orders them).
fn stats_flatten(stats: &DeviceStats) -> Vec<(String, i64)> {
    crate::stats::keys::flatten(stats)
}

/// Number of `memory_stats` keys (122), or -1 on an internal error.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_stats_count() -> i64 {
    guarded("torch_arena_stats_count", || Ok(STAT_KEYS.len() as i64)).unwrap_or(-1)
}

/// Key `i` (0-based, sorted order) as a static NUL-terminated string; NULL when out of range.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_stats_key(i: i64) -> *const c_char {
    guarded("torch_arena_stats_key", || {
        usize::try_from(i)
            .ok()
            .and_then(|i| STAT_KEYS.get(i))
            .map(|k| k.as_ptr())
            .ok_or_else(|| {
                Failure::invalid(format!(
                    "torch_arena_stats_key({i}): expected 0..{}",
                    STAT_KEYS.len()
                ))
            })
    })
    .unwrap_or(std::ptr::null())
}

/// Fill `values[0..count)` with device `device`'s statistics in key order. `n` must be at least
/// `torch_arena_stats_count()`; entries past the count are left alone.
///
/// # Safety
/// `values` is NULL or valid for `n` `int64_t` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_stats(device: c_int, values: *mut i64, n: usize) -> c_int {
    status("torch_arena_stats", || {
        let count = STAT_KEYS.len();
        if values.is_null() {
            return Err(Failure::invalid("torch_arena_stats: values is NULL"));
        }
        if n < count {
            return Err(Failure::invalid(format!(
                "torch_arena_stats: the buffer holds {n} values, {count} are needed (torch_arena_stats_count)"
            )));
        }
        let inst = instance()?;
        let r = inst.stats(device);
        watch_device(inst, device, &r);
        let flat = stats_flatten(&r?);
        if flat.len() != count
            || flat
                .iter()
                .zip(STAT_KEYS.iter())
                .any(|((k, _), key)| k.as_bytes() != key.as_bytes())
        {
            return Err(Failure::new(
                TORCH_ARENA_ERR_OTHER,
                "torch-arena internal error: the flattened stats do not match the key list",
            ));
        }
        // SAFETY: non-null and valid for n >= count writes by the caller's contract.
        let out = unsafe { std::slice::from_raw_parts_mut(values, count) };
        for (slot, (_, v)) in out.iter_mut().zip(flat) {
            *slot = v;
        }
        Ok(())
    })
}

/// `memory_summary()` text of `device` into `buf` (snprintf style: NUL-terminated, truncated to
/// `cap`, full length returned). 0 means failure (last error set; `buf` gets "").
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_summary(
    device: c_int,
    abbreviated: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    let text = guarded("torch_arena_summary", || {
        let inst = instance()?;
        let r = inst.summary(device, abbreviated != 0);
        watch_device(inst, device, &r);
        Ok(r?)
    });
    // SAFETY: the caller's contract.
    unsafe { copy_out(text.as_deref().unwrap_or(""), buf, cap) }
}

/// `reset_peak_memory_stats(device)`: 0 or an error code.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_reset_peak_stats(device: c_int) -> c_int {
    status("torch_arena_reset_peak_stats", || {
        let inst = instance()?;
        let r = inst.reset_peak_stats(device);
        watch_device(inst, device, &r);
        Ok(r?)
    })
}

/// `reset_accumulated_memory_stats(device)`: 0 or an error code.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_reset_accumulated_stats(device: c_int) -> c_int {
    status("torch_arena_reset_accumulated_stats", || {
        let inst = instance()?;
        let r = inst.reset_accumulated_stats(device);
        watch_device(inst, device, &r);
        Ok(r?)
    })
}

/// `torch_arena_growth` in the header: the memory a device's arena created since it started,
/// by what the request it served did to the bytes requested ([`crate::arena::GrowthCounts`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TorchArenaGrowth {
    pub at_peak_handles: u64,
    pub at_peak_bytes: u64,
    pub below_peak_handles: u64,
    pub below_peak_bytes: u64,
}

/// The memory `device`'s arena created, into `*out`. 0 or an error code (`out` NULL:
/// `TORCH_ARENA_ERR_INVALID_ARGUMENT`).
///
/// # Safety
/// `out` is NULL or valid for one `torch_arena_growth` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_growth(device: c_int, out: *mut TorchArenaGrowth) -> c_int {
    status("torch_arena_growth", || {
        if out.is_null() {
            return Err(Failure::invalid("torch_arena_growth: out is NULL"));
        }
        let inst = instance()?;
        let r = inst.growth(device);
        watch_device(inst, device, &r);
        let g = r?;
        let v = TorchArenaGrowth {
            at_peak_handles: g.at_peak.handles,
            at_peak_bytes: g.at_peak.bytes,
            below_peak_handles: g.below_peak.handles,
            below_peak_bytes: g.below_peak.bytes,
        };
        // SAFETY: non-null, valid by the caller's contract.
        unsafe { *out = v };
        Ok(())
    })
}

/// `torch_arena_pages` in the header: where a device's physical memory is, in bytes
/// ([`crate::arena::PageCounts`]): the four add up to what it holds reserved.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TorchArenaPages {
    pub page_size: u64,
    pub in_use_bytes: u64,
    pub idle_mapped_bytes: u64,
    pub held_bytes: u64,
    pub pooled_bytes: u64,
    /// What the arena may hold reserved: the device's capacity, or its memory fraction of it.
    pub limit_bytes: u64,
    /// The device's free bytes, as the driver reports them (0 where it cannot say).
    pub device_free_bytes: u64,
}

/// Where `device`'s physical memory is, into `*out`. 0 or an error code (`out` NULL:
/// `TORCH_ARENA_ERR_INVALID_ARGUMENT`).
///
/// # Safety
/// `out` is NULL or valid for one `torch_arena_pages` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_pages(device: c_int, out: *mut TorchArenaPages) -> c_int {
    status("torch_arena_pages", || {
        if out.is_null() {
            return Err(Failure::invalid("torch_arena_pages: out is NULL"));
        }
        let inst = instance()?;
        let r = inst.pages(device);
        watch_device(inst, device, &r);
        let p = r?;
        let (limit_bytes, device_free_bytes) = inst.limits(device)?;
        let bytes = |n: u64| n.saturating_mul(p.page_size);
        let v = TorchArenaPages {
            page_size: p.page_size,
            in_use_bytes: bytes(p.in_use),
            idle_mapped_bytes: bytes(p.idle_mapped),
            held_bytes: bytes(p.held),
            pooled_bytes: bytes(p.pooled),
            limit_bytes,
            device_free_bytes,
        };
        // SAFETY: non-null, valid by the caller's contract.
        unsafe { *out = v };
        Ok(())
    })
}

/// Return empty slabs and idle ranges of `device` to the page pool; what was recovered goes to
/// `*out`. 0 or an error code (`out` NULL: `TORCH_ARENA_ERR_INVALID_ARGUMENT`, nothing done).
///
/// # Safety
/// `out` is NULL or valid for one `torch_arena_reclaim_report` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_defragment(
    device: c_int,
    out: *mut TorchArenaReclaimReport,
) -> c_int {
    status("torch_arena_defragment", || {
        if out.is_null() {
            return Err(Failure::invalid("torch_arena_defragment: out is NULL"));
        }
        let inst = instance()?;
        let r = inst.defragment(device);
        watch_device(inst, device, &r);
        let r = r?;
        tracing::debug!("defragment(device {device}): {}", reclaim_text(&r));
        // SAFETY: non-null, valid by the caller's contract.
        unsafe { *out = r };
        Ok(())
    })
}

/// `empty_cache` on every open device, saying what was recovered in `*out`. 0 or an error code.
///
/// # Safety
/// `out` is NULL or valid for one `torch_arena_reclaim_report` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_empty_cache_report(
    out: *mut TorchArenaReclaimReport,
) -> c_int {
    status("torch_arena_empty_cache_report", || {
        if out.is_null() {
            return Err(Failure::invalid(
                "torch_arena_empty_cache_report: out is NULL",
            ));
        }
        let r = instance()?.empty_cache()?;
        tracing::debug!("empty_cache: {}", reclaim_text(&r));
        // SAFETY: non-null, valid by the caller's contract.
        unsafe { *out = r };
        Ok(())
    })
}
