//! `replay --json`: one JSON object per trace and setting (and the native emulation), the
//! fields BENCHMARKS.md and the shared checks read, in the order they are declared here.

use serde::Serialize;

use torch_arena_lab::live::{self, LiveJson};

use crate::args::TraceArg;

use crate::json::{CallsByKind, Covered, GrowthJson, LoadError, Oom, Step, steps, to_line};
use crate::replay_run::{Emulated, ReplaySettings, TraceOutcome};
use crate::text::{fragmentation, source_key};

/// One line of `replay --json` (see the field list in `replay --help`). `None` is `null`; a
/// failed run has `null` for every figure of its own and the error.
#[derive(Serialize)]
struct ReplayLine<'a> {
    /// With `--live` only: what was live by site, and when.
    #[serde(skip_serializing_if = "Option::is_none")]
    live: Option<LiveJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    live_at: Option<&'a str>,
    trace: &'a str,
    path: &'a str,
    source: String,
    kind: &'a str,
    device: i32,
    events: u64,
    seeded_events: u64,
    capacity_bytes: u64,
    conf: &'a str,
    conf_effective: String,
    backing: bool,
    check: bool,
    events_replayed: Option<u64>,
    peak_requested_bytes: Option<u64>,
    peak_reserved_bytes: Option<u64>,
    native_peak_reserved_bytes: Option<u64>,
    fragmentation: Option<f64>,
    oom_event: Option<u64>,
    oom: Option<Oom<'a>>,
    native_emulated_peak_reserved_bytes: Option<u64>,
    native_emulated_oom_event: Option<u64>,
    native_emulated_fragmentation: Option<f64>,
    native_emulated_elapsed_s: Option<f64>,
    elapsed_s: Option<f64>,
    ns_per_event: Option<f64>,
    events_per_s: Option<f64>,
    driver_calls: Option<u64>,
    driver_calls_by_kind: Option<CallsByKind>,
    driver_calls_covered: Option<Covered>,
    modelled_driver_s: Option<f64>,
    modelled_stall_s: Option<f64>,
    growth: Option<GrowthJson>,
    steps: Option<Vec<Step>>,
    gpu_lag_us: f64,
    repeat: u64,
    driver_costs: &'a str,
    native_driver_calls: Option<u64>,
    native_driver_calls_by_kind: Option<CallsByKind>,
    native_driver_calls_covered: Option<Covered>,
    native_modelled_driver_s: Option<f64>,
    native_modelled_stall_s: Option<f64>,
    native_growth: Option<GrowthJson>,
    /// `emulated` (with `--native`), `recorded` (a snapshot's segment events) or empty.
    native_driver_calls_from: &'a str,
    native_steps: Option<Vec<Step>>,
    native_emulated: Vec<EmulatedJson<'a>>,
    error: Option<&'a str>,
}

/// One native emulation of the trace (`--native`, then each `--native-conf`): `conf` is null
/// for the recorded settings, else the settings as given.
#[derive(Serialize)]
struct EmulatedJson<'a> {
    conf: Option<&'a str>,
    peak_requested_bytes: u64,
    peak_reserved_bytes: u64,
    fragmentation: f64,
    oom_event: Option<u64>,
    driver_calls: u64,
    modelled_driver_s: f64,
    modelled_stall_s: f64,
    elapsed_s: f64,
}

impl<'a> EmulatedJson<'a> {
    fn of(e: &'a Emulated) -> Self {
        let r = &e.result;
        EmulatedJson {
            conf: e.conf.as_deref(),
            peak_requested_bytes: e.peak_requested,
            peak_reserved_bytes: r.peak_reserved,
            fragmentation: fragmentation(r.peak_reserved, e.peak_requested),
            oom_event: r.oom_event.map(|n| n as u64),
            driver_calls: r.driver_calls,
            modelled_driver_s: r.modelled_driver_s,
            modelled_stall_s: r.modelled_stall_s,
            elapsed_s: e.elapsed.as_secs_f64(),
        }
    }
}

/// One JSON object per setting of the trace (see the field list in `replay --help`).
pub(crate) fn json_lines(s: &ReplaySettings, o: &TraceOutcome) -> Vec<String> {
    let i = &o.info;
    let em = o.emulated.first();
    let t = &s.timing;
    // The native allocator's calls: emulated where it ran, else the recorded segment events
    // (one step: the trace's own).
    let recorded = i.native_recorded_calls;
    let native_calls = em.map(|e| e.result.calls).or(recorded);
    o.runs
        .iter()
        .map(|run| {
            let ok = run.outcome.as_ref().ok();
            let secs = ok.map(|r| r.elapsed.as_secs_f64());
            let line = ReplayLine {
                live: o.live.as_ref().map(|(set, _)| live::json(set, s.live)),
                live_at: o.live.as_ref().map(|(_, what)| what.as_str()),
                trace: &i.name,
                path: &i.path,
                source: source_key(i.source),
                kind: i.kind.as_str(),
                device: i.device,
                events: i.events as u64,
                seeded_events: i.seeded as u64,
                capacity_bytes: s.capacity,
                conf: &run.label,
                conf_effective: run.effective.to_string(),
                backing: run.effective.sim_backing,
                check: s.check,
                events_replayed: ok.map(|r| r.events as u64),
                peak_requested_bytes: ok.map(|r| r.peak_requested),
                peak_reserved_bytes: ok.map(|r| r.peak_reserved),
                native_peak_reserved_bytes: match ok {
                    Some(r) => r.native_peak_reserved.or(i.native_recorded),
                    None => i.native_recorded,
                },
                fragmentation: ok.map(|r| r.fragmentation),
                oom_event: ok.and_then(|r| r.oom.as_ref().map(|o| o.event as u64)),
                oom: ok.and_then(|r| r.oom.as_ref().map(Oom::of)),
                native_emulated_peak_reserved_bytes: em.map(|e| e.result.peak_reserved),
                native_emulated_oom_event: em.and_then(|e| e.result.oom_event.map(|n| n as u64)),
                native_emulated_fragmentation: em
                    .map(|e| fragmentation(e.result.peak_reserved, e.peak_requested)),
                native_emulated_elapsed_s: em.map(|e| e.elapsed.as_secs_f64()),
                elapsed_s: secs,
                ns_per_event: ok
                    .zip(secs)
                    .map(|(r, secs)| secs * 1e9 / r.events.max(1) as f64),
                // A replay too quick to time has no rate (NaN: null).
                events_per_s: ok.zip(secs).map(|(r, secs)| {
                    if secs > 0.0 {
                        r.events as f64 / secs
                    } else {
                        f64::NAN
                    }
                }),
                driver_calls: ok.map(|r| r.driver_calls),
                driver_calls_by_kind: ok.map(|r| CallsByKind(r.calls)),
                driver_calls_covered: ok.map(|r| Covered::of(&r.calls)),
                modelled_driver_s: ok.map(|r| r.modelled_driver_s),
                modelled_stall_s: ok.map(|r| r.modelled_stall_s),
                growth: ok.and_then(|r| r.growth.as_ref().map(GrowthJson::of)),
                steps: ok.map(|r| steps(&r.steps)),
                gpu_lag_us: t.gpu_lag_ns as f64 / 1e3,
                repeat: u64::from(t.repeat),
                driver_costs: &t.costs.source,
                native_driver_calls: native_calls.map(|c| c.total()),
                native_driver_calls_by_kind: native_calls.map(CallsByKind),
                native_driver_calls_covered: native_calls.as_ref().map(Covered::of),
                native_modelled_driver_s: em
                    .map(|e| e.result.modelled_driver_s)
                    .or(recorded.map(|c| t.costs.seconds(&c))),
                native_modelled_stall_s: em.map(|e| e.result.modelled_stall_s),
                native_growth: em.and_then(|e| e.result.growth.as_ref().map(GrowthJson::of)),
                native_driver_calls_from: match (em, recorded) {
                    (Some(_), _) => "emulated",
                    (None, Some(_)) => "recorded",
                    (None, None) => "",
                },
                native_steps: em.map(|e| steps(&e.result.steps)),
                native_emulated: o.emulated.iter().map(EmulatedJson::of).collect(),
                error: run.outcome.as_ref().err().map(String::as_str),
            };
            to_line(&line)
        })
        .collect()
}

/// The JSON line of a trace that could not be loaded.
pub(crate) fn json_load_error(arg: &TraceArg, error: &str) -> String {
    to_line(&LoadError {
        trace: &arg.name(),
        path: &arg.text(),
        error,
    })
}
