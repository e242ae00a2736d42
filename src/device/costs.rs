//! What driver calls would cost on a real GPU: a latency per call kind, which turns the counts a
//! [`Device`](super::Device) keeps ([`DriverCounters`]) into modelled seconds.
//!
//! The defaults are the A100 column of `reference/vmm-costs.md` ([K1]: kvcached's `bench_vmm`,
//! A100 80GB, one thread, 2 MiB pages, averages). Where no measured figure exists the default is
//! an **assumption**, marked as such below and in `BENCHMARKS.md`:
//!
//! | call | µs | source |
//! |---|---:|---|
//! | cuMemAddressReserve | 19 | [K1] (8 GB reservation) |
//! | cuMemAddressFree | 19 | assumption: as cuMemAddressReserve |
//! | cuMemCreate | 193 | [K1], 2 MiB |
//! | cuMemRelease | 26 | assumption: not timed in [K1]; as cuMemUnmap |
//! | cuMemMap | 1.45 | [K1], 2 MiB |
//! | cuMemSetAccess | 36 | [K1], 2 MiB |
//! | cuMemUnmap | 25.6 | [K1], 2 MiB |
//! | cuMemAlloc (cudaMalloc) | 230 | assumption: create + map + set access of one 2 MiB chunk |
//! | cuMemFree (cudaFree) | 52 | assumption: unmap + release; its device synchronisation is modelled as a stall, not here |
//! | cuEventCreate, cuEventRecord, cuEventSynchronize, cuStreamSynchronize, cuCtxSynchronize | 2 | assumption (call overhead; any wait for the GPU is a stall) |
//! | cuEventDestroy, cuEventQuery, cuMemGetInfo | 1 | assumption |
//!
//! No measured cudaMalloc/cudaFree latency on A100/H100 was found (reference, last section);
//! each call is priced at one figure whatever its size, which flatters a few large segments.
//!
//! A cuMemSetAccess is priced per handle it covers ([`DriverCounters::set_access_handles`]):
//! on an H200 one grant over a run of k handles cost k single grants. Every figure of the table
//! was measured on an H200 too (`bench/driver_costs.py`, run by `scripts/gpu-check`); the file
//! `bench/costs/h200.txt` holds them for `--driver-costs` (BENCHMARKS.md, "On a GPU").
//!
//! A costs file (`--driver-costs FILE`, conf key `driver_costs:FILE`) overrides any of these:
//! one `NAME = MICROSECONDS` per line (`NAME: MICROSECONDS` also accepted), `#` starts a comment,
//! names as in [`DriverCounters::entries`] (`cudaMalloc`/`cudaFree` are accepted for
//! `cuMemAlloc`/`cuMemFree`, and a `_v2` suffix is ignored). `NAME per GiB = MICROSECONDS` adds a
//! term per GiB the calls of that kind handled, for the kinds whose bytes are counted
//! (cuMemCreate, cuMemRelease, cuMemAlloc, cuMemFree); the defaults have none (nothing was
//! measured on an A100).

use std::path::Path;

use super::DriverCounters;

/// Number of call kinds in [`DriverCounters::entries`].
pub const KINDS: usize = 17;

/// Latency of each call kind in microseconds, in the order of [`DriverCounters::entries`].
#[derive(Clone, Debug, PartialEq)]
pub struct DriverCosts {
    pub us: [f64; KINDS],
    /// Microseconds per GiB the calls of a kind handled, on top of `us` (0 where not given).
    pub per_gib_us: [f64; KINDS],
    /// Where the figures came from ("A100 defaults" or the file).
    pub source: String,
}

/// The A100 defaults, in the order of [`DriverCounters::entries`].
const A100_US: [f64; KINDS] = [
    19.0,  // cuMemAddressReserve [K1]
    19.0,  // cuMemAddressFree (assumption)
    193.0, // cuMemCreate [K1]
    26.0,  // cuMemRelease (assumption)
    1.45,  // cuMemMap [K1]
    25.6,  // cuMemUnmap [K1]
    36.0,  // cuMemSetAccess [K1]
    230.0, // cuMemAlloc (assumption)
    52.0,  // cuMemFree (assumption)
    2.0,   // cuEventCreate (assumption)
    1.0,   // cuEventDestroy (assumption)
    2.0,   // cuEventRecord (assumption)
    1.0,   // cuEventQuery (assumption)
    2.0,   // cuEventSynchronize (assumption)
    2.0,   // cuStreamSynchronize (assumption)
    2.0,   // cuCtxSynchronize (assumption)
    1.0,   // cuMemGetInfo (assumption)
];

impl Default for DriverCosts {
    fn default() -> Self {
        DriverCosts {
            us: A100_US,
            per_gib_us: [0.0; KINDS],
            source: "A100 defaults (reference/vmm-costs.md)".to_string(),
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
            .zip(self.us.iter().zip(self.per_gib_us.iter()))
            .map(|(&(name, n), (us, per_gib))| {
                let n = if name == "cuMemSetAccess" { grants } else { n };
                let gib = c.bytes_of(name).unwrap_or(0) as f64 / (1u64 << 30) as f64;
                n as f64 * us + gib * per_gib
            })
            .sum::<f64>()
            / 1e6
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
        let want = (10.0 * 193.0 + 4.0 * 1.45 + 4.0 * 36.0 + 2.0 * 25.6) / 1e6;
        assert!((d.seconds(&c) - want).abs() < 1e-12);
        let o = DriverCosts::parse("# test\ncuMemCreate = 7.6\ncudaMalloc: 100us\n", "t").unwrap();
        assert_eq!(o.get("cuMemCreate"), Some(7.6));
        assert_eq!(o.get("cuMemAlloc"), Some(100.0));
        assert_eq!(o.get("cuMemMap_v2"), Some(1.45));
        let want = (10.0 * 7.6 + 4.0 * 1.45 + 4.0 * 36.0 + 2.0 * 25.6) / 1e6;
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
        let want = (10.0 * 193.0 + 4.0 * 1.45 + 9.0 * 36.0 + 2.0 * 25.6) / 1e6;
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
        assert_eq!(DriverCosts::default().seconds(&freed), 3.0 * 52.0 / 1e6);
        let err = DriverCosts::parse("cuMemMap per GiB = 1", "t").unwrap_err();
        assert!(
            err.contains("cuMemMap per GiB") && err.contains("cuMemFree"),
            "{err}"
        );
    }

    #[test]
    fn the_h200_costs_file_reads_and_overrides_every_kind() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/costs/h200.txt");
        let h = DriverCosts::load(&path).unwrap();
        let d = DriverCosts::default();
        for (i, &(name, _)) in DriverCounters::default().entries().iter().enumerate() {
            assert_ne!(h.us[i], d.us[i], "{name} keeps the A100 default");
        }
        for name in ["cuMemCreate", "cuMemRelease", "cuMemAlloc", "cuMemFree"] {
            let i = kind_index(name).unwrap();
            assert!(h.per_gib_us[i] > 0.0, "{name} has no per-GiB term");
        }
    }
}
