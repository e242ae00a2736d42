//! `torch-arena diff A [B]`: what grew and shrank between two moments, of two traces or of two
//! steps (or two moments) of one, by site or file; the totals; text, `--json` or `--plot`.
//!
//! The work is the lab's (`torch_arena_lab::diff`): this file reads the arguments into two
//! sides, and prints or draws what the lab found.

use std::path::PathBuf;

use serde::Serialize;
use torch_arena_lab::Trace;
use torch_arena_lab::diff::{self as lib, By, Diff, Moment, Row, Side, Span, delta, unavailable};
use torch_arena_lab::plot::{Line, Mark, Panel, Style, XAxis};

use crate::args::DEFAULT_TOP;
use crate::args::{ByArg, DiffArgs, TraceArg, usage_of};
use crate::json::to_line;
use crate::out::CliResult;
use crate::replay_plot::write_plot;
use crate::replay_run::check_plot_file;
use crate::text::{
    columns, fmt_bytes, fmt_count, fmt_signed_bytes, fmt_signed_count, source_key, source_name,
};

/// The plot's x axis: this many units stand for a whole run (or step).
const SHARE_SCALE: u64 = 10_000;
/// Points drawn per run, at most (about).
const PLOT_POINTS: usize = 2_000;

/// What one side asks for: which trace, which span of it, which moment there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SideSpec {
    /// Index into the traces given.
    pub(crate) trace: usize,
    pub(crate) step: Option<usize>,
    pub(crate) moment: Moment,
}

/// The two sides the arguments ask for, checked before any trace is read.
pub(crate) fn plan(a: &DiffArgs) -> CliResult<[SideSpec; 2]> {
    let n = a.traces.len();
    if n == 0 {
        return Err(format!(
            "diff: which traces? Two (A and B), or one with --steps I J or two --at\n{}",
            usage_of("diff")
        ));
    }
    if n > 2 {
        return Err(format!(
            "diff compares two traces (or two steps or moments of one); {n} given\n{}",
            usage_of("diff")
        ));
    }
    let (ma, mb) = match a.at.as_slice() {
        [] => (Moment::Peak, Moment::Peak),
        [m] => (*m, *m),
        [x, y] => (*x, *y),
        more => {
            return Err(format!(
                "--at is given once (both sides) or twice (A's, then B's); {} given",
                more.len()
            ));
        }
    };
    let steps = match a.steps.as_slice() {
        [] => None,
        [i, j] => Some((*i as usize, *j as usize)),
        _ => return Err("--steps takes two step numbers, I and J, once".into()),
    };
    if n == 1 && steps.is_none() && a.at.len() != 2 {
        return Err(format!(
            "diff: one trace: compare two of its steps (--steps I J) or two of its moments (--at \
             twice, e.g. --at event:1000 --at end); or give a second trace\n{}",
            usage_of("diff")
        ));
    }
    let b = if n == 2 { 1 } else { 0 };
    Ok([
        SideSpec {
            trace: 0,
            step: steps.map(|s| s.0),
            moment: ma,
        },
        SideSpec {
            trace: b,
            step: steps.map(|s| s.1),
            moment: mb,
        },
    ])
}

/// One side, taken.
pub(crate) struct Taken<'t> {
    pub(crate) trace: &'t Trace,
    /// The argument as given.
    pub(crate) arg: String,
    pub(crate) path: Option<String>,
    pub(crate) span: Span,
    pub(crate) moment: Moment,
    pub(crate) side: Side,
    /// Most requested bytes live over the span.
    pub(crate) span_peak: u64,
}

/// Take `spec`'s side of `trace`, grouped `by`.
pub(crate) fn take<'t>(
    trace: &'t Trace,
    arg: &TraceArg,
    spec: SideSpec,
    by: By,
) -> CliResult<Taken<'t>> {
    let span = match spec.step {
        None => Span::whole(trace),
        Some(i) => Span::step(trace, i).map_err(|e| {
            if trace.steps.as_ref().is_some_and(|s| !s.ends.is_empty()) {
                e
            } else {
                format!("{e}; compare two of its moments with --at (e.g. --at event:N) instead")
            }
        })?,
    };
    let applied = lib::resolve(trace, span, spec.moment)?;
    let side = lib::side(trace, applied, by)?;
    Ok(Taken {
        trace,
        arg: arg.text(),
        path: match arg {
            TraceArg::File(p) => Some(p.display().to_string()),
            _ => None,
        },
        span,
        moment: spec.moment,
        span_peak: lib::span_peak(trace, span),
        side,
    })
}

/// `torch-arena diff`.
pub(crate) fn diff_command(a: DiffArgs) -> CliResult<u8> {
    if let Some(pair) = crate::diff_report::reports(&a)? {
        return crate::diff_report::diff_reports(&a, pair);
    }
    let specs = plan(&a)?;
    let by = a.by.unwrap_or(ByArg::Site).by();
    let top = a.top.unwrap_or(DEFAULT_TOP);
    let plot_path = match &a.plot {
        Some(p) => Some(check_plot(p)?),
        None => None,
    };
    TraceArg::check_all(&a.traces)?;
    let traces: Vec<Trace> = a
        .traces
        .iter()
        .map(TraceArg::load)
        .collect::<CliResult<_>>()?;
    // A grouping the traces do not record: say why, for each trace, before anything else.
    let why: Vec<String> = traces.iter().filter_map(|t| unavailable(by, t)).collect();
    if !why.is_empty() {
        return Err(format!(
            "--by {}: not recorded in these traces\ntorch-arena: {}",
            by.as_str(),
            why.join("\ntorch-arena: ")
        ));
    }
    let [sa, sb] = specs;
    let ta = take(&traces[sa.trace], &a.traces[sa.trace], sa, by)?;
    let tb = take(&traces[sb.trace], &a.traces[sb.trace], sb, by)?;
    let d = lib::diff(&ta.side, &tb.side);
    let missing: Vec<(By, String)> = [By::Category, By::Module]
        .into_iter()
        .filter_map(|g| {
            let why: Vec<String> = traces.iter().filter_map(|t| unavailable(g, t)).collect();
            (!why.is_empty()).then(|| (g, why.join("; ")))
        })
        .collect();
    if a.json {
        outln!("{}", to_line(&json(by, &ta, &tb, &d, top, &missing)))?;
    } else {
        print_text(by, &ta, &tb, &d, top, &missing)?;
    }
    if let Some(path) = plot_path {
        write_plot(&path, &[panel(&ta, &tb)])?;
    }
    Ok(0)
}

/// `--plot FILE`: its extension known and its folder there, before any trace is read.
fn check_plot(p: &str) -> CliResult<PathBuf> {
    let path = PathBuf::from(p);
    check_plot_file(p, &path)?;
    Ok(path)
}

/// Where a side's live set was taken, for people: "at the peak of step 2 (events 100 to 200):
/// after 150 events".
fn where_taken(t: &Taken) -> String {
    let what = match t.moment {
        Moment::Peak => "at the peak".to_string(),
        Moment::Start => "at the start".to_string(),
        Moment::End => "at the end".to_string(),
        Moment::Event(e) => format!("at event:{e}"),
    };
    let of = match t.span.step {
        None => "of the run".to_string(),
        Some(i) => format!(
            "of step {i} (events {} to {})",
            fmt_count(t.span.from as u64),
            fmt_count(t.span.to as u64)
        ),
    };
    format!(
        "{what} {of}: after {} of {} events",
        fmt_count(t.side.applied as u64),
        fmt_count(t.trace.events.len() as u64)
    )
}

fn print_text(
    by: By,
    a: &Taken,
    b: &Taken,
    d: &Diff,
    top: usize,
    missing: &[(By, String)],
) -> CliResult<()> {
    for (label, t) in [("A", a), ("B", b)] {
        outln!(
            "{label}: {} ({}, {}), {}",
            t.arg,
            source_name(t.trace.source),
            t.trace.kind.as_str(),
            where_taken(t)
        )?;
    }
    let peak_of = if a.span.step.is_some() || b.span.step.is_some() {
        "peak requested in the step"
    } else {
        "peak requested in the run"
    };
    let rows = [
        [String::new(), "A".into(), "B".into(), "change".into()],
        [
            "live requested".into(),
            fmt_bytes(a.side.bytes),
            fmt_bytes(b.side.bytes),
            fmt_signed_bytes(delta(a.side.bytes, b.side.bytes)),
        ],
        [
            "live allocations".into(),
            fmt_count(a.side.count),
            fmt_count(b.side.count),
            fmt_signed_count(delta(a.side.count, b.side.count)),
        ],
        [
            peak_of.into(),
            fmt_bytes(a.span_peak),
            fmt_bytes(b.span_peak),
            fmt_signed_bytes(delta(a.span_peak, b.span_peak)),
        ],
    ];
    outln!()?;
    for line in columns(&rows, &[true, false, false, false]) {
        outln!("{line}")?;
    }
    outln!()?;
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    outln!(
        "by {}: {} grew, {} shrank, {} unchanged",
        by.as_str(),
        d.grew.len(),
        d.shrank.len(),
        d.unchanged
    )?;
    let shown = |list: &[Row]| cells(&list[..top.min(list.len())]);
    let (grew, shrank) = (shown(&d.grew), shown(&d.shrank));
    let head = [
        "change".to_string(),
        "A".into(),
        "B".into(),
        "allocations".into(),
        by.as_str().into(),
    ];
    // One set of column widths for both tables: laid out together, then split.
    let all: Vec<&[String; 5]> = std::iter::once(&head).chain(&grew).chain(&shrank).collect();
    let lines = columns(&all, &[false; 4]);
    let (head_line, rest) = lines.split_first().expect("the header is a row");
    let (grew_lines, shrank_lines) = rest.split_at(grew.len());
    for (title, list, table) in [
        ("grew (most bytes added first)", &d.grew, grew_lines),
        ("shrank (most bytes removed first)", &d.shrank, shrank_lines),
    ] {
        if list.is_empty() {
            continue;
        }
        outln!()?;
        outln!("{title}:")?;
        for line in std::iter::once(head_line).chain(table) {
            outln!("{line}")?;
        }
        if list.len() > top {
            let hidden = list.len() - top;
            outln!("  ... and {hidden} more {}{}", by.as_str(), plural(hidden))?;
        }
    }
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|(g, _)| g.as_str()).collect();
        outln!()?;
        outln!(
            "by {}: not recorded in these traces (--by {} says why)",
            names.join(" or "),
            names[0]
        )?;
    }
    Ok(())
}

/// A table's cells for `rows`: change, A, B, allocations (A -> B), the group.
fn cells(rows: &[Row]) -> Vec<[String; 5]> {
    rows.iter()
        .map(|r| {
            [
                fmt_signed_bytes(r.delta_bytes),
                fmt_bytes(r.a_bytes),
                fmt_bytes(r.b_bytes),
                format!("{} -> {}", fmt_count(r.a_count), fmt_count(r.b_count)),
                r.key.clone(),
            ]
        })
        .collect()
}

/// One side in JSON.
#[derive(Serialize)]
struct SideJson<'a> {
    trace: &'a str,
    path: Option<&'a str>,
    source: String,
    kind: &'static str,
    events: usize,
    seeded_events: usize,
    step: Option<usize>,
    span_events: [usize; 2],
    moment: String,
    events_applied: usize,
    live_bytes: u64,
    live_count: u64,
    peak_requested_bytes: u64,
    groups: usize,
}

/// Why the traces cannot be grouped by category or module (absent when they can).
#[derive(Serialize)]
struct Unavailable<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    module: Option<&'a str>,
}

/// `diff --json`: the object (its fields in `DIFF_JSON_HELP`).
#[derive(Serialize)]
struct DiffJson<'a> {
    by: &'static str,
    a: SideJson<'a>,
    b: SideJson<'a>,
    delta_live_bytes: i64,
    delta_live_count: i64,
    delta_peak_requested_bytes: i64,
    grew_groups: usize,
    shrank_groups: usize,
    unchanged_groups: usize,
    grew: &'a [Row],
    shrank: &'a [Row],
    grew_not_shown: usize,
    shrank_not_shown: usize,
    unavailable: Unavailable<'a>,
}

fn side_json<'a>(t: &'a Taken) -> SideJson<'a> {
    SideJson {
        trace: &t.arg,
        path: t.path.as_deref(),
        source: source_key(t.trace.source),
        kind: t.trace.kind.as_str(),
        events: t.trace.events.len(),
        seeded_events: t.trace.seeded,
        step: t.span.step,
        span_events: [t.span.from, t.span.to],
        moment: t.moment.name(),
        events_applied: t.side.applied,
        live_bytes: t.side.bytes,
        live_count: t.side.count,
        peak_requested_bytes: t.span_peak,
        groups: t.side.groups.len(),
    }
}

fn json<'a>(
    by: By,
    a: &'a Taken,
    b: &'a Taken,
    d: &'a Diff,
    top: usize,
    missing: &'a [(By, String)],
) -> DiffJson<'a> {
    let why = |g: By| {
        missing
            .iter()
            .find(|(m, _)| *m == g)
            .map(|(_, w)| w.as_str())
    };
    DiffJson {
        by: by.as_str(),
        a: side_json(a),
        b: side_json(b),
        delta_live_bytes: delta(a.side.bytes, b.side.bytes),
        delta_live_count: delta(a.side.count, b.side.count),
        delta_peak_requested_bytes: delta(a.span_peak, b.span_peak),
        grew_groups: d.grew.len(),
        shrank_groups: d.shrank.len(),
        unchanged_groups: d.unchanged,
        grew: &d.grew[..top.min(d.grew.len())],
        shrank: &d.shrank[..top.min(d.shrank.len())],
        grew_not_shown: d.grew.len().saturating_sub(top),
        shrank_not_shown: d.shrank.len().saturating_sub(top),
        unavailable: Unavailable {
            category: why(By::Category),
            module: why(By::Module),
        },
    }
}

/// A side's trace for a legend: a file's name without its folders, else the argument.
fn short(t: &Taken) -> String {
    match &t.path {
        Some(p) => std::path::Path::new(p)
            .file_name()
            .map_or_else(|| p.clone(), |n| n.to_string_lossy().into_owned()),
        None => t.arg.clone(),
    }
}

/// What a side is, beside its trace: "step 3", "at event:100".
fn which(t: &Taken) -> String {
    match t.span.step {
        Some(i) => format!("step {i}"),
        None => format!("at {}", t.moment.name()),
    }
}

/// x of event index `k` within `span`, as a share of the span in [`SHARE_SCALE`] units.
fn share(span: Span, k: usize) -> u64 {
    match span.len() {
        0 => 0,
        len => ((k.saturating_sub(span.from)) as u128 * SHARE_SCALE as u128 / len as u128) as u64,
    }
}

/// The plot: both sides' requested bytes over the share of their span's events, one axis, with
/// each side's moment marked.
pub(crate) fn panel(a: &Taken, b: &Taken) -> Panel {
    let steps = a.span.step.is_some() || b.span.step.is_some();
    let mut lines = Vec::new();
    let mut marks = Vec::new();
    for (n, (label, t)) in [("A", a), ("B", b)].into_iter().enumerate() {
        let points = lib::series(t.trace, t.span, PLOT_POINTS)
            .into_iter()
            .map(|(k, bytes)| (share(t.span, k), bytes))
            .collect();
        let step = t.span.step.map_or(String::new(), |i| format!(", step {i}"));
        lines.push(Line {
            label: format!("{label}: {}{step}", short(t)),
            style: Style::Run(n),
            points,
        });
        marks.push(Mark {
            event: share(t.span, t.side.applied),
            label: format!("{label}: {}", t.moment.name()),
            style: Style::Run(n),
        });
    }
    let what = if steps { "step" } else { "run" };
    let title = if a.arg == b.arg {
        format!(
            "torch-arena diff: {}, {} vs {}",
            short(a),
            which(a),
            which(b)
        )
    } else {
        format!("torch-arena diff: {} vs {}", short(a), short(b))
    };
    Panel {
        title,
        subtitle: format!(
            "requested bytes live; live at the moments: A {}, B {} ({})",
            fmt_bytes(a.side.bytes),
            fmt_bytes(b.side.bytes),
            fmt_signed_bytes(delta(a.side.bytes, b.side.bytes))
        ),
        events: SHARE_SCALE,
        lines,
        capacity: None,
        seeded: 0,
        marks,
        times: Vec::new(),
        x_axis: XAxis::Percent(format!("share of each {what}'s events")),
    }
}
