//! Every setting of torch-arena as a typed value ([`Config`]) and its defaults.

/// Which device implementation backs the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cuda,
    Sim,
}

impl DeviceKind {
    /// The spelling in `TORCH_ARENA_CONF` (`cuda` or `sim`).
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cuda => "cuda",
            DeviceKind::Sim => "sim",
        }
    }
}

/// Which allocation sites are captured (`sites:none|python|native|all`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SitesMode {
    None,
    Python,
    Native,
    All,
}

impl SitesMode {
    /// The spelling in `TORCH_ARENA_CONF` and `torch_arena_set_sites`.
    pub fn as_str(self) -> &'static str {
        match self {
            SitesMode::None => "none",
            SitesMode::Python => "python",
            SitesMode::Native => "native",
            SitesMode::All => "all",
        }
    }

    /// `none`, `python`, `native` or `all`.
    pub fn parse(v: &str) -> Option<SitesMode> {
        Some(match v {
            "none" => SitesMode::None,
            "python" => SitesMode::Python,
            "native" => SitesMode::Native,
            "all" => SitesMode::All,
            _ => return None,
        })
    }
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
    /// The multiple-of-granularity check happens when the arena is created, not here.
    pub page_size_mb: u64,
    /// `handle_mb:N`: largest physical handle created for large blocks, in whole pages (rounded
    /// down, at least one); 0 (the default): one handle per contiguous run mapped.
    pub handle_mb: u64,
    /// `stitch:True|False`: move idle mapped pages to where they are needed when creating new ones
    /// would pass the limit; with False, only on the out-of-memory path (default True).
    pub stitch: bool,
    /// `views:True|False`: at the limit, a moved idle mapping of up to 64 pages stays mapped where
    /// it was too, so that a step that repeats finds its pages in both places (default False).
    pub views: bool,
    /// `release_idle_ms:N`: release cached pages idle longer than N ms to the driver; 0 = never.
    pub release_idle_ms: u64,
    /// `memory_fraction:F`: cap on reserved bytes as a fraction of device memory, in (0, 1].
    pub memory_fraction: f64,
    /// `slab_max_kb:N`: largest request served from size-class slabs, in KiB; larger requests
    /// take 512-byte-granular blocks of the page heap (default 64: one slab chunk, see
    /// ARCHITECTURE.md "Small requests"). Statistics count every request up to 1 MiB in
    /// `small_pool`, as PyTorch does, whichever serves it.
    pub slab_max_kb: u64,
    /// `trace:PATH`: record every alloc and free to this file (`{rank}`, `{pid}` expanded by the
    /// Python package); `None` = no recording.
    pub trace: Option<String>,
    /// `driver_costs:PATH`: latencies of the driver calls for the lab's cost model
    /// (`torch-arena replay`; see `src/device/costs.rs`); `None` = the defaults, measured on an
    /// H200.
    pub driver_costs: Option<String>,
    /// `sites:none|python|native|all|auto`: which allocation sites are captured; `None` = `auto`
    /// (not given: see [`Config::effective_sites`]).
    pub sites: Option<SitesMode>,
    /// `sites_every:N`: capture the site of one allocation in N (default 1).
    pub sites_every: u64,
    /// `sites_min_kb:N`: capture sites only for requests of at least N KiB (default 0).
    pub sites_min_kb: u64,
    /// `leaks:True|False`: the Python layer prints a leak report at exit (default False).
    pub leaks: bool,
    /// `explain:True|False`: the Python layer attributes memory to modules (forward hooks) and
    /// writes an `explain()` report at out-of-memory (default False).
    pub explain: bool,
    /// `leak_warmup:N`: steps ignored before growth counts (default 2).
    pub leak_warmup: u64,
    /// `leak_age:N`: also report live allocations older than N steps; 0 = off (default 0).
    pub leak_age: u64,
    /// `cpu_tensors:True|False`: the Python package puts the storage of every CPU tensor made
    /// after `enable()` on simulated device 0 (a CPU allocator registered with c10), so real
    /// models run through the arena without a GPU. Needs `device:sim` and `sim_backing:True`
    /// (checked by [`Config::parse`]); the allocator itself reads nothing of it (default False).
    pub cpu_tensors: bool,
}

impl Config {
    /// The site mode in effect: `sites` when given, else `python` with `leaks:True`, else `none`.
    pub fn effective_sites(&self) -> SitesMode {
        match self.sites {
            Some(m) => m,
            None if self.leaks => SitesMode::Python,
            None => SitesMode::None,
        }
    }
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
            handle_mb: 0,
            stitch: true,
            views: false,
            release_idle_ms: 0,
            memory_fraction: 1.0,
            slab_max_kb: 64,
            trace: None,
            driver_costs: None,
            sites: None,
            sites_every: 1,
            sites_min_kb: 0,
            leaks: false,
            explain: false,
            leak_warmup: 2,
            leak_age: 0,
            cpu_tensors: false,
        }
    }
}
