//! What grew and shrank between two moments: of two traces (two runs, two snapshots) or of one
//! (two of its steps, two of its events), by allocation site or by the source file of the site.
//! `torch-arena diff` prints it.
//!
//! A moment ([`Moment`]) is taken within a [`Span`]: the whole trace, or one of the steps it marks
//! ([`crate::StepMarks`]). Its live set is [`live_at`]'s, grouped ([`By`]) and matched between
//! the two sides by the group's text (site numbers differ from trace to trace). Category and module
//! groupings need a source that records them; none of the trace forms does ([`unavailable`] says
//! why rather than guessing).

use std::collections::HashMap;

use serde::Serialize;

use crate::live::{At, live_at, peak_end};
use crate::model::{Op, Source, Trace};

/// When, within a span, the live set is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// After the first event at which requested bytes were highest within the span (where the
    /// span began, when none rose above it).
    Peak,
    /// Where the span begins: for a whole trace, after its seeded events (the live set the
    /// recording began with); for a step, when the step began.
    Start,
    /// Where the span ends: the end of the trace, or of the step.
    End,
    /// Just before event `N`: counted from the trace's first event (seeded ones included) for a
    /// whole trace, from the step's first event for a step.
    Event(usize),
}

/// The forms [`Moment::parse`] reads, for messages.
pub const MOMENT_FORMS: &str = "peak, start, end or event:N";

impl Moment {
    /// `peak`, `start`, `end` or `event:N` (`_` allowed in N).
    pub fn parse(text: &str) -> Result<Moment, String> {
        match text.trim() {
            "peak" => Ok(Moment::Peak),
            "start" => Ok(Moment::Start),
            "end" => Ok(Moment::End),
            t => t
                .strip_prefix("event:")
                .and_then(|n| n.replace('_', "").parse().ok())
                .map(Moment::Event)
                .ok_or_else(|| format!("'{text}' is not a moment: expected {MOMENT_FORMS}")),
        }
    }

    /// The moment as [`Moment::parse`] reads it.
    pub fn name(self) -> String {
        match self {
            Moment::Peak => "peak".into(),
            Moment::Start => "start".into(),
            Moment::End => "end".into(),
            Moment::Event(n) => format!("event:{n}"),
        }
    }
}

/// The events a moment is taken among: `events[from..to]` of a trace, the whole trace or one of
/// its steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub from: usize,
    pub to: usize,
    /// The step's number, `None` for the whole trace.
    pub step: Option<usize>,
}

impl Span {
    /// The whole trace, starting after its seeded events.
    pub fn whole(trace: &Trace) -> Span {
        let n = trace.events.len();
        Span {
            from: trace.seeded.min(n),
            to: n,
            step: None,
        }
    }

    /// Step `i` of `trace` ([`crate::StepMarks`]); an error says why there is none.
    pub fn step(trace: &Trace, i: usize) -> Result<Span, String> {
        let marks = trace.steps.as_ref().ok_or_else(|| no_steps(trace))?;
        let m = marks.ends.len();
        let Some(&to) = marks.ends.get(i) else {
            let before = match marks.before_window {
                0 => String::new(),
                b => format!(
                    "; {b} more step end{} before its first recorded event (its start was not \
                     recorded)",
                    if b == 1 { "" } else { "s" }
                ),
            };
            return Err(match m {
                0 => format!(
                    "{}: no step ends within its recorded events ({}){before}",
                    trace.name, marks.marker
                ),
                _ => format!(
                    "step {i} is out of range: {} marks {m} step{} (0 to {}), by {}{before}",
                    trace.name,
                    if m == 1 { "" } else { "s" },
                    m - 1,
                    marks.marker
                ),
            });
        };
        let n = trace.events.len();
        let to = to.min(n);
        let from = match i {
            0 => trace.seeded.min(to),
            _ => marks.ends[i - 1].min(to),
        };
        Ok(Span {
            from,
            to,
            step: Some(i),
        })
    }

    /// Events in the span.
    pub fn len(&self) -> usize {
        self.to - self.from
    }

    pub fn is_empty(&self) -> bool {
        self.to == self.from
    }
}

/// Why `trace` has no steps, by its source.
fn no_steps(trace: &Trace) -> String {
    let name = &trace.name;
    match trace.source {
        Source::Arena(v) => format!(
            "{name} marks no steps: torch-arena's trace format (version {v}) records no step \
             boundaries (a process counts them with torch_arena.step() and optimizer.step(), but \
             the trace recorder does not write them)"
        ),
        Source::TorchSnapshot => format!(
            "{name} marks no steps: its external_annotations hold no ProfilerStep or \
             Optimizer.step range that can be placed among its events (PyTorch records these \
             record_function ranges while memory history is on; a run without an optimizer or \
             profiler, an older PyTorch, or a snapshot without trace events has none)"
        ),
        Source::RmmCsv => {
            format!("{name} marks no steps: an RMM log records no step boundaries")
        }
        Source::Synthetic => format!(
            "{name} marks no steps: of the synthetic traces only the workloads \
             (synth:KIND[:STEPS[:SEED]]) have steps"
        ),
    }
}

/// Events applied to stand at `moment` of `span` (as [`At::Before`] takes them).
pub fn resolve(trace: &Trace, span: Span, moment: Moment) -> Result<usize, String> {
    let n = trace.events.len();
    match (moment, span.step) {
        (Moment::Peak, _) => Ok(peak_end(trace, span.from, span.to)),
        (Moment::Start, _) => Ok(span.from),
        (Moment::End, _) => Ok(span.to),
        (Moment::Event(e), None) if e <= n => Ok(e),
        (Moment::Event(e), None) => Err(format!(
            "event:{e} is beyond {}'s {n} events (event:0 to event:{n})",
            trace.name
        )),
        (Moment::Event(e), Some(_)) if e <= span.len() => Ok(span.from + e),
        (Moment::Event(e), Some(i)) => Err(format!(
            "event:{e} is beyond step {i} of {}: it has {} events (event:0 to event:{}, counted \
             from the step's first)",
            trace.name,
            span.len(),
            span.len()
        )),
    }
}

/// How allocations are grouped into rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    /// The allocation site's text (`train.py:40 in step`).
    Site,
    /// The source file of the site (`train.py`).
    File,
    /// What the memory is (parameters, gradients, ...): not recorded by any trace form.
    Category,
    /// The `nn.Module` that allocated it: not recorded by any trace form.
    Module,
}

impl By {
    pub fn as_str(self) -> &'static str {
        match self {
            By::Site => "site",
            By::File => "file",
            By::Category => "category",
            By::Module => "module",
        }
    }
}

/// Why allocations of `trace` cannot be grouped `by` (`None`: they can).
pub fn unavailable(by: By, trace: &Trace) -> Option<String> {
    let (what, records) = match trace.source {
        Source::TorchSnapshot => ("a PyTorch snapshot", "the stack that made each allocation"),
        Source::Arena(_) => ("a torch-arena trace", "the site that made each allocation"),
        Source::RmmCsv => ("an RMM log", "each allocation's address, size and stream"),
        Source::Synthetic => ("a synthetic trace", "a label per allocation site"),
    };
    let name = &trace.name;
    match by {
        By::Site | By::File => None,
        By::Category => Some(format!(
            "{name}: {what} records {records}, not what the memory holds (parameter, gradient, \
             optimizer state, activation); torch_arena.explain() sorts a running process's \
             memory into categories"
        )),
        By::Module => Some(format!(
            "{name}: {what} records {records}, not which nn.Module made it (frames name source \
             lines: --by site or --by file); torch_arena.explain() with track_modules() \
             attributes a running process's memory to modules"
        )),
    }
}

/// The source file of a site's text: `train.py` of `train.py:40 in step` (the text itself when
/// it names no file and line).
pub fn site_file(site: &str) -> &str {
    let head = site.rfind(" in ").map_or(site, |i| &site[..i]);
    match head.rsplit_once(':') {
        Some((file, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => file,
        _ => head,
    }
}

/// One group's share of a live set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub key: String,
    pub bytes: u64,
    pub count: u64,
}

/// A live set, grouped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Side {
    /// Events applied.
    pub applied: usize,
    pub bytes: u64,
    pub count: u64,
    /// Most bytes first.
    pub groups: Vec<Group>,
}

/// The live set of `trace` after `applied` events, grouped `by`.
pub fn side(trace: &Trace, applied: usize, by: By) -> Result<Side, String> {
    if let Some(why) = unavailable(by, trace) {
        return Err(why);
    }
    let set = live_at(trace, At::Before(applied))?;
    let mut groups: Vec<Group> = Vec::with_capacity(set.sites.len());
    let mut index: HashMap<String, usize> = HashMap::new();
    for s in &set.sites {
        let key = match by {
            By::File => site_file(&s.name).to_string(),
            _ => s.name.clone(),
        };
        match index.get(&key) {
            Some(&i) => {
                groups[i].bytes = groups[i].bytes.saturating_add(s.bytes);
                groups[i].count += s.count;
            }
            None => {
                index.insert(key.clone(), groups.len());
                groups.push(Group {
                    key,
                    bytes: s.bytes,
                    count: s.count,
                });
            }
        }
    }
    groups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.key.cmp(&b.key)));
    Ok(Side {
        applied: set.events_applied,
        bytes: set.bytes,
        count: set.count,
        groups,
    })
}

/// `b - a`, as a signed count (clamped to `i64`).
pub fn delta(a: u64, b: u64) -> i64 {
    (i128::from(b) - i128::from(a)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// One group on both sides (as JSON: these fields, in this order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    pub key: String,
    pub a_bytes: u64,
    pub b_bytes: u64,
    /// `b_bytes - a_bytes`.
    pub delta_bytes: i64,
    pub a_count: u64,
    pub b_count: u64,
    /// `b_count - a_count`.
    pub delta_count: i64,
}

/// What grew and what shrank from side A to side B.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diff {
    /// More bytes in B (or as many, in more allocations): most added bytes first.
    pub grew: Vec<Row>,
    /// Fewer bytes in B (or as many, in fewer allocations): most removed bytes first.
    pub shrank: Vec<Row>,
    /// Groups with the same bytes and count on both sides.
    pub unchanged: usize,
}

/// Match the groups of `a` and `b` by key and sort them into [`Diff`]'s lists.
pub fn diff(a: &Side, b: &Side) -> Diff {
    let mut rows: Vec<Row> = Vec::with_capacity(a.groups.len().max(b.groups.len()));
    let mut index: HashMap<&str, usize> = HashMap::new();
    for g in &a.groups {
        index.insert(&g.key, rows.len());
        rows.push(Row {
            key: g.key.clone(),
            a_bytes: g.bytes,
            b_bytes: 0,
            delta_bytes: 0,
            a_count: g.count,
            b_count: 0,
            delta_count: 0,
        });
    }
    for g in &b.groups {
        match index.get(g.key.as_str()) {
            Some(&i) => {
                rows[i].b_bytes = g.bytes;
                rows[i].b_count = g.count;
            }
            None => rows.push(Row {
                key: g.key.clone(),
                a_bytes: 0,
                b_bytes: g.bytes,
                delta_bytes: 0,
                a_count: 0,
                b_count: g.count,
                delta_count: 0,
            }),
        }
    }
    let (mut grew, mut shrank, mut unchanged) = (Vec::new(), Vec::new(), 0);
    for mut r in rows {
        r.delta_bytes = delta(r.a_bytes, r.b_bytes);
        r.delta_count = delta(r.a_count, r.b_count);
        match (r.delta_bytes.signum(), r.delta_count.signum()) {
            (1, _) | (0, 1) => grew.push(r),
            (-1, _) | (0, -1) => shrank.push(r),
            _ => unchanged += 1,
        }
    }
    grew.sort_by(|x, y| {
        (y.delta_bytes, y.delta_count)
            .cmp(&(x.delta_bytes, x.delta_count))
            .then_with(|| x.key.cmp(&y.key))
    });
    shrank.sort_by(|x, y| {
        (x.delta_bytes, x.delta_count)
            .cmp(&(y.delta_bytes, y.delta_count))
            .then_with(|| x.key.cmp(&y.key))
    });
    Diff {
        grew,
        shrank,
        unchanged,
    }
}

/// The most requested bytes live at any moment of `span` (its start included): the running sum
/// of [`Trace::peak_requested`].
pub fn span_peak(trace: &Trace, span: Span) -> u64 {
    let (mut live, mut peak) = (0u64, 0u64);
    for (i, e) in trace.events[..span.to].iter().enumerate() {
        if i == span.from {
            peak = live;
        }
        match e.op {
            Op::Alloc => live = live.saturating_add(e.size),
            Op::Free => live = live.saturating_sub(e.size),
        }
        if i >= span.from {
            peak = peak.max(live);
        }
    }
    if span.from == span.to {
        peak = live;
    }
    peak
}

/// Requested bytes live over `span`, as `(events applied, bytes)` from `span.from` to `span.to`,
/// at most about `max_points` points: past that, each stretch of events keeps its lowest and
/// highest point, so peaks survive. The running sum of [`Trace::peak_requested`].
pub fn series(trace: &Trace, span: Span, max_points: usize) -> Vec<(usize, u64)> {
    let mut live = 0u64;
    let step = |live: &mut u64, i: usize| {
        let e = &trace.events[i];
        match e.op {
            Op::Alloc => *live = live.saturating_add(e.size),
            Op::Free => *live = live.saturating_sub(e.size),
        }
    };
    for i in 0..span.from {
        step(&mut live, i);
    }
    let points = span.len() + 1;
    let per = points.div_ceil((max_points / 2).max(1)).max(1);
    let mut out = Vec::with_capacity(points.min(max_points + 2));
    let mut k = span.from;
    // (index, bytes) of the lowest and highest point of the current stretch.
    let mut lo = (k, live);
    let mut hi = (k, live);
    let mut in_stretch = 0;
    loop {
        if in_stretch == 0 {
            lo = (k, live);
            hi = (k, live);
        } else {
            if live < lo.1 {
                lo = (k, live);
            }
            if live > hi.1 {
                hi = (k, live);
            }
        }
        in_stretch += 1;
        if in_stretch == per || k == span.to {
            let (first, second) = if lo.0 <= hi.0 { (lo, hi) } else { (hi, lo) };
            out.push(first);
            if second.0 != first.0 {
                out.push(second);
            }
            in_stretch = 0;
        }
        if k == span.to {
            break;
        }
        step(&mut live, k);
        k += 1;
    }
    if out.last().map(|p| p.0) != Some(span.to) {
        out.push((span.to, live));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StepMarks;
    use crate::live::tests::ev;

    /// live.rs's hand-built trace, with step ends when given.
    fn trace(events: Vec<crate::Event>, ends: Option<Vec<usize>>) -> Trace {
        Trace {
            steps: ends.map(|ends| StepMarks {
                marker: "hand".into(),
                ends,
                before_window: 0,
            }),
            ..crate::live::tests::trace(events)
        }
    }

    /// Two steps: step 0 allocates 100 (site 1) and 50 (site 3, freed); step 1 allocates 300
    /// at site 2 (a leak) and 40 at site 3, and frees site 1's 100.
    fn two_steps() -> Trace {
        use Op::*;
        trace(
            vec![
                ev(Alloc, 1, 100, 1),
                ev(Alloc, 2, 50, 3),
                ev(Free, 2, 50, 3),
                ev(Alloc, 3, 300, 2),
                ev(Alloc, 4, 40, 3),
                ev(Free, 1, 100, 1),
            ],
            Some(vec![3, 6]),
        )
    }

    #[test]
    fn moments_parse_and_name_themselves() {
        for m in [Moment::Peak, Moment::Start, Moment::End, Moment::Event(12)] {
            assert_eq!(Moment::parse(&m.name()), Ok(m));
        }
        assert_eq!(Moment::parse("event:1_000"), Ok(Moment::Event(1000)));
        for bad in ["top", "event:", "event:-1", "event:x", ""] {
            let e = Moment::parse(bad).unwrap_err();
            assert!(e.contains(MOMENT_FORMS), "{e}");
        }
    }

    #[test]
    fn steps_and_their_moments() {
        let t = two_steps();
        let s0 = Span::step(&t, 0).unwrap();
        let s1 = Span::step(&t, 1).unwrap();
        assert_eq!((s0.from, s0.to, s1.from, s1.to), (0, 3, 3, 6));
        assert_eq!(resolve(&t, s0, Moment::Peak), Ok(2));
        assert_eq!(resolve(&t, s1, Moment::Peak), Ok(5));
        assert_eq!(resolve(&t, s1, Moment::Start), Ok(3));
        assert_eq!(resolve(&t, s1, Moment::End), Ok(6));
        assert_eq!(resolve(&t, s1, Moment::Event(2)), Ok(5));
        let e = resolve(&t, s1, Moment::Event(4)).unwrap_err();
        assert!(e.contains("beyond step 1") && e.contains("event:3"), "{e}");
        let e = Span::step(&t, 2).unwrap_err();
        assert!(
            e.contains("step 2 is out of range") && e.contains("(0 to 1)"),
            "{e}"
        );
        let whole = Span::whole(&t);
        assert_eq!(resolve(&t, whole, Moment::Peak), Ok(5));
        assert_eq!(resolve(&t, whole, Moment::Event(6)), Ok(6));
        assert!(resolve(&t, whole, Moment::Event(7)).is_err());
    }

    #[test]
    fn a_trace_without_steps_says_why() {
        let mut t = two_steps();
        t.steps = None;
        for (source, says) in [
            (Source::Arena(1), "trace format (version 1) records no step"),
            (Source::TorchSnapshot, "external_annotations"),
            (Source::RmmCsv, "RMM log"),
            (Source::Synthetic, "synth:KIND"),
        ] {
            t.source = source;
            let e = Span::step(&t, 0).unwrap_err();
            assert!(e.contains("marks no steps") && e.contains(says), "{e}");
        }
        t.steps = Some(StepMarks {
            marker: "m".into(),
            ends: vec![],
            before_window: 2,
        });
        let e = Span::step(&t, 0).unwrap_err();
        assert!(
            e.contains("no step ends within") && e.contains("2 more"),
            "{e}"
        );
    }

    #[test]
    fn what_grew_and_shrank_between_two_steps() {
        let t = two_steps();
        let a = side(&t, 3, By::Site).unwrap();
        let b = side(&t, 6, By::Site).unwrap();
        assert_eq!((a.bytes, b.bytes), (100, 340));
        let d = diff(&a, &b);
        let grew: Vec<(&str, i64, i64)> = d
            .grew
            .iter()
            .map(|r| (r.key.as_str(), r.delta_bytes, r.delta_count))
            .collect();
        assert_eq!(
            grew,
            vec![
                ("train.py:20 in step", 300, 1),
                ("cache.py:5 in get", 40, 1)
            ]
        );
        assert_eq!(d.shrank.len(), 1);
        assert_eq!(
            (d.shrank[0].key.as_str(), d.shrank[0].delta_bytes),
            ("train.py:10 in forward", -100)
        );
        assert_eq!(d.unchanged, 0);
        // By file: train.py's two sites become one row (+300 - 100).
        let a = side(&t, 3, By::File).unwrap();
        let b = side(&t, 6, By::File).unwrap();
        let d = diff(&a, &b);
        let grew: Vec<(&str, i64)> = d
            .grew
            .iter()
            .map(|r| (r.key.as_str(), r.delta_bytes))
            .collect();
        assert_eq!(grew, vec![("train.py", 200), ("cache.py", 40)]);
        assert!(d.shrank.is_empty());
        // The same side against itself: nothing changed.
        let d = diff(&a, &a);
        assert!(d.grew.is_empty() && d.shrank.is_empty());
        assert_eq!(d.unchanged, 1);
    }

    #[test]
    fn equal_bytes_in_more_allocations_grew() {
        let a = Side {
            applied: 0,
            bytes: 100,
            count: 1,
            groups: vec![Group {
                key: "k".into(),
                bytes: 100,
                count: 1,
            }],
        };
        let mut b = a.clone();
        b.groups[0].count = 2;
        let d = diff(&a, &b);
        assert_eq!((d.grew.len(), d.grew[0].delta_count), (1, 1));
        let d = diff(&b, &a);
        assert_eq!(d.shrank.len(), 1);
    }

    #[test]
    fn category_and_module_are_not_in_any_trace() {
        let t = two_steps();
        for by in [By::Category, By::Module] {
            let e = side(&t, 0, by).unwrap_err();
            assert!(e.contains(", not ") && e.contains("explain()"), "{e}");
        }
        assert!(unavailable(By::Site, &t).is_none());
    }

    #[test]
    fn files_of_sites() {
        assert_eq!(site_file("train.py:40 in step"), "train.py");
        assert_eq!(site_file("/a b/c.py:7 in <lambda>"), "/a b/c.py");
        assert_eq!(site_file("c.py in f"), "c.py");
        assert_eq!(
            site_file("aten/src/ATen/x.cpp:10 in at::native::empty"),
            "aten/src/ATen/x.cpp"
        );
        assert_eq!(site_file("unknown"), "unknown");
        assert_eq!(site_file("ln_1 (activation)"), "ln_1 (activation)");
    }

    #[test]
    fn peaks_of_spans() {
        let t = two_steps();
        assert_eq!(span_peak(&t, Span::whole(&t)), 440);
        assert_eq!(span_peak(&t, Span::whole(&t)), t.peak_requested());
        assert_eq!(span_peak(&t, Span::step(&t, 0).unwrap()), 150);
        assert_eq!(span_peak(&t, Span::step(&t, 1).unwrap()), 440);
        let at_end = Span {
            from: 6,
            to: 6,
            step: None,
        };
        assert_eq!(span_peak(&t, at_end), 340);
        let second = Span {
            from: 3,
            to: 4,
            step: None,
        };
        assert_eq!(span_peak(&t, second), 400);
    }

    #[test]
    fn the_series_keeps_each_stretchs_extremes() {
        let t = two_steps();
        let all = series(&t, Span::whole(&t), 100);
        assert_eq!(
            all,
            vec![
                (0, 0),
                (1, 100),
                (2, 150),
                (3, 100),
                (4, 400),
                (5, 440),
                (6, 340)
            ]
        );
        let s1 = series(&t, Span::step(&t, 1).unwrap(), 100);
        assert_eq!(s1.first(), Some(&(3, 100)));
        assert_eq!(s1.last(), Some(&(6, 340)));
        // Four points at most (two stretches): the peak (440) survives.
        let few = series(&t, Span::whole(&t), 4);
        assert!(few.contains(&(5, 440)), "{few:?}");
        assert!(few.len() <= 5, "{few:?}");
        assert_eq!(few.last(), Some(&(6, 340)));
    }
}
