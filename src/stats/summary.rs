//! The text of `torch.cuda.memory_summary()`: PyTorch's table, byte for byte, then a torch-arena
//! section in the same 77-column box.
//!
//! This file owns the rendering only. [`torch_table`] reproduces `torch/cuda/memory.py`'s
//! `memory_summary` (torch 2.11) exactly, including Python's formatting semantics: `_format_size`
//! and `_format_count` with their units chosen from the `all` row, floor division of negative
//! values, `{:6d}` / `{:7d}` / `{:<17d}` widths (a value too wide for its field widens the line, as
//! in Python). [`memory_summary`] appends the torch-arena section: device, capacity, limit,
//! fragmentation, pages, size-class occupancy, bad and pending frees, and driver calls; every line
//! of that section is exactly 77 characters wide.

use std::fmt::Write as _;

use super::report::ArenaExtras;
use super::{DeviceStats, Stat, StatArray};

/// Characters between the two bars of every line.
const WIDTH: usize = 75;

/// `torch.cuda.memory_summary(device, abbreviated)` for these stats, followed by the torch-arena
/// section (see [`arena_section`]).
pub fn memory_summary(
    device: i32,
    stats: &DeviceStats,
    extras: &ArenaExtras,
    abbreviated: bool,
) -> String {
    let mut out = torch_table(device, stats, abbreviated);
    out.push_str(&arena_section(device, stats, extras));
    out
}

/// Python's `_format_size(sz, pref_sz)`: the unit is chosen from `pref` (the `all` row's value),
/// the value is floor-divided by 1024 per step; `f"{sz:6d} {prefix}"`, 10 characters.
///
/// `pref` follows Python exactly: the first test compares integers, later ones the float
/// `pref / 1024**k` (an `i64 → f64` conversion then exact divisions by 1024 give the same correctly
/// rounded float as Python's `int / int`).
fn format_size_pref(sz: i64, pref: i64) -> String {
    const PREFIXES: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut prefix = PREFIXES[0];
    let mut sz = sz;
    let mut pref = pref as f64;
    for p in &PREFIXES[1..] {
        if pref < (768 * 1024) as f64 {
            break;
        }
        prefix = p;
        sz = sz.div_euclid(1024);
        pref /= 1024.0;
    }
    format!("{sz:6} {prefix}")
}

/// Python's `_format_count(cnt, pref_cnt)`: units " ", "K", "M" at a threshold of 750 000,
/// floor division by 1000; `f"{cnt:7d} {prefix} "`, 10 characters.
///
/// Python compares `pref` with 750 000, then the float `pref / 1000` with 750 000; the second test
/// is exactly `pref < 750 000 000` for every integer `pref` (the quotient is never within a
/// rounding step of 750 000 unless it is at least 750 000), so integers are used.
fn format_count(cnt: i64, pref: i64) -> String {
    const PREFIXES: [&str; 3] = [" ", "K", "M"];
    let mut prefix = PREFIXES[0];
    let mut cnt = cnt;
    let mut threshold: i64 = 750 * 1000;
    for p in &PREFIXES[1..] {
        if pref < threshold {
            break;
        }
        prefix = p;
        cnt = cnt.div_euclid(1000);
        threshold = threshold.saturating_mul(1000);
    }
    format!("{cnt:7} {prefix} ")
}

/// The lines of PyTorch's table, without the bars.
fn torch_lines(device: i32, stats: &DeviceStats, abbreviated: bool) -> Vec<String> {
    type Fmt = fn(i64, i64) -> String;
    let metrics: [(&StatArray, &str, Fmt); 9] = [
        (&stats.allocated_bytes, "Allocated memory", format_size_pref),
        (&stats.active_bytes, "Active memory", format_size_pref),
        (&stats.requested_bytes, "Requested memory", format_size_pref),
        (
            &stats.reserved_bytes,
            "GPU reserved memory",
            format_size_pref,
        ),
        (
            &stats.inactive_split_bytes,
            "Non-releasable memory",
            format_size_pref,
        ),
        (&stats.allocation, "Allocations", format_count),
        (&stats.active, "Active allocs", format_count),
        (&stats.segment, "GPU reserved segments", format_count),
        (&stats.inactive_split, "Non-releasable allocs", format_count),
    ];

    let mut lines = vec![
        "=".repeat(WIDTH),
        format!(
            " {:16} PyTorch CUDA memory summary, device ID {:<17} ",
            "", device
        ),
        "-".repeat(WIDTH),
        format!(
            "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
            "", stats.num_ooms, "", stats.num_alloc_retries
        ),
        "=".repeat(WIDTH),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];

    let row = |name: &str, s: &Stat, pref: &Stat, fmt: Fmt| {
        format!(
            " {:<21} | {} | {} | {} | {} ",
            name,
            fmt(s.current, pref.current),
            fmt(s.peak, pref.peak),
            fmt(s.allocated, pref.allocated),
            fmt(s.freed, pref.freed)
        )
    };

    for (array, name, fmt) in metrics {
        lines.push("-".repeat(WIDTH));
        // StatArray indices: 0 = all, 1 = small_pool, 2 = large_pool; torch prints large first.
        let all = &array.0[0];
        lines.push(row(name, all, all, fmt));
        if !abbreviated {
            lines.push(row("      from large pool", &array.0[2], all, fmt));
            lines.push(row("      from small pool", &array.0[1], all, fmt));
        }
    }

    for (stat, name) in [
        (&stats.oversize_allocations, "Oversize allocations"),
        (&stats.oversize_segments, "Oversize GPU segments"),
    ] {
        lines.push("-".repeat(WIDTH));
        // Each value is its own unit reference here.
        lines.push(format!(
            " {:<21} | {} | {} | {} | {} ",
            name,
            format_count(stat.current, stat.current),
            format_count(stat.peak, stat.peak),
            format_count(stat.allocated, stat.allocated),
            format_count(stat.freed, stat.freed)
        ));
    }

    lines.push("=".repeat(WIDTH));
    lines
}

/// `"|" + "|\n|".join(lines) + "|\n"`.
fn boxed(lines: &[String]) -> String {
    let mut out = String::with_capacity(lines.len() * (WIDTH + 3));
    for l in lines {
        out.push('|');
        out.push_str(l);
        out.push_str("|\n");
    }
    out
}

/// Exactly the text `torch.cuda.memory_summary(device, abbreviated)` returns for these stats
/// under PyTorch's native allocator: 77-character lines (75 between the bars), each ending in
/// `\n`, the last one `|===...===|`.
pub fn torch_table(device: i32, stats: &DeviceStats, abbreviated: bool) -> String {
    boxed(&torch_lines(device, stats, abbreviated))
}

/// `1 - peak requested / peak reserved` (`requested_bytes.all.peak / reserved_bytes.all.peak`),
/// or `None` when nothing was ever reserved.
pub fn fragmentation(stats: &DeviceStats) -> Option<f64> {
    let reserved = stats.reserved_bytes.all().peak;
    let requested = stats.requested_bytes.all().peak;
    (reserved > 0).then(|| 1.0 - requested as f64 / reserved as f64)
}

/// The fragmentation as the summary prints it: `"12.5%"`, or `"n/a"`.
pub fn format_fragmentation(stats: &DeviceStats) -> String {
    match fragmentation(stats) {
        Some(f) => format!("{:.1}%", f * 100.0),
        None => "n/a".to_string(),
    }
}

/// PyTorch's `format_size`: "512 bytes", "1.50 KiB", "20.00 MiB", "3.25 GiB".
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2} {}", UNITS[i])
}

/// Bytes with two decimals in the largest binary unit that keeps the number >= 1: `79.65 GiB`
/// (`512 B` under 1 KiB). The crate's one byte formatter for people, besides PyTorch's own
/// (`format_size_pref` for `memory_summary`'s table, [`format_size`] for out-of-memory
/// messages), whose exact text PyTorch users know. The Python package's `format_size` writes
/// the same text (`tests/fixtures/byte_formats.txt` holds both).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// A size written exactly in the largest unit that divides it: `2 MiB`, `1280 B`, `96 KiB`.
fn exact_bytes(n: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n != 0 && n.is_multiple_of(1u64 << shift) {
            return format!("{} {unit}", n >> shift);
        }
    }
    format!("{n} B")
}

/// Exactly [`WIDTH`] characters: padded with spaces, or cut with `...` when too long.
fn fit(text: &str) -> String {
    let n = text.chars().count();
    if n <= WIDTH {
        let mut s = text.to_string();
        s.extend(std::iter::repeat_n(' ', WIDTH - n));
        s
    } else {
        let mut s: String = text.chars().take(WIDTH - 3).collect();
        s.push_str("...");
        s
    }
}

/// A header row on the grid of PyTorch's table: each title centred in its 12-character cell, as
/// in `| Cur Usage  | Peak Usage |`.
fn grid_header(label: &str, titles: [&str; 4]) -> String {
    fit(&format!(
        " {label:<21} |{:^12}|{:^12}|{:^12}|{:^12}",
        titles[0], titles[1], titles[2], titles[3]
    ))
}

/// ` {label:<21} | {value}`, fitted to the box.
fn kv(label: &str, value: &str) -> String {
    fit(&format!(" {label:<21} | {value}"))
}

/// A row on the grid of PyTorch's table: a label and four 10-character cells.
fn grid(label: &str, cells: [&str; 4]) -> String {
    fit(&format!(
        " {label:<21} | {} | {} | {} | {} ",
        cells[0], cells[1], cells[2], cells[3]
    ))
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A byte count in a 10-character cell: whole bytes below 1 KiB, else one decimal in the largest
/// unit that keeps the number below 1024 (`  24.0 MiB`).
fn size_cell(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n:6} B  ");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:6.1} {}", UNITS[unit])
}

/// A count in a 10-character cell, in its own unit.
fn count_cell(n: u64) -> String {
    format_count(to_i64(n), to_i64(n))
}

/// The lines of the torch-arena section, without the bars.
fn arena_lines(device: i32, stats: &DeviceStats, extras: &ArenaExtras) -> Vec<String> {
    let dash = "-".repeat(WIDTH);
    let mut lines = vec![
        fit(&format!(
            "{:^WIDTH$}",
            format!("torch-arena summary, device ID {device}")
        )),
        dash.clone(),
    ];

    // Device, capacity, limit, fragmentation.
    let name = if extras.device_name.is_empty() {
        "(unnamed)"
    } else {
        extras.device_name.as_str()
    };
    let kind = if extras.vmm {
        "VMM pages"
    } else {
        "cuMemAlloc segments"
    };
    lines.push(kv("Device", &format!("{name} ({kind})")));
    lines.push(kv(
        "Capacity",
        &format!(
            "{} ({} bytes)",
            human_bytes(extras.capacity),
            extras.capacity
        ),
    ));
    let limit_share = if extras.capacity > 0 {
        format!(
            ", {:.1}% of capacity",
            extras.limit as f64 * 100.0 / extras.capacity as f64
        )
    } else {
        String::new()
    };
    lines.push(kv(
        "Limit",
        &format!(
            "{} ({} bytes{limit_share})",
            human_bytes(extras.limit),
            extras.limit
        ),
    ));
    lines.push(kv(
        "Fragmentation",
        &format!(
            "{} (1 - peak requested / peak reserved)",
            format_fragmentation(stats)
        ),
    ));

    // Pages.
    let p = &extras.pages;
    lines.push(dash.clone());
    lines.push(grid_header(
        &format!("Pages of {}", exact_bytes(p.page_size)),
        ["In use", "Idle mapped", "Held unused", "Pooled"],
    ));
    let counts = [p.in_use, p.idle_mapped, p.held, p.pooled];
    let [a, b, c, d] = counts.map(count_cell);
    lines.push(grid("      pages", [&a, &b, &c, &d]));
    let [a, b, c, d] = counts.map(|n| size_cell(n.saturating_mul(p.page_size)));
    lines.push(grid("      bytes", [&a, &b, &c, &d]));

    // Physical memory created, by what its request did to the bytes requested.
    let g = &extras.growth;
    let blank = " ".repeat(10);
    lines.push(dash.clone());
    lines.push(grid_header(
        "Memory created for",
        ["A new peak", "Under peak", "", ""],
    ));
    let [a, b] = [g.at_peak.handles, g.below_peak.handles].map(count_cell);
    lines.push(grid("      handles", [&a, &b, &blank, &blank]));
    let [a, b] = [g.at_peak.bytes, g.below_peak.bytes].map(size_cell);
    lines.push(grid("      bytes", [&a, &b, &blank, &blank]));

    // Size classes with slabs.
    lines.push(dash.clone());
    lines.push(grid_header(
        "Size class",
        ["Slabs", "Used slots", "Tot slots", "Occupancy"],
    ));
    let mut any = false;
    for class in extras.classes.iter().filter(|c| c.slabs > 0) {
        any = true;
        let occupancy = if class.total_slots > 0 {
            format!(
                "{:8.1}% ",
                class.used_slots as f64 * 100.0 / class.total_slots as f64
            )
        } else {
            format!("{:>8}  ", "n/a")
        };
        let [a, b, c] = [class.slabs, class.used_slots, class.total_slots].map(count_cell);
        lines.push(grid(
            &format!("      {}", exact_bytes(class.size)),
            [&a, &b, &c, &occupancy],
        ));
    }
    if !any {
        lines.push(kv("      (no slabs)", ""));
    }

    // Frees.
    lines.push(dash.clone());
    lines.push(kv("Bad frees", &extras.bad_frees.to_string()));
    lines.push(kv("Pending frees", &extras.pending_frees.to_string()));
    lines.push(kv("Threads in own shards", &extras.own_shards.to_string()));

    // Driver calls.
    lines.push(dash);
    let total = extras.driver.total();
    if total == 0 {
        lines.push(kv("Driver calls", "none"));
    } else {
        lines.push(kv("Driver calls", "count"));
        for (call, n) in extras.driver.entries().into_iter().filter(|&(_, n)| n > 0) {
            // Two spaces, not six: the longest name (cuMemAddressReserve) then fills the column.
            lines.push(kv(&format!("  {call}"), &n.to_string()));
        }
        lines.push(kv("  total", &total.to_string()));
    }

    lines.push("=".repeat(WIDTH));
    lines
}

/// The torch-arena section of the summary: device name, capacity and limit, fragmentation
/// (`1 - requested_bytes.all.peak / reserved_bytes.all.peak`, one decimal, `n/a` when nothing was
/// reserved), pages (in use, idle mapped, pooled, total: counts and bytes), occupancy of every size
/// class that has slabs, bad and pending frees, and the driver calls made (non-zero ones and the
/// total). Every line is 77 characters, `|...|`.
pub fn arena_section(device: i32, stats: &DeviceStats, extras: &ArenaExtras) -> String {
    let mut out = String::new();
    for l in arena_lines(device, stats, extras) {
        debug_assert_eq!(l.chars().count(), WIDTH, "{l:?}");
        let _ = writeln!(out, "|{l}|");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_size_matches_python() {
        // Values checked against Python's `_format_size`.
        assert_eq!(format_size_pref(512, 512), "   512 B  ");
        assert_eq!(format_size_pref(786_431, 786_431), "786431 B  ");
        assert_eq!(format_size_pref(786_432, 786_432), "   768 KiB");
        assert_eq!(format_size_pref(1000, 805_306_368), "     0 MiB");
        assert_eq!(format_size_pref(-1, 1 << 30), "    -1 MiB");
        assert_eq!(format_size_pref(0, 0), "     0 B  ");
    }

    /// Rust's one byte formatter for people and the Python package's (`_sizes.format_size`,
    /// tested against the same file) write the same text.
    #[test]
    fn human_bytes_matches_the_shared_fixture() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/byte_formats.txt"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let mut rows = 0;
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (n, want) = line.split_once('\t').expect("bytes<TAB>text");
            assert_eq!(human_bytes(n.parse().unwrap()), want, "{n}");
            rows += 1;
        }
        assert!(rows >= 20, "{rows} rows");
    }

    #[test]
    fn format_count_matches_python() {
        assert_eq!(format_count(749_999, 749_999), " 749999   ");
        assert_eq!(format_count(750_000, 750_000), "    750 K ");
        assert_eq!(format_count(749_999_999, 749_999_999), " 749999 K ");
        assert_eq!(format_count(750_000_000, 750_000_000), "    750 M ");
        assert_eq!(format_count(5, 1_000_000), "      0 K ");
        assert_eq!(format_count(-1, 1_000_000), "     -1 K ");
    }
}
