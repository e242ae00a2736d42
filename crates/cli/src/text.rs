//! Formatting for people: bytes, counts, times, fragmentation, wrapped text and tables.

use torch_arena_lab::Source;

use crate::out::CliResult;

/// Bytes for people: the library's one formatter (`79.65 GiB`, `512 B`).
pub(crate) fn fmt_bytes(b: u64) -> String {
    torch_arena::stats::summary::human_bytes(b)
}

/// 1234567 -> "1,234,567".
pub(crate) fn fmt_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "+1.50 GiB", "-512 B", "0 B".
pub(crate) fn fmt_signed_bytes(d: i64) -> String {
    match d.signum() {
        1 => format!("+{}", fmt_bytes(d.unsigned_abs())),
        -1 => format!("-{}", fmt_bytes(d.unsigned_abs())),
        _ => "0 B".into(),
    }
}

/// "+1,234", "-3", "0".
pub(crate) fn fmt_signed_count(d: i64) -> String {
    match d.signum() {
        1 => format!("+{}", fmt_count(d.unsigned_abs())),
        -1 => format!("-{}", fmt_count(d.unsigned_abs())),
        _ => "0".into(),
    }
}

pub(crate) fn fmt_rate(per_s: f64) -> String {
    if per_s >= 1e6 {
        format!("{:.2}M", per_s / 1e6)
    } else if per_s >= 1e3 {
        format!("{:.1}k", per_s / 1e3)
    } else {
        format!("{per_s:.0}")
    }
}

/// Seconds as `0 s`, `12.3 µs`, `4.56 ms`, `1.23 s`.
pub(crate) fn fmt_secs(s: f64) -> String {
    if s == 0.0 {
        "0 s".into()
    } else if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

pub(crate) fn fmt_ns(ns: f64) -> String {
    if !ns.is_finite() {
        "–".into()
    } else if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{:.1} ms", ns / 1e6)
    }
}

/// `reserved / requested - 1` as a percentage ("–" when nothing was requested).
pub(crate) fn fragmentation(reserved: u64, requested: u64) -> f64 {
    if requested == 0 {
        f64::NAN
    } else {
        reserved as f64 / requested as f64 - 1.0
    }
}

pub(crate) fn fmt_frag(f: f64) -> String {
    if f.is_finite() {
        format!("{:.1} %", f * 100.0)
    } else {
        "–".into()
    }
}

pub(crate) fn source_name(s: Source) -> String {
    match s {
        Source::Arena(v) => format!("torch-arena trace v{v}"),
        Source::TorchSnapshot => "PyTorch snapshot".into(),
        Source::RmmCsv => "RMM log".into(),
        Source::Synthetic => "synthetic".into(),
    }
}

pub(crate) fn source_key(s: Source) -> String {
    match s {
        Source::Arena(v) => format!("arena-v{v}"),
        Source::TorchSnapshot => "torch-snapshot".into(),
        Source::RmmCsv => "rmm-csv".into(),
        Source::Synthetic => "synthetic".into(),
    }
}

/// Break `text` into lines of at most `width` characters, at ASCII spaces only: a no-break space
/// (U+00A0) holds a figure and its unit together and is printed as a plain space.
pub(crate) fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut col = 0;
    for word in text.split([' ', '\n']).filter(|w| !w.is_empty()) {
        let len = word.chars().count();
        if col > 0 && col + 1 + len > width {
            out.push('\n');
            col = 0;
        } else if col > 0 {
            out.push(' ');
            col += 1;
        }
        out.push_str(&word.replace('\u{a0}', " "));
        col += len;
    }
    out
}

/// `s` with its spaces made no-break, for [`wrap`].
pub(crate) fn nb(s: String) -> String {
    s.replace(' ', "\u{a0}")
}

/// `rows` as lines of columns: a two-space indent, then each cell two spaces from the last;
/// column `c` padded to the column's widest cell, on the left where `left[c]` (text), else on
/// the right (figures). Cells past `left.len()` are free text, not padded.
pub(crate) fn columns<R: AsRef<[String]>>(rows: &[R], left: &[bool]) -> Vec<String> {
    let widths: Vec<usize> = (0..left.len())
        .map(|c| {
            rows.iter()
                .map(|r| r.as_ref()[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|r| {
            let cells: Vec<String> = r
                .as_ref()
                .iter()
                .enumerate()
                .map(|(c, cell)| match (left.get(c), widths.get(c)) {
                    (Some(true), Some(&w)) => format!("{cell:<w$}"),
                    (Some(false), Some(&w)) => format!("{cell:>w$}"),
                    _ => cell.clone(),
                })
                .collect();
            format!("  {}", cells.join("  "))
        })
        .collect()
}

/// Print `rows` as a table: first row the header, first column left-aligned, the others
/// right-aligned except the last (a free-text note).
pub(crate) fn print_table(rows: &[Vec<String>]) -> CliResult<()> {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let mut line = String::from("  ");
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c] - cell.chars().count();
            if c == 0 || c == cols - 1 {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
            line.push_str("  ");
        }
        outln!("{}", line.trim_end())?;
        if i == 0 {
            let total: usize = widths.iter().sum::<usize>() + 2 * cols;
            outln!("  {}", "-".repeat(total.saturating_sub(2)))?;
        }
    }
    Ok(())
}
