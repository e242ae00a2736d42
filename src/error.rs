//! Errors that cross layers. Each one says what was asked, what was found and what would be right.

use std::fmt;

use crate::device::DeviceError;

/// Everything that can go wrong in torch-arena.
#[derive(Clone, Debug)]
pub enum Error {
    /// A bad `TORCH_ARENA_CONF`.
    Config(String),
    /// The device layer failed.
    Device(DeviceError),
    /// A request could not be met. The text starts with "CUDA out of memory. Tried to allocate".
    OutOfMemory(String),
    /// A free or record_stream named a pointer we never returned, or one already freed: which
    /// fault it was, and the message.
    BadPointer(PointerFault, String),
    /// A device ordinal outside what was configured.
    BadDevice(String),
    /// A trace file that cannot be read, written or parsed: the message names the file and, for
    /// corrupt content, the byte offset or line.
    Trace(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(m)
            | Error::OutOfMemory(m)
            | Error::BadPointer(_, m)
            | Error::BadDevice(m)
            | Error::Trace(m) => f.write_str(m),
            Error::Device(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

/// What was wrong with a pointer handed back to us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointerFault {
    /// Not in memory this allocator manages.
    Unknown,
    /// Ours, but not a live allocation: freed already (or never handed out).
    Freed,
    /// Inside a live allocation, not at its start.
    Interior,
    /// A live allocation freed with another size than it was requested with (it is freed).
    SizeMismatch,
}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Self {
        Error::Device(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;
