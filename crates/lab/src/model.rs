//! The trace event model every importer produces and the replayer consumes: [`Trace`] (events,
//! sites, how complete its start is, what native reserved), [`Event`], and the [`Window`] that
//! turns a source's reused addresses into unique allocation ids.

/// Whether an event hands out or gives back memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Alloc,
    Free,
}

/// One allocation or free. `id` links a free to its alloc: importers give every allocation a
/// unique id (addresses are reused in a source trace; ids never are within one trace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub op: Op,
    pub id: u64,
    /// Requested bytes (for a free: the bytes of the allocation it ends).
    pub size: u64,
    pub stream: u64,
    /// Microseconds since the trace began (0 where the source has no clock).
    pub time_us: i64,
    /// Index into [`Trace::sites`]; 0 = unknown.
    pub site: u32,
}

/// Where a trace came from, and how complete its start is (see `traces/snapshots/INDEX.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Recorded from an empty allocator: nothing was live before the first event.
    Fresh,
    /// Some memory was live, or reserved, before recording began; the live set is seeded.
    Partial,
    /// No segment events: the native allocator had reserved everything before the window.
    Warm,
    /// Segments and blocks only: replayed as the allocation of the live set.
    StateOnly,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Fresh => "fresh",
            Kind::Partial => "partial",
            Kind::Warm => "warm",
            Kind::StateOnly => "state",
        }
    }
}

/// The format a trace was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `torch-arena-trace` text format (ours), with its version.
    Arena(u32),
    /// A PyTorch `_dump_snapshot` pickle.
    TorchSnapshot,
    /// An RMM `logging_resource_adaptor` CSV log.
    RmmCsv,
    /// Generated in process ([`crate::synth`]).
    Synthetic,
}

/// What PyTorch's native allocator reserved over the trace, from the trace's own segment events.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NativeReserved {
    /// Reserved bytes before the first event.
    pub initial: u64,
    /// `(index into Trace::events, reserved bytes from that event on)`, in event order. The
    /// index is of the first replayed event at or after the segment event.
    pub changes: Vec<(usize, u64)>,
    /// The most reserved at any point.
    pub peak: u64,
    /// The native allocator's settings the source recorded (`allocator_settings` of a snapshot
    /// from torch ≥ 2.5), so an emulation runs under the same rules; defaults otherwise.
    pub expandable_segments: bool,
    /// `max_split_size` in bytes, `None` = unlimited (PyTorch's default).
    pub max_split_size: Option<u64>,
    /// The `PYTORCH_CUDA_ALLOC_CONF` text the snapshot recorded (`None` when it recorded none, or
    /// an empty one).
    pub conf: Option<String>,
}

/// Where a trace marks the ends of training steps, as event indices, and what marked them.
///
/// Step `k` is `events[ends[k-1]..ends[k]]` (step 0 from the first event, seeded ones included);
/// events after the last end belong to no marked step. Sources: a PyTorch snapshot's
/// `external_annotations` (the end of each `ProfilerStep#N`, else each `Optimizer.step#...`
/// `record_function` range on the trace's device), and the synthetic workloads' own steps.
/// torch-arena's trace format (version 1) and RMM logs record none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepMarks {
    /// What marked them, for reports ("the end of each Optimizer.step annotation").
    pub marker: String,
    /// Event index at which each step ends (non-decreasing, at most `events.len()`).
    pub ends: Vec<usize>,
    /// Marks the source holds that fall before the first recorded event (a recording whose
    /// start was lost): not steps of this trace.
    pub before_window: usize,
}

/// An allocation trace of one device, ready to replay.
#[derive(Clone, Debug)]
pub struct Trace {
    /// File name (or synthetic name) for reports.
    pub name: String,
    pub source: Source,
    pub kind: Kind,
    /// The device the events are from (multi-device sources: the one with the most events).
    pub device: i32,
    /// The first `seeded` events are allocations of what was live before the trace began; a
    /// replay performs them before event 0 of the recorded window (they count as events).
    pub seeded: usize,
    pub events: Vec<Event>,
    /// Interned allocation sites, index 0 = "unknown". Text such as `train.py:40 in step`.
    pub sites: Vec<String>,
    /// Native reserved bytes, where the source records them (PyTorch snapshots).
    pub native: Option<NativeReserved>,
    /// Step ends, where the source marks them ([`StepMarks`]).
    pub steps: Option<StepMarks>,
}

/// Turns a source's address-keyed allocs and frees into [`Event`]s with ids that never repeat
/// (addresses are reused; ids are not). A free of an address that is not live was allocated
/// before the window began: it is *seeded*, allocated before event 0 with the free's size, so a
/// replay starts from the live set the source started with.
#[derive(Default)]
pub(crate) struct Window {
    /// The window's events, in source order.
    pub events: Vec<Event>,
    /// Allocations live before the window (to replay first).
    pub seeds: Vec<Event>,
    /// Address → (id, requested bytes) of what is live now.
    pub live: std::collections::HashMap<u64, (u64, u64)>,
    next_id: u64,
}

impl Window {
    /// A window for `n` events. Callers pass a count the input justifies (a snapshot's entries,
    /// charged to its walk budget first), so the events never reallocate (doubling 20 M events
    /// would hold 1.3 GB for a moment where 800 MB suffice).
    pub fn with_capacity(n: usize) -> Self {
        Window {
            events: Vec::with_capacity(n),
            ..Default::default()
        }
    }

    /// A window whose first allocation gets id `first` (our format numbers from 1).
    pub fn starting_at(first: u64) -> Self {
        Window {
            next_id: first,
            ..Default::default()
        }
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id - 1
    }

    /// An allocation of `size` bytes at `addr`. An address already live replaces the older
    /// block in the map: its free was lost, and it stays live for the rest of the trace.
    pub fn alloc(&mut self, addr: u64, size: u64, stream: u64, time_us: i64, site: u32) {
        let id = self.next_id();
        self.live.insert(addr, (id, size));
        self.events.push(Event {
            op: Op::Alloc,
            id,
            size,
            stream,
            time_us,
            site,
        });
    }

    /// The free of the allocation at `addr` (seeded first if the window never allocated it).
    pub fn free(&mut self, addr: u64, size: u64, stream: u64, time_us: i64) {
        let (id, size) = match self.live.remove(&addr) {
            Some(x) => x,
            None => (self.seed(size, stream), size),
        };
        self.events.push(Event {
            op: Op::Free,
            id,
            size,
            stream,
            time_us,
            site: 0,
        });
    }

    /// A block live before the window; returns its id.
    pub fn seed(&mut self, size: u64, stream: u64) -> u64 {
        self.seed_at(size, stream, 0)
    }

    /// [`Window::seed`] of a block whose allocation site is known (a snapshot's live block with
    /// its frames).
    pub fn seed_at(&mut self, size: u64, stream: u64, site: u32) -> u64 {
        let id = self.next_id();
        self.seeds.push(Event {
            op: Op::Alloc,
            id,
            size,
            stream,
            time_us: 0,
            site,
        });
        id
    }

    /// The seeds, then the window: the events of a [`Trace`], and how many are seeds.
    pub fn finish(self) -> (Vec<Event>, usize) {
        let seeded = self.seeds.len();
        let mut events = self.events;
        if seeded > 0 {
            // In place: a copy of a 20 M-event window would double its 800 MB for a moment.
            events.reserve_exact(seeded);
            events.splice(0..0, self.seeds);
        }
        events.shrink_to_fit();
        (events, seeded)
    }
}

impl Trace {
    /// A synthetic trace (`synth:`): fresh, device 0, nothing seeded, no native record.
    pub fn synthetic(name: String, events: Vec<Event>, sites: Vec<String>) -> Trace {
        Trace {
            name,
            source: Source::Synthetic,
            kind: Kind::Fresh,
            device: 0,
            seeded: 0,
            events,
            sites,
            native: None,
            steps: None,
        }
    }

    /// Most requested bytes live at once, seeded live set included.
    pub fn peak_requested(&self) -> u64 {
        let (mut live, mut peak) = (0u64, 0u64);
        for e in &self.events {
            match e.op {
                Op::Alloc => {
                    live = live.saturating_add(e.size);
                    peak = peak.max(live);
                }
                Op::Free => live = live.saturating_sub(e.size),
            }
        }
        peak
    }
}
