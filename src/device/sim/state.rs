//! The simulated GPU's state: every record a device keeps (its configuration, the memory it
//! reserved, created and mapped, its streams and their queued work, planned failures, captures),
//! behind the device's one lock. Plain data; what the device does with it is in the files beside
//! this one, one concern each (`memory.rs`, `asynchrony.rs`, `faults.rs`, `capture.rs`), and the
//! `Device` calls in `mod.rs`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use parking_lot::Mutex;

use crate::device::{DevPtr, DeviceError, DeviceInfo, DriverCounters, StreamId};

/// Where the fake address space of a device without backing starts (an address no host
/// allocation is likely to have, so a stray host write through it faults instead of corrupting).
pub const FAKE_VA_BASE: DevPtr = 0x7e00_0000_0000;

/// CUDA_ERROR_OUT_OF_MEMORY.
pub(super) const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
/// CUDA_ERROR_UNKNOWN.
pub(super) const CUDA_ERROR_UNKNOWN: i32 = 999;

/// How a simulated device is built.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub ordinal: i32,
    /// Device memory in bytes.
    pub capacity: u64,
    /// Physical allocation granularity in bytes, a power of two (a multiple of the host page
    /// size when `backing` is on).
    pub granularity: u64,
    /// Back every page and plain allocation with real host memory at the same address.
    pub backing: bool,
    /// Whether the VMM calls (reserve, create_page, map, ...) are supported.
    pub vmm: bool,
}

impl SimConfig {
    /// Device 0 with VMM support.
    pub fn new(capacity: u64, granularity: u64, backing: bool) -> SimConfig {
        SimConfig {
            ordinal: 0,
            capacity,
            granularity,
            backing,
            vmm: true,
        }
    }
}

/// The kinds of call whose failure can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimCall {
    /// `reserve` (cuMemAddressReserve): fails with `OutOfMemory` (address space spent; the cuda
    /// device reports CUDA_ERROR_OUT_OF_MEMORY from this call the same way).
    Reserve,
    /// `create_page` (cuMemCreate): fails with `OutOfMemory`.
    Create,
    /// `map`, its cuMemMap half: fails with `Driver { code: 999 }`.
    Map,
    /// `map`, its cuMemSetAccess half: fails with `Driver { code: 999 }`; nothing stays mapped.
    SetAccess,
    /// `alloc_plain` (cuMemAlloc): fails with `OutOfMemory`.
    AllocPlain,
    /// `create_event` (cuEventCreate): fails with `Driver { code: 2 }`.
    EventCreate,
    /// `free_plain` (cuMemFree): fails with `Driver { code: 999 }`; the allocation stays live.
    FreePlain,
}

impl SimCall {
    pub(super) const COUNT: usize = 7;

    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// The error an injected failure of this call returns.
    pub(super) fn injected_error(self) -> DeviceError {
        let driver = |call, code| DeviceError::Driver {
            call,
            code,
            message: "injected failure".to_string(),
        };
        match self {
            SimCall::Reserve | SimCall::Create | SimCall::AllocPlain => DeviceError::OutOfMemory,
            SimCall::Map => driver("cuMemMap", CUDA_ERROR_UNKNOWN),
            SimCall::SetAccess => driver("cuMemSetAccess", CUDA_ERROR_UNKNOWN),
            SimCall::EventCreate => driver("cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY),
            SimCall::FreePlain => driver("cuMemFree", CUDA_ERROR_UNKNOWN),
        }
    }
}

/// A simulated GPU. See the module documentation.
pub struct SimDevice {
    pub(super) info: DeviceInfo,
    pub(super) state: Mutex<State>,
}

pub(super) struct State {
    pub(super) capacity: u64,
    pub(super) granularity: u64,
    pub(super) vmm: bool,
    pub(super) counters: DriverCounters,
    pub(super) backing: Option<Backing>,
    /// Next free address of the fake address space (no backing). Never reused.
    pub(super) next_fake_va: DevPtr,
    /// Live reservations: start -> size.
    pub(super) reservations: BTreeMap<DevPtr, u64>,
    /// Live mappings: start -> mapping.
    pub(super) mappings: BTreeMap<DevPtr, Mapping>,
    pub(super) pages: HashMap<u64, Page>,
    pub(super) next_page: u64,
    /// Live plain allocations: start -> size.
    pub(super) plain: BTreeMap<DevPtr, u64>,
    /// Live events: handle -> `(stream, submitted count)` of the last record, if any.
    pub(super) events: HashMap<u64, Option<(StreamId, u64)>>,
    pub(super) next_event: u64,
    pub(super) streams: HashMap<StreamId, Stream>,
    pub(super) used: u64,
    /// The most `used` has been.
    pub(super) peak_used: u64,
    pub(super) violations: Vec<String>,
    pub(super) faults: Faults,
    /// Streams in capture and the graphs they built (`capture.rs`).
    pub(super) captures: Captures,
    /// The modelled host clock ([`SimDevice::advance_to`]), in nanoseconds.
    pub(super) now_ns: u64,
    /// Host time spent blocked in synchronising calls waiting for launches not yet due.
    pub(super) stall_ns: u64,
}

pub(super) fn misuse(what: String) -> DeviceError {
    DeviceError::Misuse(what)
}

/// One physical page.
pub(super) struct Page {
    pub(super) size: u64,
    /// Offset of its bytes in the memfd (backing only).
    pub(super) offset: u64,
    /// Its pieces mapped now: `(offset, size, va)` each (two may overlap: the same bytes mapped
    /// at two addresses).
    pub(super) maps: Vec<(u64, u64, DevPtr)>,
}

/// One successful `map` call.
pub(super) struct Mapping {
    pub(super) size: u64,
    pub(super) page: u64,
}

/// The memfd behind every physical page of a device with backing, and which of its ranges are
/// free. Pages may have any size that is a multiple of the granularity, so offsets come from a
/// first-fit free list with coalescing; when the list has no hole big enough (fragmentation) the
/// file simply grows past `capacity`: it is sparse, so its length costs nothing, and capacity is
/// enforced by the byte accounting, not by the file.
pub(super) struct Backing {
    pub(super) fd: libc::c_int,
    pub(super) file_len: u64,
    /// Free holes below `end`: offset -> length.
    pub(super) free: BTreeMap<u64, u64>,
    /// Everything at and above `end` is free.
    pub(super) end: u64,
}

/// One queued "kernel".
pub(super) struct Launch {
    /// The stream's `submitted` count right after this launch was queued.
    pub(super) seq: u64,
    pub(super) ptr: DevPtr,
    pub(super) len: u64,
    /// Physical pages mapped under the range when it was launched, so that releasing one of
    /// them while the launch is pending is caught even after the range was unmapped.
    pub(super) pages: Vec<u64>,
    /// With the modelled clock: when the GPU finishes it ([`SimDevice::launch_until`]); `None`
    /// = only `complete` or a synchronising call finishes it.
    pub(super) due_ns: Option<u64>,
}

#[derive(Default)]
pub(super) struct Stream {
    pub(super) submitted: u64,
    pub(super) completed: u64,
    /// Uncompleted launches, oldest first (so `seq` increases).
    pub(super) pending: VecDeque<Launch>,
}

/// Planned failures.
#[derive(Default)]
pub(super) struct Faults {
    /// Calls of each kind so far.
    pub(super) calls: [u64; SimCall::COUNT],
    /// `(kind, call number)` pairs that must fail.
    pub(super) planned: Vec<(SimCall, u64)>,
    /// xorshift64 state and "one in N", for Reserve/Create/Map.
    pub(super) random: Option<(u64, u64)>,
}

/// One captured "kernel" of a graph: its range and the physical pages under it at capture time.
pub(super) struct GraphLaunch {
    pub(super) ptr: DevPtr,
    pub(super) len: u64,
    pub(super) pages: Vec<u64>,
}

#[derive(Default)]
pub(super) struct Captures {
    /// Streams being captured now, with the graph each builds.
    pub(super) active: HashMap<StreamId, u64>,
    /// Graphs being built or captured and not destroyed.
    pub(super) graphs: HashMap<u64, Vec<GraphLaunch>>,
    pub(super) next_graph: u64,
    /// Events whose last record was on a capturing stream.
    pub(super) captured_events: HashSet<u64>,
}

pub(super) fn overlaps(a: DevPtr, a_len: u64, b: DevPtr, b_len: u64) -> bool {
    a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}
