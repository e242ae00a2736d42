//! `TORCH_ARENA_CONF`: every key, every error message, PyTorch's grammar (whitespace, brackets,
//! trailing comma), the key table, and `Display` round trips.

use torch_arena::config::{Config, DeviceKind, accepted_keys};
use torch_arena::error::Error;

fn parse(text: &str) -> Config {
    Config::parse(text).unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
}

/// The error message for `text`, which must fail to parse.
fn error(text: &str) -> String {
    match Config::parse(text) {
        Ok(c) => panic!("{text:?} should fail, parsed as {c:?}"),
        Err(Error::Config(m)) => m,
        Err(e) => panic!("{text:?}: expected a Config error, got {e:?}"),
    }
}

/// `text` fails with a message that contains every one of `parts`.
fn fails_with(text: &str, parts: &[&str]) -> String {
    let m = error(text);
    assert!(
        m.starts_with("TORCH_ARENA_CONF: "),
        "{text:?}: no source in {m:?}"
    );
    for p in parts {
        assert!(m.contains(p), "{text:?}: message {m:?} lacks {p:?}");
    }
    m
}

const KEYS: [&str; 23] = [
    "device",
    "sim_capacity_mb",
    "sim_backing",
    "sim_granularity_kb",
    "sim_vmm",
    "sim_devices",
    "page_size_mb",
    "handle_mb",
    "stitch",
    "views",
    "release_idle_ms",
    "memory_fraction",
    "slab_max_kb",
    "trace",
    "driver_costs",
    "sites",
    "sites_every",
    "sites_min_kb",
    "leaks",
    "explain",
    "leak_warmup",
    "leak_age",
    "cpu_tensors",
];

// ---- defaults and every key ----------------------------------------------------------------

#[test]
fn empty_text_is_the_defaults() {
    let d = Config::default();
    for text in ["", " ", "\t\n "] {
        assert_eq!(parse(text), d, "{text:?}");
    }
    assert_eq!(d.device, DeviceKind::Cuda);
    assert_eq!(d.sim_capacity_mb, 81920);
    assert!(!d.sim_backing);
    assert_eq!(d.sim_granularity_kb, 2048);
    assert!(d.sim_vmm);
    assert_eq!(d.sim_devices, 1);
    assert_eq!(d.page_size_mb, 2);
    assert!(d.stitch);
    assert_eq!(d.release_idle_ms, 0);
    assert_eq!(d.memory_fraction, 1.0);
}

#[test]
fn every_key_parses() {
    let c = parse(
        "device:sim,sim_capacity_mb:1024,sim_backing:True,sim_granularity_kb:64,sim_vmm:False,\
         sim_devices:8,page_size_mb:4,stitch:False,release_idle_ms:1500,memory_fraction:0.25,\
         slab_max_kb:64,trace:/tmp/run-{rank}.trace",
    );
    assert_eq!(
        c,
        Config {
            device: DeviceKind::Sim,
            sim_capacity_mb: 1024,
            sim_backing: true,
            sim_granularity_kb: 64,
            sim_vmm: false,
            sim_devices: 8,
            page_size_mb: 4,
            stitch: false,
            release_idle_ms: 1500,
            memory_fraction: 0.25,
            slab_max_kb: 64,
            trace: Some("/tmp/run-{rank}.trace".into()),
            ..Config::default()
        }
    );
}

#[test]
fn keys_not_given_keep_their_defaults() {
    let c = parse("device:sim");
    assert_eq!(
        c,
        Config {
            device: DeviceKind::Sim,
            ..Config::default()
        }
    );
    let c = parse("stitch:False");
    assert_eq!(
        c,
        Config {
            stitch: false,
            ..Config::default()
        }
    );
}

#[test]
fn each_key_alone() {
    let d = Config::default;
    assert_eq!(parse("device:cuda"), d());
    assert_eq!(parse("device:sim").device, DeviceKind::Sim);
    assert_eq!(parse("sim_capacity_mb:1").sim_capacity_mb, 1);
    // The largest simulated device is 1 PiB, so capacities in bytes never wrap.
    assert_eq!(parse("sim_capacity_mb:1073741824").sim_capacity_mb, 1 << 30);
    assert!(parse("sim_backing:True").sim_backing);
    assert!(!parse("sim_backing:False").sim_backing);
    for g in [4u64, 8, 64, 2048, 1 << 20] {
        assert_eq!(
            parse(&format!("sim_granularity_kb:{g}")).sim_granularity_kb,
            g
        );
    }
    assert!(!parse("sim_vmm:False").sim_vmm);
    assert!(parse("sim_vmm:True").sim_vmm);
    assert_eq!(parse("sim_devices:1").sim_devices, 1);
    assert_eq!(parse("sim_devices:64").sim_devices, 64);
    // 1 MiB pages only where the granularity allows them (CUDA GPUs allocate in 2 MiB units).
    assert_eq!(
        parse("device:sim,sim_granularity_kb:1024,page_size_mb:1").page_size_mb,
        1
    );
    assert_eq!(parse("page_size_mb:20").page_size_mb, 20);
    assert_eq!(parse("page_size_mb:1024").page_size_mb, 1024);
    assert!(!parse("stitch:False").stitch);
    assert!(parse("stitch:True").stitch);
    assert!(!parse("views:False").views);
    assert!(parse("views:True").views);
    assert_eq!(parse("release_idle_ms:0").release_idle_ms, 0);
    assert_eq!(parse("release_idle_ms:60000").release_idle_ms, 60000);
    assert_eq!(parse("memory_fraction:1").memory_fraction, 1.0);
    assert_eq!(parse("memory_fraction:1.0").memory_fraction, 1.0);
    assert_eq!(parse("memory_fraction:0.5").memory_fraction, 0.5);
    assert_eq!(parse("memory_fraction:.5").memory_fraction, 0.5);
    assert_eq!(parse("memory_fraction:1e-3").memory_fraction, 0.001);
    assert_eq!(parse("memory_fraction:0.000001").memory_fraction, 1e-6);
}

// ---- grammar -------------------------------------------------------------------------------

#[test]
fn whitespace_is_ignored_anywhere() {
    let want = Config {
        device: DeviceKind::Sim,
        sim_devices: 4,
        stitch: false,
        ..Config::default()
    };
    for text in [
        "device:sim,sim_devices:4,stitch:False",
        " device : sim , sim_devices : 4 , stitch : False ",
        "\tdevice:sim,\n sim_devices:4,\r\nstitch:False\n",
        // PyTorch's tokenizer drops whitespace inside words too.
        "dev ice:s im,sim_devices:4,stitch:Fal se",
    ] {
        assert_eq!(parse(text), want, "{text:?}");
    }
}

#[test]
fn trailing_comma_is_fine() {
    assert_eq!(
        parse("stitch:False,"),
        Config {
            stitch: false,
            ..Config::default()
        }
    );
    assert_eq!(
        parse("stitch:False , "),
        Config {
            stitch: false,
            ..Config::default()
        }
    );
}

#[test]
fn empty_entries_are_errors() {
    fails_with(",stitch:False", &["empty entry", "','"]);
    fails_with(
        "stitch:False,,sim_vmm:True",
        &["empty entry", "after stitch:False"],
    );
    fails_with("stitch:False,,", &["empty entry"]);
    // A trailing comma needs an entry before it.
    fails_with(",", &["empty entry"]);
}

#[test]
fn missing_colon() {
    let m = fails_with(
        "stitch",
        &["missing ':' after key 'stitch'", "stitch:value"],
    );
    assert_eq!(
        m,
        "TORCH_ARENA_CONF: missing ':' after key 'stitch'; expected stitch:value"
    );
    fails_with(
        "stitch,sim_vmm:True",
        &["missing ':' after key 'stitch'", "found ','"],
    );
    fails_with("device:sim,stitch", &["missing ':' after key 'stitch'"]);
    fails_with(
        "stitch[True]",
        &["missing ':' after key 'stitch'", "found '['"],
    );
}

#[test]
fn missing_key_or_value() {
    fails_with(":True", &["missing key before ':'", "key:value"]);
    fails_with(
        "stitch:",
        &["missing value after 'stitch:'", "stitch:value"],
    );
    fails_with("stitch:,sim_vmm:True", &["missing value after 'stitch:'"]);
    fails_with("stitch::True", &["missing value between 'stitch:' and ':'"]);
}

#[test]
fn junk_after_a_value() {
    fails_with(
        "stitch:True:False",
        &["unexpected ':'", "'True'", "key 'stitch'", "','"],
    );
    fails_with(
        "stitch:True[",
        &["unexpected '['", "'True'", "key 'stitch'"],
    );
    fails_with("stitch:[a]b", &["unexpected 'b'", "'[a]'", "key 'stitch'"]);
}

#[test]
fn duplicate_keys_are_errors() {
    let m = fails_with(
        "stitch:True,stitch:False",
        &["duplicate key 'stitch'", "'True'", "'False'"],
    );
    assert_eq!(
        m,
        "TORCH_ARENA_CONF: duplicate key 'stitch': given as 'True' and again as 'False'; give each \
         key once"
    );
    // Even with the same value.
    fails_with(
        "sim_devices:2, device:sim, sim_devices:2",
        &["duplicate key 'sim_devices'"],
    );
}

#[test]
fn brackets_tokenize_and_lists_are_rejected_for_scalar_keys() {
    let m = fails_with(
        "stitch:[a:b, c:d]",
        &[
            "bad value '[a:b,c:d]' for key 'stitch'",
            "not a list",
            "expected True or False",
        ],
    );
    assert_eq!(
        m,
        "TORCH_ARENA_CONF: bad value '[a:b,c:d]' for key 'stitch': 'stitch' takes a single value, \
         not a list; expected True or False"
    );
    fails_with(
        "sim_devices:[]",
        &[
            "bad value '[]' for key 'sim_devices'",
            "an integer from 1 to 64",
        ],
    );
    fails_with(
        "device:sim,memory_fraction:[0.5]",
        &[
            "bad value '[0.5]' for key 'memory_fraction'",
            "a number in (0, 1]",
        ],
    );
    // The grammar is checked first, then the keys: a list for an unknown key is an unknown key.
    fails_with("unknown:[1:2,>:3]", &["unknown key 'unknown'"]);
}

#[test]
fn unbalanced_brackets_are_errors() {
    fails_with(
        "stitch:[a:b",
        &[
            "unbalanced brackets",
            "'[' opened in the value of key 'stitch'",
            "never closed",
        ],
    );
    fails_with(
        "stitch:[a:b,sim_vmm:True",
        &["unbalanced brackets", "never closed"],
    );
    fails_with(
        "stitch:]",
        &[
            "unbalanced brackets",
            "']' without a matching '['",
            "key 'stitch'",
        ],
    );
    fails_with(
        "stitch:True]",
        &[
            "unbalanced brackets",
            "']' without a matching '['",
            "'True'",
            "'stitch'",
        ],
    );
    fails_with("]", &["unbalanced brackets", "']' without a matching '['"]);
    fails_with(
        "stitch:True,]",
        &["unbalanced brackets", "after stitch:True"],
    );
    fails_with(
        "stitch:[[a]]",
        &["unbalanced brackets", "nested '['", "'stitch'"],
    );
    fails_with("[stitch:True]", &["unexpected '['", "key:[a:b,c:d]"]);
}

// ---- errors: keys and values ---------------------------------------------------------------

#[test]
fn unknown_key_suggests_and_lists_every_key() {
    let m = fails_with(
        "sim_capacty_mb:10",
        &[
            "unknown key 'sim_capacty_mb'",
            "(did you mean 'sim_capacity_mb'?)",
        ],
    );
    assert_eq!(
        m,
        "TORCH_ARENA_CONF: unknown key 'sim_capacty_mb' (did you mean 'sim_capacity_mb'?); accepted \
         keys: device, sim_capacity_mb, sim_backing, sim_granularity_kb, sim_vmm, sim_devices, \
         page_size_mb, handle_mb, stitch, views, release_idle_ms, memory_fraction, slab_max_kb, \
         trace, driver_costs, sites, sites_every, sites_min_kb, leaks, explain, leak_warmup, \
         leak_age, cpu_tensors"
    );
    fails_with(
        "Stitch:True",
        &["unknown key 'Stitch'", "did you mean 'stitch'?"],
    );
    fails_with("devcie:sim", &["did you mean 'device'?"]);
    fails_with("memory_fractoin:0.5", &["did you mean 'memory_fraction'?"]);
    fails_with("release_idle:5", &["did you mean 'release_idle_ms'?"]);
    // Nothing close: no suggestion, still the list.
    let m = fails_with(
        "expandable_segments:True",
        &["unknown key 'expandable_segments'", "accepted keys: device"],
    );
    assert!(!m.contains("did you mean"), "{m}");
    for k in KEYS {
        assert!(m.contains(k), "{m} lacks {k}");
    }
}

#[test]
fn cpu_tensors_needs_a_simulated_device_backed_by_host_memory() {
    let c = parse("device:sim,sim_backing:True,cpu_tensors:True");
    assert!(c.cpu_tensors && c.sim_backing && c.device == DeviceKind::Sim);
    assert!(!parse("cpu_tensors:False").cpu_tensors);
    assert_eq!(
        parse("device:sim,sim_backing:True,cpu_tensors:True").to_string(),
        "device:sim,sim_capacity_mb:81920,sim_backing:True,sim_granularity_kb:2048,sim_vmm:True,\
         sim_devices:1,page_size_mb:2,handle_mb:0,stitch:True,views:False,release_idle_ms:0,memory_fraction:1,\
         slab_max_kb:64,sites:auto,sites_every:1,sites_min_kb:0,leaks:False,explain:False,leak_warmup:2,\
         leak_age:0,cpu_tensors:True"
    );
    for (text, lacks) in [
        ("cpu_tensors:True", "device:sim and sim_backing:True"),
        (
            "device:cuda,sim_backing:True,cpu_tensors:True",
            "device:sim",
        ),
        ("device:sim,cpu_tensors:True", "sim_backing:True"),
        (
            "cpu_tensors:True,sim_backing:False,device:sim",
            "sim_backing:True",
        ),
    ] {
        fails_with(
            text,
            &[
                "cpu_tensors:True needs device:sim and sim_backing:True",
                &format!("this configuration lacks {lacks}:"),
                "or drop cpu_tensors",
            ],
        );
    }
    let m = fails_with("cpu_tensors:yes", &[]);
    assert_eq!(
        m,
        "TORCH_ARENA_CONF: bad value 'yes' for key 'cpu_tensors': expected True or False"
    );
}

#[test]
fn bad_values_name_key_value_and_forms() {
    let m = fails_with("sim_backing:yes", &[]);
    assert_eq!(
        m,
        "TORCH_ARENA_CONF: bad value 'yes' for key 'sim_backing': expected True or False"
    );
    let m = fails_with("device:gpu", &[]);
    assert_eq!(
        m,
        "TORCH_ARENA_CONF: bad value 'gpu' for key 'device': expected cuda or sim"
    );

    let cases: &[(&str, &str, &str)] = &[
        ("device", "CUDA", "cuda or sim"),
        ("device", "Sim", "cuda or sim"),
        ("sim_capacity_mb", "0", "an integer from 1 to 1073741824"),
        ("sim_capacity_mb", "-5", "an integer from 1 to 1073741824"),
        ("sim_capacity_mb", "1.5", "an integer from 1 to 1073741824"),
        ("sim_capacity_mb", "+5", "an integer from 1 to 1073741824"),
        (
            "sim_capacity_mb",
            "18446744073709551616",
            "an integer from 1 to 1073741824",
        ),
        ("sim_capacity_mb", "1k", "an integer from 1 to 1073741824"),
        ("sim_backing", "true", "True or False"),
        ("sim_backing", "1", "True or False"),
        ("sim_backing", "TRUE", "True or False"),
        ("sim_granularity_kb", "3", "a power of two >= 4"),
        ("sim_granularity_kb", "2", "a power of two >= 4"),
        ("sim_granularity_kb", "0", "a power of two >= 4"),
        ("sim_granularity_kb", "96", "a power of two >= 4"),
        ("sim_vmm", "no", "True or False"),
        ("sim_devices", "0", "an integer from 1 to 64"),
        ("sim_devices", "65", "an integer from 1 to 64"),
        ("sim_devices", "4294967297", "an integer from 1 to 64"),
        ("page_size_mb", "0", "an integer from 1 to 1024"),
        ("page_size_mb", "two", "an integer from 1 to 1024"),
        ("page_size_mb", "1025", "an integer from 1 to 1024"),
        ("stitch", "on", "True or False"),
        ("views", "1", "True or False"),
        ("release_idle_ms", "-1", "an integer >= 0"),
        ("release_idle_ms", "1.5", "an integer >= 0"),
        ("memory_fraction", "0", "a number in (0, 1]"),
        ("memory_fraction", "0.0", "a number in (0, 1]"),
        ("memory_fraction", "1.01", "a number in (0, 1]"),
        ("memory_fraction", "-0.5", "a number in (0, 1]"),
        ("memory_fraction", "nan", "a number in (0, 1]"),
        ("memory_fraction", "inf", "a number in (0, 1]"),
        ("memory_fraction", "half", "a number in (0, 1]"),
        ("memory_fraction", "50%", "a number in (0, 1]"),
    ];
    for &(key, value, forms) in cases {
        let m = fails_with(
            &format!("{key}:{value}"),
            &[&format!(
                "bad value '{value}' for key '{key}': expected {forms}"
            )],
        );
        // The error is the same wherever the entry sits.
        let before = if key == "stitch" {
            "sim_vmm:True"
        } else {
            "stitch:True"
        };
        assert_eq!(m, error(&format!("{before},{key}:{value},")));
    }
}

#[test]
fn errors_apply_nothing_and_parse_from_names_its_source() {
    // All or nothing: one bad entry fails the whole text.
    assert!(Config::parse("device:sim,sim_devices:4,stitch:maybe").is_err());
    match Config::parse_from("torch_arena.configure()", "stitch:maybe") {
        Err(Error::Config(m)) => {
            assert!(
                m.starts_with("torch_arena.configure(): bad value 'maybe' for key 'stitch'"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(Config::parse_from("x", "").unwrap(), Config::default());
}

// ---- the key table and Display -------------------------------------------------------------

#[test]
fn accepted_keys_is_the_single_table() {
    let table = accepted_keys();
    let names: Vec<&str> = table.iter().map(|(k, _)| *k).collect();
    assert_eq!(names, KEYS);
    // Every key in the table parses (with the value Display prints for the defaults), and every
    // description ends with the default Display prints.
    let shown = Config::default().to_string();
    let defaults: Vec<(&str, &str)> = shown
        .split(',')
        .map(|kv| kv.split_once(':').unwrap())
        .collect();
    // Optional keys (unset by default) are left out of Display; their help says so.
    let optional: Vec<&(&str, &str)> = table
        .iter()
        .filter(|(k, _)| !defaults.iter().any(|(d, _)| d == k))
        .collect();
    assert_eq!(
        optional.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        ["trace", "driver_costs"]
    );
    for (key, help) in optional {
        let default = if *key == "trace" {
            "(default: no recording)"
        } else {
            "(default: the figures measured on an H200)"
        };
        assert!(help.ends_with(default), "{key}: {help:?}");
    }
    let listed: Vec<&(&str, &str)> = table
        .iter()
        .filter(|(k, _)| !["trace", "driver_costs"].contains(k))
        .collect();
    assert_eq!(
        defaults.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        listed.iter().map(|(k, _)| *k).collect::<Vec<_>>()
    );
    for ((key, help), (dkey, dvalue)) in listed.into_iter().zip(&defaults) {
        assert_eq!(key, dkey);
        assert!(
            help.ends_with(&format!("(default {dvalue})")),
            "{key}: {help:?} vs default {dvalue}"
        );
        assert!(!help.contains('\n'), "{key}: one line");
        assert_eq!(parse(&format!("{key}:{dvalue}")), Config::default());
    }
}

#[test]
fn display_prints_the_grammar() {
    assert_eq!(
        Config::default().to_string(),
        "device:cuda,sim_capacity_mb:81920,sim_backing:False,sim_granularity_kb:2048,sim_vmm:True,\
         sim_devices:1,page_size_mb:2,handle_mb:0,stitch:True,views:False,release_idle_ms:0,memory_fraction:1,\
         slab_max_kb:64,sites:auto,sites_every:1,sites_min_kb:0,leaks:False,explain:False,leak_warmup:2,\
         leak_age:0,cpu_tensors:False"
    );
}

#[test]
fn display_round_trips() {
    let configs = [
        Config::default(),
        parse(
            "device:sim,sim_capacity_mb:1024,sim_backing:True,sim_granularity_kb:64,sim_vmm:False,\
             sim_devices:8,page_size_mb:4,stitch:False,release_idle_ms:1500,memory_fraction:0.25",
        ),
        Config {
            memory_fraction: 0.1 + 0.2 - 0.2,
            ..Config::default()
        },
        Config {
            memory_fraction: 1e-9,
            release_idle_ms: u64::MAX,
            sim_capacity_mb: 1 << 30,
            ..Config::default()
        },
        Config {
            memory_fraction: f64::MIN_POSITIVE,
            sim_devices: 64,
            ..Config::default()
        },
        Config {
            memory_fraction: 1.0 - f64::EPSILON,
            ..Config::default()
        },
    ];
    for c in configs {
        let text = c.to_string();
        assert_eq!(parse(&text), c, "{text}");
    }
}
