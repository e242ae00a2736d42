//! The single table of accepted keys (`KEY_DEFS`): each key's help text with its default, the
//! forms its value takes, how it sets a [`Config`] and how it prints one back; and the bounds and
//! value formats those use.

use super::settings::{Config, DeviceKind, SitesMode};

/// Where `Config::parse` says its text came from.
pub const ENV_VAR: &str = "TORCH_ARENA_CONF";

/// One accepted key: its name, its one-line help (with the default), how to apply a value and how
/// to print the current one back.
pub(super) struct KeyDef {
    pub(super) name: &'static str,
    pub(super) help: &'static str,
    /// The accepted forms of a value, as error messages name them ("True or False").
    pub(super) forms: &'static str,
    /// Applies a scalar value; `None` if the value is not one of the accepted forms.
    pub(super) set: fn(&mut Config, &str) -> Option<()>,
    /// The value of this key in `conf`, in a form `set` accepts.
    pub(super) show: fn(&Config) -> String,
}

pub(super) fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "True" => Some(true),
        "False" => Some(false),
        _ => None,
    }
}

pub(super) fn show_bool(b: bool) -> String {
    if b { "True" } else { "False" }.to_string()
}

/// A plain decimal integer: digits only (no sign, no underscores, no exponent).
/// Largest simulated device: 1 PiB, so capacities in bytes never wrap.
pub const MAX_SIM_CAPACITY_MB: u64 = 1 << 30;
/// Largest physical page: 1 GiB.
pub const MAX_PAGE_SIZE_MB: u64 = 1024;
/// CUDA's allocation granularity for device memory on every NVIDIA GPU that supports VMM.
pub const CUDA_GRANULARITY_MB: u64 = 2;
/// Longest piece of user text an error message repeats.
pub(super) const ECHO_MAX: usize = 80;

/// `text` as an error message repeats it: at most `ECHO_MAX` (80) bytes, then how long it was.
pub fn clip(text: &str) -> String {
    if text.len() <= ECHO_MAX {
        return text.to_string();
    }
    let mut n = ECHO_MAX;
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    format!("{}... ({} bytes in all)", &text[..n], text.len())
}

/// A fraction as a person reads it: `0.25`, `1`, and `1e-300` rather than 300 digits.
pub fn show_fraction(f: f64) -> String {
    let plain = f.to_string();
    if plain.len() <= 12 {
        plain
    } else {
        format!("{f:e}")
    }
}

pub(super) fn parse_uint(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

/// The keys, in the order they are listed and printed. Keys are defined here and nowhere else.
pub(super) const KEY_DEFS: [KeyDef; 23] = [
    KeyDef {
        name: "device",
        help: "device implementation: cuda (the GPU, through the CUDA driver) or sim (a simulated \
               GPU) (default cuda)",
        forms: "cuda or sim",
        set: |c, v| {
            c.device = match v {
                "cuda" => DeviceKind::Cuda,
                "sim" => DeviceKind::Sim,
                _ => return None,
            };
            Some(())
        },
        show: |c| c.device.as_str().to_string(),
    },
    KeyDef {
        name: "sim_capacity_mb",
        help: "capacity of each simulated device in MiB, an integer from 1 to 1073741824 \
               (1 PiB) (default 81920)",
        forms: "an integer from 1 to 1073741824 (MiB)",
        set: |c, v| {
            c.sim_capacity_mb =
                parse_uint(v).filter(|&n| (1..=MAX_SIM_CAPACITY_MB).contains(&n))?;
            Some(())
        },
        show: |c| c.sim_capacity_mb.to_string(),
    },
    KeyDef {
        name: "sim_backing",
        help: "back simulated pages with host memory, True or False (default False)",
        forms: "True or False",
        set: |c, v| {
            c.sim_backing = parse_bool(v)?;
            Some(())
        },
        show: |c| show_bool(c.sim_backing),
    },
    KeyDef {
        name: "sim_granularity_kb",
        help: "simulated allocation granularity in KiB, a power of two >= 4 (default 2048)",
        forms: "a power of two >= 4 (KiB), such as 4, 64 or 2048",
        set: |c, v| {
            c.sim_granularity_kb = parse_uint(v).filter(|&n| n >= 4 && n.is_power_of_two())?;
            Some(())
        },
        show: |c| c.sim_granularity_kb.to_string(),
    },
    KeyDef {
        name: "sim_vmm",
        help: "whether the simulated device supports VMM, True or False (default True)",
        forms: "True or False",
        set: |c, v| {
            c.sim_vmm = parse_bool(v)?;
            Some(())
        },
        show: |c| show_bool(c.sim_vmm),
    },
    KeyDef {
        name: "sim_devices",
        help: "number of simulated devices, an integer from 1 to 64 (default 1)",
        forms: "an integer from 1 to 64",
        set: |c, v| {
            c.sim_devices = parse_uint(v).filter(|n| (1..=64).contains(n))? as u32;
            Some(())
        },
        show: |c| c.sim_devices.to_string(),
    },
    KeyDef {
        name: "page_size_mb",
        help: "physical page size in MiB, an integer from 1 to 1024 and a multiple of the \
               device's granularity: 2 MiB on every CUDA GPU, sim_granularity_kb on the \
               simulated one (default 2)",
        forms: "an integer from 1 to 1024 (MiB), a multiple of the granularity (2 on CUDA GPUs)",
        set: |c, v| {
            c.page_size_mb = parse_uint(v).filter(|&n| (1..=MAX_PAGE_SIZE_MB).contains(&n))?;
            Some(())
        },
        show: |c| c.page_size_mb.to_string(),
    },
    KeyDef {
        name: "handle_mb",
        help: "largest physical handle in MiB created for large blocks (one cuMemCreate and one \
               cuMemMap each), an integer from 1 to 1024, in whole pages (rounded down, at least \
               one page), or 0 for one handle per contiguous run of pages mapped: larger handles \
               mean fewer driver calls, smaller ones let freed memory move between ranges more \
               finely without releasing it (default 0)",
        forms: "0, or an integer from 1 to 1024 (MiB)",
        set: |c, v| {
            c.handle_mb = parse_uint(v).filter(|&n| n <= MAX_PAGE_SIZE_MB)?;
            Some(())
        },
        show: |c| c.handle_mb.to_string(),
    },
    KeyDef {
        name: "stitch",
        help: "move idle mapped pages to where they are needed when creating new ones would \
               pass the memory limit (with False, only on the out-of-memory path), True or False \
               (default True)",
        forms: "True or False",
        set: |c, v| {
            c.stitch = parse_bool(v)?;
            Some(())
        },
        show: |c| show_bool(c.stitch),
    },
    KeyDef {
        name: "views",
        help: "at the memory limit, keep an idle mapping of up to 64 pages that is moved where a \
               request needs it mapped where it was as well (CUDA maps one physical piece at \
               several addresses; one address is used at a time), so that a step that repeats \
               may find the pages in both places with no driver call; some workloads make more \
               calls with it, True or False (default False)",
        forms: "True or False",
        set: |c, v| {
            c.views = parse_bool(v)?;
            Some(())
        },
        show: |c| show_bool(c.views),
    },
    KeyDef {
        name: "release_idle_ms",
        help: "release cached pages idle longer than this many ms to the driver, an integer >= 0; \
               0 = never (default 0)",
        forms: "an integer >= 0 (milliseconds; 0 = never)",
        set: |c, v| {
            c.release_idle_ms = parse_uint(v)?;
            Some(())
        },
        show: |c| c.release_idle_ms.to_string(),
    },
    KeyDef {
        name: "memory_fraction",
        help: "cap on reserved bytes as a fraction of device memory, a number in (0, 1] \
               (default 1)",
        forms: "a number in (0, 1], such as 0.5",
        set: |c, v| {
            // Decimal notation only: Rust's float syntax less its words (inf, nan).
            let numeric = v
                .bytes()
                .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b));
            c.memory_fraction = v
                .parse::<f64>()
                .ok()
                .filter(|f| numeric && *f > 0.0 && *f <= 1.0)?;
            Some(())
        },
        show: |c| show_fraction(c.memory_fraction),
    },
    KeyDef {
        name: "slab_max_kb",
        help: "largest request served from size-class slabs in KiB, a power of two from 4 to \
               1024; larger ones take 512-byte blocks of the page heap (default 64)",
        forms: "a power of two from 4 to 1024 (KiB)",
        set: |c, v| {
            c.slab_max_kb =
                parse_uint(v).filter(|&n| (4..=1024).contains(&n) && n.is_power_of_two())?;
            Some(())
        },
        show: |c| c.slab_max_kb.to_string(),
    },
    KeyDef {
        name: "trace",
        help: "record every alloc and free of this process to this file, in the torch-arena-trace \
               format; {rank} and {pid} are replaced (default: no recording)",
        forms: "a file path without ',', ':', '[' or ']', such as /tmp/run-{rank}.trace",
        set: |c, v| {
            c.trace = Some(v.to_string()).filter(|p| !p.is_empty());
            c.trace.as_ref().map(|_| ())
        },
        show: |c| c.trace.clone().unwrap_or_default(),
    },
    KeyDef {
        name: "driver_costs",
        help: "torch-arena replay only: a file of driver call latencies (NAME = MICROSECONDS per \
               line) that prices the simulated device's calls (default: the figures measured \
               on an H200)",
        forms: "a file path without ',', ':', '[' or ']'",
        set: |c, v| {
            c.driver_costs = Some(v.to_string()).filter(|p| !p.is_empty());
            c.driver_costs.as_ref().map(|_| ())
        },
        show: |c| c.driver_costs.clone().unwrap_or_default(),
    },
    KeyDef {
        name: "sites",
        help: "allocation sites to capture: none, python (Python file, line and function), \
               native (instruction pointers, symbolised in reports), all, or auto (python with \
               leaks:True, else none) (default auto)",
        forms: "none, python, native, all or auto",
        set: |c, v| {
            c.sites = match v {
                "auto" => None,
                v => Some(SitesMode::parse(v)?),
            };
            Some(())
        },
        show: |c| c.sites.map_or("auto", SitesMode::as_str).to_string(),
    },
    KeyDef {
        name: "sites_every",
        help: "capture the site of one allocation in N, an integer >= 1 (default 1)",
        forms: "an integer >= 1",
        set: |c, v| {
            c.sites_every = parse_uint(v).filter(|&n| n >= 1)?;
            Some(())
        },
        show: |c| c.sites_every.to_string(),
    },
    KeyDef {
        name: "sites_min_kb",
        help: "capture sites only for requests of at least this many KiB, an integer >= 0 \
               (default 0)",
        forms: "an integer >= 0 (KiB)",
        set: |c, v| {
            c.sites_min_kb = parse_uint(v)?;
            Some(())
        },
        show: |c| c.sites_min_kb.to_string(),
    },
    KeyDef {
        name: "leaks",
        help: "print a leak report (sites that grow from step to step) at exit, True or False \
               (default False)",
        forms: "True or False",
        set: |c, v| {
            c.leaks = parse_bool(v)?;
            Some(())
        },
        show: |c| show_bool(c.leaks),
    },
    KeyDef {
        name: "explain",
        help: "attribute memory to modules (forward hooks) and, at out-of-memory, add what the \
               memory is to the error and write an explain() report, True or False (default \
               False)",
        forms: "True or False",
        set: |c, v| {
            c.explain = parse_bool(v)?;
            Some(())
        },
        show: |c| show_bool(c.explain),
    },
    KeyDef {
        name: "leak_warmup",
        help: "steps ignored before growth counts as a leak, an integer >= 0 (default 2)",
        forms: "an integer >= 0 (steps)",
        set: |c, v| {
            c.leak_warmup = parse_uint(v)?;
            Some(())
        },
        show: |c| c.leak_warmup.to_string(),
    },
    KeyDef {
        name: "leak_age",
        help: "also report live allocations older than this many steps, an integer >= 0; 0 = off \
               (default 0)",
        forms: "an integer >= 0 (steps; 0 = off)",
        set: |c, v| {
            c.leak_age = parse_uint(v)?;
            Some(())
        },
        show: |c| c.leak_age.to_string(),
    },
    KeyDef {
        name: "cpu_tensors",
        help: "testing without a GPU: the storage of every CPU tensor made once torch-arena is \
               enabled comes from simulated device 0, tracked and counted as a CUDA tensor's \
               would be; needs device:sim and sim_backing:True, True or False (default False)",
        forms: "True or False",
        set: |c, v| {
            c.cpu_tensors = parse_bool(v)?;
            Some(())
        },
        show: |c| show_bool(c.cpu_tensors),
    },
];

pub(super) static ACCEPTED_KEYS: [(&str, &str); KEY_DEFS.len()] = {
    let mut out = [("", ""); KEY_DEFS.len()];
    let mut i = 0;
    while i < KEY_DEFS.len() {
        out[i] = (KEY_DEFS[i].name, KEY_DEFS[i].help);
        i += 1;
    }
    out
};

/// Every key `TORCH_ARENA_CONF` accepts, in order, with a one-line description that ends with the
/// default, e.g. `("stitch", "move idle mapped pages ..., True or False (default True)")`.
/// This is the table the parser checks keys against; the README prints it.
pub fn accepted_keys() -> &'static [(&'static str, &'static str)] {
    &ACCEPTED_KEYS
}
