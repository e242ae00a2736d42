//! The `torch-arena` command, run as a user runs it: usage errors, exit codes, JSON lines and
//! plot files.
//!
//! The tests under "Replays" need the trace importer, the replayer, the native emulator and the
//! synthetic traces (`torch_arena_lab::{load, replay, native, synth}`); `synth_writes_a_trace_file` also
//! needs `torch_arena_lab::format::write`.

use std::path::PathBuf;
use std::process::{Command, Output};

#[path = "../../../tests/common/json.rs"]
mod json;
#[path = "../../../tests/common/python_pickle.rs"]
mod python_pickle;

fn torch_arena(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_torch-arena"))
        .args(args)
        .env_remove("TORCH_ARENA_DEMO_TRACE")
        .env_remove("TORCH_ARENA_CONF")
        .output()
        .expect("run torch-arena")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh folder for one test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Exit status 1, nothing on stdout, and stderr containing every one of `says`.
fn assert_usage_error(o: &Output, says: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(o.stdout.is_empty(), "stdout: {}", stdout(o));
    assert!(err.starts_with("torch-arena: "), "{err}");
    for s in says {
        assert!(err.contains(s), "stderr lacks {s:?}: {err}");
    }
}

// ---------------------------------------------------------------------------------------------
// Usage

#[test]
fn help_lists_commands_options_and_exit_codes() {
    // The whole command: its commands, the TRACE forms, SIZE and the exit status.
    for args in [&[][..], &["help"], &["--help"]] {
        let o = torch_arena(args);
        assert_eq!(o.status.code(), Some(0));
        let out = stdout(&o);
        for s in [
            "Usage: torch-arena <COMMAND>",
            "replay ",
            "fit ",
            "diff ",
            "synth ",
            "convert ",
            "demo ",
            "completions ",
            "synth:adversarial:CAPACITY",
            "synth:rmm-random:N:MAX[:SEED]",
            "SIZE is a number and a unit",
            "TORCH_ARENA_DEMO_TRACE",
            "scripts/make-demo-trace",
            "exit status",
            "2   an arena replay ran out of memory",
        ] {
            assert!(out.contains(s), "{args:?}: help lacks {s:?}");
        }
    }
    // Each command's options, with the explanation of each (--help, `help COMMAND`).
    let per_command: [(&str, &[&str]); 7] = [
        (
            "replay",
            &[
                "Usage: torch-arena replay [OPTIONS] [TRACE]...",
                "--capacity <SIZE>",
                "--conf <CONF>",
                "--native\n",
                "--native-conf <SETTINGS>",
                "row per setting",
                "--backing",
                "--check",
                "--live[=<N>]",
                "--json",
                "native_emulated_peak_reserved_bytes",
                "--plot <FILE>",
                "--progress",
                "--no-progress",
                "synth:rmm-random:N:MAX[:SEED]",
                "2   an arena replay ran out of memory",
            ],
        ),
        (
            "fit",
            &[
                "--native-conf <SETTINGS>",
                "backend:cudaMallocAsync is refused",
                "-j, --jobs <N>",
                "--plot <FILE.svg>",
                "The capacity is bisected",
            ],
        ),
        (
            "demo",
            &[
                "--model",
                "--steps <N>",
                "TORCH_ARENA_DEMO_TRACE",
                "scripts/make-demo-trace",
            ],
        ),
        (
            "synth",
            &[
                "[KIND]",
                "--n <N>",
                "--max <SIZE>",
                "--seed <S>",
                "-o, --output <FILE>",
            ],
        ),
        ("convert", &["[TRACE]", "-o, --output <FILE>"]),
        (
            "merge",
            &[
                "<FILE>...",
                "--json",
                "explain(json=True)",
                "TORCH_ARENA_LEAK_REPORT",
            ],
        ),
        (
            "diff",
            &[
                "Usage: torch-arena diff [OPTIONS] [TRACE]...",
                "--at <MOMENT>",
                "--steps <I> <J>",
                "--by <GROUP>",
                "--top <N>",
                "--json",
                "delta_live_bytes",
                "--plot <FILE>",
                "share of each run's events",
                "Optimizer.step",
                "ProfilerStep#N",
                "explain()",
                "synth:rmm-random:N:MAX[:SEED]",
            ],
        ),
    ];
    for (command, says) in per_command {
        for args in [&[command, "--help"][..], &["help", command]] {
            let o = torch_arena(args);
            assert_eq!(o.status.code(), Some(0), "{args:?}");
            let out = stdout(&o);
            for s in says {
                assert!(out.contains(s), "{args:?}: help lacks {s:?}: {out}");
            }
        }
    }
}

#[test]
fn completions_name_the_commands_and_options() {
    let o = torch_arena(&["completions", "bash"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let script = stdout(&o);
    assert!(script.contains("complete -F _torch__arena"), "{script}");
    for s in [
        "replay",
        "fit",
        "diff",
        "synth",
        "convert",
        "demo",
        "--capacity",
        "--native-conf",
        "--gpu-lag",
        "--live",
        "--jobs",
        "--model",
        "--output",
    ] {
        assert!(script.contains(s), "the bash script lacks {s:?}");
    }
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let o = torch_arena(&["completions", shell]);
        assert_eq!(o.status.code(), Some(0), "{shell}: {}", stderr(&o));
        assert!(stdout(&o).contains("native-conf"), "{shell}");
    }
    assert_usage_error(
        &torch_arena(&["completions", "tcsh"]),
        &[
            "invalid value 'tcsh'",
            "bash, elvish, fish, powershell, zsh",
        ],
    );
}

#[test]
fn unknown_command() {
    let o = torch_arena(&["replya"]);
    assert_usage_error(
        &o,
        &[
            "unrecognized subcommand 'replya'",
            "a similar subcommand exists: 'replay'",
            "replay, fit, synth, convert, demo, merge, diff",
        ],
    );
}

#[test]
fn version_is_printed() {
    let o = torch_arena(&["--version"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        stdout(&o),
        format!("torch-arena {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn unknown_option_is_named_with_a_hint() {
    let o = torch_arena(&["replay", "--frobnicate", "synth:adversarial:1GiB"]);
    assert_usage_error(
        &o,
        &[
            "unexpected argument '--frobnicate'",
            "Usage: torch-arena replay",
        ],
    );
    let o = torch_arena(&["replay", "--capcity", "1GiB", "synth:adversarial:1GiB"]);
    assert_usage_error(
        &o,
        &[
            "unexpected argument '--capcity'",
            "a similar argument exists: '--capacity'",
        ],
    );
    let o = torch_arena(&["demo", "--stpes", "3"]);
    assert_usage_error(
        &o,
        &[
            "unexpected argument '--stpes'",
            "a similar argument exists: '--steps'",
        ],
    );
}

#[test]
fn option_without_value() {
    let o = torch_arena(&["replay", "synth:adversarial:1GiB", "--capacity"]);
    assert_usage_error(&o, &["a value is required for '--capacity <SIZE>'"]);
    let o = torch_arena(&["replay", "--json=yes", "synth:adversarial:1GiB"]);
    assert_usage_error(
        &o,
        &[
            "unexpected value 'yes' for '--json'",
            "no more were expected",
        ],
    );
}

#[test]
fn bad_capacity_unit_lists_accepted_forms() {
    for bad in ["80GiG", "80", "lots"] {
        let o = torch_arena(&["replay", "--capacity", bad, "synth:adversarial:1GiB"]);
        assert_usage_error(
            &o,
            &[
                &format!("invalid value '{bad}' for '--capacity <SIZE>'"),
                "B, KiB, MiB, GiB, TiB",
                "KB, MB, GB, TB",
                "80GiB",
            ],
        );
    }
}

#[test]
fn missing_trace_files_are_named_before_any_replay() {
    let o = torch_arena(&[
        "replay",
        "synth:rmm-random:10:1MiB",
        "/no/such/run.pickle.gz",
        "also-missing.trace",
    ]);
    assert_usage_error(
        &o,
        &[
            "cannot read trace '/no/such/run.pickle.gz'",
            "cannot read trace 'also-missing.trace'",
            "No such file",
        ],
    );
}

#[test]
fn no_trace_and_bad_synthetic_specs() {
    assert_usage_error(&torch_arena(&["replay"]), &["no trace given"]);
    assert_usage_error(
        &torch_arena(&["replay", "synth:rmm-random:many:1MiB"]),
        &[
            "'many' is not a whole number",
            "synth:rmm-random:N:MAX[:SEED]",
        ],
    );
    assert_usage_error(
        &torch_arena(&["replay", "synth:chaos:1GiB"]),
        &[
            "unknown synthetic trace 'chaos'",
            "synth:adversarial:CAPACITY",
        ],
    );
}

#[test]
fn bad_conf_names_the_key() {
    let o = torch_arena(&["replay", "--conf", "stich:False", "synth:adversarial:1GiB"]);
    assert_usage_error(
        &o,
        &["--conf 'stich:False'", "unknown key 'stich'", "stitch"],
    );
    let o = torch_arena(&[
        "replay",
        "--conf",
        "sim_capacity_mb:1024",
        "synth:adversarial:1GiB",
    ]);
    assert_usage_error(&o, &["--capacity 1024MiB"]);
}

#[test]
fn bad_plot_file_is_refused_before_any_replay() {
    let o = torch_arena(&["replay", "--plot", "out.jpg", "synth:adversarial:1GiB"]);
    assert_usage_error(&o, &["'out.jpg'", ".svg or .png"]);
    let o = torch_arena(&[
        "replay",
        "--plot",
        "/no/such/dir/out.svg",
        "synth:adversarial:1GiB",
    ]);
    assert_usage_error(&o, &["'/no/such/dir' does not exist"]);
}

#[test]
fn synth_usage_errors() {
    assert_usage_error(&torch_arena(&["synth"]), &["adversarial or rmm-random"]);
    assert_usage_error(
        &torch_arena(&["synth", "adversarial"]),
        &["-o FILE is required"],
    );
    assert_usage_error(
        &torch_arena(&["synth", "rmm-random", "--n", "10", "-o", "x.trace"]),
        &["needs --n N and --max SIZE"],
    );
    assert_usage_error(
        &torch_arena(&["synth", "fractal", "-o", "x.trace"]),
        &["unknown KIND 'fractal'"],
    );
    assert_usage_error(
        &torch_arena(&["synth", "adversarial", "--n", "3", "-o", "x.trace"]),
        &["takes --capacity only"],
    );
}

#[test]
fn demo_without_its_trace_says_how_to_make_it() {
    let o = Command::new(env!("CARGO_BIN_EXE_torch-arena"))
        .arg("demo")
        .env("TORCH_ARENA_DEMO_TRACE", "/no/such/demo.trace.gz")
        .output()
        .unwrap();
    assert_usage_error(
        &o,
        &[
            "TORCH_ARENA_DEMO_TRACE",
            "'/no/such/demo.trace.gz'",
            "scripts/make-demo-trace",
            "torch-arena demo --model",
        ],
    );
}

#[test]
fn demo_model_runs_the_modelled_loop() {
    // --steps alone implies --model, as callers of the old `demo --steps N` expect.
    for args in [
        &["demo", "--model", "--steps", "1"][..],
        &["demo", "--steps", "1"],
    ] {
        let o = torch_arena(args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = stdout(&o);
        assert!(out.contains("torch-arena summary, device ID 0"), "{out}");
        assert!(out.contains("\n1 step in "), "{out}");
    }
    let o = torch_arena(&["demo", "--model", "--capacity", "1GiB"]);
    assert_usage_error(&o, &["--capacity, --plot", "are for the trace replay"]);
    let o = torch_arena(&["demo", "--model", "--gpu-lag", "1ms"]);
    assert_usage_error(&o, &["--gpu-lag", "are for the trace replay"]);
}

// ---------------------------------------------------------------------------------------------
// Replays (need the trace bodies: load, replay, native, synth)

/// Fields every `--json` line has.
const JSON_FIELDS: &[&str] = &[
    "trace",
    "conf",
    "kind",
    "events",
    "seeded_events",
    "peak_requested_bytes",
    "peak_reserved_bytes",
    "native_peak_reserved_bytes",
    "fragmentation",
    "oom_event",
    "native_emulated_peak_reserved_bytes",
    "native_emulated_oom_event",
    "elapsed_s",
    "ns_per_event",
    "driver_calls",
];

#[test]
fn json_lines_have_every_field() {
    let o = torch_arena(&[
        "replay",
        "--json",
        "--native",
        "--capacity",
        "4GiB",
        "--conf",
        "",
        "--conf",
        "stitch:False",
        "synth:rmm-random:2000:4MiB",
        "synth:rmm-random:500:1MiB:7",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "one line per (trace, conf): {out}");
    for (n, line) in lines.iter().enumerate() {
        assert!(line.starts_with('{') && line.ends_with('}'), "{line}");
        for f in JSON_FIELDS {
            assert!(
                line.contains(&format!("\"{f}\": ")),
                "line {n} lacks {f}: {line}"
            );
        }
        assert!(line.contains("\"oom_event\": null"), "{line}");
        assert!(
            line.contains("\"native_emulated_peak_reserved_bytes\": "),
            "{line}"
        );
        assert!(
            !line.contains("\"native_emulated_peak_reserved_bytes\": null"),
            "{line}"
        );
        assert!(line.contains("\"kind\": \"fresh\""), "{line}");
    }
    assert!(lines[0].contains("\"trace\": \"synth:rmm-random:2000:4MiB\""));
    assert!(lines[0].contains("\"conf\": \"\""));
    assert!(lines[1].contains("\"conf\": \"stitch:False\""));
    assert!(lines[3].contains("\"trace\": \"synth:rmm-random:500:1MiB:7\""));
}

#[test]
fn human_table_has_a_row_per_allocator() {
    let o = torch_arena(&[
        "replay",
        "--native",
        "--conf",
        "stitch:False",
        "synth:rmm-random:1000:4MiB",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for s in [
        "synth:rmm-random:1000:4MiB: synthetic",
        "peak requested",
        "peak reserved",
        "fragmentation",
        "time/event",
        "driver calls",
        "native (emulated)",
        "arena (stitch:False)",
    ] {
        assert!(out.contains(s), "lacks {s:?}: {out}");
    }
}

/// `--native-conf`: one emulation per setting, after `--native`'s, in tables and JSON; an empty
/// setting is the defaults, which is what `--native` runs on a trace that recorded none.
#[test]
fn native_conf_adds_an_emulation_per_setting() {
    let trace = "synth:adversarial:4GiB";
    let o = torch_arena(&[
        "replay",
        "--capacity",
        "4GiB",
        "--native",
        "--native-conf",
        "",
        "--native-conf",
        "expandable_segments:True",
        "--json",
        trace,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let line = stdout(&o);
    let v = json::parse(line.trim()).expect("one JSON line");
    let em = v.get("native_emulated").arr();
    assert_eq!(em.len(), 3, "{line}");
    assert_eq!(em[0].get("conf"), &json::Json::Null, "{line}");
    assert_eq!(em[1].get("conf").str(), "");
    assert_eq!(em[2].get("conf").str(), "expandable_segments:True");
    // --native on a trace with no recorded settings runs the defaults: the same figures.
    for key in ["peak_reserved_bytes", "oom_event", "driver_calls"] {
        assert_eq!(em[0].get(key), em[1].get(key), "{key}: {line}");
    }
    // The first emulation is the one the native_emulated_* fields describe.
    assert_eq!(
        v.get("native_emulated_peak_reserved_bytes"),
        em[0].get("peak_reserved_bytes")
    );
    // The trace is built so that native's default policy runs out at its capacity.
    assert_ne!(em[1].get("oom_event"), &json::Json::Null, "{line}");

    let o = torch_arena(&[
        "replay",
        "--capacity",
        "4GiB",
        "--native-conf",
        "expandable_segments:True",
        "--native-conf",
        "max_split_size_mb:512",
        trace,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for row in [
        "native (expandable_segments:True)",
        "native (max_split_size_mb:512)",
    ] {
        assert!(out.contains(row), "lacks {row:?}: {out}");
    }
    assert!(!out.contains("native (emulated)"), "{out}");
}

#[test]
fn native_conf_refuses_a_bad_setting_before_replaying() {
    let o = torch_arena(&[
        "replay",
        "--native-conf",
        "max_split_size_mb:lots",
        "synth:rmm-random:100:1MiB",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("--native-conf 'max_split_size_mb:lots'"),
        "{err}"
    );
    assert!(err.contains("max_split_size_mb"), "{err}");
}

#[test]
fn adversarial_trace_runs_native_out_of_memory_but_not_the_arena() {
    let o = torch_arena(&[
        "replay",
        "--native",
        "--capacity",
        "4GiB",
        "--json",
        "synth:adversarial:4GiB",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("\"oom_event\": null"), "{out}");
    assert!(
        !out.contains("\"native_emulated_oom_event\": null"),
        "{out}"
    );
}

#[test]
fn out_of_memory_exits_2_with_a_report() {
    let o = torch_arena(&[
        "replay",
        "--capacity",
        "64MiB",
        "synth:rmm-random:2000:64MiB",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let out = stdout(&o);
    for s in [
        "OOM at event",
        "ran out of memory at event",
        "live:",
        "cached",
    ] {
        assert!(out.contains(s), "lacks {s:?}: {out}");
    }
}

#[test]
fn plots_are_written_as_svg_and_png() {
    let dir = scratch("plots");
    let svg = dir.join("both.svg");
    let png = dir.join("both.png");
    for file in [&svg, &png] {
        let o = torch_arena(&[
            "replay",
            "--native",
            "--conf",
            "",
            "--conf",
            "stitch:False",
            "--plot",
            file.to_str().unwrap(),
            "synth:rmm-random:1000:4MiB",
            "synth:rmm-random:300:1MiB",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg ") && text.trim_end().ends_with("</svg>"));
    for s in [
        "synth:rmm-random:1000:4MiB",
        "synth:rmm-random:300:1MiB",
        "requested",
        "native (emulated) reserved",
        "arena (defaults) reserved",
        "arena (stitch:False) reserved",
        "MiB",
    ] {
        assert!(text.contains(s), "svg lacks {s:?}");
    }
    assert_eq!(text.matches("<g>").count(), 2, "one panel per trace");
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert_eq!(&bytes[12..16], b"IHDR");

    // {trace} in the name: one file per trace.
    let pattern = dir.join("each-{trace}.svg");
    let o = torch_arena(&[
        "replay",
        "--plot",
        pattern.to_str().unwrap(),
        "synth:rmm-random:100:1MiB",
        "synth:rmm-random:200:1MiB",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for name in ["synth_rmm-random_100_1MiB", "synth_rmm-random_200_1MiB"] {
        assert!(dir.join(format!("each-{name}.svg")).is_file(), "{name}");
    }
}

#[test]
fn unreadable_trace_file_is_named_and_the_others_still_run() {
    let dir = scratch("corrupt");
    let bad = dir.join("garbage.trace");
    std::fs::write(&bad, b"\x00\x01 this is not a trace\n").unwrap();
    let o = torch_arena(&[
        "replay",
        "--json",
        bad.to_str().unwrap(),
        "synth:rmm-random:100:1MiB",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("garbage.trace"), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(out.lines().next().unwrap().contains("\"error\": "), "{out}");
    assert!(
        out.contains("\"trace\": \"synth:rmm-random:100:1MiB\""),
        "{out}"
    );
}

#[test]
fn synth_writes_a_trace_file() {
    // Needs torch_arena_lab::format::write too (see write_trace in crates/cli/src/convert.rs).
    let dir = scratch("synth");
    let file = dir.join("rmm.trace.gz");
    let o = torch_arena(&[
        "synth",
        "rmm-random",
        "--n",
        "300",
        "--max",
        "1MiB",
        "--seed",
        "3",
        "-o",
        file.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("wrote "));
    let o = torch_arena(&["replay", "--json", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let spec = torch_arena(&["replay", "--json", "synth:rmm-random:300:1MiB:3"]);
    let field = |s: &str, f: &str| {
        let at = s.find(&format!("\"{f}\": ")).unwrap();
        s[at..].split(',').next().unwrap().to_string()
    };
    for f in ["events", "peak_requested_bytes"] {
        assert_eq!(field(&stdout(&o), f), field(&stdout(&spec), f), "{f}");
    }
}

#[test]
fn convert_writes_a_trace_that_replays_the_same() {
    let dir = scratch("convert");
    let rmm = dir.join("log.csv");
    // An RMM log whose first free is of a block allocated before logging began (seeded).
    std::fs::write(
        &rmm,
        "Thread,Time,Action,Pointer,Size,Stream\n\
         1,10:00:00:000001,free,0x1000,4096,0x0\n\
         1,10:00:00:000002,allocate,0x2000,1048576,0x0\n\
         1,10:00:00:000003,allocate,0x3000,3145728,0x0\n\
         1,10:00:00:000004,free,0x2000,1048576,0x0\n",
    )
    .unwrap();
    let out = dir.join("log.trace.gz");
    let o = torch_arena(&[
        "convert",
        rmm.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("5 events (1 seeded)"), "{}", stdout(&o));
    let replay = |p: &PathBuf| {
        let o = torch_arena(&["replay", "--json", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let line = stdout(&o);
        let field = |k: &str| {
            let at = line.find(&format!("\"{k}\": ")).expect(k) + k.len() + 4;
            line[at..]
                .split([',', '}'])
                .next()
                .unwrap()
                .trim()
                .to_string()
        };
        (
            field("events"),
            field("seeded_events"),
            field("peak_requested_bytes"),
            field("peak_reserved_bytes"),
        )
    };
    assert_eq!(replay(&rmm), replay(&out));
    // The seeded 4 KiB block is freed before the others are allocated.
    assert_eq!(replay(&out).2, (1048576 + 3145728).to_string());
    assert_usage_error(
        &torch_arena(&["convert", rmm.to_str().unwrap()]),
        &["-o FILE"],
    );
    assert_usage_error(&torch_arena(&["convert"]), &["which trace"]);
}

// ---------------------------------------------------------------------------------------------
// The timing model: --repeat, --gpu-lag, --driver-costs

/// The number after `"key": ` at or after byte `from` of `line`.
fn num_after(line: &str, key: &str, from: usize) -> f64 {
    let pat = format!("\"{key}\": ");
    let at = line[from..]
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key}: {line}"))
        + from;
    let rest = &line[at + pat.len()..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end]
        .parse()
        .unwrap_or_else(|_| panic!("{key}: {}", &rest[..end]))
}

/// The `"key": {...}` object of call counts at or after byte `from`, as (name, count) pairs.
fn calls_after(line: &str, key: &str, from: usize) -> Vec<(String, f64)> {
    let pat = format!("\"{key}\": {{");
    let at = line[from..].find(&pat).unwrap() + from + pat.len();
    let body = &line[at..at + line[at..].find('}').unwrap()];
    body.split(", ")
        .map(|kv| {
            let (k, v) = kv.split_once(": ").unwrap();
            (k.trim_matches('"').to_string(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn timing_options_reach_the_json() {
    let dir = scratch("timing");
    let costs = dir.join("costs.txt");
    std::fs::write(
        &costs,
        "# slower maps\ncuMemMap = 10\ncudaMalloc: 100\ncuMemCreate per GiB = 40\n\
         cudaMalloc per GiB = 70\n",
    )
    .unwrap();
    let o = torch_arena(&[
        "replay",
        "--json",
        "--native",
        "--repeat",
        "3",
        "--gpu-lag",
        "500us",
        "--driver-costs",
        costs.to_str().unwrap(),
        "--capacity",
        "80GiB",
        "synth:rmm-random:2000:64MiB",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let line = stdout(&o);
    let line = line.trim_end();
    assert_eq!(num_after(line, "gpu_lag_us", 0), 500.0);
    assert_eq!(num_after(line, "repeat", 0), 3.0);
    assert!(line.contains(&format!("\"driver_costs\": \"{}\"", costs.display())));
    // Counts by kind add up to driver_calls, and modelled time is Σ count × latency, with grants
    // priced per handle and the per-GiB terms on the bytes the calls covered.
    // The file's figures, and the defaults (measured on an H200) for the rest.
    let latency = |k: &str| match k {
        "cuMemAddressReserve" => 3.25,
        "cuMemAddressFree" => 2.1,
        "cuMemCreate" => 13.54,
        "cuMemRelease" => 11.2,
        "cuMemMap" => 10.0,
        "cuMemUnmap" => 18.21,
        "cuMemSetAccess" => 33.04,
        "cuMemAlloc" => 100.0,
        "cuMemFree" => 34.77,
        "cuEventCreate" => 1.03,
        "cuEventDestroy" => 0.55,
        "cuEventRecord" => 1.53,
        "cuEventQuery" => 0.62,
        "cuEventSynchronize" => 4.58,
        "cuStreamSynchronize" => 0.63,
        "cuCtxSynchronize" => 0.73,
        "cuMemGetInfo" => 5.81,
        k => panic!("no latency for {k}"),
    };
    for prefix in ["", "native_"] {
        let calls = calls_after(line, &format!("{prefix}driver_calls_by_kind"), 0);
        assert_eq!(calls.len(), 17, "{calls:?}");
        let total: f64 = calls.iter().map(|(_, n)| n).sum();
        assert_eq!(total, num_after(line, &format!("{prefix}driver_calls"), 0));
        assert!(total > 0.0);
        let covered = calls_after(line, &format!("{prefix}driver_calls_covered"), 0);
        let cov = |k: &str| covered.iter().find(|(n, _)| n == k).unwrap().1;
        let grants = cov("set_access_handles")
            .max(calls.iter().find(|(k, _)| k == "cuMemSetAccess").unwrap().1);
        let per_call: f64 = calls
            .iter()
            .filter(|(k, _)| k != "cuMemSetAccess")
            .map(|(k, n)| n * latency(k))
            .sum();
        let gib = |b: f64| b / (1u64 << 30) as f64;
        let sized = gib(cov("mem_create_bytes")) * 40.0
            + gib(cov("mem_alloc_bytes")) * 70.0
            + gib(cov("mem_release_bytes")) * 375.5
            + gib(cov("mem_free_bytes")) * 358.7;
        let secs = (per_call + grants * latency("cuMemSetAccess") + sized) / 1e6;
        assert!(sized > 0.0, "{prefix}: the per-GiB terms priced nothing");
        let got = num_after(line, &format!("{prefix}modelled_driver_s"), 0);
        assert!((got - secs).abs() < 1e-9, "{prefix}: {got} vs {secs}");
    }
    // Three steps each, for the arena and the emulation.
    for key in ["steps", "native_steps"] {
        let at = line.find(&format!("\"{key}\": [")).unwrap();
        let body = &line[at..at + line[at..].find("}]").unwrap()];
        assert_eq!(body.matches("\"peak_reserved_bytes\"").count(), 3, "{key}");
    }
    assert!(line.contains("\"native_driver_calls_from\": \"emulated\""));
}

#[test]
fn timing_options_are_checked() {
    let t = "synth:rmm-random:10:1MiB";
    let o = torch_arena(&["replay", "--gpu-lag", "5 parsecs", t]);
    assert_usage_error(
        &o,
        &[
            "invalid value '5 parsecs' for '--gpu-lag <DURATION>'",
            "is not a duration",
            "5ms",
        ],
    );
    let o = torch_arena(&["replay", "--repeat", "0", t]);
    assert_usage_error(
        &o,
        &["invalid value '0' for '--repeat <N>'", "must be from 1"],
    );
    let o = torch_arena(&["replay", "--driver-costs", "/no/such/costs", t]);
    assert_usage_error(&o, &["driver costs file '/no/such/costs'"]);
    let dir = scratch("bad-costs");
    let costs = dir.join("costs.txt");
    std::fs::write(&costs, "cuMemFrob = 3\n").unwrap();
    let o = torch_arena(&["replay", "--driver-costs", costs.to_str().unwrap(), t]);
    assert_usage_error(&o, &["unknown call 'cuMemFrob'", "cuMemCreate"]);
}

#[test]
fn gpu_lag_zero_is_the_replay_without_a_lag_model() {
    // The same figures as the replay always gave: no stall, and the peaks and calls of a lag-0
    // run do not depend on the per-event clock.
    let args = |lag: &'static str| {
        vec![
            "replay",
            "--json",
            "--gpu-lag",
            lag,
            "--capacity",
            "2GiB",
            "synth:rmm-random:3000:128MiB",
        ]
    };
    let a = stdout(&torch_arena(&args("0")));
    assert_eq!(num_after(&a, "modelled_stall_s", 0), 0.0);
    let b = stdout(&torch_arena(&args("0ms")));
    for k in ["peak_reserved_bytes", "driver_calls", "modelled_driver_s"] {
        assert_eq!(num_after(&a, k, 0), num_after(&b, k, 0), "{k}");
    }
}

#[test]
fn repeat_shows_a_steady_state_table() {
    let o = torch_arena(&[
        "replay",
        "--native",
        "--repeat",
        "2",
        "synth:rmm-random:1000:4MiB",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for s in [
        "replayed 2 times in a row (replay steps 1–2, each the whole trace); GPU lag 2.00 ms",
        "driver time",
        "stall",
        "steady state",
        "last step: memory calls",
    ] {
        assert!(out.contains(s), "lacks {s:?}: {out}");
    }
}

#[test]
fn demo_runs_from_a_copy_of_the_command_anywhere() {
    // The demo trace is built into the command: a copy in a folder outside the source tree,
    // run from there, replays it (the wheel installs exactly such a copy; the installed-wheel
    // test is tests/python/test_demo_installed.py).
    let dir = scratch("demo-anywhere");
    let exe = dir.join("torch-arena");
    std::fs::copy(env!("CARGO_BIN_EXE_torch-arena"), &exe).unwrap();
    // Another test thread that forks between the copy's write and its close hands the child a
    // descriptor open for writing until that child execs: running the copy then fails with
    // ETXTBSY ("Text file busy"), a race of the test harness, not of the command. Try again.
    let mut tries = 0;
    let o = loop {
        let run = Command::new(&exe)
            .args(["demo", "--no-progress"])
            .current_dir(&dir)
            .env_remove("TORCH_ARENA_DEMO_TRACE")
            .env_remove("TORCH_ARENA_CONF")
            .output();
        match run {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.unwrap(),
        }
    };
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for s in [
        "the demo trace built into torch-arena",
        "replayed 3 times in a row (replay steps 1–3, each the whole trace)",
        "native (emulated)",
        "Memory driver calls in the last replay step",
        "the same for native (emulated)",
    ] {
        assert!(out.contains(s), "lacks {s:?}: {out}");
    }
}

#[test]
fn plots_show_capacity_oom_seeded_and_driver_time() {
    // The adversarial trace at its own capacity: the native emulation runs out of memory, the
    // capacity line is inside the plot, and both allocators' driver time is drawn.
    let dir = scratch("plot-marks");
    let svg = dir.join("adv.svg");
    let o = torch_arena(&[
        "replay",
        "--native",
        "--capacity",
        "1GiB",
        "--plot",
        svg.to_str().unwrap(),
        "synth:adversarial:1GiB",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(
        text.matches("<line class=\"capacity\"").count(),
        1,
        "{text}"
    );
    assert!(text.contains("capacity 1 GiB"));
    assert_eq!(text.matches("<line class=\"oom\"").count(), 1, "{text}");
    assert!(text.contains(">OOM: native (emulated)</text>"));
    assert_eq!(text.matches("class=\"driver-time\"").count(), 2);
    assert!(text.contains("modelled driver time: native (emulated)"));
    // An arena out-of-memory is marked too, in its own colour.
    let svg = dir.join("oom.svg");
    let o = torch_arena(&[
        "replay",
        "--capacity",
        "256MiB",
        "--plot",
        svg.to_str().unwrap(),
        "synth:rmm-random:2000:64MiB",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains(">OOM: arena (defaults)</text>"), "{text}");
}

#[test]
fn many_traces_make_an_overview_chart() {
    let dir = scratch("overview");
    let svg = dir.join("all.svg");
    let traces: Vec<String> = (1..=8)
        .map(|s| format!("synth:rmm-random:300:4MiB:{s}"))
        .collect();
    let mut args = vec!["replay", "--native", "--plot", svg.to_str().unwrap()];
    args.extend(traces.iter().map(String::as_str));
    let o = torch_arena(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("overview of 8 traces"),
        "{}",
        stderr(&o)
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(text.matches("<g>").count(), 0, "no stacked panels");
    for t in &traces {
        assert!(text.contains(&format!(">{t}</text>")), "{t}");
    }
    assert!(text.contains("peak reserved, ours / native"));
    assert!(text.contains("modelled driver time, ours / native"));
}

/// `--live`: what is live by site at the peak, or where the arena ran out of memory (issue 15
/// item 4, the CLI half), in the table and in JSON.
#[test]
fn live_by_site_at_the_peak_or_at_the_oom() {
    let o = torch_arena(&[
        "replay",
        "synth:adversarial:16GiB",
        "--capacity",
        "12GiB",
        "--live=3",
        "--no-progress",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("live by site at the out-of-memory of event"),
        "{out}"
    );
    assert!(out.contains("in 2048 allocations"), "{out}");
    // Bytes for people, never a raw count of bytes.
    assert!(out.contains(" GiB "), "{out}");

    let o = torch_arena(&[
        "replay",
        "synth:rmm-random:2000:64MiB:3",
        "--live",
        "--json",
        "--no-progress",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let line = stdout(&o);
    assert!(
        line.contains("\"live_at\":\"at the peak of requested bytes\"")
            || line.contains("\"live_at\": \"at the peak of requested bytes\""),
        "{line}"
    );
    assert!(line.contains("\"events_applied\""), "{line}");

    let o = torch_arena(&["replay", "synth:rmm-random:10:1MiB", "--live=0"]);
    assert_usage_error(&o, &["invalid value '0' for '--live[=<N>]'", "at least 1"]);
}

// ---------------------------------------------------------------------------------------------
// fit

/// `fit --json`: every field, one object per trace in the order given, and a minimum that
/// `replay --capacity` confirms: the arena fits there and runs out of memory one page below (the
/// precision on a trace this small is one page); native's emulation fits there too.
#[test]
fn fit_reports_minimums_that_replay_confirms() {
    let traces = ["synth:rmm-random:400:6MiB:3", "synth:adversarial:512MiB"];
    let mut args = vec!["fit", "--json", "--no-progress", "--repeat", "2"];
    args.extend(traces);
    let o = torch_arena(&args);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    let lines: Vec<json::Json> = stdout(&o)
        .lines()
        .map(|l| json::parse(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 2);
    for (line, trace) in lines.iter().zip(traces) {
        assert_eq!(line.get("path").str(), trace);
        assert_eq!(line.get("repeat").u64(), 2);
        let peak = line.get("peak_requested_bytes").u64();
        let fits = line.get("fit").arr();
        let confs: Vec<(&str, &str)> = fits
            .iter()
            .map(|f| (f.get("allocator").str(), f.get("conf").str()))
            .collect();
        assert_eq!(
            confs,
            [
                ("arena", ""),
                ("native", ""),
                ("native", "expandable_segments:True")
            ]
        );
        for f in fits {
            let min = f.get("min_capacity_bytes").u64();
            assert!(min >= peak && min % (2 << 20) == 0, "{f:?}");
            assert!(f.get("trials").u64() > 1);
            let ratio = f.get("ratio_to_requested").f64();
            assert!((ratio - min as f64 / peak as f64).abs() < 1e-9);
            let step = f.get("last_step");
            for k in [
                "memory_driver_calls",
                "driver_calls",
                "modelled_driver_s",
                "modelled_stall_s",
            ] {
                assert!(step.has(k), "{k}: {step:?}");
            }
        }
        let best = line.get("best_native_bytes").u64();
        let arena = &fits[0];
        let saved = arena.get("saved_vs_best_native_bytes").f64() as i64;
        assert_eq!(
            saved,
            best as i64 - arena.get("min_capacity_bytes").u64() as i64
        );
        let replay_at = |capacity: u64| {
            let cap = format!("{capacity}B");
            torch_arena(&[
                "replay",
                trace,
                "--capacity",
                &cap,
                "--gpu-lag",
                "0",
                "--repeat",
                "2",
                "--native",
                "--json",
                "--no-progress",
            ])
        };
        let min = arena.get("min_capacity_bytes").u64();
        assert_eq!(replay_at(min).status.code(), Some(0), "{trace} at {min}");
        assert_eq!(
            replay_at(min - (2 << 20)).status.code(),
            Some(2),
            "{trace} below {min}"
        );
        let native_min = fits[1].get("min_capacity_bytes").u64();
        let r = json::parse(stdout(&replay_at(native_min)).trim()).unwrap();
        assert_eq!(
            r.get("native_emulated_oom_event"),
            &json::Json::Null,
            "{trace}"
        );
    }
    // The adversarial trace is built so that native's default runs out where the arena fits.
    let adversarial = lines[1].get("fit").arr();
    assert!(
        adversarial[0].get("min_capacity_bytes").u64()
            < adversarial[1].get("min_capacity_bytes").u64()
    );
}

#[test]
fn fit_table_names_every_allocator_and_setting() {
    let o = torch_arena(&[
        "fit",
        "synth:rmm-random:200:4MiB",
        "--no-progress",
        "--native-conf",
        "max_split_size_mb:20",
        "--native-conf",
        "roundup_power2_divisions:[1:4,>:2]",
        "--conf",
        "handle_mb:2",
    ]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    let out = stdout(&o);
    for s in [
        "min capacity",
        "x requested",
        "vs best native",
        "memory calls",
        "handle_mb:2",
        "max_split_size_mb:20",
        "roundup_power2_divisions:[1:4,>:2]",
    ] {
        assert!(out.contains(s), "{s}: {out}");
    }
    assert!(
        !out.contains("expandable_segments"),
        "only the settings given: {out}"
    );
}

/// `fit --plot`: one panel per trace with each allocator's curve and where it starts to fit;
/// `{trace}` writes a file per trace; more than 6 traces make an overview; not SVG is refused.
#[test]
fn fit_plot_draws_each_allocator_near_its_limit() {
    let dir = scratch("fit-plot");
    let one = dir.join("one.svg");
    let o = torch_arena(&[
        "fit",
        "synth:rmm-random:200:4MiB",
        "--no-progress",
        "--plot",
        one.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    let svg = std::fs::read_to_string(&one).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    for s in [
        "synth:rmm-random:200:4MiB (peak requested",
        "arena (defaults): fits from",
        "native (defaults): fits from",
        "native (expandable_segments:True): fits from",
        "device capacity (GiB)",
    ] {
        assert!(svg.contains(s), "lacks {s:?}");
    }
    // A file per trace.
    let per = dir.join("{trace}.svg");
    let o = torch_arena(&[
        "fit",
        "synth:rmm-random:100:2MiB:1",
        "synth:rmm-random:100:2MiB:2",
        "--no-progress",
        "--plot",
        per.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    for seed in [1, 2] {
        let f = dir.join(format!("synth_rmm-random_100_2MiB_{seed}.svg"));
        assert!(f.exists(), "{f:?} not written");
    }
    // Seven traces: the overview.
    let many = dir.join("many.svg");
    let traces: Vec<String> = (1..=7)
        .map(|k| format!("synth:rmm-random:60:2MiB:{k}"))
        .collect();
    let mut args = vec!["fit", "--no-progress", "--plot", many.to_str().unwrap()];
    args.extend(traces.iter().map(String::as_str));
    let o = torch_arena(&args);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    let svg = std::fs::read_to_string(&many).unwrap();
    assert!(
        svg.contains("over peak requested (7 traces)"),
        "overview title"
    );
    // Not SVG: refused before any work.
    let o = torch_arena(&["fit", "--plot", "out.png", "synth:rmm-random:100:2MiB"]);
    assert_usage_error(&o, &["fit --plot: 'out.png' must end in .svg"]);
}

#[test]
fn fit_usage_errors_name_what_was_wrong() {
    assert_usage_error(&torch_arena(&["fit"]), &["fit: no trace given"]);
    assert_usage_error(
        &torch_arena(&[
            "fit",
            "synth:rmm-random:10:1MiB",
            "--native-conf",
            "max_split_mb:64",
        ]),
        &[
            "--native-conf 'max_split_mb:64'",
            "unknown setting 'max_split_mb'",
            "max_split_size_mb",
        ],
    );
    assert_usage_error(
        &torch_arena(&[
            "fit",
            "synth:rmm-random:10:1MiB",
            "--native-conf",
            "max_split_size_mb:8",
        ]),
        &["bad value '8' for 'max_split_size_mb'", "at least 20"],
    );
    assert_usage_error(
        &torch_arena(&["fit", "synth:rmm-random:10:1MiB", "-j", "0"]),
        &[
            "invalid value '0' for '--jobs <N>'",
            "must be from 1 to 1024",
        ],
    );
    assert_usage_error(
        &torch_arena(&["fit", "synth:rmm-random:10:1MiB", "--native"]),
        &[
            "unexpected argument '--native'",
            "a similar argument exists: '--native-conf'",
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Interrupted writes (issue 37 item 5): every file the command writes replaces the old one whole
// or not at all.

/// Runs torch-arena with every file it writes limited to `limit` bytes (`RLIMIT_FSIZE`, with
/// `SIGXFSZ` ignored): a write past the limit fails (`EFBIG`) as a write to a full disk fails
/// (`ENOSPC`). Pipes (stdout, stderr) are not files and are not limited.
fn torch_arena_with_file_limit(args: &[&str], limit: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(env!("CARGO_BIN_EXE_torch-arena"));
    c.args(args)
        .env_remove("TORCH_ARENA_DEMO_TRACE")
        .env_remove("TORCH_ARENA_CONF");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        c.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let r = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c.output().expect("run torch-arena")
}

/// The names in `dir`, sorted.
fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A write that fails part-way (the disk fills up) leaves the old file as it was and no partial
/// file beside it, for each file the command writes: `synth -o`, `convert -o`, `--plot` (SVG,
/// PNG, one file per trace, the overview chart; `demo --plot` writes through the same function).
/// Seen failing before the fix:
/// each target was left truncated to the limit.
#[test]
fn a_write_that_fails_keeps_the_old_file_and_leaves_no_partial_one() {
    let dir = scratch("write-fails");
    let old = b"an old file that must survive\n";
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let synth8: Vec<String> = (1..=8)
        .map(|s| format!("synth:rmm-random:200:4MiB:{s}"))
        .collect();
    let mut overview = vec![
        "replay".to_string(),
        "--no-progress".into(),
        "--plot".into(),
    ];
    overview.push(path("all.svg"));
    overview.extend(synth8.iter().cloned());
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "s.trace.gz",
            ["synth", "rmm-random", "--n", "20000", "--max", "1MiB", "-o"]
                .map(String::from)
                .into_iter()
                .chain([path("s.trace.gz")])
                .collect(),
        ),
        (
            "s.trace",
            ["synth", "adversarial", "--capacity", "16GiB", "-o"]
                .map(String::from)
                .into_iter()
                .chain([path("s.trace")])
                .collect(),
        ),
        (
            "c.trace.gz",
            vec![
                "convert".into(),
                "synth:rmm-random:20000:1MiB".into(),
                "-o".into(),
                path("c.trace.gz"),
            ],
        ),
        (
            "p.svg",
            vec![
                "replay".into(),
                "synth:rmm-random:500:4MiB".into(),
                "--no-progress".into(),
                "--plot".into(),
                path("p.svg"),
            ],
        ),
        (
            "p.png",
            vec![
                "replay".into(),
                "synth:rmm-random:500:4MiB".into(),
                "--no-progress".into(),
                "--plot".into(),
                path("p.png"),
            ],
        ),
        (
            "synth_rmm-random_500_4MiB.svg",
            vec![
                "replay".into(),
                "synth:rmm-random:500:4MiB".into(),
                "--no-progress".into(),
                "--plot".into(),
                path("{trace}.svg"),
            ],
        ),
        ("all.svg", overview),
    ];
    for (target, args) in &cases {
        let file = dir.join(target);
        std::fs::write(&file, old).unwrap();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = torch_arena_with_file_limit(&args, 1024);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{target}: {err}");
        assert!(
            err.contains("File too large") && err.contains(target),
            "{target}: the error names neither the cause nor the file: {err}"
        );
        assert_eq!(
            std::fs::read(&file).unwrap(),
            old,
            "{target}: the old file was overwritten"
        );
        let mut expected: Vec<String> = cases[..]
            .iter()
            .map(|(t, _)| t.to_string())
            .take_while(|t| t != target)
            .chain([target.to_string()])
            .collect();
        expected.sort();
        assert_eq!(listing(&dir), expected, "{target}: a partial file was left");
    }
    // Without the limit the same commands replace the old files.
    for (target, args) in &cases[..2] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = torch_arena(&args);
        assert_eq!(o.status.code(), Some(0), "{target}: {}", stderr(&o));
        assert_ne!(std::fs::read(dir.join(target)).unwrap(), old, "{target}");
    }
}

/// `synth -o` killed (SIGKILL) while it writes leaves the old file intact: it writes a temporary
/// file beside the target and renames it only when complete. Seen failing before the fix: the
/// target was truncated when the write began, and the kill left a broken gzip stream.
#[test]
fn a_write_killed_part_way_leaves_the_old_file_intact() {
    let dir = scratch("write-killed");
    let target = dir.join("t.trace.gz");
    let t = target.to_str().unwrap();
    let o = torch_arena(&[
        "synth",
        "rmm-random",
        "--n",
        "100",
        "--max",
        "1MiB",
        "-o",
        t,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let old = std::fs::read(&target).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_torch-arena"))
        .args([
            "synth",
            "rmm-random",
            "--n",
            "200000",
            "--max",
            "1MiB",
            "-o",
            t,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the write has begun: a temporary file appears beside the target or (writing in
    // place) the target changes. Compressing 400,000 events takes far longer than this poll.
    let began = loop {
        if child.try_wait().unwrap().is_some() {
            break false;
        }
        let beside = listing(&dir).len() > 1;
        let changed = std::fs::metadata(&target).map_or(true, |m| m.len() != old.len() as u64);
        if beside || changed {
            break true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert!(began, "the write ended before it could be interrupted");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        std::fs::read(&target).unwrap() == old,
        "the old file was overwritten by a partial one"
    );
    // What the kill left is a hidden temporary file, never the target.
    for name in listing(&dir) {
        assert!(
            name == "t.trace.gz" || name.starts_with(".t.trace.gz.tmp-"),
            "{name}"
        );
    }
    let o = torch_arena(&["replay", "--json", "--no-progress", t]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A `trace:PATH` recording ended by SIGKILL (issue 37 item 6) replays: the complete lines are
/// replayed and a warning says what was dropped. Seen failing before the fix: replay refused the
/// whole file ("'a' needs ... fields").
#[test]
fn a_recording_killed_mid_line_replays_its_complete_lines() {
    let dir = scratch("killed-recording");
    let rec = dir.join("rec.trace");
    let conf = format!("device:sim,trace:{}", rec.display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_torch-arena"))
        .args(["demo", "--model", "--steps", "1000000", "--conf", &conf])
        .env_remove("TORCH_ARENA_CONF")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The recorder writes its 256 KiB buffer whenever it fills, not at line ends: wait for a few.
    loop {
        assert!(child.try_wait().unwrap().is_none(), "the run ended");
        if std::fs::metadata(&rec).is_ok_and(|m| m.len() > 1 << 20) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let mut bytes = std::fs::read(&rec).unwrap();
    if bytes.ends_with(b"\n") {
        // The kill fell on a line end: cut the last line as a full disk would.
        bytes.pop();
        std::fs::write(&rec, &bytes).unwrap();
    }
    let o = torch_arena(&["replay", "--json", "--no-progress", rec.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.starts_with("torch-arena: warning: ")
            && err.contains("rec.trace:")
            && err.contains("the trace was cut off")
            && err.contains("1 incomplete line at the end"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(stdout(&o).contains("\"events\": "), "{}", stdout(&o));
}

/// With stdout on a full disk (issue 37 item 7), every command that prints says so in one line
/// and exits 1: `replay --json`, a table, `demo`, `demo --model`, `synth`, help. Seen failing
/// before the fix: a panic's backtrace and exit 101.
#[test]
fn a_full_stdout_is_one_line_of_error_and_exit_1() {
    let dir = scratch("full-stdout");
    let synth_out = dir.join("s.trace");
    for args in [
        &[
            "replay",
            "--json",
            "--no-progress",
            "synth:rmm-random:100:1MiB",
        ][..],
        &["replay", "--no-progress", "synth:rmm-random:100:1MiB"],
        &[
            "replay",
            "--no-progress",
            "--repeat",
            "2",
            "--live",
            "synth:adversarial:1GiB",
        ],
        &["demo", "--no-progress", "--repeat", "1"],
        &["demo", "--model", "--steps", "1"],
        &["fit", "--no-progress", "synth:rmm-random:100:1MiB"],
        &[
            "fit",
            "--no-progress",
            "--json",
            "synth:rmm-random:100:1MiB",
        ],
        &["synth", "adversarial", "-o", synth_out.to_str().unwrap()],
        &["--help"],
        &["--version"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_torch-arena"))
            .args(args)
            .env_remove("TORCH_ARENA_DEMO_TRACE")
            .env_remove("TORCH_ARENA_CONF")
            .stdout(full)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(
            err, "torch-arena: error writing to stdout: No space left on device (os error 28)\n",
            "{args:?}"
        );
    }
}

/// `demo --model`'s table stays aligned past 10,000 MiB (issue 37 item 12: its columns shifted
/// at step 7, where the peak passes 10 GiB): every row has its `|` where the header has them,
/// and sizes are written for people. Seen failing before the fix (`10505.5 MiB` overflowed).
#[test]
fn demo_model_columns_stay_aligned_past_10_gib() {
    let o = torch_arena(&["demo", "--model", "--steps", "7"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let bars = |l: &str| -> Vec<usize> {
        l.chars()
            .enumerate()
            .filter(|&(_, c)| c == '|')
            .map(|(i, _)| i)
            .collect()
    };
    let header = out.lines().find(|l| l.starts_with(" step |")).expect(&out);
    let rows: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with(" step |"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(rows.len(), 7, "{out}");
    for r in &rows {
        assert_eq!(bars(r), bars(header), "\n{header}\n{r}");
    }
    assert!(rows[6].contains(" GiB "), "{}", rows[6]);
}

/// The hostile-sizes issue, item 2, CLI side (the library side is in `tests/hostile_sizes.rs`):
/// a one-line trace asking for 1 EiB took the process down (an abort while
/// building the page table). It is an out-of-memory replay now: exit status 2, a report that
/// names the event, and a small process.
#[test]
fn the_cli_replays_an_absurd_one_line_trace_as_an_oom() {
    let dir = std::env::temp_dir().join(format!("ta-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("absurd.trace");
    std::fs::write(
        &path,
        "torch-arena-trace 1\na 0x1 1152921504606846976 0 0 0\na 0x2 4096 18446744073709551615 0 1\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_torch-arena"))
        .arg("replay")
        .arg(&path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("out of memory at event 0"), "{text}");
    assert!(
        text.contains("CUDA out of memory. Tried to allocate"),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// merge (the files of a real two-rank run: tests/python/test_ranks.py)

/// An explain report of `rank` of two with `params` bytes of parameters.
fn explain_file(dir: &std::path::Path, name: &str, rank: u64, params: u64) -> String {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            r#"{{"rank": {rank}, "world_size": 2, "categories": {{"parameters": {params},
            "gradients": 0, "optimizer_state": 0, "activations": 0, "held_graphs": 0,
            "other": 0}}, "remedies": [], "warnings": []}}"#
        ),
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn merge_tables_the_ranks_and_their_imbalance() {
    let dir = scratch("merge");
    let a = explain_file(&dir, "a.json", 0, 1 << 20);
    let b = explain_file(&dir, "b.json", 1, 3 << 20);
    let o = torch_arena(&["merge", &b, &a]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("2 of 2 rank(s)"), "{out}");
    assert!(
        out.contains(
            "imbalance: rank 1 has the most total, 3.00 MiB: 1.50x the mean of 2.00 MiB \
             (least: rank 0, 1.00 MiB)"
        ),
        "{out}"
    );
    let o = torch_arena(&["merge", "--json", &a, &b]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let line = stdout(&o);
    assert!(
        line.starts_with(r#"{"kind": "explain", "world_size": 2, "#),
        "{line}"
    );
    assert!(
        line.contains(r#""imbalance": {"column": "total", "rank": 1, "ratio": 1.5}"#),
        "{line}"
    );
}

#[test]
fn merge_names_what_is_wrong_with_its_files() {
    let dir = scratch("merge-bad");
    let a = explain_file(&dir, "a.json", 0, 1);
    let o = torch_arena(&["merge", &a, &a]);
    assert_usage_error(&o, &["merge: rank 0 appears twice", "a.json"]);
    let other = dir.join("other.json");
    std::fs::write(&other, r#"{"step": 3}"#).unwrap();
    let o = torch_arena(&["merge", &a, other.to_str().unwrap()]);
    assert_usage_error(
        &o,
        &["other.json: neither an explain report", "leak report"],
    );
    let o = torch_arena(&["merge"]);
    assert_usage_error(&o, &["required", "<FILE>"]);
}

// ---------------------------------------------------------------------------------------------
// diff

/// Two hand-built runs in torch-arena's trace format, each a file in `dir`. At the end, A holds
/// 2 x 1000 B at train.py:10 and 300 B at model.py:5 (its peak, 7,300 B, also held 5,000 B at
/// cache.py:7); B holds 3 x 1000 B at train.py:10, 4,096 B at cache.py:7 and 512 B from no site
/// (its peak is its end, 7,608 B).
fn diff_pair(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    let head = "torch-arena-trace 1\nsite 1 train.py:10 in forward\nsite 2 model.py:5 in step\n\
                site 3 cache.py:7 in get\n";
    let a = dir.join("a.trace");
    std::fs::write(
        &a,
        format!(
            "{head}a 0x1000 1000 0 0 1 1\na 0x2000 1000 0 0 2 1\na 0x3000 300 0 0 3 2\n\
             a 0x4000 5000 0 0 4 3\nf 0x4000 5000 0 0 5\n"
        ),
    )
    .unwrap();
    let b = dir.join("b.trace");
    std::fs::write(
        &b,
        format!(
            "{head}a 0x1000 1000 0 0 1 1\na 0x2000 1000 0 0 2 1\na 0x5000 1000 0 0 3 1\n\
             a 0x6000 4096 0 0 4 3\na 0x7000 512 0 0 5 0\n"
        ),
    )
    .unwrap();
    (a, b)
}

/// A JSON number that may be negative.
fn int(j: &json::Json) -> i64 {
    match j {
        json::Json::Num(n) => n.parse().unwrap_or_else(|_| panic!("not an integer: {n}")),
        other => panic!("not a number: {other:?}"),
    }
}

/// The rows of a JSON list of diff rows: (key, a_bytes, b_bytes, delta_bytes, a_count, b_count,
/// delta_count).
fn diff_rows(list: &json::Json) -> Vec<(String, i64, i64, i64, i64, i64, i64)> {
    list.arr()
        .iter()
        .map(|r| {
            (
                r.get("key").str().to_string(),
                int(r.get("a_bytes")),
                int(r.get("b_bytes")),
                int(r.get("delta_bytes")),
                int(r.get("a_count")),
                int(r.get("b_count")),
                int(r.get("delta_count")),
            )
        })
        .collect()
}

fn row(key: &str, v: [i64; 6]) -> (String, i64, i64, i64, i64, i64, i64) {
    (key.to_string(), v[0], v[1], v[2], v[3], v[4], v[5])
}

#[test]
fn diff_of_two_runs_names_what_grew_and_shrank_by_how_much() {
    let dir = scratch("diff-pair");
    let (a, b) = diff_pair(&dir);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());

    // At the end of each run, as JSON: every figure exact.
    let o = torch_arena(&["diff", a, b, "--at", "end", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 1, "{out}");
    let v = json::parse(out.trim()).unwrap();
    assert_eq!(v.get("by").str(), "site");
    for (side, path, live, count, peak) in [("a", a, 2300, 3, 7300), ("b", b, 7608, 5, 7608)] {
        let s = v.get(side);
        assert_eq!(s.get("path").str(), path);
        assert_eq!(s.get("source").str(), "arena-v1");
        assert_eq!(s.get("moment").str(), "end");
        assert_eq!(s.get("events").u64(), 5);
        assert_eq!(s.get("events_applied").u64(), 5);
        assert_eq!(s.get("step"), &json::Json::Null);
        assert_eq!(
            (s.get("live_bytes").u64(), s.get("live_count").u64()),
            (live, count)
        );
        assert_eq!(s.get("peak_requested_bytes").u64(), peak);
    }
    assert_eq!(int(v.get("delta_live_bytes")), 7608 - 2300);
    assert_eq!(int(v.get("delta_live_count")), 2);
    assert_eq!(int(v.get("delta_peak_requested_bytes")), 7608 - 7300);
    assert_eq!(
        diff_rows(v.get("grew")),
        vec![
            row("cache.py:7 in get", [0, 4096, 4096, 0, 1, 1]),
            row("train.py:10 in forward", [2000, 3000, 1000, 2, 3, 1]),
            row("unknown", [0, 512, 512, 0, 1, 1]),
        ]
    );
    assert_eq!(
        diff_rows(v.get("shrank")),
        vec![row("model.py:5 in step", [300, 0, -300, 1, 0, -1])]
    );
    assert_eq!(
        (
            v.get("grew_groups").u64(),
            v.get("shrank_groups").u64(),
            v.get("unchanged_groups").u64()
        ),
        (3, 1, 0)
    );
    // The groupings no trace records are named, with why.
    let why = v.get("unavailable");
    assert!(
        why.get("category")
            .str()
            .contains("a torch-arena trace records")
    );
    assert!(why.get("module").str().contains("nn.Module"));

    // The same as text, at each run's peak (the default): cache.py's 5,000 B at A's peak are
    // 4,096 B at B's.
    let o = torch_arena(&["diff", a, b]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let line = |needle: &str| {
        out.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}: {out}"))
            .to_string()
    };
    assert!(
        line("A: ").contains("at the peak of the run: after 4 of 5 events"),
        "{out}"
    );
    assert!(
        line("B: ").contains("at the peak of the run: after 5 of 5 events"),
        "{out}"
    );
    let live = line("live requested");
    for s in ["7.13 KiB", "7.43 KiB", "+308 B"] {
        assert!(live.contains(s), "{live}");
    }
    assert!(line("live allocations").ends_with("+1"), "{out}");
    assert!(
        line("peak requested in the run").contains("+308 B"),
        "{out}"
    );
    assert!(
        out.contains("by site: 2 grew, 2 shrank, 0 unchanged"),
        "{out}"
    );
    let grew = out.find("grew (most bytes added first):").expect(&out);
    let shrank = out.find("shrank (most bytes removed first):").expect(&out);
    let forward = line("train.py:10 in forward");
    assert!(
        forward.contains("+1000 B") && forward.contains("2 -> 3"),
        "{forward}"
    );
    let cache = line("cache.py:7 in get");
    assert!(
        cache.contains("-904 B") && cache.contains("4.88 KiB") && cache.contains("4.00 KiB"),
        "{cache}"
    );
    assert!(out.find("train.py:10 in forward").unwrap() > grew);
    assert!(out.find("cache.py:7 in get").unwrap() > shrank);
    assert!(
        out.contains("by category or module: not recorded in these traces"),
        "{out}"
    );

    // By file, the top row only.
    let o = torch_arena(&[
        "diff", a, b, "--at", "end", "--by", "file", "--top", "1", "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json::parse(stdout(&o).trim()).unwrap();
    assert_eq!(v.get("by").str(), "file");
    assert_eq!(
        diff_rows(v.get("grew")),
        vec![row("cache.py", [0, 4096, 4096, 0, 1, 1])]
    );
    assert_eq!(v.get("grew_not_shown").u64(), 2);

    // Two moments of one run: the start and the end of A.
    let o = torch_arena(&["diff", a, "--at", "start", "--at", "end", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json::parse(stdout(&o).trim()).unwrap();
    assert_eq!(int(v.get("delta_live_bytes")), 2300);
    assert_eq!(v.get("b").get("moment").str(), "end");
}

/// A PyTorch snapshot of three training steps (an `Optimizer.step` range ends each): each step
/// leaks 100 B at train.py:10 and makes a temporary at train.py:20 that is 1,000 B larger than
/// the step before's.
fn three_step_snapshot(dir: &std::path::Path) -> PathBuf {
    let bytes = python_pickle::python_pickle(
        "f = lambda line: [dict(filename='train.py', line=line, name='step')]\n\
         e = lambda a, addr, s, t, line: dict(action=a, addr=addr, size=s, stream=0, \
             time_us=1000 + t, frames=f(line))\n\
         ann = lambda stage, t: dict(stage=stage, name='Optimizer.step#AdamW.step', device=0, \
             time_us=1000 + t)\n\
         ev, notes = [], []\n\
         for k in range(3):\n\
         \x20   t = 10 * k\n\
         \x20   ev += [e('alloc', 16 + k, 100, t + 1, 10), e('alloc', 64, 1000 * (k + 1), t + 2, 20), \
                    e('free_completed', 64, 1000 * (k + 1), t + 3, 20)]\n\
         \x20   notes += [ann('START', t + 4), ann('END', t + 5)]\n\
         obj = dict(segments=[], device_traces=[ev], external_annotations=notes)",
        4,
    );
    let path = dir.join("steps.pickle");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn diff_of_two_steps_of_one_run() {
    let dir = scratch("diff-steps");
    let snap = three_step_snapshot(&dir);
    let snap = snap.to_str().unwrap();
    // At each step's peak: the temporary grew by 2,000 B, the leak by 200 B.
    let o = torch_arena(&["diff", snap, "--steps", "0", "2", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json::parse(stdout(&o).trim()).unwrap();
    for (side, step, span, applied, live) in [("a", 0, [0, 3], 2, 1100), ("b", 2, [6, 9], 8, 3300)]
    {
        let s = v.get(side);
        assert_eq!(s.get("step").u64(), step);
        let got: Vec<u64> = s.get("span_events").arr().iter().map(|j| j.u64()).collect();
        assert_eq!(got, span);
        assert_eq!(s.get("events_applied").u64(), applied);
        assert_eq!(s.get("live_bytes").u64(), live);
        assert_eq!(s.get("peak_requested_bytes").u64(), live);
    }
    assert_eq!(
        diff_rows(v.get("grew")),
        vec![
            row("train.py:20 in step", [1000, 3000, 2000, 1, 1, 0]),
            row("train.py:10 in step", [100, 300, 200, 1, 3, 2]),
        ]
    );
    // At each step's end: only the leak is left.
    let o = torch_arena(&["diff", snap, "--steps", "0", "2", "--at", "end"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("at the end of step 0 (events 0 to 3)"),
        "{out}"
    );
    assert!(
        out.contains("at the end of step 2 (events 6 to 9)"),
        "{out}"
    );
    assert!(
        out.contains("by site: 1 grew, 0 shrank, 0 unchanged"),
        "{out}"
    );
    let leak = out
        .lines()
        .find(|l| l.contains("train.py:10 in step"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(leak.contains("+200 B") && leak.contains("1 -> 3"), "{leak}");
    // N events into each step.
    let o = torch_arena(&[
        "diff", snap, "--steps", "1", "2", "--at", "event:1", "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json::parse(stdout(&o).trim()).unwrap();
    assert_eq!(v.get("a").get("events_applied").u64(), 4);
    assert_eq!(v.get("b").get("events_applied").u64(), 7);

    // A step past the last, an event past a step's end.
    assert_usage_error(
        &torch_arena(&["diff", snap, "--steps", "0", "3"]),
        &[
            "step 3 is out of range",
            "marks 3 steps (0 to 2)",
            "Optimizer.step",
        ],
    );
    assert_usage_error(
        &torch_arena(&["diff", snap, "--steps", "0", "1", "--at", "event:4"]),
        &["event:4 is beyond step 0", "event:0 to event:3"],
    );
    // A synthetic workload marks its own steps.
    let o = torch_arena(&[
        "diff",
        "synth:varlen-train:3",
        "--steps",
        "0",
        "2",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json::parse(stdout(&o).trim()).unwrap();
    assert_eq!(v.get("b").get("step").u64(), 2);
    assert_eq!(
        int(v.get("delta_live_bytes")),
        v.get("b").get("live_bytes").u64() as i64 - v.get("a").get("live_bytes").u64() as i64
    );
}

#[test]
fn diff_refuses_bad_input_with_clear_errors() {
    let dir = scratch("diff-bad");
    let (a, b) = diff_pair(&dir);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let missing = dir.join("missing.pickle");
    let missing = missing.to_str().unwrap();
    assert_usage_error(
        &torch_arena(&["diff", a, missing]),
        &["cannot read trace", "missing.pickle"],
    );
    let junk = dir.join("junk.pickle");
    std::fs::write(&junk, b"GIF89a not a trace").unwrap();
    assert_usage_error(
        &torch_arena(&["diff", a, junk.to_str().unwrap()]),
        &["junk.pickle", "not a trace format torch-arena knows"],
    );
    let cut = dir.join("cut.pickle");
    let snap = three_step_snapshot(&dir);
    let bytes = std::fs::read(&snap).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    assert_usage_error(
        &torch_arena(&["diff", cut.to_str().unwrap(), a]),
        &["cut.pickle", "truncated"],
    );
    // Steps of a trace that marks none: why, and what to do instead.
    assert_usage_error(
        &torch_arena(&["diff", a, "--steps", "0", "1"]),
        &[
            "a.trace marks no steps",
            "trace format (version 1) records no step boundaries",
            "--at",
        ],
    );
    assert_usage_error(
        &torch_arena(&["diff", a, b, "--at", "event:6"]),
        &["event:6 is beyond", "5 events (event:0 to event:5)"],
    );
    assert_usage_error(
        &torch_arena(&["diff", a, b, "--at", "top"]),
        &["'top' is not a moment", "peak, start, end or event:N"],
    );
    assert_usage_error(
        &torch_arena(&["diff", a]),
        &["one trace", "--steps I J", "--at"],
    );
    assert_usage_error(
        &torch_arena(&["diff"]),
        &["which traces?", "Usage: torch-arena diff"],
    );
    assert_usage_error(&torch_arena(&["diff", a, b, a]), &["3 given"]);
    assert_usage_error(
        &torch_arena(&["diff", a, b, "--at", "end", "--at", "end", "--at", "end"]),
        &["--at is given once", "3 given"],
    );
    assert_usage_error(
        &torch_arena(&["diff", a, b, "--top", "0"]),
        &["at least 1 row"],
    );
    // Groupings no trace records: refused, with why and where to find them.
    for by in ["category", "module"] {
        assert_usage_error(
            &torch_arena(&["diff", a, b, "--by", by]),
            &[
                &format!("--by {by}: not recorded in these traces"),
                "explain()",
            ],
        );
    }
    // A plot file refused before any trace is read.
    assert_usage_error(
        &torch_arena(&["diff", missing, b, "--plot", "x.gif"]),
        &["--plot", "unknown extension"],
    );
}

#[test]
fn diff_plots_both_runs_on_one_axis() {
    let dir = scratch("diff-plot");
    let (a, b) = diff_pair(&dir);
    let svg = dir.join("diff.svg");
    let png = dir.join("diff.png");
    for f in [&svg, &png] {
        let o = torch_arena(&[
            "diff",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--plot",
            f.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(stderr(&o).contains("plot written to"), "{}", stderr(&o));
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    // An XML parser reads it whole.
    let parsed = Command::new("python3")
        .args([
            "-c",
            "import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); \
             print(r.tag, len(r.findall('.//{http://www.w3.org/2000/svg}polyline')))",
            svg.to_str().unwrap(),
        ])
        .output()
        .expect("python3 parses the SVG");
    assert!(parsed.status.success(), "{}", stderr(&parsed));
    let parsed = stdout(&parsed);
    assert!(
        parsed.starts_with("{http://www.w3.org/2000/svg}svg "),
        "{parsed}"
    );
    for s in [
        "torch-arena diff: a.trace vs b.trace",
        "A: a.trace",
        "B: b.trace",
        "share of each run&apos;s events",
        ">100%<",
        "class=\"moment\"",
        "A: peak",
    ] {
        assert!(text.contains(s), "svg lacks {s:?}");
    }
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert_eq!(&bytes[12..16], b"IHDR");
    // Steps: x is the share of each step.
    let steps = dir.join("steps.svg");
    let o = torch_arena(&[
        "diff",
        "synth:varlen-train:2",
        "--steps",
        "0",
        "1",
        "--plot",
        steps.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&steps).unwrap();
    assert!(text.contains("share of each step&apos;s events"), "{text}");
    assert!(text.contains("step 0 vs step 1"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// diff of two explain reports (torch_arena.explain(json=True); written by tests/python)

/// Two explain reports: from A to B activations grow by 3 MiB and held graphs appear (1 MiB),
/// other shrinks by 512 B; by module, blocks.1 grows by 3 MiB and head is gone.
fn report_pair(dir: &std::path::Path) -> (String, String) {
    let a = dir.join("a.json");
    let b = dir.join("b.json");
    std::fs::write(
        &a,
        r#"{"categories": {"parameters": 4194304, "gradients": 4194304, "optimizer_state": 8388608,
            "activations": 2097152, "held_graphs": 0, "other": 1024},
            "by_module": [{"module": "Net.blocks.1", "parameters": 1048576, "activations": 1048576},
                          {"module": "Net.head", "parameters": 2048}],
            "cached_bytes": 0, "unusable_bytes": 0, "remedies": [], "warnings": [], "rank": 0}"#,
    )
    .unwrap();
    std::fs::write(
        &b,
        r#"{"categories": {"parameters": 4194304, "gradients": 4194304, "optimizer_state": 8388608,
            "activations": 5242880, "held_graphs": 1048576, "other": 512},
            "by_module": [{"module": "Net.blocks.1", "parameters": 1048576, "activations": 4194304}],
            "cached_bytes": 2097152, "unusable_bytes": 1048576, "remedies": [], "warnings": [],
            "rank": 0, "oom": {"device": 0, "request_bytes": 6291456}}"#,
    )
    .unwrap();
    (
        a.to_str().unwrap().to_string(),
        b.to_str().unwrap().to_string(),
    )
}

#[test]
fn diff_of_two_explain_reports_by_category_and_by_module() {
    let dir = scratch("diff-reports");
    let (a, b) = report_pair(&dir);
    let o = torch_arena(&["diff", &a, &b, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json::parse(stdout(&o).trim()).unwrap();
    assert_eq!(v.get("by").str(), "category");
    assert_eq!(int(v.get("delta_total_bytes")), 3 * 1048576 + 1048576 - 512);
    let grew: Vec<(&str, i64)> = v
        .get("grew")
        .arr()
        .iter()
        .map(|r| (r.get("key").str(), int(r.get("delta_bytes"))))
        .collect();
    assert_eq!(grew, [("activations", 3 << 20), ("held_graphs", 1 << 20)]);
    let shrank = v.get("shrank").arr();
    assert_eq!(shrank.len(), 1);
    assert_eq!(shrank[0].get("key").str(), "other");
    assert_eq!(int(shrank[0].get("delta_bytes")), -512);
    assert_eq!(v.get("unchanged_groups").u64(), 3);
    assert_eq!(v.get("b").get("oom_request_bytes").u64(), 6 << 20);
    assert_eq!(v.get("b").get("unusable_bytes").u64(), 1 << 20);

    let o = torch_arena(&["diff", &a, &b, "--by", "module"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("by module: 1 grew, 1 shrank, 0 unchanged"),
        "{text}"
    );
    assert!(text.contains("+3.00 MiB"), "{text}");
    assert!(
        text.contains("Net.blocks.1") && text.contains("Net.head"),
        "{text}"
    );
    assert!(
        text.contains("at an out-of-memory error (6.00 MiB asked)"),
        "{text}"
    );
}

#[test]
fn diff_of_explain_reports_refuses_what_a_report_cannot_answer() {
    let dir = scratch("diff-reports-bad");
    let (a, b) = report_pair(&dir);
    let trace = dir.join("t.trace");
    std::fs::write(&trace, "torch-arena-trace 1\n").unwrap();
    let o = torch_arena(&["diff", &a, trace.to_str().unwrap()]);
    assert_usage_error(
        &o,
        &["an explain report is compared with another explain report"],
    );
    let o = torch_arena(&["diff", &a, &b, "--by", "site"]);
    assert_usage_error(&o, &["explain reports record categories and modules"]);
    let o = torch_arena(&["diff", &a, &b, "--steps", "0", "1"]);
    assert_usage_error(&o, &["an explain report is one moment"]);
    let svg = dir.join("x.svg");
    let o = torch_arena(&["diff", &a, &b, "--plot", svg.to_str().unwrap()]);
    assert_usage_error(&o, &["nothing to draw"]);
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"categories": {"parameters": -3}}"#).unwrap();
    let o = torch_arena(&["diff", &a, bad.to_str().unwrap()]);
    assert_usage_error(
        &o,
        &[
            "bad.json",
            "\"parameters\" is -3, not a whole number of bytes",
        ],
    );
}
