//! What is live in a recorded trace at one moment, by allocation site: the offline form of
//! `torch_arena.live_report()` (memray's table, pytorch_memlab's MemReporter), for a trace at
//! its peak (of the whole trace or of a span, such as a step) or just before an event (the one
//! that ran out of memory).
//!
//! One pass over the events up to the moment, keeping only the live set (memory proportional to
//! what is live, not to the trace). Frees of allocations the trace never made are ignored.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::model::{Op, Trace};

/// The moment to take the live set at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// Right after the first event at which requested bytes were highest.
    Peak,
    /// Just before event `i` runs (the live set an out-of-memory request met); `i` may be
    /// `events.len()` (the end of the trace).
    Before(usize),
    /// The peak within a span: after the first of events `from..to` at which requested bytes
    /// were highest over the span, or before event `from` when none rose above where it began.
    PeakIn(usize, usize),
}

/// One site's share of the live set (as JSON: these fields, in this order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteLive {
    /// Index into [`Trace::sites`] (0 = unknown).
    pub site: u32,
    /// The site's text (`train.py:40 in step`), "unknown" for site 0.
    pub name: String,
    /// Requested bytes live.
    pub bytes: u64,
    pub count: u64,
}

/// The live set of a trace at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveSet {
    /// Events applied: the live set is the one after `events[..events_applied]`.
    pub events_applied: usize,
    pub bytes: u64,
    pub count: u64,
    /// Every site with something live, most bytes first (ties: lower site index first).
    pub sites: Vec<SiteLive>,
}

/// The live set of `trace` at `at`, by site. Err when `At::Before(i)` is beyond the trace.
pub fn live_at(trace: &Trace, at: At) -> Result<LiveSet, String> {
    let n = trace.events.len();
    let upto = match at {
        At::Before(i) if i > n => {
            return Err(format!(
                "event {i} is beyond the trace's {n} events (0 to {n} are allowed)"
            ));
        }
        At::Before(i) => i,
        At::Peak => peak_end(trace, 0, n),
        At::PeakIn(from, to) if from > to || to > n => {
            return Err(format!(
                "events {from} to {to} are not a span of the trace's {n} events"
            ));
        }
        At::PeakIn(from, to) => peak_end(trace, from, to),
    };
    let mut live: HashMap<u64, (u64, u32)> = HashMap::new();
    for e in &trace.events[..upto] {
        match e.op {
            Op::Alloc => {
                live.insert(e.id, (e.size, e.site));
            }
            Op::Free => {
                live.remove(&e.id);
            }
        }
    }
    let mut by_site: HashMap<u32, (u64, u64)> = HashMap::new();
    for &(size, site) in live.values() {
        let s = by_site.entry(site).or_default();
        s.0 = s.0.saturating_add(size);
        s.1 += 1;
    }
    let mut sites: Vec<SiteLive> = by_site
        .into_iter()
        .map(|(site, (bytes, count))| SiteLive {
            site,
            name: site_name(trace, site),
            bytes,
            count,
        })
        .collect();
    sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
    Ok(LiveSet {
        events_applied: upto,
        bytes: sites.iter().map(|s| s.bytes).fold(0, u64::saturating_add),
        count: sites.iter().map(|s| s.count).sum(),
        sites,
    })
}

/// Events to apply to stand at the peak of events `from..to`: through the first of them that
/// reached it (`from` when none rose above the bytes live before `from`). Requested bytes are
/// the running sum [`Trace::peak_requested`] keeps.
pub(crate) fn peak_end(trace: &Trace, from: usize, to: usize) -> usize {
    let (mut live, mut peak, mut end) = (0u64, 0u64, from);
    for (i, e) in trace.events[..to].iter().enumerate() {
        match e.op {
            Op::Alloc => {
                live = live.saturating_add(e.size);
                if i >= from && live > peak {
                    peak = live;
                    end = i + 1;
                }
            }
            Op::Free => live = live.saturating_sub(e.size),
        }
        if i + 1 == from {
            peak = live;
        }
    }
    end
}

fn site_name(trace: &Trace, site: u32) -> String {
    match trace.sites.get(site as usize) {
        Some(s) if site != 0 && !s.is_empty() => s.clone(),
        _ => "unknown".to_string(),
    }
}

/// A table for people: the `top` sites by live bytes (as `1.50 GiB`, the crate's one byte
/// formatter), with their share and count.
pub fn render(set: &LiveSet, top: usize) -> String {
    let bytes = torch_arena::stats::summary::human_bytes;
    let n = |count: u64, one: &str, many: &str| {
        format!("{count} {}", if count == 1 { one } else { many })
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "live after {}: {} in {} at {}",
        n(set.events_applied as u64, "event", "events"),
        bytes(set.bytes),
        n(set.count, "allocation", "allocations"),
        n(set.sites.len() as u64, "site", "sites")
    );
    let _ = writeln!(out, "{:>11} {:>6} {:>8}  site", "bytes", "share", "count");
    for s in set.sites.iter().take(top) {
        let share = if set.bytes == 0 {
            0.0
        } else {
            100.0 * s.bytes as f64 / set.bytes as f64
        };
        let _ = writeln!(
            out,
            "{:>11} {:>5.1}% {:>8}  {}",
            bytes(s.bytes),
            share,
            s.count,
            s.name
        );
    }
    if set.sites.len() > top {
        let hidden = (set.sites.len() - top) as u64;
        let what = if hidden == 1 { "site" } else { "sites" };
        let _ = writeln!(out, "... and {hidden} more {what}");
    }
    out
}

/// A live set as JSON (serde): `{"events_applied": N, "bytes": B, "count": C, "sites":
/// [{"site", "name", "bytes", "count"}, ...], "sites_not_shown": H}`, the `top` sites only.
#[derive(Clone, Debug, Serialize)]
pub struct LiveJson<'a> {
    pub events_applied: usize,
    pub bytes: u64,
    pub count: u64,
    pub sites: &'a [SiteLive],
    pub sites_not_shown: u64,
}

/// `set` as JSON, its `top` sites only.
pub fn json(set: &LiveSet, top: usize) -> LiveJson<'_> {
    LiveJson {
        events_applied: set.events_applied,
        bytes: set.bytes,
        count: set.count,
        sites: &set.sites[..top.min(set.sites.len())],
        sites_not_shown: set.sites.len().saturating_sub(top) as u64,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{Event, Kind, Source};

    /// An event of the hand-built traces (stream 0, no clock); also diff.rs's tests'.
    pub(crate) fn ev(op: Op, id: u64, size: u64, site: u32) -> Event {
        Event {
            op,
            id,
            size,
            stream: 0,
            time_us: 0,
            site,
        }
    }

    /// A synthetic trace of `events` with three sites (1 and 2 in train.py, 3 in cache.py).
    pub(crate) fn trace(events: Vec<Event>) -> Trace {
        Trace {
            name: "t".into(),
            source: Source::Synthetic,
            kind: Kind::Fresh,
            device: 0,
            seeded: 0,
            events,
            sites: vec![
                String::new(),
                "train.py:10 in forward".into(),
                "train.py:20 in step".into(),
                "cache.py:5 in get".into(),
            ],
            native: None,
            steps: None,
        }
    }

    /// Site 1: 3 x 100; site 2: 1 x 500 then freed after the peak; site 3: 2 x 50.
    fn known() -> Trace {
        use Op::*;
        trace(vec![
            ev(Alloc, 1, 100, 1),
            ev(Alloc, 2, 100, 1),
            ev(Alloc, 3, 50, 3),
            ev(Alloc, 4, 500, 2),
            ev(Alloc, 5, 100, 1),
            ev(Alloc, 6, 50, 3),
            ev(Free, 4, 500, 2), // after the peak (900)
            ev(Alloc, 7, 10, 0),
        ])
    }

    #[test]
    fn at_the_peak_sites_are_listed_by_live_bytes() {
        let set = live_at(&known(), At::Peak).unwrap();
        assert_eq!(set.events_applied, 6);
        assert_eq!((set.bytes, set.count), (900, 6));
        let got: Vec<(u32, u64, u64)> = set
            .sites
            .iter()
            .map(|s| (s.site, s.bytes, s.count))
            .collect();
        assert_eq!(got, vec![(2, 500, 1), (1, 300, 3), (3, 100, 2)]);
        assert_eq!(set.sites[0].name, "train.py:20 in step");
    }

    #[test]
    fn before_an_event_and_at_the_end() {
        let t = known();
        let set = live_at(&t, At::Before(4)).unwrap();
        let got: Vec<(u32, u64)> = set.sites.iter().map(|s| (s.site, s.bytes)).collect();
        assert_eq!(got, vec![(2, 500), (1, 200), (3, 50)]);
        let end = live_at(&t, At::Before(t.events.len())).unwrap();
        let got: Vec<(u32, u64)> = end.sites.iter().map(|s| (s.site, s.bytes)).collect();
        assert_eq!(got, vec![(1, 300), (3, 100), (0, 10)]);
        assert_eq!(end.sites[2].name, "unknown");
        assert!(live_at(&t, At::Before(t.events.len() + 1)).is_err());
        assert_eq!(live_at(&t, At::Before(0)).unwrap().count, 0);
    }

    #[test]
    fn the_peak_within_a_span() {
        let t = known();
        // Events 6.. : the free of 500 B, then 10 B: the peak is where the span began.
        assert_eq!(live_at(&t, At::PeakIn(6, 8)).unwrap().events_applied, 6);
        // Events 3..5: 500 B then 100 B, each a new high.
        let set = live_at(&t, At::PeakIn(3, 5)).unwrap();
        assert_eq!((set.events_applied, set.bytes), (5, 850));
        assert_eq!(live_at(&t, At::PeakIn(0, 8)).unwrap().events_applied, 6);
        assert_eq!(live_at(&t, At::PeakIn(2, 2)).unwrap().events_applied, 2);
        assert!(live_at(&t, At::PeakIn(5, 4)).is_err());
        assert!(live_at(&t, At::PeakIn(0, 9)).is_err());
    }

    #[test]
    fn frees_of_unknown_allocations_are_ignored() {
        let t = trace(vec![ev(Op::Free, 9, 100, 1), ev(Op::Alloc, 1, 64, 1)]);
        let set = live_at(&t, At::Peak).unwrap();
        assert_eq!((set.bytes, set.count), (64, 1));
    }

    #[test]
    fn text_and_json_show_the_top_sites() {
        let set = live_at(&known(), At::Peak).unwrap();
        let text = render(&set, 2);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0] == "live after 6 events: 900 B in 6 allocations at 3 sites",
            "{text}"
        );
        assert!(
            lines[2].ends_with("train.py:20 in step") && lines[2].contains("55.6%"),
            "{text}"
        );
        assert!(lines[3].ends_with("train.py:10 in forward"), "{text}");
        assert_eq!(lines[4], "... and 1 more site");
        // Bytes for people: 1.50 GiB, not 1610612736.
        let mut big = set.clone();
        big.bytes = 3 << 29;
        big.sites[0].bytes = 3 << 29;
        let text = render(&big, 1);
        assert!(text.contains(": 1.50 GiB in 6 allocations"), "{text}");
        assert!(
            text.lines().nth(2).unwrap().starts_with("   1.50 GiB"),
            "{text}"
        );
        let j = serde_json::to_string(&json(&set, 2)).unwrap();
        assert!(
            j.starts_with(
                r#"{"events_applied":6,"bytes":900,"count":6,"sites":[{"site":2,"name":"train.py:20 in step","bytes":500,"count":1}"#
            ),
            "{j}"
        );
        assert!(j.ends_with(r#"],"sites_not_shown":1}"#), "{j}");
        assert_eq!(json(&set, 9).sites_not_shown, 0);
    }
}
