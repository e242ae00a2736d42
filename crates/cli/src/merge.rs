//! `torch-arena merge FILE...`: the table of every rank's report and their imbalance, from the
//! per-rank JSON files the Python package writes: `torch_arena.explain(json=True)` dumped, or
//! the leak report (`TORCH_ARENA_LEAK_REPORT`'s file, `leak_report(format="json")` dumped).
//!
//! The same table as `explain(all_ranks=True)` and `leak_report(all_ranks=True)` gather live
//! (python/torch_arena/_ranks.py), built again here rather than by calling Python, so that the
//! files can be merged where they were copied to, without torch or the package; the rules are
//! the same (mean rounded half up to whole bytes, imbalance to hundredths half up from exact
//! sums, ties to the lowest rank) and tests/python/test_ranks.py holds the two to the same JSON
//! and text on the files of a real two-rank run.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::ser::{SerializeMap as _, Serializer};
use serde_json::{Map, Value};

use crate::args::MergeArgs;
use crate::json::to_line;
use crate::out::CliResult;
use crate::text::{columns, fmt_bytes};

/// `torch_arena._explain.CATEGORIES`, the order of an explain table's columns (categories a
/// file has beyond these follow, sorted by name; then `total`).
const CATEGORIES: [&str; 6] = [
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "held_graphs",
    "other",
];
/// The columns of a leak table.
const LEAK_COLUMNS: [&str; 2] = ["leaked_bytes", "growing_sites"];
/// Columns that count things rather than bytes.
const COUNTS: [&str; 1] = ["growing_sites"];
/// The most ranks a file may claim (a world size beyond is a damaged file, not a job).
const MAX_WORLD: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Explain,
    Leaks,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Explain => "explain",
            Kind::Leaks => "leaks",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Kind::Explain => "an explain report",
            Kind::Leaks => "a leak report",
        }
    }

    fn headline(self) -> &'static str {
        match self {
            Kind::Explain => "total",
            Kind::Leaks => "leaked_bytes",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Kind::Explain => "bytes in live tensors per rank",
            Kind::Leaks => "leaks per rank (the live bytes of the growing allocation sites)",
        }
    }
}

/// One rank's report reduced to a row.
#[derive(Clone, Debug)]
pub(crate) struct RankRow {
    pub(crate) file: String,
    pub(crate) kind: Kind,
    pub(crate) rank: u64,
    pub(crate) world_size: u64,
    /// Column -> value, in the table's order.
    pub(crate) values: Vec<(String, u64)>,
}

/// Per column: the largest, least and mean value over the ranks, and the imbalance.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ColumnStats {
    pub(crate) max: u64,
    pub(crate) max_rank: u64,
    pub(crate) min: u64,
    pub(crate) min_rank: u64,
    pub(crate) mean: u64,
    /// The largest over the mean in hundredths (None: every rank has 0).
    pub(crate) hundredths: Option<u64>,
}

/// The table: the rows by rank and each column's figures.
#[derive(Clone, Debug)]
pub(crate) struct Table {
    pub(crate) kind: Kind,
    pub(crate) world_size: u64,
    pub(crate) columns: Vec<String>,
    pub(crate) rows: Vec<RankRow>,
    pub(crate) missing: Vec<u64>,
    pub(crate) stats: Vec<ColumnStats>,
}

/// `torch-arena merge FILE... [--json]`.
pub(crate) fn merge_command(a: MergeArgs) -> CliResult<u8> {
    let mut rows = Vec::with_capacity(a.files.len());
    for path in &a.files {
        let file = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("merge: cannot read {file}: {e}"))?;
        rows.push(read_report(&file, &text).map_err(|e| format!("merge: {e}"))?);
    }
    let t = table(rows).map_err(|e| format!("merge: {e}"))?;
    if a.json {
        outln!("{}", to_line(&table_json(&t)))?;
    } else {
        outln!("{}", render(&t))?;
    }
    Ok(0)
}

/// A whole number >= 0 from `v`, or an error naming `what` in `file`.
fn whole(file: &str, what: &str, v: Option<&Value>) -> CliResult<u64> {
    match v {
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64().expect("checked")),
        Some(other) => Err(format!(
            "{file}: {what} must be a whole number >= 0, not {other}"
        )),
        None => Err(format!("{file}: {what} is missing")),
    }
}

/// One per-rank file's text as a row; errors name the file and what is wrong.
pub(crate) fn read_report(file: &str, text: &str) -> CliResult<RankRow> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("{file}: not a JSON report ({e})"))?;
    let neither = || {
        format!(
            "{file}: neither an explain report (torch_arena.explain(json=True): \"categories\") \
             nor a leak report (TORCH_ARENA_LEAK_REPORT's file: \"devices\"; \
             leak_report(format=\"json\"): \"growing\")"
        )
    };
    let Value::Object(obj) = &value else {
        return Err(neither());
    };
    if obj.contains_key("ranks") && obj.contains_key("stats") {
        return Err(format!(
            "{file}: a merged table already (torch-arena merge --json, all_ranks=True): give \
             the per-rank files"
        ));
    }
    let kind = if obj.contains_key("categories") {
        Kind::Explain
    } else if obj.contains_key("devices") || obj.contains_key("growing") {
        Kind::Leaks
    } else {
        return Err(neither());
    };
    if !obj.contains_key("rank") {
        return Err(format!(
            "{file}: {} without \"rank\" (written by a torch-arena that did not record ranks: \
             write it again, or add \"rank\" and \"world_size\" to it)",
            kind.what()
        ));
    }
    let rank = whole(file, "\"rank\"", obj.get("rank"))?;
    let world_size = whole(file, "\"world_size\"", obj.get("world_size"))?;
    if !(1..=MAX_WORLD).contains(&world_size) {
        return Err(format!(
            "{file}: \"world_size\" must be from 1 to {MAX_WORLD}, not {world_size}"
        ));
    }
    if rank >= world_size {
        return Err(format!(
            "{file}: \"rank\" {rank} is not below \"world_size\" {world_size}"
        ));
    }
    let values = match kind {
        Kind::Explain => explain_values(file, obj)?,
        Kind::Leaks => leak_values(file, obj)?,
    };
    Ok(RankRow {
        file: file.to_string(),
        kind,
        rank,
        world_size,
        values,
    })
}

/// The categories in the table's order, then `total`.
fn explain_values(file: &str, obj: &Map<String, Value>) -> CliResult<Vec<(String, u64)>> {
    let Some(Value::Object(cats)) = obj.get("categories") else {
        return Err(format!(
            "{file}: \"categories\" must be an object of bytes per category"
        ));
    };
    let mut names: Vec<&str> = CATEGORIES
        .iter()
        .copied()
        .filter(|c| cats.contains_key(*c))
        .collect();
    let mut extra: Vec<&str> = cats
        .keys()
        .map(String::as_str)
        .filter(|k| !CATEGORIES.contains(k))
        .collect();
    extra.sort_unstable();
    names.extend(extra);
    let mut values = Vec::with_capacity(names.len() + 1);
    let mut total: u64 = 0;
    for name in names {
        let n = whole(file, &format!("categories.{name}"), cats.get(name))?;
        total = total.checked_add(n).ok_or_else(|| {
            format!(
                "{file}: the categories add up to more than {} bytes",
                u64::MAX
            )
        })?;
        values.push((name.to_string(), n));
    }
    values.push(("total".to_string(), total));
    Ok(values)
}

/// The live bytes of the growing sites over every device, and how many sites grow.
fn leak_values(file: &str, obj: &Map<String, Value>) -> CliResult<Vec<(String, u64)>> {
    let single = [Value::Object(obj.clone())];
    let reports: &[Value] = match obj.get("devices") {
        Some(Value::Array(devices)) => devices,
        Some(_) => {
            return Err(format!(
                "{file}: \"devices\" must be a list of leak reports, one per device"
            ));
        }
        None => &single,
    };
    let (mut bytes, mut sites) = (0u64, 0u64);
    for (d, report) in reports.iter().enumerate() {
        let growing = match report.get("growing") {
            Some(Value::Array(g)) => g,
            _ => {
                return Err(format!(
                    "{file}: device report {d} has no \"growing\" list of sites"
                ));
            }
        };
        for (i, site) in growing.iter().enumerate() {
            let what = format!("growing[{i}].live_bytes of device report {d}");
            let n = whole(file, &what, site.get("live_bytes"))?;
            bytes = bytes.checked_add(n).ok_or_else(|| {
                format!(
                    "{file}: the growing sites add up to more than {} bytes",
                    u64::MAX
                )
            })?;
            sites += 1;
        }
    }
    Ok(vec![
        (LEAK_COLUMNS[0].to_string(), bytes),
        (LEAK_COLUMNS[1].to_string(), sites),
    ])
}

/// The table of `rows` (one per rank, any order): one kind, one world size, each rank once, the
/// same columns.
pub(crate) fn table(mut rows: Vec<RankRow>) -> CliResult<Table> {
    let Some(first) = rows.first().cloned() else {
        return Err("no report to merge".into());
    };
    for r in &rows[1..] {
        if r.kind != first.kind {
            return Err(format!(
                "cannot merge explain reports with leak reports: {} is {}, {} is {}",
                first.file,
                first.kind.what(),
                r.file,
                r.kind.what()
            ));
        }
        if r.world_size != first.world_size {
            return Err(format!(
                "the files come from different jobs: {} has world_size {}, {} has {}",
                first.file, first.world_size, r.file, r.world_size
            ));
        }
        let names = |row: &RankRow| {
            row.values
                .iter()
                .map(|(c, _)| c.clone())
                .collect::<Vec<_>>()
        };
        if names(r) != names(&first) {
            return Err(format!(
                "{} and {} list different categories: {} / {}",
                first.file,
                r.file,
                names(&first).join(", "),
                names(r).join(", ")
            ));
        }
    }
    let mut by_rank: BTreeMap<u64, &RankRow> = BTreeMap::new();
    for r in &rows {
        if let Some(other) = by_rank.insert(r.rank, r) {
            return Err(format!(
                "rank {} appears twice: {} and {}",
                r.rank, other.file, r.file
            ));
        }
    }
    rows.sort_by_key(|r| r.rank);
    let columns: Vec<String> = first.values.iter().map(|(c, _)| c.clone()).collect();
    let n = rows.len() as u128;
    let stats = (0..columns.len())
        .map(|i| {
            let values: Vec<(u64, u64)> = rows.iter().map(|r| (r.values[i].1, r.rank)).collect();
            let max = values.iter().map(|v| v.0).max().expect("a row");
            let min = values.iter().map(|v| v.0).min().expect("a row");
            let total: u128 = values.iter().map(|v| u128::from(v.0)).sum();
            let lowest = |x: u64| values.iter().filter(|v| v.0 == x).map(|v| v.1).min();
            ColumnStats {
                max,
                max_rank: lowest(max).expect("a row has it"),
                min,
                min_rank: lowest(min).expect("a row has it"),
                // At most the largest value, so within u64.
                mean: ((2 * total + n) / (2 * n)) as u64,
                hundredths: (total > 0).then(|| hundredths(max, n, total)),
            }
        })
        .collect();
    let seen: Vec<u64> = rows.iter().map(|r| r.rank).collect();
    let missing = (0..first.world_size)
        .filter(|r| !seen.contains(r))
        .collect();
    Ok(Table {
        kind: first.kind,
        world_size: first.world_size,
        columns,
        rows,
        missing,
        stats,
    })
}

/// `max / (total / n)` in hundredths, rounded half up, exactly (`total` > 0; at most 100 n,
/// since `max` <= `total`).
fn hundredths(max: u64, n: u128, total: u128) -> u64 {
    ((200 * u128::from(max) * n + total) / (2 * total)) as u64
}

fn ratio(h: Option<u64>) -> Option<f64> {
    h.map(|h| h as f64 / 100.0)
}

/// The table as `_ranks.table` writes it, its fields in the same order (so that the two JSON
/// texts are the same bytes): `{"kind", "world_size", "columns", "ranks", "missing_ranks",
/// "stats", "imbalance"}`.
#[derive(Serialize)]
pub(crate) struct TableJson<'a> {
    kind: &'static str,
    world_size: u64,
    columns: &'a [String],
    ranks: Vec<RowJson<'a>>,
    missing_ranks: &'a [u64],
    stats: StatsJson<'a>,
    imbalance: HeadlineJson,
}

/// A row: `rank`, then each column.
struct RowJson<'a>(&'a RankRow);

impl Serialize for RowJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.values.len() + 1))?;
        m.serialize_entry("rank", &self.0.rank)?;
        for (c, v) in &self.0.values {
            m.serialize_entry(c, v)?;
        }
        m.end()
    }
}

/// Column -> its figures, in the columns' order.
struct StatsJson<'a>(&'a Table);

impl Serialize for StatsJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.columns.len()))?;
        for (c, st) in self.0.columns.iter().zip(&self.0.stats) {
            m.serialize_entry(
                c,
                &StatJson {
                    max: st.max,
                    max_rank: st.max_rank,
                    min: st.min,
                    min_rank: st.min_rank,
                    mean: st.mean,
                    imbalance: ratio(st.hundredths),
                },
            )?;
        }
        m.end()
    }
}

#[derive(Serialize)]
struct StatJson {
    max: u64,
    max_rank: u64,
    min: u64,
    min_rank: u64,
    mean: u64,
    imbalance: Option<f64>,
}

#[derive(Serialize)]
struct HeadlineJson {
    column: &'static str,
    rank: u64,
    ratio: Option<f64>,
}

pub(crate) fn table_json(t: &Table) -> TableJson<'_> {
    let (head, hs) = headline(t);
    TableJson {
        kind: t.kind.name(),
        world_size: t.world_size,
        columns: &t.columns,
        ranks: t.rows.iter().map(RowJson).collect(),
        missing_ranks: &t.missing,
        stats: StatsJson(t),
        imbalance: HeadlineJson {
            column: head,
            rank: hs.max_rank,
            ratio: ratio(hs.hundredths),
        },
    }
}

fn headline(t: &Table) -> (&'static str, &ColumnStats) {
    let head = t.kind.headline();
    let i = t
        .columns
        .iter()
        .position(|c| c == head)
        .expect("every table has its headline column");
    (head, &t.stats[i])
}

fn cell(column: &str, v: u64) -> String {
    if COUNTS.contains(&column) {
        v.to_string()
    } else {
        fmt_bytes(v)
    }
}

fn ratio_text(h: Option<u64>) -> String {
    h.map_or_else(|| "-".into(), |h| format!("{:.2}x", h as f64 / 100.0))
}

/// The table as text, as `_ranks.render` writes it.
pub(crate) fn render(t: &Table) -> String {
    let mut head = vec!["rank".to_string()];
    head.extend(t.columns.iter().cloned());
    let mut body: Vec<Vec<String>> = t
        .rows
        .iter()
        .map(|r| {
            std::iter::once(r.rank.to_string())
                .chain(r.values.iter().map(|(c, v)| cell(c, *v)))
                .collect()
        })
        .collect();
    type Pick = fn(&ColumnStats) -> u64;
    let figures: [(&str, Pick); 3] = [("max", |s| s.max), ("min", |s| s.min), ("mean", |s| s.mean)];
    for (label, pick) in figures {
        let cells = t
            .columns
            .iter()
            .zip(&t.stats)
            .map(|(c, s)| cell(c, pick(s)));
        body.push(std::iter::once(label.to_string()).chain(cells).collect());
    }
    let ratios = t.stats.iter().map(|s| ratio_text(s.hundredths));
    body.push(
        std::iter::once("max/mean".to_string())
            .chain(ratios)
            .collect(),
    );
    // The rank (or statistic) column left-aligned, the figures right-aligned.
    let left: Vec<bool> = (0..head.len()).map(|c| c == 0).collect();
    let mut lines = vec![format!(
        "torch-arena: {}, {} of {} rank(s)",
        t.kind.title(),
        t.rows.len(),
        t.world_size
    )];
    lines.extend(columns(
        &std::iter::once(&head).chain(&body).collect::<Vec<_>>(),
        &left,
    ));
    let (col, s) = headline(t);
    lines.push(match s.hundredths {
        None => format!("imbalance: none, every rank has {} {col}", cell(col, 0)),
        Some(h) => format!(
            "imbalance: rank {} has the most {col}, {}: {} the mean of {} (least: rank {}, {})",
            s.max_rank,
            cell(col, s.max),
            ratio_text(Some(h)),
            cell(col, s.mean),
            s.min_rank,
            cell(col, s.min)
        ),
    });
    if !t.missing.is_empty() {
        let missing: Vec<String> = t.missing.iter().map(u64::to_string).collect();
        lines.push(format!(
            "note: no report from rank(s) {}",
            missing.join(", ")
        ));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn explain(rank: u64, world: u64, params: u64, other: u64) -> String {
        format!(
            r#"{{"rank": {rank}, "world_size": {world}, "categories": {{"parameters": {params},
            "gradients": 0, "optimizer_state": 0, "activations": 0, "held_graphs": 0,
            "other": {other}}}, "remedies": []}}"#
        )
    }

    fn rows(files: &[(&str, String)]) -> CliResult<Table> {
        let rows = files
            .iter()
            .map(|(f, t)| read_report(f, t))
            .collect::<CliResult<Vec<_>>>()?;
        table(rows)
    }

    #[test]
    fn the_table_has_each_rank_and_the_imbalance_of_each_column() {
        let t = rows(&[
            ("b.json", explain(1, 2, 3 << 20, 1 << 20)),
            ("a.json", explain(0, 2, 1 << 20, 1 << 20)),
        ])
        .unwrap();
        assert_eq!(t.rows.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(t.columns.last().map(String::as_str), Some("total"));
        let total = t.stats.last().unwrap();
        // Totals 2 MiB and 4 MiB: mean 3 MiB, rank 1 has 4/3 of it.
        assert_eq!(total.max, 4 << 20);
        assert_eq!(total.max_rank, 1);
        assert_eq!(total.min_rank, 0);
        assert_eq!(total.mean, 3 << 20);
        assert_eq!(total.hundredths, Some(133));
        let other = &t.stats[5];
        assert_eq!((other.hundredths, other.max_rank), (Some(100), 0));
        let gradients = &t.stats[1];
        assert_eq!(gradients.hundredths, None);
        let text = render(&t);
        assert!(text.contains("max/mean"), "{text}");
        assert!(
            text.contains("imbalance: rank 1 has the most total, 4.00 MiB: 1.33x the mean of 3.00 MiB (least: rank 0, 2.00 MiB)"),
            "{text}"
        );
        let j: Value = serde_json::from_str(&to_line(&table_json(&t))).unwrap();
        assert_eq!(j["imbalance"]["ratio"], serde_json::json!(1.33));
        assert_eq!(j["stats"]["gradients"]["imbalance"], Value::Null);
        assert_eq!(j["missing_ranks"], serde_json::json!([]));
        // Python's field order: kind first, a row's rank first.
        let line = to_line(&table_json(&t));
        assert!(
            line.starts_with(r#"{"kind": "explain", "world_size": 2, "columns": ["parameters", "#),
            "{line}"
        );
        assert!(
            line.contains(r#""ranks": [{"rank": 0, "parameters": 1048576, "#),
            "{line}"
        );
    }

    #[test]
    fn the_mean_rounds_half_up_and_ties_name_the_lowest_rank() {
        let t = rows(&[
            ("a", explain(0, 3, 1, 0)),
            ("b", explain(1, 3, 2, 0)),
            ("c", explain(2, 3, 2, 0)),
        ])
        .unwrap();
        let p = &t.stats[0];
        // 5 / 3 = 1.67 -> 2; 2 / (5/3) = 1.2.
        assert_eq!((p.mean, p.max_rank, p.hundredths), (2, 1, Some(120)));
    }

    #[test]
    fn leak_files_sum_the_growing_sites_of_every_device() {
        let f = r#"{"rank": 1, "world_size": 4, "devices": [
            {"growing": [{"live_bytes": 100}, {"live_bytes": 20}]}, {"growing": [{"live_bytes": 3}]}]}"#;
        let g = r#"{"rank": 0, "world_size": 4, "growing": []}"#;
        let t = rows(&[("f", f.into()), ("g", g.into())]).unwrap();
        assert_eq!(
            t.rows[1].values,
            [("leaked_bytes".into(), 123), ("growing_sites".into(), 3)]
        );
        assert_eq!(t.missing, [2, 3]);
        let text = render(&t);
        assert!(text.contains("note: no report from rank(s) 2, 3"), "{text}");
        assert!(text.contains("2 of 4 rank(s)"), "{text}");
    }

    #[test]
    fn bad_input_is_named() {
        let err = |files: &[(&str, String)]| rows(files).unwrap_err();
        assert!(err(&[("x", "[1]".into())]).contains("x: neither an explain report"));
        assert!(err(&[("x", "{".into())]).contains("x: not a JSON report"));
        let e = err(&[("x", r#"{"categories": {}}"#.into())]);
        assert!(e.contains("x: an explain report without \"rank\""), "{e}");
        let e = err(&[("a", explain(0, 2, 1, 1)), ("b", explain(0, 2, 1, 1))]);
        assert_eq!(e, "rank 0 appears twice: a and b");
        let leak = r#"{"rank": 1, "world_size": 2, "growing": []}"#.to_string();
        let e = err(&[("a", explain(0, 2, 1, 1)), ("l", leak)]);
        assert!(
            e.contains("cannot merge explain reports with leak reports"),
            "{e}"
        );
        let e = err(&[("a", explain(0, 2, 1, 1)), ("b", explain(1, 4, 1, 1))]);
        assert!(e.contains("different jobs"), "{e}");
        let e = err(&[("a", explain(2, 2, 1, 1))]);
        assert!(
            e.contains("\"rank\" 2 is not below \"world_size\" 2"),
            "{e}"
        );
        let e = err(&[(
            "a",
            explain(0, 1, 1, 1).replace("\"other\": 1", "\"other\": -1"),
        )]);
        assert!(
            e.contains("categories.other must be a whole number >= 0, not -1"),
            "{e}"
        );
        let max = u64::MAX;
        let e = err(&[("a", explain(0, 1, max, 1))]);
        assert!(e.contains("add up to more than"), "{e}");
        let merged = r#"{"kind": "explain", "ranks": [], "stats": {}}"#.to_string();
        assert!(err(&[("m", merged)]).contains("a merged table already"));
    }
}
