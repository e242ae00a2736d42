//! `TORCH_ARENA_CONF`: settings in PyTorch's `PYTORCH_CUDA_ALLOC_CONF` grammar.
//! (The parser is being written; this file holds the settings the arena reads.)

/// Which device implementation backs the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cuda,
    Sim,
}

/// Every setting, with its default.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `device:cuda|sim` (default cuda).
    pub device: DeviceKind,
    /// `sim_capacity_mb:N`: capacity of each simulated device in MiB (default 81920 = 80 GiB).
    pub sim_capacity_mb: u64,
    /// `sim_backing:True|False`: back simulated pages with host memory (default False).
    pub sim_backing: bool,
    /// `sim_granularity_kb:N`: simulated allocation granularity in KiB, a power of two (default 2048).
    pub sim_granularity_kb: u64,
    /// `sim_vmm:True|False`: whether the simulated device supports VMM (default True).
    pub sim_vmm: bool,
    /// `sim_devices:N`: number of simulated devices (default 1).
    pub sim_devices: u32,
    /// `page_size_mb:N`: physical page size in MiB, a multiple of the granularity (default 2).
    pub page_size_mb: u64,
    /// `stitch:True|False`: reuse idle mapped pages anywhere before creating new ones (default True).
    pub stitch: bool,
    /// `release_idle_ms:N`: release cached pages idle longer than N ms to the driver; 0 = never.
    pub release_idle_ms: u64,
    /// `memory_fraction:F`: cap on reserved bytes as a fraction of device memory, in (0, 1].
    pub memory_fraction: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            device: DeviceKind::Cuda,
            sim_capacity_mb: 80 * 1024,
            sim_backing: false,
            sim_granularity_kb: 2048,
            sim_vmm: true,
            sim_devices: 1,
            page_size_mb: 2,
            stitch: true,
            release_idle_ms: 0,
            memory_fraction: 1.0,
        }
    }
}

impl Config {
    /// Parse `TORCH_ARENA_CONF` (stub: being written).
    pub fn parse(_text: &str) -> crate::error::Result<Config> {
        Ok(Config::default())
    }
}
