//! What driver calls would cost on a real GPU: a latency per call kind, which turns the counts a
//! [`Device`](super::Device) keeps ([`DriverCounters`]) into modelled seconds.
//!
//! The defaults were measured on an NVIDIA H200 (CUDA driver API 13.0, 2026-11-26) by
//! `bench/driver_costs.py`, run by `scripts/gpu-check`: per call kind, the median of three rounds'
//! means, one thread, idle GPU, 2 MiB handles (`bench/results/driver-costs-2026-11-26-H200-*.json`;
//! BENCHMARKS.md, "On a GPU"). The rounds differ by up to 1.5×: these are one machine's figures,
//! not a law. `bench/costs/h200.txt` is the same table as a costs file.
//!
//! | call | µs per call | µs per GiB |
//! |---|---:|---:|
//! | cuMemAddressReserve (8 GiB) | 3.25 | |
//! | cuMemAddressFree | 2.1 | |
//! | cuMemCreate | 13.54 | 27.5 |
//! | cuMemRelease | 11.2 | 375.5 |
//! | cuMemMap | 3.1 | |
//! | cuMemSetAccess, per handle it covers | 33.04 | |
//! | cuMemUnmap | 18.21 | |
//! | cuMemAlloc (cudaMalloc) | 39.91 | 55.4 |
//! | cuMemFree (cudaFree) | 34.77 | 358.7 |
//! | cuEventCreate / Destroy / Record / Query | 1.03 / 0.55 / 1.53 / 0.62 | |
//! | cuEventSynchronize / cuStreamSynchronize / cuCtxSynchronize, idle | 4.58 / 0.63 / 0.73 | |
//! | cuMemGetInfo | 5.81 | |
//!
//! - A cuMemSetAccess is priced per handle it covers ([`DriverCounters::set_access_handles`]):
//!   one grant over a run of k handles cost k single grants.
//! - The per-GiB terms are the slopes between 2 MiB and 200 MiB (create, release) or 1 GiB
//!   (cudaMalloc, cudaFree), on the bytes those calls handled. The per-call figure stays the
//!   2 MiB one.
//! - A wait for the GPU is not a latency here: cudaFree waited for queued work on the H200, and
//!   the replay models that wait as a stall. The VMM calls did not wait.
//!
//! Until 2026-11-26 the defaults were the A100 column of `reference/vmm-costs.md`
//! (\[K1\]: kvcached's `bench_vmm`), with assumptions where it measured nothing (cudaMalloc
//! 230 µs, cudaFree 52 µs).
//! `bench/costs/a100.txt` holds them: the results in BENCHMARKS.md from before that date were
//! priced by them, and `--driver-costs bench/costs/a100.txt` prices a replay the same way again.
//!
//! A costs file (`--driver-costs FILE`, conf key `driver_costs:FILE`) overrides any of these:
//! one `NAME = MICROSECONDS` per line (`NAME: MICROSECONDS` also accepted), `#` starts a comment,
//! names as in [`DriverCounters::entries`] (`cudaMalloc`/`cudaFree` are accepted for
//! `cuMemAlloc`/`cuMemFree`, and a `_v2` suffix is ignored). `NAME per GiB = MICROSECONDS` adds a
//! term per GiB the calls of that kind handled, for the kinds whose bytes are counted
//! (cuMemCreate, cuMemRelease, cuMemAlloc, cuMemFree); a file's lines replace the defaults' terms
//! of the kinds they name, and `bench/costs/a100.txt` sets all four to 0 (nothing was measured by
//! size on an A100).

use std::path::Path;

use super::DriverCounters;

/// Number of call kinds in [`DriverCounters::entries`].
pub const KINDS: usize = 17;

/// Latency of each call kind in microseconds, in the order of [`DriverCounters::entries`].
#[derive(Clone, Debug, PartialEq)]
pub struct DriverCosts {
    pub us: [f64; KINDS],
    /// Microseconds per GiB the calls of a kind handled, on top of `us` (0 for the kinds that do
    /// not count bytes).
    pub per_gib_us: [f64; KINDS],
    /// Where the figures came from ("H200 defaults ..." or the file).
    pub source: String,
}

/// The defaults, measured on an H200, in the order of [`DriverCounters::entries`].
const H200_US: [f64; KINDS] = [
    3.25,  // cuMemAddressReserve
    2.1,   // cuMemAddressFree
    13.54, // cuMemCreate
    11.2,  // cuMemRelease
    3.1,   // cuMemMap
    18.21, // cuMemUnmap
    33.04, // cuMemSetAccess (per handle)
    39.91, // cuMemAlloc
    34.77, // cuMemFree
    1.03,  // cuEventCreate
    0.55,  // cuEventDestroy
    1.53,  // cuEventRecord
    0.62,  // cuEventQuery
    4.58,  // cuEventSynchronize
    0.63,  // cuStreamSynchronize
    0.73,  // cuCtxSynchronize
    5.81,  // cuMemGetInfo
];

/// Microseconds per GiB on top of [`H200_US`], for the kinds that count their bytes.
const H200_PER_GIB_US: [f64; KINDS] = [
    0.0, 0.0, 27.5, 375.5, 0.0, 0.0, 0.0, 55.4, 358.7, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
];

impl Default for DriverCosts {
    fn default() -> Self {
        DriverCosts {
            us: H200_US,
            per_gib_us: H200_PER_GIB_US,
            source: "H200 defaults (measured; bench/costs/h200.txt)".to_string(),
        }
    }
}

/// The name of call kind `i`, as [`DriverCounters::entries`] writes it.
fn name_of(i: usize) -> &'static str {
    DriverCounters::default().entries()[i].0
}

/// The index of a call kind by its name, as the costs file may write it.
pub fn kind_index(name: &str) -> Option<usize> {
    let name = name.strip_suffix("_v2").unwrap_or(name);
    let name = match name {
        "cudaMalloc" => "cuMemAlloc",
        "cudaFree" => "cuMemFree",
        n => n,
    };
    DriverCounters::default()
        .entries()
        .iter()
        .position(|(n, _)| *n == name)
}

impl DriverCosts {
    /// Modelled seconds the calls in `c` take: Σ count × latency, plus the per-GiB terms of the
    /// kinds that count bytes; a cuMemSetAccess is priced per handle it covers (a grant of a run
    /// of k handles costs k grants of one: 20, 38, 74, 183 and 608 µs for runs of 1, 2, 4, 10
    /// and 32 handles of 2 MiB on an H200, `bench/results/driver-costs-2026-11-26-H200-2.json`).
    /// Counters that do not count handles (`set_access_handles` 0) are priced per call.
    pub fn seconds(&self, c: &DriverCounters) -> f64 {
        let grants = c.set_access_handles.max(c.set_access);
        c.entries()
            .iter()
            .enumerate()
            .map(|(i, &(name, n))| {
                let n = if name == "cuMemSetAccess" { grants } else { n };
                self.price(i, n, c.bytes_of(name).unwrap_or(0))
            })
            .sum::<f64>()
            / 1e6
    }

    /// Microseconds of `calls` calls of kind `i` that handled `bytes` in all: the latency of
    /// each, plus the kind's per-GiB term.
    fn price(&self, i: usize, calls: u64, bytes: u64) -> f64 {
        let gib = bytes as f64 / (1u64 << 30) as f64;
        calls as f64 * self.us[i] + gib * self.per_gib_us[i]
    }

    /// Modelled microseconds of one growth by a physical handle of `bytes`: its cuMemCreate (with
    /// the per-GiB term), its cuMemMap and its share of a cuMemSetAccess (one handle covered).
    pub fn handle_us(&self, bytes: u64) -> f64 {
        self.call_us("cuMemCreate", bytes)
            + self.call_us("cuMemMap", 0)
            + self.call_us("cuMemSetAccess", 0)
    }

    /// Modelled microseconds of one cudaMalloc (cuMemAlloc) of `bytes`, with the per-GiB term.
    pub fn malloc_us(&self, bytes: u64) -> f64 {
        self.call_us("cuMemAlloc", bytes)
    }

    /// Modelled microseconds of one call of kind `name` handling `bytes` (0 for kinds that count
    /// no bytes).
    pub fn call_us(&self, name: &str, bytes: u64) -> f64 {
        kind_index(name).map_or(0.0, |i| self.price(i, 1, bytes))
    }

    /// The latency of the call kind `name` in microseconds.
    pub fn get(&self, name: &str) -> Option<f64> {
        kind_index(name).map(|i| self.us[i])
    }

    /// The defaults with the figures of `text` (the costs file format) applied over them.
    pub fn parse(text: &str, source: &str) -> Result<DriverCosts, String> {
        let mut costs = DriverCosts {
            source: source.to_string(),
            ..DriverCosts::default()
        };
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let Some((name, value)) = line.split_once(['=', ':']) else {
                return Err(format!(
                    "{source}:{}: '{raw}' is not NAME = MICROSECONDS",
                    n + 1
                ));
            };
            let (name, value) = (name.trim(), value.trim());
            let (name, per_gib) = match name.strip_suffix("per GiB") {
                Some(kind) => (kind.trim(), true),
                None => (name, false),
            };
            let Some(i) = kind_index(name) else {
                let names: Vec<&str> = DriverCounters::default()
                    .entries()
                    .iter()
                    .map(|(n, _)| *n)
                    .collect();
                return Err(format!(
                    "{source}:{}: unknown call '{name}'; known: {}",
                    n + 1,
                    names.join(", ")
                ));
            };
            let us: f64 = value
                .strip_suffix("us")
                .unwrap_or(value)
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| {
                    format!(
                        "{source}:{}: '{value}' is not a latency in microseconds (a number ≥ 0)",
                        n + 1
                    )
                })?;
            if !per_gib {
                costs.us[i] = us;
            } else if DriverCounters::default().bytes_of(name_of(i)).is_some() {
                costs.per_gib_us[i] = us;
            } else {
                return Err(format!(
                    "{source}:{}: '{name} per GiB': only cuMemCreate, cuMemRelease, cuMemAlloc \
                     and cuMemFree count their bytes",
                    n + 1
                ));
            }
        }
        Ok(costs)
    }

    /// Reads a costs file.
    pub fn load(path: &Path) -> Result<DriverCosts, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("driver costs file '{}': {e}", path.display()))?;
        DriverCosts::parse(&text, &path.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_count_times_latency() {
        let c = DriverCounters {
            mem_create: 10,
            mem_map: 4,
            set_access: 4,
            mem_unmap: 2,
            ..Default::default()
        };
        let d = DriverCosts::default();
        let want = (10.0 * 13.54 + 4.0 * 3.1 + 4.0 * 33.04 + 2.0 * 18.21) / 1e6;
        assert!((d.seconds(&c) - want).abs() < 1e-12);
        let o = DriverCosts::parse("# test\ncuMemCreate = 7.6\ncudaMalloc: 100us\n", "t").unwrap();
        assert_eq!(o.get("cuMemCreate"), Some(7.6));
        assert_eq!(o.get("cuMemAlloc"), Some(100.0));
        assert_eq!(o.get("cuMemMap_v2"), Some(3.1));
        let want = (10.0 * 7.6 + 4.0 * 3.1 + 4.0 * 33.04 + 2.0 * 18.21) / 1e6;
        assert!((o.seconds(&c) - want).abs() < 1e-12);
        assert!(
            DriverCosts::parse("cuMemFoo = 1", "t")
                .unwrap_err()
                .contains("cuMemFoo")
        );
        assert!(DriverCosts::parse("cuMemMap = -1", "t").is_err());
        // A grant is priced per handle it covers: 4 grants over 9 handles cost 9 grants.
        let runs = DriverCounters {
            set_access_handles: 9,
            ..c
        };
        let want = (10.0 * 13.54 + 4.0 * 3.1 + 9.0 * 33.04 + 2.0 * 18.21) / 1e6;
        assert!((d.seconds(&runs) - want).abs() < 1e-12);
        assert!(DriverCosts::parse("cuMemMap 1", "t").is_err());
        // A per-GiB term, for the kinds that count their bytes.
        let f = DriverCosts::parse("cudaFree per GiB = 350\ncuMemFree = 30\n", "t").unwrap();
        let freed = DriverCounters {
            mem_free: 3,
            mem_free_bytes: 3 << 29, // 1.5 GiB
            ..Default::default()
        };
        assert!((f.seconds(&freed) - (3.0 * 30.0 + 1.5 * 350.0) / 1e6).abs() < 1e-12);
        let want = (3.0 * 34.77 + 1.5 * 358.7) / 1e6;
        assert!((DriverCosts::default().seconds(&freed) - want).abs() < 1e-12);
        let err = DriverCosts::parse("cuMemMap per GiB = 1", "t").unwrap_err();
        assert!(
            err.contains("cuMemMap per GiB") && err.contains("cuMemFree"),
            "{err}"
        );
    }

    #[test]
    fn the_costs_files_are_the_defaults_and_the_former_defaults() {
        let file = |name: &str| {
            DriverCosts::load(
                &Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("bench/costs")
                    .join(name),
            )
            .unwrap()
        };
        let d = DriverCosts::default();
        // bench/costs/h200.txt is the default table, per call and per GiB.
        let h = file("h200.txt");
        assert_eq!((h.us, h.per_gib_us), (d.us, d.per_gib_us));
        for name in ["cuMemCreate", "cuMemRelease", "cuMemAlloc", "cuMemFree"] {
            assert!(d.per_gib_us[kind_index(name).unwrap()] > 0.0, "{name}");
        }
        // bench/costs/a100.txt, the defaults before them, differs in every kind and has no
        // per-GiB term.
        let a = file("a100.txt");
        for (i, &(name, _)) in DriverCounters::default().entries().iter().enumerate() {
            assert_ne!(a.us[i], d.us[i], "{name}");
        }
        assert_eq!(a.get("cuMemCreate"), Some(193.0));
        assert_eq!(a.per_gib_us, [0.0; KINDS]);
    }
}
