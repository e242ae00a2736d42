//! The CLI's JSON lines: serde types for the parts `replay --json` and `fit --json` share
//! (driver calls, growth, steps, the out-of-memory report), and the one writer, serde_json with
//! the spacing the lines always had (`{"a": 1, "b": [1, 2]}`), one object per line. A NaN or an
//! infinity is written as `null` (serde_json's rule, and the command's before it).

use std::io;

use serde::Serialize;
use serde::ser::{SerializeMap as _, Serializer};
use serde_json::ser::Formatter;

use torch_arena::arena::{Growth, GrowthCounts};
use torch_arena::device::DriverCounters;

use torch_arena_lab::replay::{OomReport, StepStats};

/// serde_json's compact output with a space after each `:` and `,`, as the lines were written
/// before serde (scripts and people read them; `grep '"key": '` keeps working).
struct Spaced;

impl Formatter for Spaced {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// `value` as one JSON line (no newline).
pub(crate) fn to_line<T: Serialize + ?Sized>(value: &T) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Spaced);
    value
        .serialize(&mut ser)
        .expect("the command's JSON types serialize (string keys, no failing Serialize)");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// Driver calls by kind as a JSON object: CUDA driver API name → count, in the counters' order.
pub(crate) struct CallsByKind(pub(crate) DriverCounters);

impl Serialize for CallsByKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let entries = self.0.entries();
        let mut m = s.serialize_map(Some(entries.len()))?;
        for (name, n) in entries {
            m.serialize_entry(name, &n)?;
        }
        m.end()
    }
}

/// What the calls covered, beside their counts: the handles the grants covered and the bytes
/// created, released, allocated and freed (what the cost model's per-handle and per-GiB terms
/// price; see `src/device/costs.rs`).
#[derive(Serialize)]
pub(crate) struct Covered {
    set_access_handles: u64,
    mem_create_bytes: u64,
    mem_release_bytes: u64,
    mem_alloc_bytes: u64,
    mem_free_bytes: u64,
}

impl Covered {
    pub(crate) fn of(c: &DriverCounters) -> Covered {
        let [handles, created, released, allocated, freed] = c.extras();
        Covered {
            set_access_handles: handles,
            mem_create_bytes: created,
            mem_release_bytes: released,
            mem_alloc_bytes: allocated,
            mem_free_bytes: freed,
        }
    }
}

/// One replay step (see `--json`).
#[derive(Serialize)]
pub(crate) struct Step {
    driver_calls: u64,
    driver_calls_by_kind: CallsByKind,
    modelled_driver_s: f64,
    modelled_stall_s: f64,
    peak_requested_bytes: u64,
    peak_reserved_bytes: u64,
    growth: Option<GrowthJson>,
}

/// Every step of a replay.
pub(crate) fn steps(steps: &[StepStats]) -> Vec<Step> {
    steps
        .iter()
        .map(|st| Step {
            driver_calls: st.calls.total(),
            driver_calls_by_kind: CallsByKind(st.calls),
            modelled_driver_s: st.modelled_driver_s,
            modelled_stall_s: st.modelled_stall_s,
            peak_requested_bytes: st.peak_requested,
            peak_reserved_bytes: st.peak_reserved,
            growth: st.growth.as_ref().map(GrowthJson::of),
        })
        .collect()
}

/// Physical memory created, by what its request did to the bytes requested: `{"at_peak":
/// {"handles", "bytes"}, "below_peak": {...}}` (`null` where not counted: an `Option`).
#[derive(Serialize)]
pub(crate) struct GrowthJson {
    at_peak: GrowthPart,
    below_peak: GrowthPart,
}

#[derive(Serialize)]
struct GrowthPart {
    handles: u64,
    bytes: u64,
}

impl GrowthJson {
    pub(crate) fn of(g: &GrowthCounts) -> GrowthJson {
        let part = |x: &Growth| GrowthPart {
            handles: x.handles,
            bytes: x.bytes,
        };
        GrowthJson {
            at_peak: part(&g.at_peak),
            below_peak: part(&g.below_peak),
        }
    }
}

/// The report of an arena out-of-memory.
#[derive(Serialize)]
pub(crate) struct Oom<'a> {
    event: u64,
    size_bytes: u64,
    stream: u64,
    live_bytes: u64,
    live_count: u64,
    reserved_bytes: u64,
    cached_bytes: u64,
    message: &'a str,
    largest_live: Vec<LiveAlloc<'a>>,
}

#[derive(Serialize)]
struct LiveAlloc<'a> {
    bytes: u64,
    site: &'a str,
}

impl<'a> Oom<'a> {
    pub(crate) fn of(o: &'a OomReport) -> Oom<'a> {
        Oom {
            event: o.event as u64,
            size_bytes: o.size,
            stream: o.stream,
            live_bytes: o.live_bytes,
            live_count: o.live_count,
            reserved_bytes: o.reserved,
            cached_bytes: o.cached,
            message: &o.message,
            largest_live: o
                .largest_live
                .iter()
                .map(|(bytes, site)| LiveAlloc {
                    bytes: *bytes,
                    site,
                })
                .collect(),
        }
    }
}

/// The line of a trace that could not be loaded: `{trace, path, error}`.
#[derive(Serialize)]
pub(crate) struct LoadError<'a> {
    pub(crate) trace: &'a str,
    pub(crate) path: &'a str,
    pub(crate) error: &'a str,
}
