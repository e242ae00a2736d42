//! The simulated GPU: a [`Device`] with a capacity, a granularity and modelled asynchrony, for
//! running and testing the arena without CUDA.
//!
//! This module owns three things, each a model of what the CUDA driver does, one file each
//! (`memory.rs`, `asynchrony.rs`, `faults.rs`; stream capture is in `capture.rs`), over the
//! records of `state.rs`:
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
//! - mappings never overlap, each lies inside one live reservation, and each maps a piece of
//!   one live page, which records it (`Page::maps`); a piece may be mapped at several addresses
//!   at once, as on CUDA;
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

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use super::{
    DevPtr, Device, DeviceError, DeviceInfo, DeviceResult, DriverCounters, EventHandle,
    MapRunError, PageHandle, Piece, StreamId, map_run_with,
};

mod asynchrony;
mod capture;
mod faults;
mod memory;
mod state;

use self::asynchrony::*;
use self::memory::*;
use self::state::*;
pub use self::state::{FAKE_VA_BASE, SimCall, SimConfig, SimDevice};

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
            peak_used: 0,
            violations: Vec::new(),
            faults: Faults::default(),
            captures: Captures::default(),
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

    fn fork_prepare(&self) {
        crate::fork::hold(&self.state);
    }

    fn fork_release(&self, child: bool) {
        // SAFETY: held by `fork_prepare` on this thread (the trait's contract).
        unsafe { crate::fork::release(&self.state, child) };
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
        s.counters.mem_create_bytes += size;
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
                maps: Vec::new(),
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
        if let Some(&(offset, size, va)) = p.maps.first() {
            return Err(misuse(format!(
                "cuMemRelease: page {:#x} is still mapped: bytes {offset}..{} of it at {va:#x}",
                page.0,
                offset + size
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
        s.counters.mem_release_bytes += p.size;
        if let Some(b) = s.backing.as_mut() {
            b.free(p.offset, p.size);
        }
        Ok(())
    }

    /// One cuMemMap per handle, at consecutive addresses, then one cuMemSetAccess for the run (as
    /// PyTorch's expandable segments grant access per contiguous range). What was mapped before
    /// a failure is granted access and reported (see [`Device::map_run`]).
    fn map_run(&self, va: DevPtr, handles: &[Piece]) -> Result<(), MapRunError> {
        let mut s = self.state.lock();
        map_run_with(
            &mut *s,
            va,
            handles,
            |s, at, piece| s.map_one(at, piece),
            |s, _, _, handles| {
                // CUDA needs cuMemSetAccess after cuMemMap before the range is usable.
                s.counters.set_access += 1;
                s.counters.set_access_handles += handles;
                let n = s.faults.begin(SimCall::SetAccess);
                match s.faults.fails(SimCall::SetAccess, n) {
                    true => Err(SimCall::SetAccess.injected_error()),
                    false => Ok(()),
                }
            },
            |s, at, len| s.unmap_range(at, len).is_ok(),
        )
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
                s.counters.mem_alloc_bytes += size;
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
        s.counters.mem_free_bytes += size;
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
