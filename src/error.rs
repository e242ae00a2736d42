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
    /// A free or record_stream named a pointer we never returned, or one already freed.
    BadPointer(String),
    /// A device ordinal outside what was configured.
    BadDevice(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(m)
            | Error::OutOfMemory(m)
            | Error::BadPointer(m)
            | Error::BadDevice(m) => f.write_str(m),
            Error::Device(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Self {
        Error::Device(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;
