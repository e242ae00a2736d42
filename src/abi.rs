//! The C ABI (stub: being written).
