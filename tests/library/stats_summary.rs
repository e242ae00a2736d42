//! `torch.cuda.memory_stats()` keys and `torch.cuda.memory_summary()` text.
//!
//! The golden tables below are what PyTorch 2.11's own `memory_summary` body (copied verbatim
//! from `torch/cuda/memory.py` and run on a plain dict of these numbers) prints; a few lines were
//! also checked by hand. The numbers exercise unit switching on the `all` row with smaller pool
//! rows (MiB/GiB/TiB, `0 GiB` sub-rows, `768 KiB` exactly at the threshold, `700000 B` just
//! below it), counts switching to K and M exactly at 750 000 / 750 000 000, zero rows, and an
//! 8-digit retry count that fills its field.

use torch_arena::arena::{ArenaExtras, ClassOccupancy, Growth, GrowthCounts, PageCounts};
use torch_arena::device::DriverCounters;
use torch_arena::stats::keys::{self, NUM_KEYS};
use torch_arena::stats::summary::{self, memory_summary, torch_table};
use torch_arena::stats::{DeviceStats, Stat, StatArray};

fn stat([current, peak, allocated, freed]: [i64; 4]) -> Stat {
    Stat {
        current,
        peak,
        allocated,
        freed,
    }
}

/// A stat array from its small and large pool rows; `all` is their sum.
fn arr(small: [i64; 4], large: [i64; 4]) -> StatArray {
    let all = std::array::from_fn(|i| small[i] + large[i]);
    StatArray([stat(all), stat(small), stat(large)])
}

fn golden_stats() -> DeviceStats {
    DeviceStats {
        allocated_bytes: arr(
            [4_567_890, 5_000_000, 1_000_000_000, 995_432_110],
            [
                1_230_000_000,
                2_340_678_901,
                999_000_000_000,
                997_770_000_000,
            ],
        ),
        active_bytes: arr(
            [4_568_402, 5_000_512, 1_000_000_512, 995_432_110],
            [
                1_230_000_000,
                2_340_678_901,
                1_999_998_999_999_488,
                997_770_000_000,
            ],
        ),
        requested_bytes: arr(
            [4_000_000, 4_500_000, 900_000_000, 896_000_000],
            [
                1_200_000_000,
                2_300_000_000,
                998_000_000_000,
                996_800_000_000,
            ],
        ),
        reserved_bytes: arr(
            [20_971_520, 31_457_280, 104_857_600, 83_886_080],
            [2_126_512_128, 2_969_567_232, 4_895_142_400, 2_768_630_272],
        ),
        inactive_split_bytes: arr([700_000, 786_432, 123_456, 0], [0, 0, 0, 0]),
        allocation: arr(
            [1000, 700_000, 90_000_000, 89_999_000],
            [234, 49_999, 8_765_432, 8_765_198],
        ),
        active: arr(
            [600_000, 700_000_000, 1_400_000_000, 1_399_400_000],
            [150_000, 50_000_000, 100_000_000, 99_850_000],
        ),
        segment: arr([10, 15, 50, 40], [3, 5, 12, 9]),
        inactive_split: arr([0; 4], [0; 4]),
        oversize_allocations: stat([0; 4]),
        oversize_segments: stat([1, 2, 800_000, 799_999]),
        num_alloc_retries: 12_345_678,
        num_ooms: 3,
        ..DeviceStats::new()
    }
}

const GOLDEN_FULL: &str = "\
|===========================================================================|\n\
|                  PyTorch CUDA memory summary, device ID 1                 |\n\
|---------------------------------------------------------------------------|\n\
|            CUDA OOMs: 3            |        cudaMalloc retries: 12345678  |\n\
|===========================================================================|\n\
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n\
|---------------------------------------------------------------------------|\n\
| Allocated memory      |   1177 MiB |   2237 MiB |    931 GiB |    930 GiB |\n\
|       from large pool |   1173 MiB |   2232 MiB |    930 GiB |    929 GiB |\n\
|       from small pool |      4 MiB |      4 MiB |      0 GiB |      0 GiB |\n\
|---------------------------------------------------------------------------|\n\
| Active memory         |   1177 MiB |   2237 MiB |   1818 TiB |    930 GiB |\n\
|       from large pool |   1173 MiB |   2232 MiB |   1818 TiB |    929 GiB |\n\
|       from small pool |      4 MiB |      4 MiB |      0 TiB |      0 GiB |\n\
|---------------------------------------------------------------------------|\n\
| Requested memory      |   1148 MiB |   2197 MiB |    930 GiB |    929 GiB |\n\
|       from large pool |   1144 MiB |   2193 MiB |    929 GiB |    928 GiB |\n\
|       from small pool |      3 MiB |      4 MiB |      0 GiB |      0 GiB |\n\
|---------------------------------------------------------------------------|\n\
| GPU reserved memory   |   2048 MiB |   2862 MiB |   4768 MiB |   2720 MiB |\n\
|       from large pool |   2028 MiB |   2832 MiB |   4668 MiB |   2640 MiB |\n\
|       from small pool |     20 MiB |     30 MiB |    100 MiB |     80 MiB |\n\
|---------------------------------------------------------------------------|\n\
| Non-releasable memory | 700000 B   |    768 KiB | 123456 B   |      0 B   |\n\
|       from large pool |      0 B   |      0 KiB |      0 B   |      0 B   |\n\
|       from small pool | 700000 B   |    768 KiB | 123456 B   |      0 B   |\n\
|---------------------------------------------------------------------------|\n\
| Allocations           |    1234    |  749999    |   98765 K  |   98764 K  |\n\
|       from large pool |     234    |   49999    |    8765 K  |    8765 K  |\n\
|       from small pool |    1000    |  700000    |   90000 K  |   89999 K  |\n\
|---------------------------------------------------------------------------|\n\
| Active allocs         |     750 K  |     750 M  |    1500 M  |    1499 M  |\n\
|       from large pool |     150 K  |      50 M  |     100 M  |      99 M  |\n\
|       from small pool |     600 K  |     700 M  |    1400 M  |    1399 M  |\n\
|---------------------------------------------------------------------------|\n\
| GPU reserved segments |      13    |      20    |      62    |      49    |\n\
|       from large pool |       3    |       5    |      12    |       9    |\n\
|       from small pool |      10    |      15    |      50    |      40    |\n\
|---------------------------------------------------------------------------|\n\
| Non-releasable allocs |       0    |       0    |       0    |       0    |\n\
|       from large pool |       0    |       0    |       0    |       0    |\n\
|       from small pool |       0    |       0    |       0    |       0    |\n\
|---------------------------------------------------------------------------|\n\
| Oversize allocations  |       0    |       0    |       0    |       0    |\n\
|---------------------------------------------------------------------------|\n\
| Oversize GPU segments |       1    |       2    |     800 K  |     799 K  |\n\
|===========================================================================|\n\
";

const GOLDEN_ABBREVIATED: &str = "\
|===========================================================================|\n\
|                  PyTorch CUDA memory summary, device ID 1                 |\n\
|---------------------------------------------------------------------------|\n\
|            CUDA OOMs: 3            |        cudaMalloc retries: 12345678  |\n\
|===========================================================================|\n\
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n\
|---------------------------------------------------------------------------|\n\
| Allocated memory      |   1177 MiB |   2237 MiB |    931 GiB |    930 GiB |\n\
|---------------------------------------------------------------------------|\n\
| Active memory         |   1177 MiB |   2237 MiB |   1818 TiB |    930 GiB |\n\
|---------------------------------------------------------------------------|\n\
| Requested memory      |   1148 MiB |   2197 MiB |    930 GiB |    929 GiB |\n\
|---------------------------------------------------------------------------|\n\
| GPU reserved memory   |   2048 MiB |   2862 MiB |   4768 MiB |   2720 MiB |\n\
|---------------------------------------------------------------------------|\n\
| Non-releasable memory | 700000 B   |    768 KiB | 123456 B   |      0 B   |\n\
|---------------------------------------------------------------------------|\n\
| Allocations           |    1234    |  749999    |   98765 K  |   98764 K  |\n\
|---------------------------------------------------------------------------|\n\
| Active allocs         |     750 K  |     750 M  |    1500 M  |    1499 M  |\n\
|---------------------------------------------------------------------------|\n\
| GPU reserved segments |      13    |      20    |      62    |      49    |\n\
|---------------------------------------------------------------------------|\n\
| Non-releasable allocs |       0    |       0    |       0    |       0    |\n\
|---------------------------------------------------------------------------|\n\
| Oversize allocations  |       0    |       0    |       0    |       0    |\n\
|---------------------------------------------------------------------------|\n\
| Oversize GPU segments |       1    |       2    |     800 K  |     799 K  |\n\
|===========================================================================|\n\
";

fn assert_lines_eq(got: &str, want: &str) {
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "line {} differs", i + 1);
    }
    assert_eq!(
        got.lines().count(),
        want.lines().count(),
        "line count differs"
    );
    assert_eq!(got, want);
}

fn assert_all_77(text: &str) {
    assert!(text.ends_with("|\n"), "must end with a bar and a newline");
    for (i, line) in text.lines().enumerate() {
        assert_eq!(
            line.chars().count(),
            77,
            "line {} is not 77 wide: {line:?}",
            i + 1
        );
        assert!(
            line.starts_with('|') && line.ends_with('|'),
            "line {}: {line:?}",
            i + 1
        );
    }
}

// ---- keys ----------------------------------------------------------------------------------

#[test]
fn exactly_122_keys_sorted_and_unique() {
    let names = keys::key_names();
    assert_eq!(names.len(), 122);
    assert_eq!(NUM_KEYS, 122);
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "keys must be in Python's sorted(str) order");
    sorted.dedup();
    assert_eq!(sorted.len(), 122, "keys must be unique");
    let flat = keys::flatten(&DeviceStats::new());
    let flat_names: Vec<String> = flat.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(flat_names, names);
}

#[test]
fn key_names_match_torch() {
    let names = keys::key_names();
    for k in [
        "allocated_bytes.all.current",
        "allocation.all.allocated",
        "segment.small_pool.freed",
        "oversize_segments.peak",
        "num_device_free",
        "reserved_bytes.large_pool.peak",
        "requested_bytes.all.freed",
        "inactive_split_bytes.small_pool.current",
        "oversize_allocations.current",
        "num_alloc_retries",
        "num_ooms",
        "max_split_size",
        "num_sync_all_streams",
        "num_device_alloc",
    ] {
        assert!(names.iter().any(|n| n == k), "missing key {k}");
    }
    // torch's docstring says "allocated.{...}"; the real key is "allocation".
    assert!(!names.iter().any(|n| n.starts_with("allocated.")));
    // Python orders '.' before '_': "active.*" comes before "active_bytes.*".
    assert_eq!(names[0], "active.all.allocated");
    assert_eq!(names.last().unwrap(), "segment.small_pool.peak");
    let pos = |k: &str| names.iter().position(|n| n == k).unwrap();
    assert!(pos("active.small_pool.peak") < pos("active_bytes.all.allocated"));
    // 9 arrays x 3 pools x 4 fields, 2 stats x 4 fields, 6 scalars.
    assert_eq!(
        names.iter().filter(|n| n.matches('.').count() == 2).count(),
        108
    );
    assert_eq!(
        names.iter().filter(|n| n.matches('.').count() == 1).count(),
        8
    );
    assert_eq!(names.iter().filter(|n| !n.contains('.')).count(), 6);
}

#[test]
fn values_come_from_the_right_fields() {
    let s = golden_stats();
    let get = |k| keys::get(&s, k).unwrap_or_else(|| panic!("no key {k}"));
    assert_eq!(get("allocated_bytes.all.current"), 1_234_567_890);
    assert_eq!(get("allocated_bytes.small_pool.current"), 4_567_890);
    assert_eq!(get("allocated_bytes.large_pool.peak"), 2_340_678_901);
    assert_eq!(get("allocation.all.allocated"), 98_765_432);
    assert_eq!(get("segment.small_pool.freed"), 40);
    assert_eq!(get("segment.large_pool.freed"), 9);
    assert_eq!(get("oversize_segments.peak"), 2);
    assert_eq!(get("oversize_segments.allocated"), 800_000);
    assert_eq!(get("num_alloc_retries"), 12_345_678);
    assert_eq!(get("num_ooms"), 3);
    assert_eq!(keys::get(&s, "allocated.all.current"), None);
    assert_eq!(keys::get(&s, ""), None);
    for (k, v) in keys::flatten(&s) {
        assert_eq!(keys::get(&s, &k), Some(v), "{k}");
    }
}

#[test]
fn every_field_maps_to_its_own_key() {
    // Give every value a distinct number and check each key reads a different one.
    let mut s = DeviceStats::new();
    let mut n = 1;
    let mut next = || {
        n += 1;
        n
    };
    for a in [
        &mut s.allocation,
        &mut s.segment,
        &mut s.active,
        &mut s.inactive_split,
        &mut s.allocated_bytes,
        &mut s.reserved_bytes,
        &mut s.active_bytes,
        &mut s.inactive_split_bytes,
        &mut s.requested_bytes,
    ] {
        for st in a.0.iter_mut() {
            *st = stat([next(), next(), next(), next()]);
        }
    }
    s.oversize_allocations = stat([next(), next(), next(), next()]);
    s.oversize_segments = stat([next(), next(), next(), next()]);
    s.num_alloc_retries = next();
    s.num_ooms = next();
    s.num_sync_all_streams = next();
    s.num_device_alloc = next();
    s.num_device_free = next();
    s.max_split_size = next();
    let mut values: Vec<i64> = keys::flatten(&s).into_iter().map(|(_, v)| v).collect();
    values.sort();
    values.dedup();
    assert_eq!(values.len(), 122);
    assert_eq!(
        keys::get(&s, "reserved_bytes.small_pool.freed"),
        Some(s.reserved_bytes.0[1].freed)
    );
    assert_eq!(
        keys::get(&s, "reserved_bytes.large_pool.current"),
        Some(s.reserved_bytes.0[2].current)
    );
    assert_eq!(keys::get(&s, "num_device_free"), Some(s.num_device_free));
    assert_eq!(keys::get(&s, "max_split_size"), Some(s.max_split_size));
}

#[test]
fn max_split_size_no_limit_is_minus_one_as_in_torch() {
    let s = DeviceStats::new();
    assert_eq!(s.max_split_size, i64::MAX);
    assert_eq!(keys::get(&s, "max_split_size"), Some(-1));
    assert_eq!(
        keys::get(&s, "max_split_size"),
        Some(keys::NO_MAX_SPLIT_SIZE)
    );
    let s = DeviceStats {
        max_split_size: 20 << 20,
        ..DeviceStats::new()
    };
    assert_eq!(keys::get(&s, "max_split_size"), Some(20 << 20));
}

// ---- torch table -----------------------------------------------------------------------------

#[test]
fn torch_table_matches_pytorch_byte_for_byte() {
    let got = torch_table(1, &golden_stats(), false);
    assert_lines_eq(&got, GOLDEN_FULL);
    assert_all_77(&got);
}

#[test]
fn abbreviated_table_drops_pool_rows() {
    let got = torch_table(1, &golden_stats(), true);
    assert_lines_eq(&got, GOLDEN_ABBREVIATED);
    assert_all_77(&got);
    assert!(!got.contains("from large pool"));
    assert!(!got.contains("from small pool"));
}

#[test]
fn empty_stats_table() {
    let got = torch_table(0, &DeviceStats::new(), false);
    assert_all_77(&got);
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(lines.len(), 47);
    assert_eq!(
        lines[1],
        "|                  PyTorch CUDA memory summary, device ID 0                 |"
    );
    assert_eq!(
        lines[3],
        "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |"
    );
    assert_eq!(
        lines[7],
        "| Allocated memory      |      0 B   |      0 B   |      0 B   |      0 B   |"
    );
    assert_eq!(
        lines[8],
        "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |"
    );
    assert_eq!(
        lines[27],
        "| Allocations           |       0    |       0    |       0    |       0    |"
    );
    assert_eq!(lines[46], format!("|{}|", "=".repeat(75)));
}

#[test]
fn wide_values_widen_the_line_as_python_does() {
    // Python's "{:<8d}" does not truncate: the retries field simply grows.
    let s = DeviceStats {
        num_alloc_retries: 123_456_789,
        ..DeviceStats::new()
    };
    let got = torch_table(0, &s, true);
    assert!(got.contains(
        "|            CUDA OOMs: 0            |        cudaMalloc retries: 123456789  |\n"
    ));
}

// ---- torch-arena section -------------------------------------------------------------------

fn extras() -> ArenaExtras {
    ArenaExtras {
        device_name: "NVIDIA H100 80GB HBM3".into(),
        capacity: 85_520_809_984,
        limit: 42_760_404_992,
        vmm: true,
        classes: vec![
            ClassOccupancy {
                size: 512,
                slabs: 2,
                used_slots: 1000,
                total_slots: 8192,
            },
            ClassOccupancy {
                size: 1280,
                slabs: 0,
                used_slots: 0,
                total_slots: 0,
            },
            ClassOccupancy {
                size: 786_432,
                slabs: 3,
                used_slots: 1,
                total_slots: 6,
            },
        ],
        pages: PageCounts {
            page_size: 2 << 20,
            in_use: 12,
            idle_mapped: 3,
            held: 2,
            pooled: 1,
        },
        driver: DriverCounters {
            mem_create: 16,
            mem_map: 20,
            set_access: 20,
            ..Default::default()
        },
        bad_frees: 2,
        pending_frees: 5,
        growth: GrowthCounts {
            at_peak: Growth {
                handles: 14,
                bytes: 30 << 20,
            },
            below_peak: Growth {
                handles: 2,
                bytes: 3 << 30,
            },
        },
        own_shards: 1,
    }
}

#[test]
fn summary_is_torch_table_then_arena_section() {
    let s = golden_stats();
    let e = extras();
    let got = memory_summary(1, &s, &e, false);
    assert!(got.starts_with(GOLDEN_FULL));
    assert_eq!(
        got,
        format!("{GOLDEN_FULL}{}", summary::arena_section(1, &s, &e))
    );
    assert_all_77(&got);
    let abbreviated = memory_summary(1, &s, &e, true);
    assert!(abbreviated.starts_with(GOLDEN_ABBREVIATED));
    assert!(abbreviated.contains("torch-arena"));
}

#[test]
fn arena_section_contents() {
    let s = golden_stats();
    let section = summary::arena_section(1, &s, &extras());
    assert_all_77(&section);
    let lines: Vec<&str> = section.lines().collect();
    assert!(
        lines[0].contains("torch-arena summary, device ID 1"),
        "{}",
        lines[0]
    );
    assert!(section.contains("| Device                | NVIDIA H100 80GB HBM3 (VMM pages) "));
    assert!(section.contains("| Capacity              | 79.65 GiB (85520809984 bytes) "));
    assert!(
        section.contains(
            "| Limit                 | 39.82 GiB (42760404992 bytes, 50.0% of capacity) "
        )
    );
    // 1 - 2_304_500_000 / 3_001_024_512 = 0.23208... -> 23.2%
    let frag = 1.0 - 2_304_500_000f64 / 3_001_024_512f64;
    let want = format!("{:.1}%", frag * 100.0);
    assert_eq!(want, "23.2%");
    assert_eq!(summary::format_fragmentation(&s), want);
    assert!((summary::fragmentation(&s).unwrap() - frag).abs() < 1e-12);
    assert!(
        section.contains("| Fragmentation         | 23.2% (1 - peak requested / peak reserved) ")
    );
    // Pages: counts and bytes, in the four places a page can be.
    assert!(
        section.contains(
            "| Pages of 2 MiB        |   In use   |Idle mapped |Held unused |   Pooled   |"
        )
    );
    assert!(
        section.contains(
            "|       pages           |      12    |       3    |       2    |       1    |"
        )
    );
    assert!(
        section.contains(
            "|       bytes           |   24.0 MiB |    6.0 MiB |    4.0 MiB |    2.0 MiB |"
        )
    );
    // Size classes: only those with slabs.
    assert!(
        section.contains(
            "|       512 B           |       2    |    1000    |    8192    |     12.2%  |"
        )
    );
    assert!(
        section.contains(
            "|       768 KiB         |       3    |       1    |       6    |     16.7%  |"
        )
    );
    assert!(!section.contains("1280 B"));
    // Memory created, by what its request did to the bytes requested.
    assert!(
        section.contains(
            "| Memory created for    | A new peak | Under peak |            |            |"
        )
    );
    assert!(
        section.contains(
            "|       handles         |      14    |       2    |            |            |"
        )
    );
    assert!(
        section.contains(
            "|       bytes           |   30.0 MiB |    3.0 GiB |            |            |"
        )
    );
    assert!(section.contains("| Bad frees             | 2 "));
    assert!(section.contains("| Pending frees         | 5 "));
    assert!(section.contains("| Threads in own shards | 1 "));
    // Driver calls: non-zero ones and the total.
    assert!(section.contains("|   cuMemCreate         | 16 "));
    assert!(section.contains("|   cuMemMap            | 20 "));
    assert!(section.contains("|   cuMemSetAccess      | 20 "));
    assert!(section.contains("|   total               | 56 "));
    assert!(!section.contains("cuMemRelease"));
    assert_eq!(lines.last().unwrap(), &format!("|{}|", "=".repeat(75)));
}

#[test]
fn arena_section_when_empty() {
    let section = summary::arena_section(0, &DeviceStats::new(), &ArenaExtras::default());
    assert_all_77(&section);
    assert_eq!(summary::format_fragmentation(&DeviceStats::new()), "n/a");
    assert!(section.contains("| Fragmentation         | n/a "));
    assert!(section.contains("(no slabs)"));
    assert!(section.contains("| Driver calls          | none "));
    assert!(section.contains("cuMemAlloc segments"));
}

#[test]
fn arena_section_keeps_width_with_long_names() {
    let e = ArenaExtras {
        device_name: "A very long device name that would never fit in the box at all, really"
            .into(),
        capacity: u64::MAX,
        limit: u64::MAX,
        classes: vec![ClassOccupancy {
            size: 1 << 20,
            slabs: u64::MAX,
            used_slots: u64::MAX,
            total_slots: u64::MAX,
        }],
        pages: PageCounts {
            page_size: 2 << 20,
            in_use: u64::MAX / 4,
            idle_mapped: 0,
            held: u64::MAX,
            pooled: 0,
        },
        ..Default::default()
    };
    let section = summary::arena_section(63, &DeviceStats::new(), &e);
    assert_all_77(&section);
    assert!(section.contains("..."));
}
