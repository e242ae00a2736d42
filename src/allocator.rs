//! The process-wide allocator: one [`Arena`] per device, created on first use, the configuration
//! they share, and the layers around them (`resource.rs`: tracking and recording, composed in
//! `TorchArena::stack`). Every `extern "C"` export goes through [`TorchArena`].

use std::sync::Arc;

use once_cell::sync::OnceCell;

use crate::arena::{Arena, ArenaExtras, PoolId, ReclaimReport};
use crate::block::PoolCall;
use crate::config::{Config, DeviceKind};
use crate::device::{DevPtr, Device, DeviceError, StreamId, cuda::CudaDevice, sim::SimDevice};
use crate::error::{Error, PointerFault, Result};
use crate::record::Recorder;
use crate::resource::{Recorded, Request, Resource, Tracked};
use crate::stats::DeviceStats;
use crate::track::Tracker;

pub use crate::device::MAX_DEVICES;

/// One allocator per process: a configuration and a lazily opened arena per device.
pub struct TorchArena {
    conf: Config,
    arenas: Vec<OnceCell<Arena>>,
    /// `trace:PATH`: every successful alloc and free is recorded here.
    recorder: Option<Recorder>,
    track: Tracker,
}

impl TorchArena {
    /// An allocator with these settings. Devices are opened on first use. A `trace` file that
    /// cannot be created is logged and nothing is recorded; [`TorchArena::try_new`] makes it an
    /// error instead.
    pub fn new(conf: Config) -> Self {
        Self::try_new(conf.clone()).unwrap_or_else(|e| {
            tracing::warn!("{e}; continuing without recording");
            let track = Tracker::new(&conf);
            Self::build(conf, None, track)
        })
    }

    /// An allocator with these settings; `Err` when the `trace` file cannot be created.
    pub fn try_new(conf: Config) -> Result<Self> {
        let recorder = match &conf.trace {
            Some(p) => Some(
                Recorder::create(expand_trace_path(p))
                    .map_err(|e| Error::Config(format!("trace:{p}: {e}")))?,
            ),
            None => None,
        };
        let track = Tracker::new(&conf);
        Ok(Self::build(conf, recorder, track))
    }

    /// An allocator with this tracker and no trace recording ([`Tracker::disabled`] measures
    /// what tracking costs).
    pub fn with_tracker(conf: Config, track: Tracker) -> Self {
        Self::build(conf, None, track)
    }

    fn build(conf: Config, recorder: Option<Recorder>, track: Tracker) -> Self {
        let arenas = (0..MAX_DEVICES).map(|_| OnceCell::new()).collect();
        TorchArena {
            conf,
            arenas,
            recorder,
            track,
        }
    }

    /// Who holds what: live allocations, steps, tags, sites, history.
    pub fn tracker(&self) -> &Tracker {
        &self.track
    }

    /// An allocator configured from `TORCH_ARENA_CONF` (empty or unset: defaults).
    pub fn from_env() -> Result<Self> {
        Self::try_new(Config::parse(&conf_from_env()?)?)
    }

    /// The trace recorder (`trace:PATH`), if recording.
    pub fn recorder(&self) -> Option<&Recorder> {
        self.recorder.as_ref()
    }

    pub fn config(&self) -> &Config {
        &self.conf
    }

    /// The arena slot of `device` (opened or not), or an error for an ordinal out of range.
    fn slot(&self, device: i32) -> Result<&OnceCell<Arena>> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.arenas.get(d))
            .ok_or_else(|| {
                Error::BadDevice(format!(
                    "device {device} is out of range: expected 0..{MAX_DEVICES}"
                ))
            })
    }

    /// The arena of `device`, opening the device on first use.
    #[inline]
    pub fn arena(&self, device: i32) -> Result<&Arena> {
        // Every request asks: an opened device's arena is one load away.
        if let Some(a) = usize::try_from(device)
            .ok()
            .and_then(|d| self.arenas.get(d))
            .and_then(OnceCell::get)
        {
            return Ok(a);
        }
        self.open_arena(device)
    }

    /// [`TorchArena::arena`] for a device not opened yet (or an ordinal out of range).
    #[cold]
    fn open_arena(&self, device: i32) -> Result<&Arena> {
        let slot = self.slot(device)?;
        // Made under `fork::OPENING`, so a fork child never finds it half made (a lock of the
        // cell's own that no fork handler could take).
        let _opening = crate::fork::OPENING.lock();
        slot.get_or_try_init(|| {
            let dev = self.open_device(device)?;
            let arena = Arena::new(dev, &self.conf)?;
            if let Some(r) = &self.recorder {
                // Lines are written in the order the arena did the operations.
                arena.number_operations(r.numbers());
            }
            self.track.open_device(device);
            Ok(arena)
        })
    }

    /// In a fork child of a process that used the CUDA device (`crate::fork`): the error every
    /// request for device memory gets.
    fn refuse_in_forked_child(&self) -> Result<()> {
        if self.conf.device == DeviceKind::Cuda && crate::fork::in_child() {
            return Err(Error::Device(DeviceError::ForkedChild));
        }
        Ok(())
    }

    /// Before `fork()` (`crate::fork`): takes every lock of this allocator in the lock order:
    /// the trace recorder, each open arena (and its device), the tracker.
    pub fn fork_prepare(&self) {
        crate::record::fork_prepare(self.recorder.as_ref());
        for a in self.arenas.iter().filter_map(OnceCell::get) {
            a.fork_prepare();
        }
        self.track.fork_prepare();
    }

    /// After `fork()`, in the parent (`child` false) or the child: gives back what
    /// [`TorchArena::fork_prepare`] took (in the child the trace file stops being written).
    ///
    /// # Safety
    /// Once after each `fork_prepare`, on the same thread.
    pub unsafe fn fork_release(&self, child: bool) {
        // SAFETY: each was taken by `fork_prepare` on this thread (the caller's contract); an
        // arena opened since would need `OPENING`, which the fork handlers hold.
        unsafe {
            self.track.fork_release(child);
            for a in self.arenas.iter().filter_map(OnceCell::get) {
                a.fork_release(child);
            }
            crate::record::fork_release(self.recorder.as_ref(), child);
        }
    }

    /// Arenas already opened, with their ordinals.
    pub fn open_arenas(&self) -> impl Iterator<Item = (i32, &Arena)> {
        self.arenas
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.get().map(|a| (i as i32, a)))
    }

    fn open_device(&self, device: i32) -> Result<Arc<dyn Device>> {
        match self.conf.device {
            DeviceKind::Sim => {
                if device as u32 >= self.conf.sim_devices {
                    return Err(Error::BadDevice(format!(
                        "device {device} does not exist: the simulated GPU has {} device(s) \
                         (set sim_devices:N in TORCH_ARENA_CONF for more)",
                        self.conf.sim_devices
                    )));
                }
                Ok(Arc::new(SimDevice::new(self.conf.sim_config(device))?))
            }
            DeviceKind::Cuda => Ok(Arc::new(CudaDevice::open(device)?)),
        }
    }

    /// `alloc(size, device, stream)`: a pointer to at least `size` bytes, 512-byte aligned.
    /// Size 0 gives `Ok(0)` (NULL), as PyTorch's native allocator does.
    pub fn malloc(&self, size: usize, device: i32, stream: StreamId) -> Result<DevPtr> {
        self.malloc_in(size, device, stream, None)
    }

    /// Like [`TorchArena::malloc`], from private pool `pool` (CUDA graph capture: the shim routes
    /// here the allocations whose stream the capture's filter accepts).
    pub fn malloc_pool(
        &self,
        size: usize,
        device: i32,
        stream: StreamId,
        pool: PoolId,
    ) -> Result<DevPtr> {
        self.malloc_in(size, device, stream, Some(pool))
    }

    /// `beginAllocateToPool(device, pool, filter)`, less the filter (the shim keeps it).
    pub fn begin_pool(&self, device: i32, pool: PoolId) -> Result<()> {
        self.pool_call(device, pool, PoolCall::Begin)
    }

    /// `endAllocateToPool(device, pool)`.
    pub fn end_pool(&self, device: i32, pool: PoolId) -> Result<()> {
        self.pool_call(device, pool, PoolCall::End)
    }

    /// `releasePool(device, pool)`.
    pub fn release_pool(&self, device: i32, pool: PoolId) -> Result<()> {
        self.pool_call(device, pool, PoolCall::Release)
    }

    /// A private pool call, down the same stack as an allocation.
    fn pool_call(&self, device: i32, pool: PoolId, call: PoolCall) -> Result<()> {
        let arena = self.arena(device)?;
        self.stack(arena, device).pool(pool, call)
    }

    fn malloc_in(
        &self,
        size: usize,
        device: i32,
        stream: StreamId,
        pool: Option<PoolId>,
    ) -> Result<DevPtr> {
        if size == 0 {
            return Ok(0);
        }
        // Before the arena: a cached block would be handed out with no driver call to refuse it.
        self.refuse_in_forked_child()?;
        let arena = self.arena(device)?;
        // Before any lock: capturing Python frames, and a new site's text for the trace file,
        // take the GIL.
        let site = self.track.capture_site(size as u64);
        let site_label = match &self.recorder {
            Some(r) if !r.knows_site(site) => Some(site_label(&self.track, site)),
            _ => None,
        };
        let req = Request {
            size: size as u64,
            stream,
            pool,
            site,
            site_label,
        };
        Ok(self.stack(arena, device).alloc(&req)?.ptr)
    }

    /// `free(ptr, size, device, stream)`. NULL is a no-op. A pointer we never returned or a double
    /// free is an error and changes nothing. A size that differs from the request is reported as
    /// an error too, but the allocation is still freed: the pointer is what names it, and keeping
    /// it would leak it for good.
    pub fn free(&self, ptr: DevPtr, size: usize, device: i32, stream: StreamId) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        if self.refuse_in_forked_child().is_err() {
            // A fork child's garbage collector frees the CUDA tensors it inherited: nothing of
            // the parent's context may be touched here, and nothing needs to be.
            return Ok(());
        }
        let arena = self.arena(device)?;
        self.stack(arena, device).free(ptr, size as u64, stream)
    }

    /// The resource stack of `device`, composed here and only here, outermost first in the lock
    /// order (`resource.rs`): the trace recorder, the tracker, the arena.
    #[inline]
    fn stack<'a>(&'a self, arena: &'a Arena, device: i32) -> Recorded<'a, Tracked<'a, &'a Arena>> {
        Recorded {
            inner: Tracked {
                inner: arena,
                tracker: &self.track,
                device,
            },
            recorder: self.recorder.as_ref(),
            device,
        }
    }

    /// The arena that owns `ptr`, among the devices opened so far, and its device.
    fn owner(&self, ptr: DevPtr) -> Result<(i32, &Arena)> {
        self.open_arenas()
            .find(|(_, a)| a.owns(ptr))
            .ok_or_else(|| {
                Error::BadPointer(
                    PointerFault::Unknown,
                    format!("pointer {ptr:#x} was not allocated by torch-arena"),
                )
            })
    }

    /// `tensor.record_stream(s)`: the allocation at `ptr` is also used on `stream`.
    pub fn record_stream(&self, ptr: DevPtr, stream: StreamId) -> Result<()> {
        self.refuse_in_forked_child()?;
        let (device, arena) = self.owner(ptr)?;
        self.stack(arena, device).record_stream(ptr, stream)?;
        Ok(())
    }

    /// The allocation that contains `ptr`: its base pointer and size.
    pub fn base_alloc(&self, ptr: DevPtr) -> Result<(DevPtr, u64)> {
        self.owner(ptr)?.1.base_alloc(ptr)
    }

    /// `torch.cuda.empty_cache()`: every cached page goes back to the driver, on every device.
    pub fn empty_cache(&self) -> Result<ReclaimReport> {
        let mut total = ReclaimReport::default();
        for (_, a) in self.open_arenas() {
            total += a.empty_cache()?;
        }
        Ok(total)
    }

    /// `torch.cuda.set_per_process_memory_fraction(fraction, device)`.
    pub fn set_memory_fraction(&self, fraction: f64, device: i32) -> Result<()> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(Error::Config(format!(
                "memory fraction {} for device {device} is invalid: expected a number in (0, 1]",
                crate::config::show_fraction(fraction)
            )));
        }
        self.arena(device)?.set_memory_fraction(fraction)
    }

    pub fn stats(&self, device: i32) -> Result<DeviceStats> {
        Ok(self.arena(device)?.stats())
    }

    /// The memory `device`'s arena created, by what each request did to the bytes requested.
    pub fn growth(&self, device: i32) -> Result<crate::arena::GrowthCounts> {
        Ok(self.arena(device)?.growth())
    }

    /// Where `device`'s physical pages are: in use, idle mapped, held unused, pooled.
    pub fn pages(&self, device: i32) -> Result<crate::arena::PageCounts> {
        Ok(self.arena(device)?.pages())
    }

    /// The arena's limit and the device's free bytes ([`crate::arena::Arena::limits`]).
    pub fn limits(&self, device: i32) -> Result<(u64, u64)> {
        Ok(self.arena(device)?.limits())
    }

    pub fn extras(&self, device: i32) -> Result<ArenaExtras> {
        Ok(self.arena(device)?.extras())
    }

    pub fn reset_peak_stats(&self, device: i32) -> Result<()> {
        self.arena(device)?.reset_peak_stats();
        Ok(())
    }

    pub fn reset_accumulated_stats(&self, device: i32) -> Result<()> {
        self.arena(device)?.reset_accumulated_stats();
        Ok(())
    }

    /// `memory_summary()`: PyTorch's table, line for line, then the torch-arena section.
    pub fn summary(&self, device: i32, abbreviated: bool) -> Result<String> {
        let arena = self.arena(device)?;
        let (stats, extras) = (arena.stats(), arena.extras());
        Ok(crate::stats::summary::memory_summary(
            device,
            &stats,
            &extras,
            abbreviated,
        ))
    }

    /// The segments and blocks of `device` (empty when it was never opened).
    pub fn layout(&self, device: i32) -> Result<crate::arena::layout::Layout> {
        Ok(self
            .slot(device)?
            .get()
            .map(Arena::layout)
            .unwrap_or_default())
    }

    /// Return empty slabs and cached ranges to the page pool, and say what was recovered.
    pub fn defragment(&self, device: i32) -> Result<ReclaimReport> {
        self.arena(device)?.defragment()
    }
}

/// The text of `TORCH_ARENA_CONF` ("" when unset). Text that is not UTF-8 is an error, not an
/// empty configuration: defaults silently applied would hide the user's settings.
pub fn conf_from_env() -> Result<String> {
    match std::env::var("TORCH_ARENA_CONF") {
        Ok(text) => Ok(text),
        Err(std::env::VarError::NotPresent) => Ok(String::new()),
        Err(std::env::VarError::NotUnicode(raw)) => Err(Error::Config(format!(
            "TORCH_ARENA_CONF is not valid UTF-8 ({}): settings are ASCII key:value pairs, such \
             as stitch:False,memory_fraction:0.5",
            crate::config::clip(&raw.to_string_lossy())
        ))),
    }
}

/// `trace:PATH` with `{pid}` replaced by this process's id and `{rank}` (normally expanded by the
/// Python layer) by `RANK`, else `LOCAL_RANK`, else 0.
pub fn expand_trace_path(path: &str) -> String {
    let mut p = path.replace("{pid}", &std::process::id().to_string());
    if p.contains("{rank}") {
        let rank = std::env::var("RANK")
            .or_else(|_| std::env::var("LOCAL_RANK"))
            .unwrap_or_else(|_| "0".to_string());
        p = p.replace("{rank}", &rank);
    }
    p
}

/// One line naming allocation site `site` for a trace file: the innermost frame outside
/// torch-arena and torch (`train.py:40 in step`), else the innermost frame. May take the GIL.
fn site_label(track: &Tracker, site: u32) -> String {
    let frames = track.site_text(site);
    let library = |f: &str| f.contains("/torch_arena/") || f.contains("/torch/");
    frames
        .iter()
        .find(|f| f.kind == "python" && !library(&f.filename))
        .or_else(|| frames.first())
        .map(|f| match f.line {
            0 => format!("{} ({})", f.name, f.filename),
            line => format!("{}:{line} in {}", f.filename, f.name),
        })
        .unwrap_or_default()
}
