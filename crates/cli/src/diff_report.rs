//! `torch-arena diff A B` on two explain reports (`torch_arena.explain(json=True)` dumped, or the
//! report written at an out-of-memory error with `explain:True`): what grew and shrank by
//! category or by module. Traces record allocation sites, not what the memory holds; the reports
//! do, so a report pair is the way to diff by category or module (two steps of one run: dump
//! `explain(json=True)` at each).

use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use torch_arena_lab::diff::delta;

use crate::args::{ByArg, DEFAULT_TOP, DiffArgs, TraceArg};
use crate::json::to_line;
use crate::out::CliResult;
use crate::text::{columns, fmt_bytes, fmt_signed_bytes};

/// Largest report file read (a report is a few KiB; its `by_module` holds at most 20 rows).
const MAX_REPORT_BYTES: u64 = 64 << 20;

/// One explain report, as far as the diff needs it.
pub(crate) struct Report {
    path: String,
    rank: Option<u64>,
    /// Categories in the report's order.
    categories: Vec<(String, u64)>,
    /// Module path -> bytes of every category the report attributes to it.
    modules: Vec<(String, u64)>,
    cached: Option<u64>,
    unusable: Option<u64>,
    oom_request: Option<u64>,
}

impl Report {
    fn total(&self) -> u64 {
        self.categories
            .iter()
            .map(|(_, v)| *v)
            .fold(0, u64::saturating_add)
    }
}

/// The report in `path`, or None when the file is not a JSON object with a `categories` object
/// (then it is read as a trace). A JSON report with a malformed field is an error naming it.
pub(crate) fn read(path: &Path) -> CliResult<Option<Report>> {
    let name = path.display().to_string();
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(None); // the trace loader names a missing file
    };
    if !meta.is_file() || meta.len() > MAX_REPORT_BYTES {
        return Ok(None);
    }
    let Ok(bytes) = std::fs::read(path) else {
        return Ok(None);
    };
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Ok(None);
    }
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(&bytes) else {
        return Ok(None);
    };
    let Some(cats) = obj.get("categories") else {
        return Ok(None);
    };
    let Value::Object(cats) = cats else {
        return Err(format!(
            "{name}: \"categories\" is not an object of byte counts"
        ));
    };
    let categories = cats
        .iter()
        .map(|(k, v)| Ok((k.clone(), bytes_of(&name, k, v)?)))
        .collect::<CliResult<Vec<_>>>()?;
    let mut modules = Vec::new();
    if let Some(rows) = obj.get("by_module") {
        let Value::Array(rows) = rows else {
            return Err(format!("{name}: \"by_module\" is not a list"));
        };
        for row in rows {
            let Value::Object(row) = row else {
                return Err(format!("{name}: a \"by_module\" row is not an object"));
            };
            let Some(Value::String(module)) = row.get("module") else {
                return Err(format!(
                    "{name}: a \"by_module\" row has no \"module\" name"
                ));
            };
            let mut sum = 0u64;
            for (k, v) in row.iter().filter(|(k, _)| *k != "module") {
                sum = sum.saturating_add(bytes_of(&name, k, v)?);
            }
            modules.push((module.clone(), sum));
        }
    }
    Ok(Some(Report {
        path: name.clone(),
        rank: optional(&name, &obj, "rank")?,
        categories,
        modules,
        cached: optional(&name, &obj, "cached_bytes")?,
        unusable: optional(&name, &obj, "unusable_bytes")?,
        oom_request: match obj.get("oom") {
            Some(Value::Object(oom)) => optional(&name, oom, "request_bytes")?,
            _ => None,
        },
    }))
}

fn bytes_of(file: &str, key: &str, v: &Value) -> CliResult<u64> {
    v.as_u64()
        .ok_or_else(|| format!("{file}: \"{key}\" is {v}, not a whole number of bytes"))
}

fn optional(file: &str, obj: &Map<String, Value>, key: &str) -> CliResult<Option<u64>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => bytes_of(file, key, v).map(Some),
    }
}

/// One group's change.
#[derive(Serialize, Debug, PartialEq, Eq)]
struct Row {
    key: String,
    a_bytes: u64,
    b_bytes: u64,
    delta_bytes: i64,
}

/// Rows of `a` and `b` by key (a key missing on one side is 0 there), in `a`'s order then
/// `b`'s new keys: grew (most added first), shrank (most removed first), and the unchanged count.
fn compare(a: &[(String, u64)], b: &[(String, u64)]) -> (Vec<Row>, Vec<Row>, usize) {
    let mut keys: Vec<&str> = a.iter().map(|(k, _)| k.as_str()).collect();
    keys.extend(
        b.iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| !a.iter().any(|(x, _)| x == k)),
    );
    let get =
        |side: &[(String, u64)], k: &str| side.iter().find(|(x, _)| x == k).map_or(0, |v| v.1);
    let (mut grew, mut shrank, mut same) = (Vec::new(), Vec::new(), 0);
    for k in keys {
        let (x, y) = (get(a, k), get(b, k));
        let row = Row {
            key: k.to_string(),
            a_bytes: x,
            b_bytes: y,
            delta_bytes: delta(x, y),
        };
        match row.delta_bytes.signum() {
            1 => grew.push(row),
            -1 => shrank.push(row),
            _ => same += 1,
        }
    }
    grew.sort_by_key(|r| std::cmp::Reverse(r.delta_bytes));
    shrank.sort_by_key(|r| r.delta_bytes);
    (grew, shrank, same)
}

#[derive(Serialize)]
struct SideJson<'a> {
    report: &'a str,
    rank: Option<u64>,
    total_bytes: u64,
    cached_bytes: Option<u64>,
    unusable_bytes: Option<u64>,
    oom_request_bytes: Option<u64>,
}

#[derive(Serialize)]
struct ReportDiffJson<'a> {
    by: &'static str,
    a: SideJson<'a>,
    b: SideJson<'a>,
    delta_total_bytes: i64,
    grew: &'a [Row],
    shrank: &'a [Row],
    unchanged_groups: usize,
    grew_not_shown: usize,
    shrank_not_shown: usize,
}

fn side_json(r: &Report) -> SideJson<'_> {
    SideJson {
        report: &r.path,
        rank: r.rank,
        total_bytes: r.total(),
        cached_bytes: r.cached,
        unusable_bytes: r.unusable,
        oom_request_bytes: r.oom_request,
    }
}

/// The two reports of `a`'s arguments when both are explain reports; None when neither is; an
/// error when one is and the other is not.
pub(crate) fn reports(a: &DiffArgs) -> CliResult<Option<[Report; 2]>> {
    let mut found = Vec::new();
    for t in &a.traces {
        found.push(match t {
            TraceArg::File(p) => read(p)?,
            _ => None,
        });
    }
    let n = found.iter().filter(|r| r.is_some()).count();
    if n == 0 {
        return Ok(None);
    }
    if n != 2 || a.traces.len() != 2 {
        return Err(
            "diff: an explain report is compared with another explain report (two files of \
             torch_arena.explain(json=True) or of the report written at out-of-memory), not \
             with a trace"
                .into(),
        );
    }
    let mut it = found.into_iter().flatten();
    let (x, y) = (
        it.next().expect("two reports"),
        it.next().expect("two reports"),
    );
    Ok(Some([x, y]))
}

/// `torch-arena diff` on two explain reports.
pub(crate) fn diff_reports(a: &DiffArgs, [ra, rb]: [Report; 2]) -> CliResult<u8> {
    if !a.steps.is_empty() || !a.at.is_empty() {
        return Err(
            "diff: --steps and --at choose moments of a trace; an explain report is one moment \
             already (dump explain(json=True) at each step to compare steps)"
                .into(),
        );
    }
    if a.plot.is_some() {
        return Err(
            "diff --plot draws two traces over time; explain reports hold one moment each: \
             nothing to draw"
                .into(),
        );
    }
    let by = match a.by {
        None | Some(ByArg::Category) => "category",
        Some(ByArg::Module) => "module",
        Some(ByArg::Site | ByArg::File) => {
            return Err(
                "diff --by site|file: explain reports record categories and modules, not \
                 allocation sites; use --by category or --by module (or diff two traces by site)"
                    .into(),
            );
        }
    };
    let (grew, shrank, same) = if by == "category" {
        compare(&ra.categories, &rb.categories)
    } else {
        compare(&ra.modules, &rb.modules)
    };
    let top = a.top.unwrap_or(DEFAULT_TOP);
    if a.json {
        outln!(
            "{}",
            to_line(&ReportDiffJson {
                by,
                a: side_json(&ra),
                b: side_json(&rb),
                delta_total_bytes: delta(ra.total(), rb.total()),
                grew: &grew[..top.min(grew.len())],
                shrank: &shrank[..top.min(shrank.len())],
                unchanged_groups: same,
                grew_not_shown: grew.len().saturating_sub(top),
                shrank_not_shown: shrank.len().saturating_sub(top),
            })
        )?;
        return Ok(0);
    }
    for (label, r) in [("A", &ra), ("B", &rb)] {
        let rank = r.rank.map_or(String::new(), |n| format!(", rank {n}"));
        let oom = r.oom_request.map_or(String::new(), |n| {
            format!(", at an out-of-memory error ({} asked)", fmt_bytes(n))
        });
        outln!("{label}: {} (explain report{rank}{oom})", r.path)?;
    }
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), fmt_bytes);
    let opt_delta = |x: Option<u64>, y: Option<u64>| match (x, y) {
        (Some(x), Some(y)) => fmt_signed_bytes(delta(x, y)),
        _ => "-".into(),
    };
    let rows = [
        ["".to_string(), "A".into(), "B".into(), "change".into()],
        [
            "live tensors".into(),
            fmt_bytes(ra.total()),
            fmt_bytes(rb.total()),
            fmt_signed_bytes(delta(ra.total(), rb.total())),
        ],
        [
            "cached".into(),
            opt(ra.cached),
            opt(rb.cached),
            opt_delta(ra.cached, rb.cached),
        ],
        [
            "reserved but unusable".into(),
            opt(ra.unusable),
            opt(rb.unusable),
            opt_delta(ra.unusable, rb.unusable),
        ],
    ];
    outln!()?;
    for line in columns(&rows, &[true, false, false, false]) {
        outln!("{line}")?;
    }
    outln!()?;
    outln!(
        "by {by}: {} grew, {} shrank, {same} unchanged",
        grew.len(),
        shrank.len()
    )?;
    for (title, list) in [
        ("grew (most bytes added first)", &grew),
        ("shrank (most bytes removed first)", &shrank),
    ] {
        if list.is_empty() {
            continue;
        }
        outln!()?;
        outln!("{title}:")?;
        let head = ["change".to_string(), "A".into(), "B".into(), by.into()];
        let table: Vec<[String; 4]> = std::iter::once(head)
            .chain(list[..top.min(list.len())].iter().map(|r| {
                [
                    fmt_signed_bytes(r.delta_bytes),
                    fmt_bytes(r.a_bytes),
                    fmt_bytes(r.b_bytes),
                    r.key.clone(),
                ]
            }))
            .collect();
        for line in columns(&table, &[false; 3]) {
            outln!("{line}")?;
        }
        if list.len() > top {
            outln!("  ... and {} more", list.len() - top)?;
        }
    }
    if by == "module" {
        outln!()?;
        outln!(
            "(a report's by_module holds its 20 largest modules: a module absent from one side \
             counts 0 there)"
        )?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
        pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    }

    #[test]
    fn rows_grow_and_shrink_by_key_with_keys_missing_on_one_side_at_zero() {
        let a = v(&[("parameters", 100), ("activations", 50), ("other", 7)]);
        let b = v(&[
            ("parameters", 100),
            ("activations", 80),
            ("held_graphs", 40),
        ]);
        let (grew, shrank, same) = compare(&a, &b);
        assert_eq!(
            grew.iter()
                .map(|r| (r.key.as_str(), r.delta_bytes))
                .collect::<Vec<_>>(),
            [("held_graphs", 40), ("activations", 30)]
        );
        assert_eq!(
            shrank,
            [Row {
                key: "other".into(),
                a_bytes: 7,
                b_bytes: 0,
                delta_bytes: -7
            }]
        );
        assert_eq!(same, 1);
    }
}
