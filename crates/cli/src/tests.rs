//! Unit tests of the command's formatting, JSON and reading.

use std::path::PathBuf;
use std::time::Duration;

use json_reader::Json;
use torch_arena::device::DriverCounters;
use torch_arena_lab::fit::Fit;
use torch_arena_lab::native::NativeResult;

use crate::demo::demo_reading;
use crate::json::to_line;

use torch_arena::arena::{Growth, GrowthCounts};
use torch_arena::config::{Config, DeviceKind};
use torch_arena_lab::replay::{OomReport, Point, ReplayResult, StepStats};
use torch_arena_lab::{Kind, Source};

use crate::args::{
    Cli, CliCommand, SYNTH_FORMS, SynthSpec, TraceArg, parse_args, parse_capacity, parse_size,
};
use crate::progress::shorten;
use crate::replay_json::{json_lines, json_load_error};
use crate::replay_plot::{panel, plot_path_for};
use crate::replay_run::{Emulated, ReplaySettings, Run, TraceInfo, TraceOutcome};
use crate::text::{fmt_bytes, fmt_count, fmt_frag, fmt_ns, fragmentation, nb, wrap};
use crate::usage::DEFAULT_SEED;

// The tests' one strict JSON reader (tests/common/json.rs), shared with the ABI tests.
#[path = "../../../tests/common/json.rs"]
mod json_reader;

fn parse_json(text: &str) -> Json {
    json_reader::parse(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn sizes() {
    assert_eq!(parse_size("80GiB"), Ok(80 << 30));
    assert_eq!(parse_size("512MiB"), Ok(512 << 20));
    assert_eq!(parse_size("512 mib"), Ok(512 << 20));
    assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
    assert_eq!(parse_size("4KiB"), Ok(4096));
    assert_eq!(parse_size("3KB"), Ok(3000));
    assert_eq!(parse_size("7B"), Ok(7));
    assert_eq!(parse_size("2TiB"), Ok(2 << 40));
    assert_eq!(parse_size("1TB"), Ok(1_000_000_000_000));
    assert_eq!(parse_size("0.5KiB"), Ok(512));
    for bad in [
        "80",
        "80GiG",
        "GiB",
        "",
        "1..5GB",
        ".5GB",
        "5.GB",
        "-1GiB",
        "99999999TiB",
    ] {
        let e = parse_size(bad).unwrap_err();
        assert!(
            e.contains("KiB, MiB, GiB, TiB") && e.contains("KB, MB, GB, TB"),
            "{e}"
        );
        assert!(e.contains(&format!("'{bad}'")), "{e}");
    }
    assert!(
        parse_size("80GiG")
            .unwrap_err()
            .contains("unknown unit 'GiG'")
    );
    assert!(parse_size("80").unwrap_err().contains("no unit"));
    assert!(parse_capacity("0GiB").unwrap_err().contains("more than 0"));
}

#[test]
fn synth_specs() {
    assert_eq!(
        SynthSpec::parse("synth:adversarial:16GiB"),
        Ok(SynthSpec::Adversarial { capacity: 16 << 30 })
    );
    assert_eq!(
        SynthSpec::parse("synth:rmm-random:10_000:64MiB"),
        Ok(SynthSpec::RmmRandom {
            n: 10_000,
            max: 64 << 20,
            seed: DEFAULT_SEED
        })
    );
    assert_eq!(
        SynthSpec::parse("synth:rmm-random:5:1KiB:9"),
        Ok(SynthSpec::RmmRandom {
            n: 5,
            max: 1024,
            seed: 9
        })
    );
    assert_eq!(
        SynthSpec::parse("synth:llm-serve"),
        Ok(SynthSpec::Workload {
            kind: "llm-serve",
            steps: 3,
            seed: DEFAULT_SEED
        })
    );
    assert_eq!(
        SynthSpec::parse("synth:moe-train:2:9"),
        Ok(SynthSpec::Workload {
            kind: "moe-train",
            steps: 2,
            seed: 9
        })
    );
    for (bad, says) in [
        ("synth:llm-serve:0", "STEPS: 0 must be from 1 to 1000"),
        ("synth:varlen-train:1:2:3", "wrong number"),
        ("synth:two-stream-train:x", "'x' is not a whole number"),
        ("synth:foo:1", "unknown synthetic trace 'foo'"),
        ("synth:adversarial", "wrong number"),
        ("synth:rmm-random:10:1MiB:1:2", "wrong number"),
        ("synth:rmm-random:x:1MiB", "'x' is not a whole number"),
        ("synth:rmm-random:10:64", "no unit"),
        ("synth:rmm-random:0:1MiB", "N must be at least 1"),
        ("synth:adversarial:0B", "more than 0"),
    ] {
        let e = SynthSpec::parse(bad).unwrap_err();
        assert!(e.contains(says) && e.contains(SYNTH_FORMS), "{bad}: {e}");
    }
}

#[test]
fn trace_args_are_checked_up_front() {
    let check = |t: &str| TraceArg::from_arg(t).and_then(|a| a.check());
    let e = check("/nonexistent/x.pickle").unwrap_err();
    assert!(e.contains("'/nonexistent/x.pickle'"), "{e}");
    let e = check("/").unwrap_err();
    assert!(e.contains("directory"), "{e}");
    let a = TraceArg::from_arg("synth:rmm-random:10:1MiB").unwrap();
    assert_eq!(a.check(), Ok(()));
    assert_eq!(a.name(), "synth:rmm-random:10:1MiB");
    let f = TraceArg::File(PathBuf::from("a/b/run.pickle.gz"));
    assert_eq!(f.name(), "run.pickle.gz");
    assert_eq!(f.text(), "a/b/run.pickle.gz");
}

#[test]
fn options_and_values_as_clap_reads_them() {
    let args: Vec<String> = [
        "replay",
        "--conf=stitch:False",
        "--capacity",
        "1GiB",
        "--capacity=2GiB",
        "--live",
        "synth:llm-serve",
        "--",
        "--x",
    ]
    .map(String::from)
    .to_vec();
    let Ok(Cli {
        command: CliCommand::Replay(a),
    }) = parse_args(&args)
    else {
        panic!("replay");
    };
    assert_eq!(a.confs, ["stitch:False"]);
    // The last of an option given twice counts; `--live` alone is the default 10 sites.
    assert_eq!(a.capacity, Some(2 << 30));
    assert_eq!(a.live, Some(10));
    let names: Vec<String> = a.traces.iter().map(TraceArg::name).collect();
    assert_eq!(names, ["synth:llm-serve", "--x"]);
    // A misspelt option: clap names it and the option meant.
    let e = parse_args(&["replay", "--capacty", "1GiB"].map(String::from))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'--capacty'") && e.contains("'--capacity'"),
        "{e}"
    );
    assert!(e.contains("Usage: torch-arena replay"), "{e}");
}

#[test]
fn confs_are_forced_to_the_sim_device() {
    let mut s = ReplaySettings::new(Some(false));
    s.capacity = 3 << 30;
    s.backing = true;
    s.add_conf(" stitch:False ").unwrap();
    assert_eq!(s.confs[0].0, "stitch:False");
    let e = s.effective(&s.confs[0].1);
    assert_eq!(e.device, DeviceKind::Sim);
    assert_eq!(e.sim_capacity_mb, 3072);
    assert!(e.sim_backing && !e.stitch);
    let err = s.add_conf("sim_capacity_mb:1024").unwrap_err();
    assert!(err.contains("--capacity 1024MiB"), "{err}");
    let err = s.add_conf("stich:False").unwrap_err();
    assert!(
        err.contains("--conf 'stich:False'") && err.contains("stitch"),
        "{err}"
    );
}

#[test]
fn formatting() {
    assert_eq!(fmt_count(0), "0");
    assert_eq!(fmt_count(1234567), "1,234,567");
    assert_eq!(fmt_count(100), "100");
    assert_eq!(fmt_bytes(512), "512 B");
    assert_eq!(fmt_bytes(3 << 29), "1.50 GiB");
    assert_eq!(fmt_ns(850.0), "850 ns");
    assert_eq!(fmt_ns(1500.0), "1.5 µs");
    assert_eq!(fmt_frag(0.019), "1.9 %");
    assert_eq!(fmt_frag(fragmentation(1, 0)), "–");
    assert_eq!(wrap("aa bb cc", 5), "aa bb\ncc");
    assert_eq!(wrap(&format!("a {}", nb("1.0 %".into())), 4), "a\n1.0 %");
    assert_eq!(shorten("abcdef", 4), "…def");
    assert_eq!(
        plot_path_for("out/{trace}.svg", "a b/c.pickle"),
        PathBuf::from("out/a_b_c.pickle.svg")
    );
}

#[test]
fn json_escapes() {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        #[serde(rename = "k\"")]
        k: &'a str,
        nan: f64,
        x: f64,
        whole: f64,
        none: Option<u64>,
        list: [u64; 2],
    }
    let line = to_line(&Line {
        k: "v\t\u{7f}\u{1f}",
        nan: f64::NAN,
        x: 0.25,
        whole: 1048576.0,
        none: None,
        list: [1, 2],
    });
    // The spacing the lines had before serde; a float always reads back as a float; NaN: null.
    assert_eq!(
        line,
        "{\"k\\\"\": \"v\\t\u{7f}\\u001f\", \"nan\": null, \"x\": 0.25, \"whole\": 1048576.0, \"none\": null, \"list\": [1, 2]}"
    );
    let v = parse_json(&line);
    assert_eq!(v.get("k\"").str(), "v\t\u{7f}\u{1f}");
}

fn outcome(oom: bool, error: bool) -> TraceOutcome {
    let result = ReplayResult {
        trace: "t".into(),
        conf: "stitch:False".into(),
        events: 10,
        peak_requested: 100 << 20,
        peak_reserved: 110 << 20,
        fragmentation: 0.1,
        native_peak_reserved: Some(120 << 20),
        oom: oom.then(|| OomReport {
            event: 7,
            size: 64 << 20,
            stream: 3,
            live_bytes: 90 << 20,
            live_count: 4,
            reserved: 110 << 20,
            cached: 20 << 20,
            message: "CUDA out of memory. Tried to allocate 64.00 MiB\n\"quoted\"".into(),
            step: 1,
            largest_live: vec![
                (50 << 20, "train.py:40 in \"step\"".into()),
                (1, String::new()),
            ],
        }),
        elapsed: Duration::from_millis(2),
        driver_calls: 17,
        calls: DriverCounters {
            mem_create: 10,
            mem_map: 7,
            ..Default::default()
        },
        growth: Some(GrowthCounts {
            at_peak: Growth {
                handles: 9,
                bytes: 90 << 20,
            },
            below_peak: Growth {
                handles: 1,
                bytes: 20 << 20,
            },
        }),
        modelled_driver_s: 0.5,
        modelled_stall_s: 0.25,
        gpu_lag_ns: 2_000_000,
        steps: vec![StepStats::default()],
        unmatched_frees: 0,
        live_at_end: 4,
        series: vec![
            Point {
                event: 0,
                requested: 0,
                reserved: 0,
                driver_ns: 0,
            },
            Point {
                event: 9,
                requested: 100 << 20,
                reserved: 110 << 20,
                driver_ns: 0,
            },
        ],
    };
    TraceOutcome {
        info: TraceInfo {
            name: "run \"1\".pickle".into(),
            path: "dir/run \"1\".pickle".into(),
            source: Source::TorchSnapshot,
            kind: Kind::Warm,
            device: 0,
            events: 10,
            seeded: 2,
            peak_requested: 100 << 20,
            native_recorded: Some(120 << 20),
            native_recorded_calls: None,
        },
        recorded_series: Some(vec![Point {
            event: 0,
            requested: 0,
            reserved: 120 << 20,
            driver_ns: 0,
        }]),
        emulated: vec![Emulated {
            conf: None,
            result: NativeResult {
                replay: ReplayResult {
                    peak_reserved: 130 << 20,
                    series: vec![],
                    native_peak_reserved: None,
                    oom: None,
                    driver_calls: 7,
                    calls: DriverCounters {
                        mem_alloc: 7,
                        ..Default::default()
                    },
                    ..result.clone()
                },
                peak_allocated: 100 << 20,
                oom_event: None,
                segments_created: 7,
                segments_released: 0,
                alloc_retries: 0,
                final_reserved: 130 << 20,
            },
            elapsed: Duration::from_millis(1),
            oom_request: None,
            peak_requested: 100 << 20,
        }],
        runs: vec![Run {
            label: "stitch:False".into(),
            effective: Config::default(),
            outcome: if error {
                Err("boom \"x\"".into())
            } else {
                Ok(result)
            },
        }],
        live: None,
    }
}

/// The fields `scripts/bench-traces` and BENCHMARKS.md rely on.
const FIELDS: &[&str] = &[
    "trace",
    "path",
    "source",
    "kind",
    "device",
    "events",
    "seeded_events",
    "capacity_bytes",
    "conf",
    "conf_effective",
    "backing",
    "check",
    "events_replayed",
    "peak_requested_bytes",
    "peak_reserved_bytes",
    "native_peak_reserved_bytes",
    "fragmentation",
    "oom_event",
    "oom",
    "native_emulated_peak_reserved_bytes",
    "native_emulated_oom_event",
    "native_emulated_fragmentation",
    "native_emulated_elapsed_s",
    "elapsed_s",
    "ns_per_event",
    "events_per_s",
    "driver_calls",
    "driver_calls_by_kind",
    "driver_calls_covered",
    "modelled_driver_s",
    "modelled_stall_s",
    "growth",
    "steps",
    "gpu_lag_us",
    "repeat",
    "driver_costs",
    "native_driver_calls",
    "native_driver_calls_by_kind",
    "native_driver_calls_covered",
    "native_modelled_driver_s",
    "native_modelled_stall_s",
    "native_growth",
    "native_driver_calls_from",
    "native_steps",
    "native_emulated",
    "error",
];

/// A snapshot's segment events priced as the emulation's are: one call per change of the
/// reserved bytes, and the bytes each reserved or released (for the per-GiB terms).
#[test]
fn recorded_segment_events_count_calls_and_bytes() {
    let mib = 1u64 << 20;
    let mut trace = torch_arena_lab::synth::rmm_random(4, mib, 1);
    trace.native = Some(torch_arena_lab::NativeReserved {
        initial: 2 * mib,
        changes: vec![(0, 22 * mib), (1, 42 * mib), (2, 20 * mib), (3, 20 * mib)],
        peak: 42 * mib,
        ..Default::default()
    });
    let c = crate::replay_run::recorded_calls(&trace).unwrap();
    assert_eq!((c.mem_alloc, c.mem_free), (2, 1));
    assert_eq!((c.mem_alloc_bytes, c.mem_free_bytes), (40 * mib, 22 * mib));
}

#[test]
fn json_lines_parse_back() {
    let s = ReplaySettings::new(Some(false));
    for (oom, error) in [(false, false), (true, false), (false, true)] {
        let lines = json_lines(&s, &outcome(oom, error));
        assert_eq!(lines.len(), 1);
        assert!(!lines[0].contains('\n'));
        let v = parse_json(&lines[0]);
        let fields = v.obj();
        let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, FIELDS);
        assert_eq!(v.get("trace").str(), "run \"1\".pickle");
        assert_eq!(v.get("kind").str(), "warm");
        assert_eq!(v.get("seeded_events").f64(), 2.0);
        assert_eq!(
            v.get("native_peak_reserved_bytes").f64(),
            (120u64 << 20) as f64
        );
        assert_eq!(
            v.get("native_emulated_peak_reserved_bytes").f64(),
            (130u64 << 20) as f64
        );
        assert_eq!(*v.get("native_emulated_oom_event"), Json::Null);
        assert_eq!(v.get("gpu_lag_us").f64(), 2000.0);
        assert_eq!(v.get("native_driver_calls").f64(), 7.0);
        assert_eq!(v.get("native_driver_calls_from").str(), "emulated");
        assert_eq!(
            v.get("native_driver_calls_by_kind").get("cuMemAlloc").f64(),
            7.0
        );
        if error {
            assert_eq!(v.get("error").str(), "boom \"x\"");
            assert_eq!(*v.get("peak_reserved_bytes"), Json::Null);
        } else {
            assert_eq!(*v.get("error"), Json::Null);
            assert_eq!(v.get("peak_reserved_bytes").f64(), (110u64 << 20) as f64);
            assert_eq!(v.get("fragmentation").f64(), 0.1);
            assert_eq!(v.get("driver_calls").f64(), 17.0);
            assert_eq!(v.get("ns_per_event").f64(), 200_000.0);
            assert_eq!(v.get("modelled_driver_s").f64(), 0.5);
            let k = v.get("driver_calls_by_kind");
            assert_eq!(k.get("cuMemCreate").f64(), 10.0);
            assert_eq!(k.get("cuMemMap").f64(), 7.0);
            let g = v.get("growth");
            assert_eq!(g.get("at_peak").get("handles").f64(), 9.0);
            assert_eq!(g.get("below_peak").get("bytes").f64(), (20u64 << 20) as f64);
            let steps = v.get("steps").arr();
            assert_eq!(steps.len(), 1);
            assert_eq!(steps[0].get("peak_reserved_bytes").f64(), 0.0);
            assert_eq!(*steps[0].get("growth"), Json::Null, "a step not counted");
        }
        if oom {
            assert_eq!(v.get("oom_event").f64(), 7.0);
            let o = v.get("oom");
            assert_eq!(o.get("stream").f64(), 3.0);
            assert!(o.get("message").str().contains("\n\"quoted\""));
            let l = o.get("largest_live").arr();
            assert_eq!(l[0].get("site").str(), "train.py:40 in \"step\"");
        } else {
            assert_eq!(*v.get("oom_event"), Json::Null);
            assert_eq!(*v.get("oom"), Json::Null);
        }
    }
    let e = json_load_error(&TraceArg::File("x\\y.pickle".into()), "bad\nfile");
    let v = parse_json(&e);
    assert_eq!(v.get("path").str(), "x\\y.pickle");
    assert_eq!(v.get("error").str(), "bad\nfile");
}

#[test]
fn plot_panel_has_every_allocator() {
    let mut s = ReplaySettings::new(Some(false));
    s.plot = Some("x.svg".into());
    let p = panel(&s, &outcome(false, false));
    let labels: Vec<&str> = p.lines.iter().map(|l| l.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "requested",
            "native (recorded) reserved",
            "native (emulated) reserved",
            "arena (stitch:False) reserved"
        ]
    );
    assert_eq!(p.lines[0].points, [(0, 0), (9, 100 << 20)]);
    assert_eq!(p.lines[3].points, [(0, 0), (9, 110 << 20)]);
    assert_eq!(p.events, 10);
}

#[test]
fn demo_reading_leads_with_the_smallest_gpu_then_compares_caches() {
    let s = ReplaySettings::new(Some(false));
    let o = outcome(false, false);
    let Ok(r) = &o.runs[0].outcome else { panic!() };
    let fit = |allocator, conf: &str, mib: u64| Fit {
        allocator,
        conf: conf.into(),
        min_capacity: Some(mib << 20),
        at_min: None,
        trials: 1,
    };
    let fits = [
        fit("arena", "", 106),
        fit("native", "", 110),
        fit("native", "expandable_segments:True", 104),
    ];
    let t = demo_reading(&s, &o, r, &fits).replace('\u{a0}', " ");
    assert!(t.contains("100.00 MiB of tensors live"), "{t}");
    assert!(
        t.contains(
            "torch-arena needs 106.00 MiB, PyTorch's native allocator at best 104.00 MiB (with \
             expandable_segments:True), so torch-arena needs 2.00 MiB more"
        ),
        "{t}"
    );
    assert!(
        t.contains("and torch-arena 20.00 MiB less (15.4 % of the native figure)"),
        "{t}"
    );
    assert!(t.contains("not what each needs"), "{t}");
    let o = outcome(true, false);
    let Ok(r) = &o.runs[0].outcome else { panic!() };
    assert!(demo_reading(&s, &o, r, &fits).contains("ran out of memory at event 7"));
}

/// `diff`'s arguments as clap reads them, and the two sides `plan` makes of them.
fn diff_args(args: &[&str]) -> Result<crate::args::DiffArgs, String> {
    let args: Vec<String> = std::iter::once("diff")
        .chain(args.iter().copied())
        .map(String::from)
        .collect();
    match parse_args(&args) {
        Ok(Cli {
            command: CliCommand::Diff(a),
        }) => Ok(a),
        Ok(_) => panic!("not diff"),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn diff_plans_two_sides_from_the_arguments() {
    use crate::diff::{SideSpec, plan};
    use torch_arena_lab::diff::Moment;
    let side = |trace, step, moment| SideSpec {
        trace,
        step,
        moment,
    };
    // Two traces at their peaks; one --at for both; two --at, one each.
    let a = diff_args(&["a.pickle", "b.pickle"]).unwrap();
    assert_eq!(
        plan(&a),
        Ok([side(0, None, Moment::Peak), side(1, None, Moment::Peak)])
    );
    let a = diff_args(&["a.pickle", "b.pickle", "--at", "end"]).unwrap();
    assert_eq!(
        plan(&a),
        Ok([side(0, None, Moment::End), side(1, None, Moment::End)])
    );
    let a = diff_args(&["a.pickle", "--at", "event:1_000", "--at=start"]).unwrap();
    assert_eq!(
        plan(&a),
        Ok([
            side(0, None, Moment::Event(1000)),
            side(0, None, Moment::Start)
        ])
    );
    // Steps of one trace, or step I of A with step J of B.
    let a = diff_args(&["run.pickle", "--steps", "1", "5"]).unwrap();
    assert_eq!(
        plan(&a),
        Ok([
            side(0, Some(1), Moment::Peak),
            side(0, Some(5), Moment::Peak)
        ])
    );
    let a = diff_args(&["a.pickle", "b.pickle", "--steps", "2", "2", "--at", "end"]).unwrap();
    assert_eq!(
        plan(&a),
        Ok([side(0, Some(2), Moment::End), side(1, Some(2), Moment::End)])
    );
    // What cannot be planned.
    let a = diff_args(&["run.pickle", "--at", "end"]).unwrap();
    assert!(plan(&a).unwrap_err().contains("one trace"));
    let a = diff_args(&["run.pickle", "--steps", "1", "2", "--steps", "3", "4"]).unwrap();
    assert!(
        plan(&a)
            .unwrap_err()
            .contains("--steps takes two step numbers")
    );
    let e = diff_args(&["run.pickle", "--steps", "1"]).unwrap_err();
    assert!(e.contains("--steps <I> <J>"), "{e}");
    let e = diff_args(&["run.pickle", "--steps", "1", "x"]).unwrap_err();
    assert!(e.contains("'x' is not a whole number"), "{e}");
    let e = diff_args(&["a", "b", "--by", "tag"]).unwrap_err();
    assert!(e.contains("site, file, category, module"), "{e}");
}

#[test]
fn signed_bytes_and_counts_for_people() {
    use crate::text::{fmt_signed_bytes, fmt_signed_count};
    assert_eq!(fmt_signed_bytes(3 << 29), "+1.50 GiB");
    assert_eq!(fmt_signed_bytes(-512), "-512 B");
    assert_eq!(fmt_signed_bytes(0), "0 B");
    // i64::MIN has no positive twin: its magnitude still prints.
    assert_eq!(fmt_signed_bytes(i64::MIN), "-8192.00 PiB");
    assert_eq!(fmt_signed_count(1234), "+1,234");
    assert_eq!(fmt_signed_count(-3), "-3");
    assert_eq!(fmt_signed_count(0), "0");
}

#[test]
fn columns_pad_text_left_figures_right_and_leave_free_text_alone() {
    use crate::text::columns;
    let rows = [
        ["".to_string(), "A".into(), "note".into()],
        ["live tensors".to_string(), "1.50 GiB".into(), "x".into()],
    ];
    assert_eq!(
        columns(&rows, &[true, false]),
        [
            // 12 spaces for the empty label, 7 before "A" in the 8-wide figure column.
            format!("  {}  {}A  note", " ".repeat(12), " ".repeat(7)),
            "  live tensors  1.50 GiB  x".to_string(),
        ]
    );
}
