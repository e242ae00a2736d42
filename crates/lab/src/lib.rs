//! Allocation traces: the event model every importer produces and the replayer consumes.
//!
//! Sources: our own recordings ([`format`](mod@format), written by the plugin with `trace:PATH`),
//! PyTorch memory snapshots ([`torch_snapshot`], read through the restricted unpickler in
//! [`pickle`]), RMM `logging_resource_adaptor` CSV logs ([`rmm`]) and synthetic workloads
//! ([`synth`]). [`load`] picks the importer from the file's content. [`replay`] runs a trace
//! through the arena on a simulated device; [`native`] emulates PyTorch's native caching allocator
//! on the same trace; [`fit`] finds the smallest device each needs; [`plot`] draws both; [`live`]
//! lists what is live at the peak or before an event, by site; [`diff`] what grew and shrank
//! between two moments (of two traces, or two steps of one).

pub mod diff;
pub mod fit;
pub mod format;
mod frames;
pub mod live;
pub mod native;
mod native_conf;
pub mod pickle;
pub mod plot;
pub mod replay;
pub mod rmm;
pub mod synth;
pub mod torch_snapshot;
pub mod training;
pub mod workloads;

mod import;
mod input;
mod model;
pub use import::{load, load_with_warnings};
pub use model::{Event, Kind, NativeReserved, Op, Source, StepMarks, Trace};
