//! The simulated GPU: a [`Device`] with a capacity, a granularity and modelled asynchrony, for
//! running and testing the arena without CUDA.
//!
//! This file owns three things, each a model of what the CUDA driver does:
//! - **Memory.** Virtual address reservations, physical pages, mappings between them and plain
//!   allocations, with the driver's contract checked strictly: a call that breaks it returns
//!   [`DeviceError::Misuse`] naming the addresses and changes nothing (it is still counted in
//!   [`DriverCounters`], as a real driver call would be). With `backing: true` every byte is real
//!   host memory at the same address (device VA == host VA): physical pages are ranges of one
//!   sparse memfd, `map` places them with `mmap(MAP_SHARED|MAP_FIXED)`, so one page mapped at two
//!   addresses in turn shows the same bytes, exactly like VMM. Without backing, addresses come
//!   from a fake range starting at [`FAKE_VA_BASE`] and nothing is touched.
//! - **Streams and events.** Work never completes by itself: a test queues "kernels" with
//!   [`SimDevice::launch`] and completes them with [`SimDevice::complete`] or a synchronising
//!   driver call. Giving memory back to the driver (`unmap`, `release_page`, `free_plain`) while
//!   an uncompleted launch may use it does not fail, as on a real GPU, but is recorded in
//!   [`SimDevice::violations`]; so is a launch over memory that is not mapped.
//! - **A host clock** for the lab's GPU lag: a launch may carry a due time
//!   ([`SimDevice::launch_until`]) and completes once [`SimDevice::advance_to`] reaches it; a
//!   synchronising call (cuEventSynchronize, cuStreamSynchronize, cuCtxSynchronize) that
//!   completes work not yet due makes the host wait until it is: the wait is added to
//!   [`SimDevice::stall_ns`] and the clock moves on. Launches without a due time behave as before.
//! - **Failure injection and leak accounting** for the arena's error paths and leak tests.
//!
//! Invariants kept under the one lock:
//! - mappings never overlap, each lies inside one live reservation, and each maps exactly one
//!   live page, which records that address (`Page::mapped_at`);
//! - `used` = bytes of live pages + bytes of live plain allocations ≤ capacity;
//! - with backing, the bytes of the memfd that hold data are exactly those of live pages (holes
//!   are punched on release), and every host mapping we made is undone on drop.
//!
//! Modelling choices, stricter than or simpler than CUDA where noted:
//! - every size (reserve, create_page, map, unmap, alloc_plain) must be a nonzero multiple of
//!   the granularity; `reserve`'s alignment may be 0 (= granularity) or a multiple of it;
//! - `unmap` takes a run of whole mappings with no gap, inside one reservation (several pages
//!   mapped separately may go in one call; part of one mapping may not);
//! - streams are independent queues: stream 0 does not synchronise with the others;
//! - `synchronize_event` completes its stream's work up to the record, not later launches;
//! - with backing, each mapping is one host VMA, so `vm.max_map_count` (65530 by default) bounds
//!   how many pages can be mapped at once.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;

use parking_lot::Mutex;

use super::{
    DevPtr, Device, DeviceError, DeviceInfo, DeviceResult, DriverCounters, EventHandle,
    MapRunError, PageHandle, StreamId,
};
use crate::config::Config;

mod capture;

/// Where the fake address space of a device without backing starts (an address no host
/// allocation is likely to have, so a stray host write through it faults instead of corrupting).
pub const FAKE_VA_BASE: DevPtr = 0x7e00_0000_0000;

/// CUDA_ERROR_OUT_OF_MEMORY.
const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
/// CUDA_ERROR_UNKNOWN.
const CUDA_ERROR_UNKNOWN: i32 = 999;

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
    pub fn from_conf(conf: &Config, ordinal: i32) -> SimConfig {
        SimConfig {
            ordinal,
            // At most 1 PiB (the parser's bound), so this cannot wrap.
            capacity: conf.sim_capacity_mb.saturating_mul(1 << 20),
            granularity: conf.sim_granularity_kb << 10,
            backing: conf.sim_backing,
            vmm: conf.sim_vmm,
        }
    }

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
    const COUNT: usize = 7;

    fn index(self) -> usize {
        self as usize
    }

    /// The error an injected failure of this call returns.
    fn injected_error(self) -> DeviceError {
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
    info: DeviceInfo,
    state: Mutex<State>,
}

/// One physical page.
struct Page {
    size: u64,
    /// Offset of its bytes in the memfd (backing only).
    offset: u64,
    /// Where it is mapped now, if anywhere.
    mapped_at: Option<DevPtr>,
}

/// One successful `map` call.
struct Mapping {
    size: u64,
    page: u64,
}

/// One queued "kernel".
struct Launch {
    /// The stream's `submitted` count right after this launch was queued.
    seq: u64,
    ptr: DevPtr,
    len: u64,
    /// Physical pages mapped under the range when it was launched, so that releasing one of
    /// them while the launch is pending is caught even after the range was unmapped.
    pages: Vec<u64>,
    /// With the modelled clock: when the GPU finishes it ([`SimDevice::launch_until`]); `None`
    /// = only `complete` or a synchronising call finishes it.
    due_ns: Option<u64>,
}

#[derive(Default)]
struct Stream {
    submitted: u64,
    completed: u64,
    /// Uncompleted launches, oldest first (so `seq` increases).
    pending: VecDeque<Launch>,
}

/// Planned failures.
#[derive(Default)]
struct Faults {
    /// Calls of each kind so far.
    calls: [u64; SimCall::COUNT],
    /// `(kind, call number)` pairs that must fail.
    planned: Vec<(SimCall, u64)>,
    /// xorshift64 state and "one in N", for Reserve/Create/Map.
    random: Option<(u64, u64)>,
}

impl Faults {
    /// Counts a call of `kind` and returns its number.
    fn begin(&mut self, kind: SimCall) -> u64 {
        self.calls[kind.index()] += 1;
        self.calls[kind.index()]
    }

    /// Whether call number `n` of `kind` (already validated) must fail.
    fn fails(&mut self, kind: SimCall, n: u64) -> bool {
        let before = self.planned.len();
        self.planned.retain(|&(k, at)| !(k == kind && at == n));
        let mut fail = self.planned.len() != before;
        if matches!(kind, SimCall::Reserve | SimCall::Create | SimCall::Map)
            && let Some((state, one_in)) = &mut self.random
        {
            // xorshift64: deterministic for a given seed and call sequence.
            let mut x = *state;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *state = x;
            fail |= x.is_multiple_of(*one_in);
        }
        fail
    }
}

/// The memfd behind every physical page of a device with backing, and which of its ranges are
/// free. Pages may have any size that is a multiple of the granularity, so offsets come from a
/// first-fit free list with coalescing; when the list has no hole big enough (fragmentation) the
/// file simply grows past `capacity`: it is sparse, so its length costs nothing, and capacity is
/// enforced by the byte accounting, not by the file.
struct Backing {
    fd: libc::c_int,
    file_len: u64,
    /// Free holes below `end`: offset -> length.
    free: BTreeMap<u64, u64>,
    /// Everything at and above `end` is free.
    end: u64,
}

impl Backing {
    fn open(capacity: u64) -> DeviceResult<Backing> {
        let name = c"torch-arena-sim";
        // SAFETY: `name` is a valid NUL-terminated string.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(host_error("memfd_create", "memfd_create"));
        }
        let mut backing = Backing {
            fd,
            file_len: 0,
            free: BTreeMap::new(),
            end: 0,
        };
        backing.grow_to(capacity)?;
        Ok(backing)
    }

    fn grow_to(&mut self, len: u64) -> DeviceResult<()> {
        if len <= self.file_len {
            return Ok(());
        }
        let Ok(off) = libc::off_t::try_from(len) else {
            return Err(DeviceError::OutOfMemory);
        };
        // SAFETY: `fd` is our memfd.
        if unsafe { libc::ftruncate(self.fd, off) } != 0 {
            return Err(host_error("cuMemCreate", "ftruncate of the memfd"));
        }
        self.file_len = len;
        Ok(())
    }

    /// Finds `size` free bytes of the file.
    fn alloc(&mut self, size: u64) -> DeviceResult<u64> {
        let hole = self
            .free
            .iter()
            .find(|&(_, &len)| len >= size)
            .map(|(&o, &l)| (o, l));
        if let Some((offset, len)) = hole {
            self.free.remove(&offset);
            if len > size {
                self.free.insert(offset + size, len - size);
            }
            return Ok(offset);
        }
        let offset = self.end;
        let end = offset.checked_add(size).ok_or(DeviceError::OutOfMemory)?;
        self.grow_to(end)?;
        self.end = end;
        Ok(offset)
    }

    /// Gives `[offset, offset+size)` back, punching a hole so its host memory is freed.
    fn free(&mut self, offset: u64, size: u64) {
        // SAFETY: punching a hole in our own memfd; no mapping of this range exists (the page is
        // unmapped before it is released). A failure only leaves memory resident.
        unsafe {
            libc::fallocate(
                self.fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                size as libc::off_t,
            );
        }
        let (mut start, mut len) = (offset, size);
        if let Some((&prev, &prev_len)) = self.free.range(..start).next_back()
            && prev + prev_len == start
        {
            self.free.remove(&prev);
            start = prev;
            len += prev_len;
        }
        if let Some(next_len) = self.free.remove(&(start + len)) {
            len += next_len;
        }
        if start + len == self.end {
            self.end = start;
        } else {
            self.free.insert(start, len);
        }
    }

    /// Bytes of the file that hold host memory.
    fn resident_bytes(&self) -> u64 {
        // SAFETY: `stat` is plain data, filled by fstat on our fd.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(self.fd, &mut stat) } != 0 {
            return 0;
        }
        stat.st_blocks as u64 * 512
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        // SAFETY: closing the fd we opened; every mapping of it was undone by `State::drop`.
        unsafe { libc::close(self.fd) };
    }
}

struct State {
    capacity: u64,
    granularity: u64,
    vmm: bool,
    counters: DriverCounters,
    backing: Option<Backing>,
    /// Next free address of the fake address space (no backing). Never reused.
    next_fake_va: DevPtr,
    /// Live reservations: start -> size.
    reservations: BTreeMap<DevPtr, u64>,
    /// Live mappings: start -> mapping.
    mappings: BTreeMap<DevPtr, Mapping>,
    pages: HashMap<u64, Page>,
    next_page: u64,
    /// Live plain allocations: start -> size.
    plain: BTreeMap<DevPtr, u64>,
    /// Live events: handle -> `(stream, submitted count)` of the last record, if any.
    events: HashMap<u64, Option<(StreamId, u64)>>,
    next_event: u64,
    streams: HashMap<StreamId, Stream>,
    used: u64,
    violations: Vec<String>,
    faults: Faults,
    /// Streams in capture and the graphs they built (`capture.rs`).
    captures: capture::Captures,
    /// The modelled host clock ([`SimDevice::advance_to`]), in nanoseconds.
    now_ns: u64,
    /// Host time spent blocked in synchronising calls waiting for launches not yet due.
    stall_ns: u64,
}

fn misuse(what: String) -> DeviceError {
    DeviceError::Misuse(what)
}

/// A host call failed: report it as the driver call it stands for, with errno.
fn host_error(call: &'static str, what: &str) -> DeviceError {
    let err = io::Error::last_os_error();
    DeviceError::Driver {
        call,
        code: CUDA_ERROR_OUT_OF_MEMORY,
        message: format!("simulated device: {what} failed: {err}"),
    }
}

fn host_page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as u64 } else { 4096 }
}

/// `mmap`s `size` bytes with protection `prot` at an address aligned to `align` (both multiples
/// of the host page size), by mapping `size + align` bytes and trimming both ends.
fn host_map_aligned(size: u64, align: u64, prot: libc::c_int) -> Option<DevPtr> {
    let total = size.checked_add(align)?;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing.
    let base = unsafe { libc::mmap(std::ptr::null_mut(), total as usize, prot, flags, -1, 0) };
    if base == libc::MAP_FAILED {
        return None;
    }
    let base = base as u64;
    let start = base.div_ceil(align) * align;
    let head = start - base;
    let tail = base + total - (start + size);
    // SAFETY: both pieces lie inside the mapping just made and are page-aligned.
    unsafe {
        if head > 0 {
            libc::munmap(base as *mut libc::c_void, head as usize);
        }
        if tail > 0 {
            libc::munmap((start + size) as *mut libc::c_void, tail as usize);
        }
    }
    Some(start)
}

/// Unmaps a host range we mapped ourselves.
fn host_unmap(ptr: DevPtr, size: u64) {
    // SAFETY: callers pass only ranges this device mapped and no longer tracks as live.
    unsafe { libc::munmap(ptr as *mut libc::c_void, size as usize) };
}

fn overlaps(a: DevPtr, a_len: u64, b: DevPtr, b_len: u64) -> bool {
    a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

impl State {
    /// cuMemMap of `page` at `va`, without the access grant (see `Device::map_run`).
    fn map_one(&mut self, va: DevPtr, size: u64, page: PageHandle) -> DeviceResult<()> {
        let s = self;
        s.counters.mem_map += 1;
        let n = s.faults.begin(SimCall::Map);
        s.need_vmm("cuMemMap")?;
        s.check_granular("cuMemMap", Some(va), size)?;
        let Some(p) = s.pages.get(&page.0) else {
            return Err(misuse(format!(
                "cuMemMap at {va:#x}+{size}: page {:#x} does not exist",
                page.0
            )));
        };
        if p.size != size {
            return Err(misuse(format!(
                "cuMemMap at {va:#x}+{size}: page {:#x} has size {}",
                page.0, p.size
            )));
        }
        if let Some(at) = p.mapped_at {
            return Err(misuse(format!(
                "cuMemMap at {va:#x}+{size}: page {:#x} is already mapped at {at:#x}",
                page.0
            )));
        }
        let offset = p.offset;
        if s.reservation_holding(va, size).is_none() {
            return Err(misuse(format!(
                "cuMemMap at {va:#x}+{size}: the range is not inside one live reservation"
            )));
        }
        if let Some((&m, mapping)) = s.mappings.range(..va + size).next_back()
            && m + mapping.size > va
        {
            return Err(misuse(format!(
                "cuMemMap at {va:#x}+{size}: {m:#x}+{} is already mapped (page {:#x})",
                mapping.size, mapping.page
            )));
        }
        if s.faults.fails(SimCall::Map, n) {
            return Err(SimCall::Map.injected_error());
        }
        if let Some(b) = &s.backing {
            // SAFETY: `[va, va+size)` lies inside one of our PROT_NONE reservations and is not
            // mapped (both checked above), so replacing it touches no other memory.
            let got = unsafe {
                libc::mmap(
                    va as *mut libc::c_void,
                    size as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    b.fd,
                    offset as libc::off_t,
                )
            };
            if got == libc::MAP_FAILED {
                return Err(host_error("cuMemMap", "mmap of the page"));
            }
        }
        s.mappings.insert(va, Mapping { size, page: page.0 });
        s.pages.get_mut(&page.0).expect("checked above").mapped_at = Some(va);
        Ok(())
    }

    /// cuMemUnmap of `[va, va+size)`: exactly a run of whole mappings.
    fn unmap_range(&mut self, va: DevPtr, size: u64) -> DeviceResult<()> {
        let s = self;
        s.counters.mem_unmap += 1;
        s.need_vmm("cuMemUnmap")?;
        s.check_granular("cuMemUnmap", Some(va), size)?;
        if s.reservation_holding(va, size).is_none() {
            return Err(misuse(format!(
                "cuMemUnmap of {va:#x}+{size}: the range is not inside one live reservation"
            )));
        }
        // The range must be exactly a run of whole mappings, with no gap.
        let end = va + size;
        let mut at = va;
        let mut covered = Vec::new();
        while at < end {
            let Some(m) = s.mappings.get(&at) else {
                let why = match s.mapping_at(at) {
                    Some((start, m)) => {
                        format!("{at:#x} is inside the mapping {start:#x}+{}", m.size)
                    }
                    None => format!("{at:#x} is not mapped"),
                };
                return Err(misuse(format!("cuMemUnmap of {va:#x}+{size}: {why}")));
            };
            if at + m.size > end {
                return Err(misuse(format!(
                    "cuMemUnmap of {va:#x}+{size}: the mapping {at:#x}+{} ends past the range",
                    m.size
                )));
            }
            covered.push(at);
            at += m.size;
        }
        if s.backing.is_some() {
            // Put the reservation's PROT_NONE placeholder back, so the address stays ours.
            let flags =
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE;
            // SAFETY: `[va, va+size)` is mapped by us inside one of our reservations.
            let got = unsafe {
                libc::mmap(
                    va as *mut libc::c_void,
                    size as usize,
                    libc::PROT_NONE,
                    flags,
                    -1,
                    0,
                )
            };
            if got == libc::MAP_FAILED {
                return Err(host_error("cuMemUnmap", "mmap of the placeholder"));
            }
        }
        s.note_busy_release("cuMemUnmap", va, size);
        for start in covered {
            let m = s.mappings.remove(&start).expect("found above");
            if let Some(p) = s.pages.get_mut(&m.page) {
                p.mapped_at = None;
            }
        }
        Ok(())
    }

    fn need_vmm(&self, call: &str) -> DeviceResult<()> {
        if self.vmm {
            Ok(())
        } else {
            Err(misuse(format!(
                "{call}: VMM not supported by this simulated device (sim_vmm is False); use \
                 alloc_plain/free_plain"
            )))
        }
    }

    /// Checks that `size` (and `va`, if given) are nonzero multiples of the granularity.
    fn check_granular(&self, call: &str, va: Option<DevPtr>, size: u64) -> DeviceResult<()> {
        let g = self.granularity;
        if size == 0 || !size.is_multiple_of(g) {
            return Err(misuse(format!(
                "{call}: size {size} is not a nonzero multiple of the granularity {g}"
            )));
        }
        if let Some(va) = va {
            if !va.is_multiple_of(g) {
                return Err(misuse(format!(
                    "{call}: address {va:#x} is not aligned to the granularity {g}"
                )));
            }
            if va.checked_add(size).is_none() {
                return Err(misuse(format!("{call}: {va:#x}+{size} wraps around")));
            }
        }
        Ok(())
    }

    /// Takes `size` bytes of capacity, or says OutOfMemory.
    fn charge(&mut self, size: u64) -> DeviceResult<()> {
        match self.used.checked_add(size) {
            Some(used) if used <= self.capacity => {
                self.used = used;
                Ok(())
            }
            _ => Err(DeviceError::OutOfMemory),
        }
    }

    /// Takes `size` bytes of fake address space aligned to `align`.
    fn fake_range(&mut self, size: u64, align: u64) -> DeviceResult<DevPtr> {
        let start = self.next_fake_va.div_ceil(align).checked_mul(align);
        let range = start.and_then(|s| Some((s, s.checked_add(size)?)));
        let Some((start, end)) = range else {
            // The simulated address space is spent: CUDA_ERROR_OUT_OF_MEMORY, as the driver says.
            return Err(DeviceError::OutOfMemory);
        };
        self.next_fake_va = end;
        Ok(start)
    }

    /// The live reservation holding all of `[va, va+size)`, if any.
    fn reservation_holding(&self, va: DevPtr, size: u64) -> Option<(DevPtr, u64)> {
        let (&start, &len) = self.reservations.range(..=va).next_back()?;
        (va + size <= start + len).then_some((start, len))
    }

    /// The mapping holding `addr`, if any.
    fn mapping_at(&self, addr: DevPtr) -> Option<(DevPtr, &Mapping)> {
        let (&start, m) = self.mappings.range(..=addr).next_back()?;
        (addr < start + m.size).then_some((start, m))
    }

    /// The plain allocation holding `addr`, if any.
    fn plain_at(&self, addr: DevPtr) -> Option<(DevPtr, u64)> {
        let (&start, &len) = self.plain.range(..=addr).next_back()?;
        (addr < start + len).then_some((start, len))
    }

    /// Uncompleted launches overlapping `[ptr, ptr+len)`.
    fn busy_over(&self, ptr: DevPtr, len: u64) -> Vec<(StreamId, &Launch)> {
        let mut found: Vec<(StreamId, &Launch)> = self
            .streams
            .iter()
            .flat_map(|(&s, st)| st.pending.iter().map(move |l| (s, l)))
            .filter(|(_, l)| overlaps(ptr, len, l.ptr, l.len))
            .collect();
        found.sort_by_key(|&(s, l)| (s, l.seq));
        found
    }

    /// Records a violation if memory `[ptr, ptr+len)` is given back while a launch may use it.
    fn note_busy_release(&mut self, call: &str, ptr: DevPtr, len: u64) {
        let found: Vec<String> = self
            .busy_over(ptr, len)
            .into_iter()
            .map(|(s, l)| describe_use(s, l))
            .collect();
        for use_ in found {
            self.violations
                .push(format!("{call} of {ptr:#x}+{len} while {use_}"));
        }
        self.note_graph_release(call, ptr, len);
    }

    /// Completes the work of `stream` up to its `submitted` count `upto`. With `wait` (a
    /// synchronising driver call), the host blocks until the last of that work is due on the
    /// modelled clock: the wait is added to `stall_ns` and the clock moves on to then.
    fn complete_upto(&mut self, stream: StreamId, upto: u64, wait: bool) {
        let mut due = 0;
        if let Some(st) = self.streams.get_mut(&stream) {
            st.completed = st.completed.max(upto.min(st.submitted));
            while st.pending.front().is_some_and(|l| l.seq <= upto) {
                let l = st.pending.pop_front().expect("checked");
                due = due.max(l.due_ns.unwrap_or(0));
            }
        }
        if wait {
            self.wait_until(due);
        }
    }

    /// The host waits until `due_ns` on the modelled clock (nothing if that has passed).
    fn wait_until(&mut self, due_ns: u64) {
        if due_ns > self.now_ns {
            self.stall_ns += due_ns - self.now_ns;
            self.now_ns = due_ns;
        }
    }

    fn complete_stream(&mut self, stream: StreamId, wait: bool) {
        let upto = self.streams.get(&stream).map_or(0, |st| st.submitted);
        self.complete_upto(stream, upto, wait);
    }

    fn complete_all(&mut self, wait: bool) {
        let mut due = 0;
        for st in self.streams.values_mut() {
            st.completed = st.submitted;
            for l in st.pending.drain(..) {
                due = due.max(l.due_ns.unwrap_or(0));
            }
        }
        if wait {
            self.wait_until(due);
        }
    }

    fn event(&self, call: &str, event: EventHandle) -> DeviceResult<Option<(StreamId, u64)>> {
        match self.events.get(&event.0) {
            Some(&last) => Ok(last),
            None => Err(misuse(format!(
                "{call}: event {:#x} does not exist",
                event.0
            ))),
        }
    }
}

fn describe_use(stream: StreamId, launch: &Launch) -> String {
    format!(
        "stream {stream} may still use {:#x}+{} (launch #{} on that stream, not completed)",
        launch.ptr, launch.len, launch.seq
    )
}

impl Drop for State {
    fn drop(&mut self) {
        if self.backing.is_none() {
            return; // fake addresses: nothing was mapped on the host
        }
        // Unmapping a whole reservation also removes the page mappings inside it.
        for (&va, &size) in &self.reservations {
            host_unmap(va, size);
        }
        for (&ptr, &size) in &self.plain {
            host_unmap(ptr, size);
        }
        // `backing` closes the memfd when it drops, after this.
    }
}

impl SimDevice {
    /// Builds a simulated device. Fails with `Misuse` for a zero capacity, a granularity that is
    /// not a power of two (or, with backing, not a multiple of the host page size).
    pub fn new(c: SimConfig) -> DeviceResult<SimDevice> {
        if c.capacity == 0 {
            return Err(misuse("simulated device: capacity must be > 0".to_string()));
        }
        if c.granularity == 0 || !c.granularity.is_power_of_two() {
            return Err(misuse(format!(
                "simulated device: granularity {} is not a power of two > 0",
                c.granularity
            )));
        }
        let backing = if c.backing {
            let host_page = host_page_size();
            if !c.granularity.is_multiple_of(host_page) {
                return Err(misuse(format!(
                    "simulated device: with backing, granularity {} must be a multiple of the \
                     host page size {host_page}",
                    c.granularity
                )));
            }
            Some(Backing::open(c.capacity)?)
        } else {
            None
        };
        let state = State {
            capacity: c.capacity,
            granularity: c.granularity,
            vmm: c.vmm,
            counters: DriverCounters::default(),
            backing,
            next_fake_va: FAKE_VA_BASE,
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            pages: HashMap::new(),
            next_page: 1,
            plain: BTreeMap::new(),
            events: HashMap::new(),
            next_event: 1,
            streams: HashMap::new(),
            used: 0,
            violations: Vec::new(),
            faults: Faults::default(),
            captures: capture::Captures::default(),
            now_ns: 0,
            stall_ns: 0,
        };
        let info = DeviceInfo {
            ordinal: c.ordinal,
            name: "sim".to_string(),
            total_bytes: c.capacity,
            granularity: c.granularity,
            vmm: c.vmm,
        };
        Ok(SimDevice {
            info,
            state: Mutex::new(state),
        })
    }

    // ---- modelled asynchrony -------------------------------------------------------------

    /// Queues a "kernel" on `stream` that uses `[ptr, ptr+len)` until the stream completes it.
    /// A range not entirely covered by mappings and plain allocations is recorded as a
    /// violation, as the kernel would fault on a real GPU.
    pub fn launch(&self, stream: StreamId, ptr: DevPtr, len: u64) {
        self.launch_at(stream, ptr, len, None);
    }

    /// Like [`SimDevice::launch`], but the GPU finishes the work by itself at `due_ns` on the
    /// modelled clock (once [`SimDevice::advance_to`] reaches it, or when a synchronising call
    /// waits for it). Launches on one stream finish in order, so give each stream's launches
    /// non-decreasing due times.
    pub fn launch_until(&self, stream: StreamId, ptr: DevPtr, len: u64, due_ns: u64) {
        self.launch_at(stream, ptr, len, Some(due_ns));
    }

    fn launch_at(&self, stream: StreamId, ptr: DevPtr, len: u64, due_ns: Option<u64>) {
        let mut s = self.state.lock();
        let end = ptr.saturating_add(len);
        let mut pages = Vec::new();
        let mut at = ptr;
        while at < end {
            if let Some((start, m)) = s.mapping_at(at) {
                pages.push(m.page);
                at = start + m.size;
            } else if let Some((start, size)) = s.plain_at(at) {
                at = start + size;
            } else {
                s.violations.push(format!(
                    "launch on stream {stream} of {ptr:#x}+{len} touches {at:#x}, which is not \
                     mapped"
                ));
                break;
            }
        }
        if s.capture_launch(stream, ptr, len, &pages) {
            return;
        }
        let st = s.streams.entry(stream).or_default();
        st.submitted += 1;
        let seq = st.submitted;
        st.pending.push_back(Launch {
            seq,
            ptr,
            len,
            pages,
            due_ns,
        });
    }

    /// Moves the modelled host clock to `now_ns` (never backwards) and completes, on every
    /// stream, the launches due by then, in stream order.
    pub fn advance_to(&self, now_ns: u64) {
        let mut s = self.state.lock();
        s.now_ns = s.now_ns.max(now_ns);
        let now = s.now_ns;
        for st in s.streams.values_mut() {
            let mut popped = false;
            while st
                .pending
                .front()
                .is_some_and(|l| l.due_ns.is_some_and(|d| d <= now))
            {
                st.pending.pop_front();
                popped = true;
            }
            if popped {
                st.completed = st.pending.front().map_or(st.submitted, |l| l.seq - 1);
            }
        }
    }

    /// The modelled host clock in nanoseconds: the latest `advance_to`, plus any time the host
    /// spent waiting in a synchronising call.
    pub fn now_ns(&self) -> u64 {
        self.state.lock().now_ns
    }

    /// Host time spent blocked in synchronising calls (cuEventSynchronize, cuStreamSynchronize,
    /// cuCtxSynchronize) for launches not yet due on the modelled clock, in nanoseconds.
    pub fn stall_ns(&self) -> u64 {
        self.state.lock().stall_ns
    }

    /// Completes all work queued on `stream` so far (the GPU finished it; no host wait).
    pub fn complete(&self, stream: StreamId) {
        self.state.lock().complete_stream(stream, false);
    }

    /// Completes all work on every stream (no host wait).
    pub fn complete_all(&self) {
        self.state.lock().complete_all(false);
    }

    /// `(stream, ptr, len)` of every uncompleted launch, by stream then launch order.
    pub fn busy_ranges(&self) -> Vec<(StreamId, DevPtr, u64)> {
        self.busy_overlapping(0, u64::MAX)
    }

    /// `(stream, ptr, len)` of every uncompleted launch overlapping `[ptr, ptr+len)`: a block the
    /// arena hands out on stream S must not overlap one of another stream.
    pub fn busy_overlapping(&self, ptr: DevPtr, len: u64) -> Vec<(StreamId, DevPtr, u64)> {
        let s = self.state.lock();
        s.busy_over(ptr, len)
            .into_iter()
            .map(|(st, l)| (st, l.ptr, l.len))
            .collect()
    }

    /// `(submitted, completed)` work counts of `stream` (0, 0 for a stream never used).
    pub fn stream_progress(&self, stream: StreamId) -> (u64, u64) {
        let s = self.state.lock();
        s.streams
            .get(&stream)
            .map_or((0, 0), |st| (st.submitted, st.completed))
    }

    /// Every stream-safety violation seen so far, oldest first.
    pub fn violations(&self) -> Vec<String> {
        self.state.lock().violations.clone()
    }

    // ---- failure injection ---------------------------------------------------------------

    /// Makes the `n`-th future call of `call` fail (1 = the next one; 0 is taken as 1). Calls
    /// that break the contract count too, but return `Misuse` rather than the injected failure.
    pub fn fail_nth(&self, call: SimCall, n: u64) {
        let mut s = self.state.lock();
        let at = s.faults.calls[call.index()] + n.max(1);
        s.faults.planned.push((call, at));
    }

    /// Makes each Reserve, Create and Map call fail with probability `1/one_in`, from a
    /// deterministic generator seeded by `seed`. `one_in == 0` stops random failures.
    pub fn fail_randomly(&self, seed: u64, one_in: u64) {
        let mut s = self.state.lock();
        // xorshift's state must not be zero.
        s.faults.random = (one_in > 0).then_some((seed | 1, one_in));
    }

    /// Cancels every planned and random failure.
    pub fn stop_failing(&self) {
        let mut s = self.state.lock();
        s.faults.planned.clear();
        s.faults.random = None;
    }

    // ---- leak accounting -----------------------------------------------------------------

    /// Physical pages created and not released.
    pub fn live_pages(&self) -> u64 {
        self.state.lock().pages.len() as u64
    }

    /// Physical pages mapped now.
    pub fn mapped_pages(&self) -> u64 {
        self.state.lock().mappings.len() as u64
    }

    /// Address reservations not freed.
    pub fn live_reservations(&self) -> u64 {
        self.state.lock().reservations.len() as u64
    }

    /// Plain allocations not freed.
    pub fn live_plain(&self) -> u64 {
        self.state.lock().plain.len() as u64
    }

    /// Events created and not destroyed.
    pub fn live_events(&self) -> u64 {
        self.state.lock().events.len() as u64
    }

    /// Bytes of live pages plus live plain allocations.
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().used
    }

    /// With backing, host bytes the memfd holding the physical pages occupies now (written,
    /// unreleased pages); `None` without backing.
    pub fn backing_resident_bytes(&self) -> Option<u64> {
        self.state
            .lock()
            .backing
            .as_ref()
            .map(Backing::resident_bytes)
    }
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("SimDevice")
            .field("info", &self.info)
            .field("backing", &s.backing.is_some())
            .field("used", &s.used)
            .field("pages", &s.pages.len())
            .field("mappings", &s.mappings.len())
            .field("reservations", &s.reservations.len())
            .field("plain", &s.plain.len())
            .field("events", &s.events.len())
            .field("violations", &s.violations.len())
            .finish()
    }
}

impl Device for SimDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_get_info(&self) -> DeviceResult<(u64, u64)> {
        let mut s = self.state.lock();
        s.counters.mem_get_info += 1;
        Ok((s.capacity - s.used, s.capacity))
    }

    fn reserve(&self, size: u64, align: u64) -> DeviceResult<DevPtr> {
        let mut s = self.state.lock();
        s.counters.address_reserve += 1;
        let n = s.faults.begin(SimCall::Reserve);
        s.need_vmm("cuMemAddressReserve")?;
        s.check_granular("cuMemAddressReserve", None, size)?;
        let g = s.granularity;
        if !align.is_multiple_of(g) {
            return Err(misuse(format!(
                "cuMemAddressReserve: alignment {align} is not a multiple of the granularity {g}"
            )));
        }
        if s.faults.fails(SimCall::Reserve, n) {
            return Err(SimCall::Reserve.injected_error());
        }
        let align = align.max(g);
        let va = if s.backing.is_some() {
            // Host address space spent: CUDA_ERROR_OUT_OF_MEMORY, as the driver says.
            host_map_aligned(size, align, libc::PROT_NONE).ok_or(DeviceError::OutOfMemory)?
        } else {
            s.fake_range(size, align)?
        };
        s.reservations.insert(va, size);
        Ok(va)
    }

    fn free_address(&self, va: DevPtr, size: u64) -> DeviceResult<()> {
        let mut s = self.state.lock();
        s.counters.address_free += 1;
        s.need_vmm("cuMemAddressFree")?;
        match s.reservations.get(&va) {
            Some(&len) if len == size => {}
            Some(&len) => {
                return Err(misuse(format!(
                    "cuMemAddressFree of {va:#x}+{size}: the reservation there is {va:#x}+{len}"
                )));
            }
            None => {
                return Err(misuse(format!(
                    "cuMemAddressFree of {va:#x}+{size}: no reservation starts there"
                )));
            }
        }
        if let Some((&m, mapping)) = s.mappings.range(va..va + size).next() {
            return Err(misuse(format!(
                "cuMemAddressFree of {va:#x}+{size}: page {:#x} is still mapped at {m:#x}+{}",
                mapping.page, mapping.size
            )));
        }
        s.reservations.remove(&va);
        if s.backing.is_some() {
            host_unmap(va, size);
        }
        Ok(())
    }

    fn create_page(&self, size: u64) -> DeviceResult<PageHandle> {
        let mut s = self.state.lock();
        s.counters.mem_create += 1;
        let n = s.faults.begin(SimCall::Create);
        s.need_vmm("cuMemCreate")?;
        s.check_granular("cuMemCreate", None, size)?;
        if s.faults.fails(SimCall::Create, n) {
            return Err(SimCall::Create.injected_error());
        }
        s.charge(size)?;
        let offset = match s.backing.as_mut().map(|b| b.alloc(size)) {
            None => 0,
            Some(Ok(offset)) => offset,
            Some(Err(e)) => {
                s.used -= size;
                return Err(e);
            }
        };
        let handle = s.next_page;
        s.next_page += 1;
        s.pages.insert(
            handle,
            Page {
                size,
                offset,
                mapped_at: None,
            },
        );
        Ok(PageHandle(handle))
    }

    fn release_page(&self, page: PageHandle) -> DeviceResult<()> {
        let mut s = self.state.lock();
        s.counters.mem_release += 1;
        s.need_vmm("cuMemRelease")?;
        let Some(p) = s.pages.get(&page.0) else {
            return Err(misuse(format!(
                "cuMemRelease: page {:#x} does not exist",
                page.0
            )));
        };
        if let Some(va) = p.mapped_at {
            return Err(misuse(format!(
                "cuMemRelease: page {:#x} is still mapped at {va:#x}+{}",
                page.0, p.size
            )));
        }
        let users: Vec<String> = s
            .streams
            .iter()
            .flat_map(|(&st, streams)| streams.pending.iter().map(move |l| (st, l)))
            .filter(|(_, l)| l.pages.contains(&page.0))
            .map(|(st, l)| describe_use(st, l))
            .collect();
        for use_ in users {
            s.violations
                .push(format!("cuMemRelease of page {:#x} while {use_}", page.0));
        }
        s.note_graph_page_release(page.0);
        let p = s.pages.remove(&page.0).expect("checked above");
        s.used -= p.size;
        if let Some(b) = s.backing.as_mut() {
            b.free(p.offset, p.size);
        }
        Ok(())
    }

    fn map(&self, va: DevPtr, size: u64, page: PageHandle) -> DeviceResult<()> {
        self.map_run(va, &[(page, size)]).map_err(|e| e.error)
    }

    /// One cuMemMap per handle, at consecutive addresses, then one cuMemSetAccess for the run (as
    /// PyTorch's expandable segments grant access per contiguous range). What was mapped before
    /// a failure is granted access and reported (see [`Device::map_run`]).
    fn map_run(&self, va: DevPtr, handles: &[(PageHandle, u64)]) -> Result<(), MapRunError> {
        let mut s = self.state.lock();
        let mut at = va;
        let mut failed = None;
        for (i, &(page, size)) in handles.iter().enumerate() {
            if let Err(e) = s.map_one(at, size, page) {
                failed = Some((e, i));
                break;
            }
            at += size;
        }
        let mapped = failed.as_ref().map_or(handles.len(), |f| f.1);
        if mapped > 0 {
            // CUDA needs cuMemSetAccess after cuMemMap before the range is usable.
            s.counters.set_access += 1;
            let n = s.faults.begin(SimCall::SetAccess);
            if s.faults.fails(SimCall::SetAccess, n) {
                let kept = if s.unmap_range(va, at - va).is_ok() {
                    0
                } else {
                    mapped
                };
                let error = failed.map_or(SimCall::SetAccess.injected_error(), |f| f.0);
                return Err(MapRunError {
                    error,
                    mapped: kept,
                });
            }
        }
        match failed {
            Some((error, mapped)) => Err(MapRunError { error, mapped }),
            None => Ok(()),
        }
    }

    fn unmap(&self, va: DevPtr, size: u64) -> DeviceResult<()> {
        self.state.lock().unmap_range(va, size)
    }

    fn alloc_plain(&self, size: u64) -> DeviceResult<DevPtr> {
        let mut s = self.state.lock();
        s.counters.mem_alloc += 1;
        let n = s.faults.begin(SimCall::AllocPlain);
        s.check_granular("cuMemAlloc", None, size)?;
        if s.faults.fails(SimCall::AllocPlain, n) {
            return Err(SimCall::AllocPlain.injected_error());
        }
        s.charge(size)?;
        let g = s.granularity;
        let ptr = if s.backing.is_some() {
            host_map_aligned(size, g, libc::PROT_READ | libc::PROT_WRITE)
                .ok_or(DeviceError::OutOfMemory)
        } else {
            s.fake_range(size, g)
        };
        match ptr {
            Ok(ptr) => {
                s.plain.insert(ptr, size);
                Ok(ptr)
            }
            Err(e) => {
                s.used -= size;
                Err(e)
            }
        }
    }

    fn free_plain(&self, ptr: DevPtr) -> DeviceResult<()> {
        let mut s = self.state.lock();
        s.counters.mem_free += 1;
        let n = s.faults.begin(SimCall::FreePlain);
        if s.faults.fails(SimCall::FreePlain, n) {
            return Err(SimCall::FreePlain.injected_error());
        }
        let Some(&size) = s.plain.get(&ptr) else {
            return Err(misuse(format!(
                "cuMemFree of {ptr:#x}: not a live plain allocation"
            )));
        };
        s.note_busy_release("cuMemFree", ptr, size);
        s.plain.remove(&ptr);
        s.used -= size;
        if s.backing.is_some() {
            host_unmap(ptr, size);
        }
        Ok(())
    }

    fn create_event(&self) -> DeviceResult<EventHandle> {
        let mut s = self.state.lock();
        s.counters.event_create += 1;
        let n = s.faults.begin(SimCall::EventCreate);
        if s.faults.fails(SimCall::EventCreate, n) {
            return Err(SimCall::EventCreate.injected_error());
        }
        let handle = s.next_event;
        s.next_event += 1;
        s.events.insert(handle, None);
        Ok(EventHandle(handle))
    }

    fn destroy_event(&self, event: EventHandle) -> DeviceResult<()> {
        let mut s = self.state.lock();
        s.counters.event_destroy += 1;
        s.event("cuEventDestroy", event)?;
        s.events.remove(&event.0);
        Ok(())
    }

    fn record_event(&self, event: EventHandle, stream: StreamId) -> DeviceResult<()> {
        let mut s = self.state.lock();
        s.counters.event_record += 1;
        s.event("cuEventRecord", event)?;
        s.capture_record(event, stream);
        let submitted = s.streams.get(&stream).map_or(0, |st| st.submitted);
        s.events.insert(event.0, Some((stream, submitted)));
        Ok(())
    }

    fn query_event(&self, event: EventHandle) -> DeviceResult<bool> {
        let mut s = self.state.lock();
        s.counters.event_query += 1;
        let last = s.event("cuEventQuery", event)?;
        s.capture_check_event("cuEventQuery", event)?;
        Ok(match last {
            None => true, // never recorded: complete, as in CUDA
            Some((stream, upto)) => s.streams.get(&stream).is_none_or(|st| st.completed >= upto),
        })
    }

    fn synchronize_event(&self, event: EventHandle) -> DeviceResult<()> {
        let mut s = self.state.lock();
        s.counters.event_synchronize += 1;
        let last = s.event("cuEventSynchronize", event)?;
        s.capture_check_event("cuEventSynchronize", event)?;
        if let Some((stream, upto)) = last {
            // Only the work captured by the record completes; later launches stay pending.
            s.complete_upto(stream, upto, true);
        }
        Ok(())
    }

    fn synchronize_stream(&self, stream: StreamId) -> DeviceResult<()> {
        let mut s = self.state.lock();
        s.counters.stream_synchronize += 1;
        s.capture_check_sync("cuStreamSynchronize", Some(stream))?;
        s.complete_stream(stream, true);
        Ok(())
    }

    fn synchronize(&self) -> DeviceResult<()> {
        let mut s = self.state.lock();
        s.counters.device_synchronize += 1;
        s.capture_check_sync("cuCtxSynchronize", None)?;
        s.complete_all(true);
        Ok(())
    }

    fn counters(&self) -> DriverCounters {
        self.state.lock().counters
    }

    fn is_capturing(&self, stream: StreamId) -> DeviceResult<bool> {
        Ok(self.is_stream_capturing(stream))
    }
}
