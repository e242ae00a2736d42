//! The CUDA graph pool hooks (private pools).

use super::shared::*;

// Private pools (CUDA graph capture). PyTorch's three pool hooks are C++ functions in the shim
// (cpp_shim/shim.cpp): begin takes a std::function the shim keeps and evaluates on every
// allocation; these are what the shim calls with the pool id split into its two halves.

/// [`status`] for calls whose caller discards the outcome (the shim's pool hooks): a failure is
/// also logged at `warn`, rate-limited, as a failed hook is.
fn logged_status(name: &str, f: impl FnOnce() -> Outcome<()>) -> c_int {
    status(name, || {
        f().inspect_err(|fail| {
            if !fail.logged {
                WARN_HOOK.report(&fail.msg)
            }
        })
    })
}

/// `beginAllocateToPool(device, (id0, id1), filter)` less the filter: pool `(id0, id1)` of
/// `device` is created (or shared, a use more) and recording. Fails if it is recording already.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_pool_begin(device: c_int, id0: u64, id1: u64) -> c_int {
    logged_status("torch_arena_pool_begin", || {
        let inst = instance()?;
        inst.begin_pool(device, (id0, id1)).map_err(|e| {
            Failure::with_context(
                &e,
                &format!("torch_arena_begin_allocate_to_pool(device={device}, id=({id0}, {id1}))"),
            )
        })
    })
}

/// `endAllocateToPool(device, (id0, id1))`: the pool stops recording and keeps its memory.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_pool_end(device: c_int, id0: u64, id1: u64) -> c_int {
    logged_status("torch_arena_pool_end", || {
        let inst = instance()?;
        inst.end_pool(device, (id0, id1)).map_err(|e| {
            Failure::with_context(
                &e,
                &format!("torch_arena_end_allocate_to_pool(device={device}, id=({id0}, {id1}))"),
            )
        })
    })
}

/// `releasePool(device, (id0, id1))`: one use of the pool ends; with none left its memory
/// returns to general use as it becomes free (after a device synchronisation proves its graphs
/// no longer run).
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_pool_release(device: c_int, id0: u64, id1: u64) -> c_int {
    logged_status("torch_arena_pool_release", || {
        let inst = instance()?;
        inst.release_pool(device, (id0, id1)).map_err(|e| {
            Failure::with_context(
                &e,
                &format!("torch_arena_release_pool(device={device}, id=({id0}, {id1}))"),
            )
        })
    })
}

/// `torch_arena_pool_info` in the header: what a private pool holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TorchArenaPoolInfo {
    pub use_count: u32,
    pub recording: u32,
    pub released: u32,
    pub states: u32,
    pub mapped_pages: u64,
    pub used_pages: u64,
}

/// What pool `(id0, id1)` of `device` holds, into `*out`. Returns 0, or
/// `TORCH_ARENA_ERR_BAD_POINTER` for a pool the device does not know (never begun, or released
/// and wholly given back; `*out` is zeroed).
///
/// # Safety
/// `out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_pool_info(
    device: c_int,
    id0: u64,
    id1: u64,
    out: *mut TorchArenaPoolInfo,
) -> c_int {
    status("torch_arena_pool_info", || {
        if out.is_null() {
            return Err(Failure::invalid("torch_arena_pool_info: out is NULL"));
        }
        let arena = instance()?.arena(device)?;
        let info = arena.pool_info((id0, id1));
        let v = info.map_or_else(TorchArenaPoolInfo::default, |i| TorchArenaPoolInfo {
            use_count: i.use_count,
            recording: i.recording as u32,
            released: i.released as u32,
            states: i.states,
            mapped_pages: i.mapped_pages,
            used_pages: i.used_pages,
        });
        // SAFETY: checked non-null; valid by the caller's contract.
        unsafe { *out = v };
        match info {
            Some(_) => Ok(()),
            None => Err(Failure::new(
                TORCH_ARENA_ERR_BAD_POINTER,
                format!("torch_arena_pool_info: device {device} has no pool ({id0}, {id1})"),
            )),
        }
    })
}

/// Whether `ptr` lies in the memory of a private pool of `device`: 1 (its id to `*id0`,
/// `*id1` when they are not NULL), 0 (not in a pool, or not ours), or a negative status code.
///
/// # Safety
/// `id0` and `id1` are NULL or valid for one write each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_pool_of(
    ptr: *mut c_void,
    device: c_int,
    id0: *mut u64,
    id1: *mut u64,
) -> c_int {
    let r = guarded("torch_arena_pool_of", || {
        let arena = instance()?.arena(device)?;
        Ok(arena.pool_of(dev_ptr(ptr)))
    });
    match r {
        Ok(Some((a, b))) => {
            // SAFETY: each is NULL or valid by the caller's contract.
            unsafe {
                if !id0.is_null() {
                    *id0 = a;
                }
                if !id1.is_null() {
                    *id1 = b;
                }
            }
            1
        }
        Ok(None) => 0,
        Err(code) => -code,
    }
}

// ---------------------------------------------------------------------------------------------
