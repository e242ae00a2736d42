//! The simulated GPU's memory: reservations, physical pages, mappings, plain allocations and
//! the host backing (a sparse memfd mapped at the device address), plus leak accounting.

use std::collections::BTreeMap;
use std::io;

use super::state::*;
use crate::device::{DevPtr, DeviceError, DeviceResult, Piece};

impl Backing {
    pub(super) fn open(capacity: u64) -> DeviceResult<Backing> {
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

    pub(super) fn grow_to(&mut self, len: u64) -> DeviceResult<()> {
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
    pub(super) fn alloc(&mut self, size: u64) -> DeviceResult<u64> {
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
    pub(super) fn free(&mut self, offset: u64, size: u64) {
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
    pub(super) fn resident_bytes(&self) -> u64 {
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

/// A host call failed: report it as the driver call it stands for, with errno.
pub(super) fn host_error(call: &'static str, what: &str) -> DeviceError {
    let err = io::Error::last_os_error();
    DeviceError::Driver {
        call,
        code: CUDA_ERROR_OUT_OF_MEMORY,
        message: format!("simulated device: {what} failed: {err}"),
    }
}

pub(super) fn host_page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as u64 } else { 4096 }
}

/// `mmap`s `size` bytes with protection `prot` at an address aligned to `align` (both multiples
/// of the host page size), by mapping `size + align` bytes and trimming both ends.
pub(super) fn host_map_aligned(size: u64, align: u64, prot: libc::c_int) -> Option<DevPtr> {
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
pub(super) fn host_unmap(ptr: DevPtr, size: u64) {
    // SAFETY: callers pass only ranges this device mapped and no longer tracks as live.
    unsafe { libc::munmap(ptr as *mut libc::c_void, size as usize) };
}

impl State {
    /// cuMemMap of a piece of a page at `va`, without the access grant (see `Device::map_run`).
    pub(super) fn map_one(&mut self, va: DevPtr, piece: Piece) -> DeviceResult<()> {
        let Piece {
            page,
            offset: at_offset,
            size,
        } = piece;
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
        if at_offset % s.granularity != 0 || at_offset.checked_add(size).is_none_or(|e| e > p.size)
        {
            return Err(misuse(format!(
                "cuMemMap at {va:#x}+{size}: page {:#x} has size {}, so bytes {at_offset}.. of \
                 it cannot be mapped (the offset must be a multiple of the granularity and the \
                 piece must end inside the page)",
                page.0, p.size
            )));
        }
        // A piece already mapped elsewhere may be mapped again (CUDA allows a handle at
        // several addresses at once; the arena lends pages so: `Inner::lend_idle`).
        let offset = p.offset + at_offset;
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
        let p = s.pages.get_mut(&page.0).expect("checked above");
        p.maps.push((at_offset, size, va));
        Ok(())
    }

    /// cuMemUnmap of `[va, va+size)`: exactly a run of whole mappings.
    pub(super) fn unmap_range(&mut self, va: DevPtr, size: u64) -> DeviceResult<()> {
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
                p.maps.retain(|&(_, _, at)| at != start);
            }
        }
        Ok(())
    }

    pub(super) fn need_vmm(&self, call: &str) -> DeviceResult<()> {
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
    pub(super) fn check_granular(
        &self,
        call: &str,
        va: Option<DevPtr>,
        size: u64,
    ) -> DeviceResult<()> {
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
    pub(super) fn charge(&mut self, size: u64) -> DeviceResult<()> {
        match self.used.checked_add(size) {
            Some(used) if used <= self.capacity => {
                self.used = used;
                self.peak_used = self.peak_used.max(used);
                Ok(())
            }
            _ => Err(DeviceError::OutOfMemory),
        }
    }

    /// Takes `size` bytes of fake address space aligned to `align`.
    pub(super) fn fake_range(&mut self, size: u64, align: u64) -> DeviceResult<DevPtr> {
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
    pub(super) fn reservation_holding(&self, va: DevPtr, size: u64) -> Option<(DevPtr, u64)> {
        let (&start, &len) = self.reservations.range(..=va).next_back()?;
        (va + size <= start + len).then_some((start, len))
    }

    /// The mapping holding `addr`, if any.
    pub(super) fn mapping_at(&self, addr: DevPtr) -> Option<(DevPtr, &Mapping)> {
        let (&start, m) = self.mappings.range(..=addr).next_back()?;
        (addr < start + m.size).then_some((start, m))
    }

    /// The plain allocation holding `addr`, if any.
    pub(super) fn plain_at(&self, addr: DevPtr) -> Option<(DevPtr, u64)> {
        let (&start, &len) = self.plain.range(..=addr).next_back()?;
        (addr < start + len).then_some((start, len))
    }
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

    /// The most bytes [`SimDevice::used_bytes`] has been.
    pub fn peak_used(&self) -> u64 {
        self.state.lock().peak_used
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
