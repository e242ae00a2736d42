//! The device layer: where bytes come from.
//!
//! One small trait, [`Device`], with two implementations:
//! - [`cuda::CudaDevice`]: the CUDA driver API through `cudarc::driver::sys`, loaded at run time;
//! - [`sim::SimDevice`]: a simulated GPU with a capacity and a granularity, optionally backed by
//!   real host pages (memfd + mmap) so tests can write into every allocation.
//!
//! The arena above speaks only this trait. Every call is a *driver-like* call: it may be slow
//! (hundreds of microseconds on a real GPU) and may fail; none of them is on the cache-hit path.
//!
//! Invariants the arena relies on:
//! - `map_run` places pieces of physical handles ([`Piece`]: a handle, an offset, a size) at
//!   page-aligned virtual addresses inside a range returned by `reserve`, and makes them readable
//!   and writable by the device (cuMemMap + cuMemSetAccess). A handle may be mapped in several
//!   pieces at once; `unmap` takes whole mappings (pieces), never part of one.
//! - A physical byte may be mapped at several addresses at once (CUDA allows it); the arena does
//!   so only to lend idle pages at the limit, and never places two live allocations on one.
//! - An event recorded on a stream completes only after all work queued on that stream before the
//!   record has completed.

pub mod costs;
pub mod cuda;
pub mod sim;

/// Most devices one process may address (CUDA's own limit is far below this).
pub const MAX_DEVICES: usize = 64;

use std::fmt;

/// A CUDA stream as PyTorch passes it (`cudaStream_t` as an integer). 0 is the legacy default stream.
pub type StreamId = u64;

/// A device virtual address.
pub type DevPtr = u64;

/// An opaque handle to one physical page (`CUmemGenericAllocationHandle` on CUDA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageHandle(pub u64);

/// `size` bytes of a physical handle from byte `offset` on: what one cuMemMap maps. A handle may
/// be mapped in several pieces at once, at different addresses, as long as no two pieces of it
/// overlap (the arena maps each physical byte at most once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub page: PageHandle,
    pub offset: u64,
    pub size: u64,
}

impl Piece {
    /// The whole of a handle of `size` bytes.
    pub fn whole(page: PageHandle, size: u64) -> Piece {
        Piece {
            page,
            offset: 0,
            size,
        }
    }
}

/// An opaque event handle (`CUevent` on CUDA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventHandle(pub u64);

/// What a device is, read once when it is opened.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Device ordinal, as PyTorch numbers it.
    pub ordinal: i32,
    /// Human-readable name ("sim", "NVIDIA H100 80GB HBM3", ...).
    pub name: String,
    /// Total device memory in bytes.
    pub total_bytes: u64,
    /// Physical allocation granularity (`CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`), a power of two.
    pub granularity: u64,
    /// Whether the device supports virtual memory management (cuMemCreate/cuMemMap).
    /// Without it the arena falls back to plain `alloc_plain`/`free_plain` segments.
    pub vmm: bool,
}

/// Counts of driver-like calls, kept by each device implementation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCounters {
    pub address_reserve: u64,
    pub address_free: u64,
    pub mem_create: u64,
    pub mem_release: u64,
    pub mem_map: u64,
    pub mem_unmap: u64,
    pub set_access: u64,
    pub mem_alloc: u64,
    pub mem_free: u64,
    pub event_create: u64,
    pub event_destroy: u64,
    pub event_record: u64,
    pub event_query: u64,
    pub event_synchronize: u64,
    pub stream_synchronize: u64,
    pub device_synchronize: u64,
    pub mem_get_info: u64,
    /// Handles covered by the `set_access` calls (not a call kind of its own). One
    /// cuMemSetAccess over a run of k handles costs about k single grants on a GPU (measured on
    /// an H200 by `bench/driver_costs.py`), so the cost model prices grants by handle.
    pub set_access_handles: u64,
    /// Bytes created, released, allocated (cuMemAlloc) and freed (cuMemFree). On an H200 these
    /// calls take longer the larger they are (cuMemFree: 30 µs at 2 MiB, 388 at 1 GiB), so the
    /// cost model may price a byte term. Counted where the lab prices them: the simulated
    /// device, the native emulation and a snapshot's recorded segment events; the CUDA device
    /// leaves them 0.
    pub mem_create_bytes: u64,
    pub mem_release_bytes: u64,
    pub mem_alloc_bytes: u64,
    pub mem_free_bytes: u64,
}

impl DriverCounters {
    /// `(name, value)` pairs in a fixed order, for reports and the summary.
    pub fn entries(&self) -> [(&'static str, u64); 17] {
        [
            ("cuMemAddressReserve", self.address_reserve),
            ("cuMemAddressFree", self.address_free),
            ("cuMemCreate", self.mem_create),
            ("cuMemRelease", self.mem_release),
            ("cuMemMap", self.mem_map),
            ("cuMemUnmap", self.mem_unmap),
            ("cuMemSetAccess", self.set_access),
            ("cuMemAlloc", self.mem_alloc),
            ("cuMemFree", self.mem_free),
            ("cuEventCreate", self.event_create),
            ("cuEventDestroy", self.event_destroy),
            ("cuEventRecord", self.event_record),
            ("cuEventQuery", self.event_query),
            ("cuEventSynchronize", self.event_synchronize),
            ("cuStreamSynchronize", self.stream_synchronize),
            ("cuCtxSynchronize", self.device_synchronize),
            ("cuMemGetInfo", self.mem_get_info),
        ]
    }

    /// Total number of calls.
    pub fn total(&self) -> u64 {
        self.entries().iter().map(|(_, v)| v).sum()
    }

    /// Mutable references to the counts, in the order of [`DriverCounters::entries`].
    fn fields_mut(&mut self) -> [&mut u64; 17] {
        [
            &mut self.address_reserve,
            &mut self.address_free,
            &mut self.mem_create,
            &mut self.mem_release,
            &mut self.mem_map,
            &mut self.mem_unmap,
            &mut self.set_access,
            &mut self.mem_alloc,
            &mut self.mem_free,
            &mut self.event_create,
            &mut self.event_destroy,
            &mut self.event_record,
            &mut self.event_query,
            &mut self.event_synchronize,
            &mut self.stream_synchronize,
            &mut self.device_synchronize,
            &mut self.mem_get_info,
        ]
    }

    /// The figures kept beside the calls: handles granted, then the byte counts.
    pub fn extras(&self) -> [u64; 5] {
        [
            self.set_access_handles,
            self.mem_create_bytes,
            self.mem_release_bytes,
            self.mem_alloc_bytes,
            self.mem_free_bytes,
        ]
    }

    fn extras_mut(&mut self) -> [&mut u64; 5] {
        [
            &mut self.set_access_handles,
            &mut self.mem_create_bytes,
            &mut self.mem_release_bytes,
            &mut self.mem_alloc_bytes,
            &mut self.mem_free_bytes,
        ]
    }

    /// The bytes behind a call kind's calls, for the kinds that count them.
    pub fn bytes_of(&self, kind: &str) -> Option<u64> {
        match kind {
            "cuMemCreate" => Some(self.mem_create_bytes),
            "cuMemRelease" => Some(self.mem_release_bytes),
            "cuMemAlloc" => Some(self.mem_alloc_bytes),
            "cuMemFree" => Some(self.mem_free_bytes),
            _ => None,
        }
    }

    /// The calls made since `earlier` (a snapshot of the same counters), kind by kind.
    pub fn since(&self, earlier: &DriverCounters) -> DriverCounters {
        let mut out = *self;
        for (f, (_, e)) in out.fields_mut().into_iter().zip(earlier.entries()) {
            *f = f.saturating_sub(e);
        }
        for (f, e) in out.extras_mut().into_iter().zip(earlier.extras()) {
            *f = f.saturating_sub(e);
        }
        out
    }

    /// Adds `other`'s counts to these, kind by kind.
    pub fn add(&mut self, other: &DriverCounters) {
        for (f, (_, o)) in self.fields_mut().into_iter().zip(other.entries()) {
            *f = f.saturating_add(o);
        }
        for (f, o) in self.extras_mut().into_iter().zip(other.extras()) {
            *f = f.saturating_add(o);
        }
    }

    /// Calls that create, map, unmap or free device memory (everything but events,
    /// synchronisation and cuMemGetInfo): the ones a warm allocator should not make.
    pub fn memory_calls(&self) -> u64 {
        self.entries()[..9].iter().map(|(_, v)| v).sum()
    }
}

/// A driver-level failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// The device has no memory left for this request (CUDA_ERROR_OUT_OF_MEMORY).
    OutOfMemory,
    /// No usable driver: the library is missing, is a stub, or failed to initialise.
    NoDriver(String),
    /// Any other driver error: the call that failed and what the driver said.
    Driver {
        call: &'static str,
        code: i32,
        message: String,
    },
    /// The caller broke the device contract (e.g. unmapping a range that is not mapped).
    Misuse(String),
    /// A CUDA call in a process forked from one that used CUDA (`crate::fork`): its context
    /// does not survive `fork()`.
    ForkedChild,
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::OutOfMemory => write!(f, "device out of memory"),
            DeviceError::NoDriver(why) => write!(f, "no usable CUDA driver: {why}"),
            DeviceError::Driver {
                call,
                code,
                message,
            } => {
                write!(f, "{call} failed with CUDA error {code}: {message}")
            }
            DeviceError::Misuse(what) => write!(f, "device misuse: {what}"),
            DeviceError::ForkedChild => f.write_str(
                "CUDA cannot be used in a forked child process: this process was forked from one \
                 that had initialised CUDA, and a CUDA context does not survive fork(). To use \
                 CUDA with multiprocessing, use the 'spawn' start method \
                 (multiprocessing.set_start_method('spawn'), or \
                 DataLoader(..., multiprocessing_context='spawn')); memory inherited from the \
                 parent may still be freed",
            ),
        }
    }
}

impl std::error::Error for DeviceError {}

pub type DeviceResult<T> = Result<T, DeviceError>;

/// A [`Device::map_run`] that failed: why, and how many leading handles of the run are still
/// mapped (and accessible); the others are not mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapRunError {
    pub error: DeviceError,
    pub mapped: usize,
}

/// The protocol of [`Device::map_run`], one place for every implementation: `map` each handle
/// at consecutive addresses from `va` until one fails, then `grant` access to what was mapped (a
/// range of `len` bytes from `va`, covering `handles` mappings); if the grant fails, `undo` that
/// range (true when it is unmapped again). Each step gets `cx`, the implementation's state (its
/// lock guard, say).
pub(crate) fn map_run_with<C>(
    cx: &mut C,
    va: DevPtr,
    handles: &[Piece],
    mut map: impl FnMut(&mut C, DevPtr, Piece) -> DeviceResult<()>,
    grant: impl FnOnce(&mut C, DevPtr, u64, u64) -> DeviceResult<()>,
    undo: impl FnOnce(&mut C, DevPtr, u64) -> bool,
) -> Result<(), MapRunError> {
    let mut at = va;
    let mut failed = None;
    for (i, &piece) in handles.iter().enumerate() {
        if let Err(e) = map(cx, at, piece) {
            failed = Some((e, i));
            break;
        }
        at += piece.size;
    }
    let mapped = failed.as_ref().map_or(handles.len(), |f| f.1);
    if mapped > 0
        && let Err(e) = grant(cx, va, at - va, mapped as u64)
    {
        // Leave nothing inaccessible: the range goes back to reserved-but-unmapped, or, if the
        // driver refuses that too, is reported mapped so it is never taken for unmapped memory.
        let kept = if undo(cx, va, at - va) { 0 } else { mapped };
        let error = failed.map_or(e, |f| f.0);
        return Err(MapRunError {
            error,
            mapped: kept,
        });
    }
    match failed {
        Some((error, mapped)) => Err(MapRunError { error, mapped }),
        None => Ok(()),
    }
}

/// The operations the arena needs from a GPU. Implementations are thread-safe; the arena calls
/// them with its own lock held, so they must never call back into the arena.
pub trait Device: Send + Sync {
    /// Static facts about the device.
    fn info(&self) -> &DeviceInfo;

    /// Before `fork()` (`crate::fork`), with the arena's lock held: takes the device's own
    /// locks, if any (the simulated device's state). The default has none.
    fn fork_prepare(&self) {}

    /// After `fork()`, in the parent (`child` false) or the child: gives back what
    /// [`Device::fork_prepare`] took. Called once after each `fork_prepare`, on its thread.
    fn fork_release(&self, _child: bool) {}

    /// `(free, total)` bytes as the driver sees them (cuMemGetInfo).
    fn mem_get_info(&self) -> DeviceResult<(u64, u64)>;

    /// Reserve `size` bytes of virtual address space aligned to `align` (both multiples of the
    /// granularity). Nothing is backed yet.
    fn reserve(&self, size: u64, align: u64) -> DeviceResult<DevPtr>;
    /// Give back a reservation made by `reserve`. Every page in it must be unmapped.
    fn free_address(&self, va: DevPtr, size: u64) -> DeviceResult<()>;

    /// Create one physical page of `size` bytes (a multiple of the granularity).
    fn create_page(&self, size: u64) -> DeviceResult<PageHandle>;
    /// Release a physical page. It must not be mapped anywhere.
    fn release_page(&self, page: PageHandle) -> DeviceResult<()>;
    /// Map `page` (of `size` bytes) at `va` and grant the device read/write access.
    fn map(&self, va: DevPtr, size: u64, page: PageHandle) -> DeviceResult<()> {
        self.map_run(va, &[Piece::whole(page, size)])
            .map_err(|e| e.error)
    }
    /// Map `handles` (pieces of handles: each a handle, an offset in it and a size) at
    /// consecutive addresses from `va`, and grant the
    /// device read/write access to the whole run: one cuMemMap per piece, then one
    /// cuMemSetAccess for the run (PyTorch grants access per contiguous range; on an H200 such a
    /// grant costs what one grant per handle would, so it saves calls, not time). On failure,
    /// says how many leading handles stay mapped, and accessible: the implementation grants
    /// access to what it mapped before the failure, or, if that fails too, unmaps it (a prefix
    /// that can be neither is reported mapped, so it is never taken for unmapped memory).
    fn map_run(&self, va: DevPtr, handles: &[Piece]) -> Result<(), MapRunError>;
    /// Unmap `size` bytes at `va`: a run of whole mappings. The physical pages stay alive.
    fn unmap(&self, va: DevPtr, size: u64) -> DeviceResult<()>;

    /// Fallback when `info().vmm` is false: a plain device allocation (cuMemAlloc).
    fn alloc_plain(&self, size: u64) -> DeviceResult<DevPtr>;
    /// Free a pointer returned by `alloc_plain` (cuMemFree).
    fn free_plain(&self, ptr: DevPtr) -> DeviceResult<()>;

    /// Create an event (timing disabled).
    fn create_event(&self) -> DeviceResult<EventHandle>;
    /// Destroy an event.
    fn destroy_event(&self, event: EventHandle) -> DeviceResult<()>;
    /// Record `event` on `stream`.
    fn record_event(&self, event: EventHandle, stream: StreamId) -> DeviceResult<()>;
    /// Whether every piece of work captured by the last record of `event` has completed.
    fn query_event(&self, event: EventHandle) -> DeviceResult<bool>;
    /// Block until `event` has completed.
    fn synchronize_event(&self, event: EventHandle) -> DeviceResult<()>;
    /// Block until all work queued on `stream` has completed.
    fn synchronize_stream(&self, stream: StreamId) -> DeviceResult<()>;
    /// Block until all work on the device (every stream) has completed.
    fn synchronize(&self) -> DeviceResult<()>;

    /// Driver-like calls made so far.
    fn counters(&self) -> DriverCounters;

    /// Whether `stream` is being captured into a CUDA graph now (`cuStreamIsCapturing`). Nothing
    /// stream-ordered (an event record, a stream synchronisation) may be issued on such a stream,
    /// and no device-wide synchronisation may run while one exists: on a GPU the call fails with
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the user's capture. Devices that
    /// cannot capture answer `false`.
    fn is_capturing(&self, _stream: StreamId) -> DeviceResult<bool> {
        Ok(false)
    }
}
