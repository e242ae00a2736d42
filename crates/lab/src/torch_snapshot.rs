//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot()` pickles) as [`Trace`]s.
//!
//! Format: `reference/pytorch-pluggable-allocator.md` §7. One device is used: the one with the
//! most trace entries (state-only snapshots: the one with the most segments).
//!
//! - `alloc` → [`Op::Alloc`] of the entry's `size` (the original request, not rounded);
//!   `free_completed` → [`Op::Free`] (the moment the block is reusable). `free_requested`,
//!   `snapshot`, `oom`, `annotate` and unknown actions are skipped.
//! - `segment_alloc` / `segment_map` add to, `segment_free` / `segment_unmap` take from the native
//!   reserved bytes ([`NativeReserved`]).
//! - Every allocation gets a fresh id (the source reuses addresses).
//! - Seeding: what was live when recording began is allocated first, as the `seeded` events:
//!   blocks freed in the window that the window never allocated (sized by the free's `size`),
//!   then blocks `active_allocated` / `active_pending_free` in the dump's `segments` that are not
//!   live allocations of the window (sized by `requested_size`, their site from the block's own
//!   `frames` where it has them).
//! - Steps ([`StepMarks`]): the ends of the `ProfilerStep#N` ranges in `external_annotations`,
//!   else of the `Optimizer.step#...` ranges (PyTorch records `record_function` ranges there while
//!   memory history is on), placed among the events by their timestamps.
//! - Kind: [`Kind::StateOnly`] without `alloc` events (the events are then the allocation of
//!   the dump's live set: `active_allocated` and `active_pending_free` blocks), [`Kind::Warm`] with events but no segment events, [`Kind::Partial`]
//!   with segment events and either a seeded live set or reserved bytes at start, otherwise
//!   [`Kind::Fresh`].
//! - Native reserved at start = final `sum(segment.total_size)` on the device − the net segment
//!   change of the window; warm traces hold the final reserved bytes throughout; state-only
//!   snapshots the reserved bytes at dump. `changes` indices count the seeded events; segment
//!   events before the same replayed event make one change (their last value; the peak still
//!   sees every step), and those after the last replayed event are at `events.len()`.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::pickle::{Seq, Value};
use crate::model::{Event, Kind, NativeReserved, Op, Source, StepMarks, Trace, Window};
use torch_arena::error::{Error, Result};

/// Read a snapshot pickle's bytes (already decompressed) into a trace of one device.
pub fn from_bytes(name: &str, data: &[u8]) -> Result<Trace> {
    let p = super::pickle::loads(name, data)?;
    from_value(name, &p.root())
}

/// Items a snapshot walk may visit (trace entries, segments, blocks) per byte of its pickle.
/// A real snapshot spends tens of bytes on each; only shared lists (a list referred to again by
/// `GET`) can make a walk visit more items than the file has bytes, and that is refused as a
/// bomb rather than walked: a few KB could otherwise stand for billions of entries.
pub const MAX_VISITS_PER_BYTE: usize = 1;

/// What is left of the walk's budget.
struct Visits<'n> {
    name: &'n str,
    left: usize,
    total: usize,
}

impl Visits<'_> {
    fn charge(&mut self, n: usize, path: &dyn Fn() -> String) -> Result<()> {
        if n > self.left {
            return Err(bad(
                self.name,
                &path(),
                format!(
                    "the snapshot refers to more items than its {} bytes can hold (budget: \
                     {MAX_VISITS_PER_BYTE} per byte; a list shared by reference many times?): \
                     refusing it as a bomb",
                    self.total / MAX_VISITS_PER_BYTE
                ),
            ));
        }
        self.left -= n;
        Ok(())
    }
}

/// Convert an unpickled snapshot into a trace of one device. `name` names the file in errors,
/// which also give the key path of a malformed part (`device_traces[0][17]: 'size' missing`).
pub fn from_value(name: &str, v: &Value) -> Result<Trace> {
    let budget = v
        .pickle()
        .input_len()
        .max(4096)
        .saturating_mul(MAX_VISITS_PER_BYTE);
    let mut visits = Visits {
        name,
        left: budget,
        total: budget,
    };
    let mut trace = trace_of(name, v, &mut visits)?;
    if let (Some(n), Some(settings)) = (trace.native.as_mut(), v.get("allocator_settings")) {
        n.expandable_segments = settings
            .get("expandable_segments")
            .and_then(Value::as_int)
            .is_some_and(|b| b != 0);
        // -1 (or anything not positive) is "unlimited".
        n.max_split_size = settings
            .get("max_split_size")
            .and_then(Value::as_int)
            .filter(|&m| m > 0)
            .map(|m| m as u64);
        n.conf = settings
            .get("PYTORCH_CUDA_ALLOC_CONF")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string);
    }
    Ok(trace)
}

/// The trace of a snapshot, native settings left at their defaults.
fn trace_of(name: &str, v: &Value, visits: &mut Visits) -> Result<Trace> {
    let (segments, traces) = match v {
        v if v.is_dict() => (v.get("segments"), v.get("device_traces")),
        // `torch.cuda.memory_snapshot()` pickled directly: just the segment list.
        v if v.is_list() => (Some(*v), None),
        other => {
            return Err(bad(
                name,
                "top level",
                format!(
                    "expected the snapshot dict (keys 'segments', 'device_traces'), found a {}",
                    other.type_name()
                ),
            ));
        }
    };
    let segments: Vec<Value> = match segments.filter(|s| !s.is_none()) {
        None => Vec::new(),
        Some(s) => s.as_seq().map(|s| s.iter().collect()).ok_or_else(|| {
            bad(
                name,
                "segments",
                format!("expected a list, found a {}", s.type_name()),
            )
        })?,
    };
    let traces: Vec<Value> = match traces.filter(|t| !t.is_none()) {
        None => Vec::new(),
        Some(t) => t.as_seq().map(|s| s.iter().collect()).ok_or_else(|| {
            bad(
                name,
                "device_traces",
                format!("expected a list, found a {}", t.type_name()),
            )
        })?,
    };
    visits.charge(segments.len() + traces.len(), &|| "top level".to_string())?;
    let mut dev_traces: Vec<Seq> = Vec::with_capacity(traces.len());
    for (d, t) in traces.iter().enumerate() {
        dev_traces.push(t.as_seq().ok_or_else(|| {
            bad(
                name,
                &format!("device_traces[{d}]"),
                format!(
                    "expected a list of trace entries, found a {}",
                    t.type_name()
                ),
            )
        })?);
    }

    // Parse the segments once: (device, total_size, live blocks with their sites).
    let mut sites = Sites::new();
    let mut segs = Vec::with_capacity(segments.len());
    for (i, s) in segments.iter().enumerate() {
        segs.push(parse_segment(name, i, s, visits, &mut sites)?);
    }

    // Which device: most trace entries; without any usable event, most segments. A window
    // without a single `alloc` (e.g. one `free_completed` left in the ring) says nothing the
    // dump's live set does not: such a snapshot is state-only.
    let mut has_events = false;
    for (d, t) in dev_traces.iter().enumerate() {
        for (i, e) in t.iter().enumerate() {
            visits.charge(1, &|| format!("device_traces[{d}][{i}]"))?;
            if e.get("action").and_then(Value::as_str) == Some("alloc") {
                has_events = true;
                break;
            }
        }
        if has_events {
            break;
        }
    }
    let device = if has_events {
        let mut best = 0usize;
        for (d, t) in dev_traces.iter().enumerate() {
            if t.len() > dev_traces[best].len() {
                best = d;
            }
        }
        best as i64
    } else {
        let mut count: HashMap<i64, usize> = HashMap::new();
        for s in &segs {
            *count.entry(s.device).or_default() += 1;
        }
        let mut c: Vec<_> = count.into_iter().collect();
        c.sort_by_key(|&(d, n)| (std::cmp::Reverse(n), d));
        c.first().map(|&(d, _)| d).unwrap_or(0)
    };
    let dev_segs: Vec<&Segment> = segs.iter().filter(|s| s.device == device).collect();
    let final_reserved: u64 = dev_segs
        .iter()
        .fold(0u64, |a, s| a.saturating_add(s.total_size));

    if !has_events {
        return Ok(state_only(
            name,
            device,
            &dev_segs,
            final_reserved,
            sites.list,
        ));
    }

    let entries = dev_traces[device as usize];
    let path = |i: usize| format!("device_traces[{device}][{i}]");
    let t0 = entries
        .first()
        .and_then(|e| e.get("time_us"))
        .and_then(Value::as_f64)
        .unwrap_or(0.0);

    // Window events, with ids; seeds found on the way.
    visits.charge(entries.len(), &|| format!("device_traces[{device}]"))?;
    let mut window = Window::with_capacity(entries.len());
    // (window event index, delta) of segment events, in order.
    let mut seg_deltas: Vec<(usize, i128)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let e = &e;
        if !e.is_dict() {
            return Err(bad(
                name,
                &path(i),
                format!("expected a trace entry dict, found a {}", e.type_name()),
            ));
        }
        let action = field(name, e, "action", &|| path(i))?
            .as_str()
            .ok_or_else(|| bad(name, &path(i), "'action' is not a string".into()))?;
        match action {
            "alloc" | "free_completed" => {
                let addr = uint(name, e, "addr", &|| path(i))?;
                let size = uint(name, e, "size", &|| path(i))?;
                let stream = opt_bits(name, e, "stream", &|| path(i))?.unwrap_or(0);
                let time_us = match e.get("time_us").and_then(Value::as_f64) {
                    Some(t) => (t - t0) as i64,
                    None => 0,
                };
                if action == "alloc" {
                    // An alloc at a live address means its free was lost: the older block stays
                    // live for the rest of the trace (as the index's running sum counts it).
                    window.alloc(addr, size, stream, time_us, sites.top_frame(e));
                } else {
                    window.free(addr, size, stream, time_us);
                }
            }
            "segment_alloc" | "segment_map" => {
                let size = uint(name, e, "size", &|| path(i))?;
                seg_deltas.push((window.events.len(), size as i128));
            }
            "segment_free" | "segment_unmap" => {
                let size = uint(name, e, "size", &|| path(i))?;
                seg_deltas.push((window.events.len(), -(size as i128)));
            }
            _ => {}
        }
    }

    // Blocks live at dump that the window did not allocate (or saw freed): seed them.
    for s in &dev_segs {
        for b in &s.live_blocks {
            if !window.live.contains_key(&b.addr) {
                window.seed_at(b.requested, s.stream, b.site);
            }
        }
    }
    let steps = step_marks(v, device, t0, &window, visits)?;
    let (events, seeded) = window.finish();

    let net: i128 = seg_deltas.iter().map(|&(_, d)| d).sum();
    let (kind, native) = if seg_deltas.is_empty() {
        (
            Kind::Warm,
            NativeReserved {
                initial: final_reserved,
                changes: Vec::new(),
                peak: final_reserved,
                ..Default::default()
            },
        )
    } else {
        let initial = (final_reserved as i128 - net).max(0);
        let mut cur = initial;
        let mut peak = initial;
        let mut changes: Vec<(usize, u64)> = Vec::new();
        for &(at, d) in &seg_deltas {
            cur = (cur + d).max(0);
            peak = peak.max(cur);
            let at = at + seeded;
            match changes.last_mut() {
                Some(last) if last.0 == at => last.1 = cur as u64,
                _ => changes.push((at, cur as u64)),
            }
        }
        let kind = if seeded > 0 || initial > 0 {
            Kind::Partial
        } else {
            Kind::Fresh
        };
        (
            kind,
            NativeReserved {
                initial: initial as u64,
                changes,
                peak: peak as u64,
                ..Default::default()
            },
        )
    };

    Ok(Trace {
        name: name.to_string(),
        source: Source::TorchSnapshot,
        kind,
        device: device as i32,
        seeded,
        events,
        sites: sites.list,
        native: Some(native),
        steps,
    })
}

/// The step ends a snapshot marks: the `END` of each `ProfilerStep#N` range in its
/// `external_annotations` (what `torch.profiler.profile.step()` records), else of each
/// `Optimizer.step#...` range (every `optimizer.step()`, as torch-arena ends its steps), on
/// `device` (or naming none). PyTorch stamps annotations with the trace entries' clock; each end
/// falls before the first window event stamped after it (so after the seeds). `None` when the
/// snapshot holds no such annotation or its entries no time. Malformed annotations are skipped:
/// they only label the events.
fn step_marks(
    v: &Value,
    device: i64,
    t0: f64,
    window: &Window,
    visits: &mut Visits,
) -> Result<Option<StepMarks>> {
    let Some(list) = v.get("external_annotations").and_then(|a| a.as_seq()) else {
        return Ok(None);
    };
    visits.charge(list.len(), &|| "external_annotations".to_string())?;
    // Without a clock (entries with no `time_us`) the annotations cannot be placed.
    if t0 == 0.0 || window.events.is_empty() {
        return Ok(None);
    }
    let ends_of = |prefix: &str| -> Vec<f64> {
        let mut t: Vec<f64> = list
            .iter()
            .filter(|a| a.get("stage").and_then(Value::as_str) == Some("END"))
            .filter(|a| {
                a.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .filter(|a| {
                a.get("device")
                    .and_then(Value::as_int)
                    .is_none_or(|d| d == device)
            })
            .filter_map(|a| a.get("time_us").and_then(Value::as_f64))
            .filter(|t| t.is_finite())
            .map(|t| t - t0)
            .collect();
        t.sort_by(f64::total_cmp);
        t
    };
    let (times, marker) = match ends_of("ProfilerStep#") {
        t if !t.is_empty() => (t, "the end of each ProfilerStep annotation"),
        _ => (
            ends_of("Optimizer.step#"),
            "the end of each Optimizer.step annotation",
        ),
    };
    if times.is_empty() {
        return Ok(None);
    }
    let seeded = window.seeds.len();
    let mut marks = StepMarks {
        marker: format!("{marker} (PyTorch's external_annotations)"),
        ..Default::default()
    };
    for t in times {
        if t < 0.0 {
            marks.before_window += 1;
            continue;
        }
        let within = window.events.partition_point(|e| (e.time_us as f64) <= t);
        marks.ends.push(seeded + within);
    }
    Ok(Some(marks))
}

/// A snapshot without events: replayed as the allocation of the live set at dump.
fn state_only(
    name: &str,
    device: i64,
    segs: &[&Segment],
    reserved: u64,
    sites: Vec<String>,
) -> Trace {
    let mut events = Vec::new();
    for s in segs {
        for b in &s.live_blocks {
            events.push(Event {
                op: Op::Alloc,
                id: events.len() as u64,
                size: b.requested,
                stream: s.stream,
                time_us: 0,
                site: b.site,
            });
        }
    }
    Trace {
        name: name.to_string(),
        source: Source::TorchSnapshot,
        kind: Kind::StateOnly,
        device: device as i32,
        seeded: events.len(),
        events,
        sites,
        native: Some(NativeReserved {
            initial: reserved,
            changes: Vec::new(),
            peak: reserved,
            ..Default::default()
        }),
        steps: None,
    }
}

struct Block {
    addr: u64,
    requested: u64,
    /// The site of the block's frames (0: none recorded).
    site: u32,
}

struct Segment {
    device: i64,
    total_size: u64,
    stream: u64,
    /// Blocks `active_allocated` or `active_pending_free`.
    live_blocks: Vec<Block>,
}

fn parse_segment(
    name: &str,
    i: usize,
    s: &Value,
    visits: &mut Visits,
    sites: &mut Sites,
) -> Result<Segment> {
    let path = || format!("segments[{i}]");
    if !s.is_dict() {
        return Err(bad(
            name,
            &path(),
            format!("expected a segment dict, found a {}", s.type_name()),
        ));
    }
    let device = opt_int(name, s, "device", &path)?.unwrap_or(0);
    let total_size = uint(name, s, "total_size", &path)?;
    let stream = opt_bits(name, s, "stream", &path)?.unwrap_or(0);
    // Older dumps give blocks no address: it is the segment's address plus the sizes before.
    let mut next_addr = opt_bits(name, s, "address", &path)?.unwrap_or(0);
    let mut live_blocks = Vec::new();
    if let Some(bl) = s.get("blocks") {
        let bl = bl.as_seq().ok_or_else(|| {
            bad(
                name,
                &format!("segments[{i}].blocks"),
                format!("expected a list, found a {}", bl.type_name()),
            )
        })?;
        visits.charge(bl.len(), &|| format!("segments[{i}].blocks"))?;
        for (j, b) in bl.iter().enumerate() {
            let b = &b;
            let bpath = || format!("segments[{i}].blocks[{j}]");
            if !b.is_dict() {
                return Err(bad(
                    name,
                    &bpath(),
                    format!("expected a block dict, found a {}", b.type_name()),
                ));
            }
            let state = field(name, b, "state", &bpath)?.as_str().unwrap_or("");
            let addr = match b.get("address") {
                Some(_) => uint(name, b, "address", &bpath)?,
                None => next_addr,
            };
            next_addr = addr.wrapping_add(uint(name, b, "size", &bpath)?);
            if state == "active_allocated" || state == "active_pending_free" {
                let requested = match b.get("requested_size") {
                    Some(_) => uint(name, b, "requested_size", &bpath)?,
                    None => uint(name, b, "size", &bpath)?,
                };
                live_blocks.push(Block {
                    addr,
                    requested,
                    site: sites.top_frame(b),
                });
            }
        }
    }
    Ok(Segment {
        device,
        total_size,
        stream,
        live_blocks,
    })
}

fn bad(name: &str, path: &str, what: String) -> Error {
    Error::Trace(format!(
        "{name}: malformed PyTorch snapshot: {path}: {what}"
    ))
}

fn field<'v>(name: &str, d: &Value<'v>, key: &str, path: &dyn Fn() -> String) -> Result<Value<'v>> {
    d.get(key)
        .ok_or_else(|| bad(name, &path(), format!("'{key}' missing")))
}

fn uint(name: &str, d: &Value, key: &str, path: &dyn Fn() -> String) -> Result<u64> {
    let v = field(name, d, key, path)?;
    if let Some(u) = v.as_u64() {
        return Ok(u);
    }
    match v.as_int() {
        Some(i) => Err(bad(
            name,
            &path(),
            format!("'{key}' is {i}; expected a non-negative integer"),
        )),
        None => Err(bad(
            name,
            &path(),
            format!("'{key}' is a {}; expected an integer", v.type_name()),
        )),
    }
}

/// An optional integer field read as 64 bits (a stream or address: `-1` is `u64::MAX`).
fn opt_bits(name: &str, d: &Value, key: &str, path: &dyn Fn() -> String) -> Result<Option<u64>> {
    match d.get(key).filter(|v| !v.is_none()) {
        None => Ok(None),
        Some(v) => v.as_u64_bits().map(Some).ok_or_else(|| {
            bad(
                name,
                &path(),
                format!("'{key}' is a {}; expected a 64-bit integer", v.type_name()),
            )
        }),
    }
}

fn opt_int(name: &str, d: &Value, key: &str, path: &dyn Fn() -> String) -> Result<Option<i64>> {
    match d.get(key).filter(|v| !v.is_none()) {
        None => Ok(None),
        Some(v) => v.as_int().map(Some).ok_or_else(|| {
            bad(
                name,
                &path(),
                format!("'{key}' is a {}; expected an integer", v.type_name()),
            )
        }),
    }
}

/// Interned allocation sites.
struct Sites {
    list: Vec<String>,
    index: HashMap<String, u32>,
    text: String,
}

impl Sites {
    fn new() -> Self {
        Sites {
            list: vec!["unknown".to_string()],
            index: HashMap::new(),
            text: String::new(),
        }
    }

    /// The site of a trace entry ("file:line in name" of the frame [`super::frames`] picks:
    /// the user's Python frame, not the unwinder or the allocator), 0 if it has none.
    fn top_frame(&mut self, e: &Value) -> u32 {
        let Some(seq) = e.get("frames").and_then(Value::as_seq) else {
            return 0;
        };
        fn text<'a>(f: Value<'a>, key: &str) -> &'a str {
            f.get(key).and_then(Value::as_str).unwrap_or("")
        }
        let frames: Vec<super::frames::Frame> = seq
            .iter()
            .map(|f| (text(f, "filename"), text(f, "name")))
            .collect();
        let Some(f) = super::frames::site_index(&frames).and_then(|i| seq.get(i)) else {
            return 0;
        };
        use std::fmt::Write;
        self.text.clear();
        let file = f.get("filename").and_then(Value::as_str).unwrap_or("?");
        let func = f.get("name").and_then(Value::as_str).unwrap_or("?");
        match f.get("line").and_then(Value::as_int) {
            Some(l) => {
                let _ = write!(self.text, "{file}:{l} in {func}");
            }
            None => {
                let _ = write!(self.text, "{file} in {func}");
            }
        }
        if let Some(&i) = self.index.get(self.text.as_str()) {
            return i;
        }
        let i = self.list.len() as u32;
        match self.index.entry(self.text.clone()) {
            Entry::Vacant(v) => {
                v.insert(i);
                self.list.push(self.text.clone());
                i
            }
            Entry::Occupied(o) => *o.get(),
        }
    }
}
