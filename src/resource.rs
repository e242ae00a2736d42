//! One small allocation interface, and the layers composed around it.
//!
//! A [`Resource`] hands out device memory as [`Block`]s and takes it back. The [`Arena`] is one;
//! [`Tracked`] (the live table, allocation sites, history) and [`Recorded`] (the `trace:PATH`
//! file) wrap any resource the way RMM's adaptors wrap a memory resource, and know nothing of
//! what they wrap but this interface. [`crate::TorchArena`] composes them in one place
//! (`TorchArena::stack`), outermost first: the recorder (which holds no lock across the call:
//! the arena numbers each operation under its shard's lock, and the recorder writes the lines
//! in that order), the arena's lock, then the tracker's shard lock (a leaf). A site is captured
//! before any of them: it may take the GIL, and no lock of ours may be held then.

use crate::arena::Arena;
pub use crate::block::Request;
use crate::block::{Block, PoolCall, PoolId};
use crate::device::{DevPtr, DeviceError, StreamId};
use crate::error::{Error, PointerFault, Result};
use crate::record::Recorder;
use crate::track::Tracker;

/// An allocator of device memory.
pub trait Resource {
    /// A block of at least `req.size` bytes, 512-byte aligned, usable on `req.stream` at once.
    fn alloc(&self, req: &Request) -> Result<Block>;
    /// Give back the block at `ptr`, allocated for `size` bytes; `stream` is where it was last
    /// used. A size that differs from the request is an error, but the block is freed all the
    /// same (the pointer is what names it); a pointer never handed out, or freed twice, is an
    /// error and changes nothing.
    fn free(&self, ptr: DevPtr, size: u64, stream: StreamId) -> Result<()>;
    /// Physical bytes held.
    fn reserved(&self) -> u64;
    /// `recordStream`: the block containing `ptr` is used on `stream` too, so its memory is
    /// reused only once that stream's work queued before its free has finished. Returns the
    /// block's base. A resource without streams cannot honour it and says so.
    fn record_stream(&self, ptr: DevPtr, stream: StreamId) -> Result<DevPtr> {
        let _ = stream;
        Err(Error::Device(DeviceError::Misuse(format!(
            "record_stream({ptr:#x}): this resource does not order memory by stream"
        ))))
    }
    /// A call on private pool `id` (CUDA graph capture). A resource without private pools
    /// refuses it.
    fn pool(&self, id: PoolId, call: PoolCall) -> Result<()> {
        Err(Error::Device(DeviceError::Misuse(format!(
            "{call:?} on pool {id:?}: this resource has no private pools"
        ))))
    }
}

/// Whether a free that returned `r` freed the block (only a size mismatch is an error that
/// frees).
pub fn freed(r: &Result<()>) -> bool {
    !matches!(
        r,
        Err(Error::BadPointer(
            PointerFault::Unknown | PointerFault::Freed | PointerFault::Interior,
            _
        ))
    )
}

impl Resource for Arena {
    #[inline]
    fn alloc(&self, req: &Request) -> Result<Block> {
        match req.pool {
            None => Arena::alloc(self, req.size, req.stream),
            Some(p) => self.alloc_pool(req.size, req.stream, p),
        }
    }

    #[inline]
    fn free(&self, ptr: DevPtr, size: u64, stream: StreamId) -> Result<()> {
        Arena::free(self, ptr, Some(size), stream)
    }

    fn reserved(&self) -> u64 {
        self.stats().reserved_bytes.all().current as u64
    }

    fn record_stream(&self, ptr: DevPtr, stream: StreamId) -> Result<DevPtr> {
        Arena::record_stream(self, ptr, stream)
    }

    fn pool(&self, id: PoolId, call: PoolCall) -> Result<()> {
        match call {
            PoolCall::Begin => self.begin_pool(id),
            PoolCall::End => self.end_pool(id),
            PoolCall::Release => self.release_pool(id),
        }
    }
}

impl<R: Resource + ?Sized> Resource for &R {
    #[inline]
    fn alloc(&self, req: &Request) -> Result<Block> {
        (**self).alloc(req)
    }

    #[inline]
    fn free(&self, ptr: DevPtr, size: u64, stream: StreamId) -> Result<()> {
        (**self).free(ptr, size, stream)
    }

    fn reserved(&self) -> u64 {
        (**self).reserved()
    }

    fn record_stream(&self, ptr: DevPtr, stream: StreamId) -> Result<DevPtr> {
        (**self).record_stream(ptr, stream)
    }

    fn pool(&self, id: PoolId, call: PoolCall) -> Result<()> {
        (**self).pool(id, call)
    }
}

/// `inner`, with every block it hands out in `tracker`'s live table of `device` (and, while
/// history is on, each call in the history ring with the reserved bytes it mapped or unmapped).
pub struct Tracked<'a, R> {
    pub inner: R,
    pub tracker: &'a Tracker,
    pub device: i32,
}

impl<R: Resource> Tracked<'_, R> {
    /// Reserved bytes before a call, read only while history is on.
    #[inline]
    fn before(&self) -> Option<u64> {
        self.tracker
            .history_enabled()
            .then(|| self.inner.reserved())
    }
}

impl<R: Resource> Resource for Tracked<'_, R> {
    #[inline]
    fn alloc(&self, req: &Request) -> Result<Block> {
        let before = self.before();
        let block = self.inner.alloc(req)?;
        let reserved = || self.inner.reserved();
        let hist = before.map(|b| (b, &reserved as &dyn Fn() -> u64));
        self.tracker
            .on_alloc(self.device, block, req.size, req.stream, req.site, hist);
        Ok(block)
    }

    #[inline]
    fn free(&self, ptr: DevPtr, size: u64, stream: StreamId) -> Result<()> {
        // Out of the live table first: once the inner resource frees it, another thread may
        // be handed `ptr` and enter it again.
        let taken = self.tracker.take(self.device, ptr, stream);
        let before = self.before();
        let r = self.inner.free(ptr, size, stream);
        let reserved = || self.inner.reserved();
        let hist = before.map(|b| (b, &reserved as &dyn Fn() -> u64));
        self.tracker
            .on_free(self.device, ptr, taken, freed(&r), stream, hist);
        r
    }

    fn reserved(&self) -> u64 {
        self.inner.reserved()
    }

    /// Marks the block as used on another stream in the live table too (its leak report says
    /// so).
    fn record_stream(&self, ptr: DevPtr, stream: StreamId) -> Result<DevPtr> {
        let base = self.inner.record_stream(ptr, stream)?;
        self.tracker.note_record_stream(base);
        Ok(base)
    }

    fn pool(&self, id: PoolId, call: PoolCall) -> Result<()> {
        self.inner.pool(id, call)
    }
}

/// `inner`, with every successful alloc and free of `device` written to `recorder` (when there
/// is one) in the order the arena performed them: each with the number the arena gave it under
/// its shard's lock (`Arena::number_operations`, `arena::last_number`), with no lock of the
/// recorder's held across the call.
pub struct Recorded<'a, R> {
    pub inner: R,
    pub recorder: Option<&'a Recorder>,
    pub device: i32,
}

impl<R: Resource> Resource for Recorded<'_, R> {
    #[inline]
    fn alloc(&self, req: &Request) -> Result<Block> {
        let Some(recorder) = self.recorder else {
            return self.inner.alloc(req);
        };
        let block = self.inner.alloc(req)?;
        let number = crate::arena::last_number();
        if let Some(text) = &req.site_label {
            recorder.define_site(req.site, text);
        }
        recorder.alloc_numbered(
            number,
            block.ptr,
            req.size,
            req.stream,
            self.device,
            req.site,
        );
        Ok(block)
    }

    #[inline]
    fn free(&self, ptr: DevPtr, size: u64, stream: StreamId) -> Result<()> {
        let Some(recorder) = self.recorder else {
            return self.inner.free(ptr, size, stream);
        };
        let r = self.inner.free(ptr, size, stream);
        if freed(&r) {
            let number = crate::arena::last_number();
            recorder.free_numbered(number, ptr, size, stream, self.device);
        }
        r
    }

    fn reserved(&self) -> u64 {
        self.inner.reserved()
    }

    /// Not in the trace format (a replay has no streams' work to wait for): passed on.
    fn record_stream(&self, ptr: DevPtr, stream: StreamId) -> Result<DevPtr> {
        self.inner.record_stream(ptr, stream)
    }

    /// Not in the trace format: passed on.
    fn pool(&self, id: PoolId, call: PoolCall) -> Result<()> {
        self.inner.pool(id, call)
    }
}
