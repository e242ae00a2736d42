//! The CLI's JSON lines, through the library's one writer (`torch_arena::json`: escaping, one
//! NaN policy, the object builder).

use torch_arena::arena::{Growth, GrowthCounts};
use torch_arena::device::DriverCounters;

use torch_arena_lab::replay::{OomReport, StepStats};

/// A JSON object built field by field, in order (the library's builder).
pub(crate) type JsonObject = torch_arena::json::Object;

/// Driver calls by kind as a JSON object: CUDA driver API name → count.
pub(crate) fn calls_json(c: &DriverCounters) -> String {
    let mut j = JsonObject::new();
    for (name, n) in c.entries() {
        j.num(name, n);
    }
    j.finish()
}

/// What the calls covered, beside their counts: the handles the grants covered and the bytes
/// created, released, allocated and freed (what the cost model's per-handle and per-GiB terms
/// price; see `src/device/costs.rs`).
pub(crate) fn covered_json(c: &DriverCounters) -> String {
    let [handles, created, released, allocated, freed] = c.extras();
    JsonObject::new()
        .num("set_access_handles", handles)
        .num("mem_create_bytes", created)
        .num("mem_release_bytes", released)
        .num("mem_alloc_bytes", allocated)
        .num("mem_free_bytes", freed)
        .finish()
}

/// Steps as a JSON array (see `--json`).
pub(crate) fn steps_json(steps: &[StepStats]) -> String {
    let items: Vec<String> = steps
        .iter()
        .map(|st| {
            JsonObject::new()
                .num("driver_calls", st.calls.total())
                .raw("driver_calls_by_kind", &calls_json(&st.calls))
                .float("modelled_driver_s", st.modelled_driver_s)
                .float("modelled_stall_s", st.modelled_stall_s)
                .num("peak_requested_bytes", st.peak_requested)
                .num("peak_reserved_bytes", st.peak_reserved)
                .raw("growth", &growth_json(st.growth.as_ref()))
                .finish()
        })
        .collect();
    format!("[{}]", items.join(", "))
}

/// Physical memory created, by what its request did to the bytes requested: `{"at_peak":
/// {"handles", "bytes"}, "below_peak": {...}}`, or `null` where not counted.
pub(crate) fn growth_json(g: Option<&GrowthCounts>) -> String {
    let Some(g) = g else {
        return "null".into();
    };
    let one = |x: &Growth| {
        JsonObject::new()
            .num("handles", x.handles)
            .num("bytes", x.bytes)
            .finish()
    };
    JsonObject::new()
        .raw("at_peak", &one(&g.at_peak))
        .raw("below_peak", &one(&g.below_peak))
        .finish()
}

pub(crate) fn oom_json(o: &OomReport) -> String {
    let largest: Vec<String> = o
        .largest_live
        .iter()
        .map(|(bytes, site)| {
            JsonObject::new()
                .num("bytes", *bytes)
                .str("site", site)
                .finish()
        })
        .collect();
    JsonObject::new()
        .num("event", o.event as u64)
        .num("size_bytes", o.size)
        .num("stream", o.stream)
        .num("live_bytes", o.live_bytes)
        .num("live_count", o.live_count)
        .num("reserved_bytes", o.reserved)
        .num("cached_bytes", o.cached)
        .str("message", &o.message)
        .raw("largest_live", &format!("[{}]", largest.join(", ")))
        .finish()
}
