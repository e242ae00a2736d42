//! `replay --json`: one JSON object per trace and setting (and the native emulation), the
//! fields BENCHMARKS.md and the shared checks read.

use torch_arena_lab::live;

use crate::args::TraceArg;

use crate::json::{JsonObject, calls_json, covered_json, growth_json, oom_json, steps_json};
use crate::replay_run::{Emulated, ReplaySettings, TraceOutcome};
use crate::text::{fragmentation, source_key};

/// One JSON object per setting of the trace (see the field list in the report of `--json`).
pub(crate) fn json_lines(s: &ReplaySettings, o: &TraceOutcome) -> Vec<String> {
    let i = &o.info;
    o.runs
        .iter()
        .map(|run| {
            let mut j = JsonObject::new();
            if let Some((set, what)) = &o.live {
                j.raw("live", &live::to_json(set, s.live))
                    .str("live_at", what);
            }
            j.str("trace", &i.name)
                .str("path", &i.path)
                .str("source", &source_key(i.source))
                .str("kind", i.kind.as_str())
                .raw("device", &i.device.to_string())
                .num("events", i.events as u64)
                .num("seeded_events", i.seeded as u64)
                .num("capacity_bytes", s.capacity)
                .str("conf", &run.label)
                .str("conf_effective", &run.effective.to_string())
                .bool("backing", run.effective.sim_backing)
                .bool("check", s.check);
            match &run.outcome {
                Ok(r) => {
                    j.num("events_replayed", r.events as u64)
                        .num("peak_requested_bytes", r.peak_requested)
                        .num("peak_reserved_bytes", r.peak_reserved)
                        .opt_num(
                            "native_peak_reserved_bytes",
                            r.native_peak_reserved.or(i.native_recorded),
                        )
                        .float("fragmentation", r.fragmentation)
                        .opt_num("oom_event", r.oom.as_ref().map(|o| o.event as u64))
                        .raw(
                            "oom",
                            &r.oom
                                .as_ref()
                                .map(oom_json)
                                .unwrap_or_else(|| "null".into()),
                        );
                }
                Err(_) => {
                    j.raw("events_replayed", "null")
                        .raw("peak_requested_bytes", "null")
                        .raw("peak_reserved_bytes", "null")
                        .opt_num("native_peak_reserved_bytes", i.native_recorded)
                        .raw("fragmentation", "null")
                        .raw("oom_event", "null")
                        .raw("oom", "null");
                }
            }
            let em = o.emulated.first();
            j.opt_num(
                "native_emulated_peak_reserved_bytes",
                em.map(|e| e.result.peak_reserved),
            )
            .opt_num(
                "native_emulated_oom_event",
                em.and_then(|e| e.result.oom_event.map(|n| n as u64)),
            )
            .opt_float(
                "native_emulated_fragmentation",
                em.map(|e| fragmentation(e.result.peak_reserved, e.peak_requested)),
            )
            .opt_float(
                "native_emulated_elapsed_s",
                em.map(|e| e.elapsed.as_secs_f64()),
            );
            match &run.outcome {
                Ok(r) => {
                    let secs = r.elapsed.as_secs_f64();
                    j.float("elapsed_s", secs)
                        .float("ns_per_event", secs * 1e9 / r.events.max(1) as f64)
                        .float(
                            "events_per_s",
                            if secs > 0.0 {
                                r.events as f64 / secs
                            } else {
                                f64::NAN
                            },
                        )
                        .num("driver_calls", r.driver_calls)
                        .raw("driver_calls_by_kind", &calls_json(&r.calls))
                        .raw("driver_calls_covered", &covered_json(&r.calls))
                        .float("modelled_driver_s", r.modelled_driver_s)
                        .float("modelled_stall_s", r.modelled_stall_s)
                        .raw("growth", &growth_json(r.growth.as_ref()))
                        .raw("steps", &steps_json(&r.steps));
                }
                Err(_) => {
                    j.raw("elapsed_s", "null")
                        .raw("ns_per_event", "null")
                        .raw("events_per_s", "null")
                        .raw("driver_calls", "null")
                        .raw("driver_calls_by_kind", "null")
                        .raw("driver_calls_covered", "null")
                        .raw("modelled_driver_s", "null")
                        .raw("modelled_stall_s", "null")
                        .raw("growth", "null")
                        .raw("steps", "null");
                }
            }
            let t = &s.timing;
            j.float("gpu_lag_us", t.gpu_lag_ns as f64 / 1e3)
                .num("repeat", u64::from(t.repeat))
                .str("driver_costs", &t.costs.source);
            // The native allocator's calls: emulated where it ran, else the recorded segment
            // events (one step: the trace's own).
            let recorded = i.native_recorded_calls;
            let native_calls = em.map(|e| e.result.calls).or(recorded);
            j.opt_num("native_driver_calls", native_calls.map(|c| c.total()))
                .raw(
                    "native_driver_calls_by_kind",
                    &native_calls.map_or_else(|| "null".into(), |c| calls_json(&c)),
                )
                .raw(
                    "native_driver_calls_covered",
                    &native_calls.map_or_else(|| "null".into(), |c| covered_json(&c)),
                )
                .opt_float(
                    "native_modelled_driver_s",
                    em.map(|e| e.result.modelled_driver_s)
                        .or(recorded.map(|c| t.costs.seconds(&c))),
                )
                .opt_float(
                    "native_modelled_stall_s",
                    em.map(|e| e.result.modelled_stall_s),
                )
                .raw(
                    "native_growth",
                    &growth_json(em.and_then(|e| e.result.growth.as_ref())),
                )
                .str(
                    "native_driver_calls_from",
                    match (em, recorded) {
                        (Some(_), _) => "emulated",
                        (None, Some(_)) => "recorded",
                        (None, None) => "",
                    },
                )
                .raw(
                    "native_steps",
                    &em.map_or_else(|| "null".into(), |e| steps_json(&e.result.steps)),
                )
                .raw("native_emulated", &emulated_json(&o.emulated));
            match &run.outcome {
                Ok(_) => j.raw("error", "null"),
                Err(e) => j.str("error", e),
            };
            j.finish()
        })
        .collect()
}

/// Every native emulation of the trace (`--native`, then each `--native-conf`): `conf` is null
/// for the recorded settings, else the settings as given.
fn emulated_json(emulated: &[Emulated]) -> String {
    torch_arena::json::array(emulated.iter().map(|e| {
        let r = &e.result;
        JsonObject::new()
            .opt_str("conf", e.conf.as_deref())
            .num("peak_requested_bytes", e.peak_requested)
            .num("peak_reserved_bytes", r.peak_reserved)
            .float(
                "fragmentation",
                fragmentation(r.peak_reserved, e.peak_requested),
            )
            .opt_num("oom_event", r.oom_event.map(|n| n as u64))
            .num("driver_calls", r.driver_calls)
            .float("modelled_driver_s", r.modelled_driver_s)
            .float("modelled_stall_s", r.modelled_stall_s)
            .float("elapsed_s", e.elapsed.as_secs_f64())
            .finish()
    }))
}

/// The JSON line of a trace that could not be loaded.
pub(crate) fn json_load_error(arg: &TraceArg, error: &str) -> String {
    JsonObject::new()
        .str("trace", &arg.name())
        .str("path", &arg.text())
        .str("error", error)
        .finish()
}
