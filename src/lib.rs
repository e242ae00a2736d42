//! torch-arena: a CUDA caching allocator that PyTorch loads as a plugin
//! (`torch.cuda.memory.CUDAPluggableAllocator`).
//!
//! Layers, one way down: [`abi`] (the `extern "C"` exports) → [`allocator`] (one arena per
//! device, process-wide) → [`arena`] (size classes, page ranges, stream-ordered reuse) →
//! [`device`] (CUDA driver or simulated GPU). [`stats`] is kept beside the arena it counts.
//! [`record`] writes the `trace:PATH` recording; reading, replaying and emulating traces is the
//! lab's (the `torch-arena-lab` crate), which this library never links.

pub mod abi;
pub mod allocator;
pub mod arena;
pub mod atomic_file;
pub mod block;
pub mod config;
pub mod device;
pub mod error;
pub mod fork;
pub mod json;
pub mod log;
mod ptr_table;
pub mod record;
pub mod resource;
mod route;
pub mod sizing;
pub mod slots;
pub mod stats;
pub mod track;

pub use allocator::TorchArena;
pub use config::Config;
pub use error::{Error, Result};
