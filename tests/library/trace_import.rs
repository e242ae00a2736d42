//! Trace importers: every real PyTorch snapshot against `traces/snapshots/index.csv`, the
//! restricted unpickler against hostile and broken input, RMM CSV logs, format detection.
//!
//! The real traces are found at `$TORCH_ARENA_TRACES`, else the repository's `traces/snapshots`.

use crate::python_pickle;
use python_pickle::python_pickle;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::snapshots;
use snapshots::traces_dir;

use torch_arena_lab::pickle;
use torch_arena_lab::{self as trace, Kind, Op, Source, Trace, rmm, torch_snapshot};

const MIB: f64 = (1u64 << 20) as f64;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces")
}

/// A scratch file under the system temp dir, unique to this process and `tag`.
fn scratch(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("torch-arena-import-{}-{tag}", std::process::id()))
}

/// Minimal CSV: commas, double-quoted fields with `""` escapes.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, '\r') => {}
            (false, c) => field.push(c),
        }
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    rows
}

fn within(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * want.abs().max(1e-9) || (got - want).abs() < 0.01
}

/// Files whose index.csv figures we knowingly do not reproduce, and why (see the report of
/// issue 5). Each entry: (file, column, reason). Checked to still differ, so a fixed index
/// or importer shows up.
const KNOWN_INDEX_DIFFERENCES: &[(&str, &str, &str)] = &[
    (
        "silmont2000__assignment2-systems__133f064__mem_snapshot.pickle",
        "window",
        "index: 'state only'; the file holds a complete event stream from an empty allocator \
         (36 alloc, 26 free_completed, 9 segment_alloc summing to the 3606 MiB reserved at dump; \
         the 10 blocks live at the end are the dump's 10 active blocks): fresh by INDEX.md's own \
         definitions",
    ),
    (
        "silmont2000__assignment2-systems__133f064__mem_snapshot.pickle",
        "allocated_MiB",
        "30.25 MiB is what is live at dump; the window's peak requested is 3098.6 MiB (several \
         512 MiB tensors live at once), the figure a fresh trace must report",
    ),
    (
        "volcengine__verl__27ee9a4__mem.pickle",
        "allocated_MiB",
        "23761.78 MiB = rounded sizes of the active_allocated blocks; the replayed live set is \
         their requested sizes (23733.9) plus the 9 active_pending_free blocks (569.2), still \
         held at dump: 24303.1 MiB",
    ),
];

#[test]
fn every_real_trace_loads_and_matches_the_index() {
    let dir = traces_dir();
    let csv = std::fs::read_to_string(dir.join("index.csv")).expect("read index.csv");
    let rows = parse_csv(&csv);
    let head = &rows[0];
    let col = |name: &str| {
        head.iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("index.csv has no column {name}"))
    };
    let (c_file, c_window, c_peak, c_res, c_alloc) = (
        col("file"),
        col("window"),
        col("peak_req_MiB"),
        col("native_res_MiB"),
        col("allocated_MiB"),
    );

    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .expect("list traces")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".pickle"))
        .collect();
    on_disk.sort();
    let indexed: Vec<&Vec<String>> = rows[1..].iter().filter(|r| r.len() > c_file).collect();
    let mut problems = Vec::new();
    for f in &on_disk {
        if !indexed.iter().any(|r| &r[c_file] == f) {
            problems.push(format!("{f}: on disk but not in index.csv"));
        }
    }

    let start = Instant::now();
    let mut bytes = 0u64;
    let mut events = 0usize;
    for r in &indexed {
        let file = &r[c_file];
        let path = dir.join(file);
        bytes += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let t = match trace::load(&path) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("{file}: does not load: {e}"));
                continue;
            }
        };
        events += t.events.len();
        let known = |column: &str| {
            KNOWN_INDEX_DIFFERENCES
                .iter()
                .any(|&(f, c, _)| f == file && c == column)
        };
        let mut check = |column: &str, ok: bool, msg: String| {
            if ok == known(column) {
                problems.push(if ok {
                    format!("{file}: {column} now matches; remove it from KNOWN_INDEX_DIFFERENCES")
                } else {
                    format!("{file}: {msg}")
                });
            }
        };
        assert_eq!(t.source, Source::TorchSnapshot);
        let window = r[c_window].as_str();
        let want_kind = if window.starts_with("fresh") {
            Kind::Fresh
        } else if window.starts_with("partial") {
            Kind::Partial
        } else if window.starts_with("warm") {
            Kind::Warm
        } else {
            Kind::StateOnly
        };
        check(
            "window",
            t.kind == want_kind,
            format!("kind {:?}, index says '{window}'", t.kind),
        );
        let native = t.native.as_ref().map(|n| n.peak as f64 / MIB);
        let want_res: f64 = r[c_res].parse().unwrap_or(f64::NAN);
        check(
            "native_res_MiB",
            native.is_some_and(|n| within(n, want_res, 0.02)),
            format!("native peak reserved {native:?} MiB, index says {want_res}"),
        );
        let peak = t.peak_requested() as f64 / MIB;
        // State-only rows have no peak requested: the replayed live set is what was allocated.
        let (column, want_peak) = if r[c_peak].is_empty() {
            ("allocated_MiB", r[c_alloc].parse().unwrap_or(f64::NAN))
        } else {
            ("peak_req_MiB", r[c_peak].parse().unwrap_or(f64::NAN))
        };
        check(
            column,
            within(peak, want_peak, 0.02),
            format!("peak requested {peak:.2} MiB, index {column} says {want_peak}"),
        );
        check_invariants(&t, &mut problems);
    }
    let el = start.elapsed();
    println!(
        "loaded {} real traces ({:.1} MB on disk, {events} events) in {:.2} s",
        indexed.len(),
        bytes as f64 / 1e6,
        el.as_secs_f64()
    );
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Ids: every free ends a live allocation of the same size; seeded events are allocations;
/// native changes are in event order and in range.
fn check_invariants(t: &Trace, problems: &mut Vec<String>) {
    let mut live = std::collections::HashMap::new();
    for (i, e) in t.events.iter().enumerate() {
        match e.op {
            Op::Alloc => {
                if live.insert(e.id, e.size).is_some() {
                    problems.push(format!(
                        "{}: event {i}: id {} allocated twice",
                        t.name, e.id
                    ));
                }
            }
            Op::Free => {
                if i < t.seeded {
                    problems.push(format!("{}: seeded event {i} is a free", t.name));
                }
                match live.remove(&e.id) {
                    Some(s) if s == e.size => {}
                    other => problems.push(format!(
                        "{}: event {i}: free of id {} size {} ends {other:?}",
                        t.name, e.id, e.size
                    )),
                }
            }
        }
        if (e.site as usize) >= t.sites.len() {
            problems.push(format!(
                "{}: event {i}: site {} out of range",
                t.name, e.site
            ));
        }
    }
    if let Some(n) = &t.native {
        let mut prev = 0;
        for &(at, _) in &n.changes {
            if at < prev || at > t.events.len() {
                problems.push(format!("{}: native change at {at} out of order", t.name));
            }
            prev = at;
        }
        let max = n
            .changes
            .iter()
            .map(|c| c.1)
            .max()
            .unwrap_or(0)
            .max(n.initial);
        if max > n.peak {
            problems.push(format!(
                "{}: native peak {} below a change {max}",
                t.name, n.peak
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile pickles

/// A pickle that, if run by Python's `pickle.load`, would create `marker`.
fn evil_global(module: &str, name: &str, arg: &str) -> Vec<u8> {
    let mut b = vec![0x80, 2, b'c'];
    b.extend_from_slice(format!("{module}\n{name}\n").as_bytes());
    b.push(b'X');
    b.extend_from_slice(&(arg.len() as u32).to_le_bytes());
    b.extend_from_slice(arg.as_bytes());
    b.extend_from_slice(&[0x85, b'R', b'.']);
    b
}

fn short_unicode(b: &mut Vec<u8>, s: &str) {
    b.push(0x8c);
    b.push(s.len() as u8);
    b.extend_from_slice(s.as_bytes());
}

fn evil_stack_global(module: &str, name: &str, arg: &str) -> Vec<u8> {
    let mut b = vec![0x80, 4];
    short_unicode(&mut b, module);
    b.push(0x94);
    short_unicode(&mut b, name);
    b.push(0x94);
    b.push(0x93);
    short_unicode(&mut b, arg);
    b.extend_from_slice(&[0x85, b'R', b'.']);
    b
}

#[test]
fn hostile_pickles_are_refused_and_nothing_runs() {
    let marker = scratch("pwned");
    let _ = std::fs::remove_file(&marker);
    let cmd = format!("touch {}", marker.display());
    let code = format!("open({:?}, 'w')", marker.display().to_string());
    let cases = [
        ("GLOBAL", "os", "system", evil_global("os", "system", &cmd)),
        (
            "GLOBAL",
            "posix",
            "system",
            evil_global("posix", "system", &cmd),
        ),
        (
            "GLOBAL",
            "builtins",
            "eval",
            evil_global("builtins", "eval", &code),
        ),
        (
            "GLOBAL",
            "builtins",
            "exec",
            evil_global("builtins", "exec", &code),
        ),
        (
            "STACK_GLOBAL",
            "os",
            "system",
            evil_stack_global("os", "system", &cmd),
        ),
        (
            "STACK_GLOBAL",
            "builtins",
            "eval",
            evil_stack_global("builtins", "eval", &code),
        ),
        (
            "STACK_GLOBAL",
            "subprocess",
            "check_call",
            evil_stack_global("subprocess", "check_call", &cmd),
        ),
    ];
    for (op, module, name, bytes) in cases {
        let e = pickle::loads("evil.pickle", &bytes)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("refusing to load global '{module}.{name}'"))
                && e.contains(op)
                && e.contains("evil.pickle")
                && e.contains("at byte ")
                && e.contains("collections.OrderedDict"),
            "{e}"
        );
        // The same through the file loader.
        let path = scratch(&format!("evil-{op}-{module}-{name}.pickle"));
        std::fs::write(&path, &bytes).unwrap();
        let e = trace::load(&path).unwrap_err().to_string();
        let _ = std::fs::remove_file(&path);
        assert!(
            e.contains("refusing") && e.contains(&path.display().to_string()),
            "{e}"
        );
    }
    // INST and OBJ (protocol 0/1 instance creation) too.
    let inst = format!("(S'{cmd}'\nios\nsystem\n.");
    let e = pickle::loads("evil.pickle", inst.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("'os.system'") && e.contains("INST"), "{e}");
    let obj = format!("(cos\nsystem\nS'{cmd}'\no.");
    let e = pickle::loads("evil.pickle", obj.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("'os.system'"), "{e}");
    // A global hidden after valid data, inside a snapshot-like dict.
    let mut b = vec![0x80, 4, b'}', 0x94];
    short_unicode(&mut b, "segments");
    b.extend_from_slice(&evil_stack_global("os", "system", &cmd)[2..]);
    let e = pickle::loads("evil.pickle", &b).unwrap_err().to_string();
    assert!(e.contains("'os.system'") && e.contains("at byte 28"), "{e}");
    assert!(!marker.exists(), "a refused pickle ran its command");
}

#[test]
fn ordered_dict_snapshot_loads_with_seeds_kind_and_native_reserved() {
    const M: u64 = 1 << 20;
    for f in ["partial_ordered.pickle", "partial_plain_p4.pickle"] {
        let t = trace::load(&fixtures().join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(t.kind, Kind::Partial, "{f}");
        assert_eq!(t.device, 1, "{f}: the device with the most entries");
        assert_eq!(t.seeded, 2, "{f}");
        let ev: Vec<(Op, u64, u64)> = t.events.iter().map(|e| (e.op, e.id, e.size)).collect();
        assert_eq!(
            ev,
            vec![
                (Op::Alloc, 2, 3 * M), // freed in the window, never allocated there
                (Op::Alloc, 3, 5 * M), // live at dump, unseen in the window
                (Op::Alloc, 0, M),
                (Op::Alloc, 1, 2 * M),
                (Op::Free, 0, M),
                (Op::Free, 2, 3 * M),
            ],
            "{f}"
        );
        assert_eq!(t.peak_requested(), 11 * M, "{f}");
        let times: Vec<i64> = t.events.iter().map(|e| e.time_us).collect();
        assert_eq!(times, vec![0, 0, 10, 20, 31, 40], "{f}");
        assert!(t.events.iter().all(|e| e.stream == 7), "{f}");
        assert_eq!(t.sites[t.events[2].site as usize], "train.py:40 in step");
        assert_eq!(t.sites[t.events[3].site as usize], "model.py:7 in forward");
        assert_eq!(t.events[0].site, 0);
        let n = t.native.as_ref().unwrap();
        assert_eq!(
            n.initial,
            22 * M,
            "{f}: 40 MiB at dump - (20 - 2) in the window"
        );
        assert_eq!(n.changes, vec![(2, 42 * M), (6, 40 * M)], "{f}");
        assert_eq!(n.peak, 42 * M, "{f}");
    }
    // Protocol 0, no events: state-only, the device with the most segments.
    let t = trace::load(&fixtures().join("state_p0.pickle")).unwrap();
    assert_eq!((t.kind, t.device, t.seeded), (Kind::StateOnly, 1, 2));
    assert_eq!(t.peak_requested(), 7 << 20);
    assert_eq!(t.native.as_ref().unwrap().peak, 40 << 20);
}

/// Steps from `external_annotations`: the end of each `Optimizer.step` range on the trace's
/// device, placed by time among the events (after the seeds); one before the first event is
/// counted apart; `ProfilerStep` ranges win where there are any. A block live at dump that the
/// window never allocated is seeded with the site of its own frames.
#[test]
fn snapshot_steps_come_from_its_annotations() {
    let code = |extra: &str| {
        format!(
            "f = lambda file, line, name: [dict(filename=file, line=line, name=name)]\n\
             e = lambda a, addr, s, t: dict(action=a, addr=addr, size=s, stream=0, time_us=t, \
                 frames=f('train.py', 40, 'step'))\n\
             ann = lambda stage, name, t, d=0: dict(stage=stage, name=name, device=d, time_us=t)\n\
             obj = dict(\n\
               segments=[dict(device=0, address=4096, total_size=1 << 20, stream=0, blocks=[\n\
                 dict(address=4096, size=512, requested_size=500, state='active_allocated', \
                      frames=f('model.py', 7, '__init__'))])],\n\
               device_traces=[[e('alloc', 16, 100, 1000), e('alloc', 32, 200, 1010), \
                 e('free_completed', 32, 200, 1020), e('alloc', 48, 300, 1030), \
                 e('free_completed', 16, 100, 1040)]],\n\
               external_annotations=[ann('START', 'Optimizer.step#AdamW.step', 900), \
                 ann('END', 'Optimizer.step#AdamW.step', 950), \
                 ann('START', 'Optimizer.zero_grad#AdamW.zero_grad', 1011), \
                 ann('END', 'Optimizer.zero_grad#AdamW.zero_grad', 1012), \
                 ann('START', 'Optimizer.step#AdamW.step', 1021), \
                 ann('END', 'Optimizer.step#AdamW.step', 1025), \
                 ann('END', 'Optimizer.step#AdamW.step', 1035, 1){extra}])"
        )
    };
    let load = |extra: &str| {
        let bytes = python_pickle(&code(extra), 4);
        let p = pickle::loads("steps.pickle", &bytes).unwrap();
        torch_snapshot::from_value("steps.pickle", &p.root()).unwrap()
    };
    let t = load("");
    assert_eq!(t.seeded, 1);
    assert_eq!(t.sites[t.events[0].site as usize], "model.py:7 in __init__");
    assert_eq!(t.sites[t.events[1].site as usize], "train.py:40 in step");
    let s = t.steps.as_ref().expect("steps");
    // 1025 µs: after the events at 1000, 1010, 1020 (and the seed): step 0 is events 0..4.
    assert_eq!(s.ends, vec![4]);
    assert_eq!(s.before_window, 1);
    assert!(s.marker.contains("Optimizer.step"), "{}", s.marker);
    let t = load(", ann('START', 'ProfilerStep#3', 1001), ann('END', 'ProfilerStep#3', 1015)");
    let s = t.steps.as_ref().unwrap();
    assert_eq!((s.ends.clone(), s.before_window), (vec![3], 0));
    assert!(s.marker.contains("ProfilerStep"), "{}", s.marker);
    // No annotation of a step: no steps.
    let bytes = python_pickle(
        "obj = dict(segments=[], device_traces=[[dict(action='alloc', addr=16, size=1, \
         stream=0, time_us=5)]], external_annotations=[dict(stage='END', name='forward', \
         device=0, time_us=9)])",
        4,
    );
    let p = pickle::loads("none.pickle", &bytes).unwrap();
    let t = torch_snapshot::from_value("none.pickle", &p.root()).unwrap();
    assert_eq!(t.steps, None);
}

/// A real training snapshot marks its optimizer steps; its ring buffer kept only the last one's
/// end (the 9 before it ended before its first recorded event).
#[test]
fn a_real_training_snapshot_marks_its_steps() {
    let f = traces_dir().join(
        "cherryni2022__cs336-assignment2-system__6effd3e__memory_nvtx_large_128_backward.pickle.gz",
    );
    let t = trace::load(&f).unwrap();
    let s = t.steps.as_ref().expect("steps");
    assert_eq!((s.ends.len(), s.before_window), (1, 9), "{s:?}");
    assert!(s.ends[0] > t.seeded && s.ends[0] < t.events.len());
    let f = traces_dir()
        .join("Wuyh11__assignment2-systems__52a0171__memory_medium_training_ctx128_amp0.pickle.gz");
    let t = trace::load(&f).unwrap();
    assert!(t.steps.is_some());
}

#[test]
fn malformed_snapshot_names_the_key_path() {
    // device_traces[1][2] has no 'size'.
    let bytes = python_pickle(
        "e = lambda a, s: dict(action=a, addr=16, size=s, stream=0)\n\
         obj = dict(segments=[], device_traces=[[], [e('alloc', 1), e('alloc', 2), dict(action='alloc', addr=32)]])",
        4,
    );
    let p = pickle::loads("snap.pickle", &bytes).unwrap();
    let e = torch_snapshot::from_value("snap.pickle", &p.root())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("snap.pickle") && e.contains("device_traces[1][2]: 'size' missing"),
        "{e}"
    );
    let p = pickle::loads("x.pickle", b"K\x03.").unwrap();
    let e = torch_snapshot::from_value("x.pickle", &p.root())
        .unwrap_err()
        .to_string();
    assert!(e.contains("x.pickle") && e.contains("top level"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Broken files

fn smallest(dir: &Path, gz: bool) -> PathBuf {
    let mut v: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(if gz { ".pickle.gz" } else { ".pickle" })
        })
        .map(|p| (std::fs::metadata(&p).unwrap().len(), p))
        .collect();
    v.sort();
    // Not the very smallest (a state-only dump of a few KB): one with events.
    v.into_iter()
        .find(|(n, _)| *n > 50_000)
        .expect("a real trace over 50 kB")
        .1
}

#[test]
fn truncated_and_corrupt_files_name_the_file_and_position() {
    let dir = traces_dir();
    // A plain pickle cut in half.
    let src = smallest(&dir, false);
    let bytes = std::fs::read(&src).unwrap();
    let half = scratch("half.pickle");
    std::fs::write(&half, &bytes[..bytes.len() / 2]).unwrap();
    let e = trace::load(&half).unwrap_err().to_string();
    let _ = std::fs::remove_file(&half);
    assert!(
        e.contains(&half.display().to_string()) && e.contains("byte ") && e.contains("truncated"),
        "{e}"
    );

    // A gzip cut in half: the stream ends early.
    let gz = smallest(&dir, true);
    let bytes = std::fs::read(&gz).unwrap();
    let cut = scratch("half.pickle.gz");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = trace::load(&cut).unwrap_err().to_string();
    let _ = std::fs::remove_file(&cut);
    assert!(
        e.contains(&cut.display().to_string()) && e.contains("gzip") && e.contains("byte "),
        "{e}"
    );

    // A gzip with garbage in the middle of its deflate data (or its CRC).
    let mut bad = bytes.clone();
    let mid = bad.len() / 2;
    for b in &mut bad[mid..mid + 64] {
        *b ^= 0x5a;
    }
    let corrupt = scratch("corrupt.pickle.gz");
    std::fs::write(&corrupt, &bad).unwrap();
    let e = trace::load(&corrupt).unwrap_err().to_string();
    let _ = std::fs::remove_file(&corrupt);
    assert!(
        e.contains(&corrupt.display().to_string()) && e.contains("gzip") && e.contains("byte "),
        "{e}"
    );

    // Bytes in no known format.
    let junk = scratch("junk.bin");
    std::fs::write(&junk, b"GIF89a not a trace at all").unwrap();
    let e = trace::load(&junk).unwrap_err().to_string();
    let _ = std::fs::remove_file(&junk);
    for want in [
        "junk.bin",
        "torch-arena-trace",
        "_dump_snapshot",
        "Thread,Time,Action",
        "gzip",
    ] {
        assert!(e.contains(want), "{want} missing from: {e}");
    }

    // A missing file: the path and the OS error.
    let missing = scratch("does-not-exist.pickle");
    let e = trace::load(&missing).unwrap_err().to_string();
    assert!(
        e.contains(&missing.display().to_string()) && e.to_lowercase().contains("no such file"),
        "{e}"
    );

    // Our own format is recognised (its reader lives in format.rs).
    let ours = scratch("ours.trace");
    std::fs::write(&ours, b"torch-arena-trace 1\n").unwrap();
    let t = trace::load(&ours);
    let _ = std::fs::remove_file(&ours);
    let t = t.expect("a header-only torch-arena-trace file is an empty trace");
    assert_eq!(t.source, trace::Source::Arena(1));
    assert!(t.events.is_empty());
}

/// xorshift64*: a fixed-seed generator, so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn random_byte_flips_never_panic() {
    let dir = traces_dir();
    let mut inputs = vec![
        std::fs::read(fixtures().join("partial_ordered.pickle")).unwrap(),
        std::fs::read(fixtures().join("partial_plain_p4.pickle")).unwrap(),
        std::fs::read(fixtures().join("state_p0.pickle")).unwrap(),
    ];
    let small = dir.join("Charran78__DocuBox__94d578b__dump_snapshot.pickle");
    if let Ok(b) = std::fs::read(small) {
        inputs.push(b);
    }
    let mut rng = Rng(0x7061_636b_6c65_2121);
    let (mut ok, mut err) = (0, 0);
    for round in 0..3000 {
        let src = &inputs[round % inputs.len()];
        let mut b = src.clone();
        let flips = 1 + (rng.next() % 4) as usize;
        for _ in 0..flips {
            let i = (rng.next() % b.len() as u64) as usize;
            match rng.next() % 3 {
                0 => b[i] ^= 1 << (rng.next() % 8),
                1 => b[i] = rng.next() as u8,
                _ => b.truncate(i.max(1)),
            }
        }
        match pickle::loads("fuzz.pickle", &b)
            .and_then(|p| torch_snapshot::from_value("fuzz.pickle", &p.root()))
        {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(e.to_string().contains("fuzz.pickle"), "{e}");
                err += 1;
            }
        }
    }
    println!("byte flips: {ok} still loaded, {err} refused");
    assert!(err > 0);
}

// ---------------------------------------------------------------------------------------------
// RMM CSV

#[test]
fn rmm_log_loads_with_seeds_and_failure_notes() {
    let path = fixtures().join("rmm_small.csv");
    let t = trace::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.source, Source::RmmCsv);
    assert_eq!(t.kind, Kind::Partial);
    assert_eq!(t.seeded, 1);
    assert!(t.native.is_none());
    assert!(
        t.name.contains("1 allocate failure not replayed"),
        "{}",
        t.name
    );
    let ev: Vec<(Op, u64, u64, u64, i64)> = t
        .events
        .iter()
        .map(|e| (e.op, e.id, e.size, e.stream, e.time_us))
        .collect();
    assert_eq!(
        ev,
        vec![
            (Op::Alloc, 2, 4096, 0, 0), // seeded: freed below, never allocated in the log
            (Op::Alloc, 0, 1000, 0, 0),
            (Op::Alloc, 1, 2000, 0x10, 5),
            (Op::Free, 0, 1000, 0, 1_000_010),
            (Op::Free, 2, 4096, 0, 1_000_020),
            (Op::Alloc, 3, 3000, 0, 60_000_000),
            (Op::Free, 1, 2000, 0x10, 60_000_001),
        ]
    );
    assert_eq!(t.peak_requested(), 4096 + 1000 + 2000);
    let (_, fails) =
        rmm::from_bytes_with_failures("x.csv", &std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(fails.len(), 1);
    assert_eq!((fails[0].line, fails[0].size), (5, 1 << 40));

    // Fresh log: no seeds, no name note.
    let t = rmm::from_bytes(
        "fresh.csv",
        b"Thread,Time,Action,Pointer,Size,Stream\n1,00:00:01:000000,allocate,0x10,8,0x0\n\
          1,00:00:01:000001,free,0x10,8,0x0\n",
    )
    .unwrap();
    assert_eq!(
        (t.kind, t.seeded, t.name.as_str()),
        (Kind::Fresh, 0, "fresh.csv")
    );
}

#[test]
fn rmm_bad_lines_name_the_line() {
    let path = fixtures().join("rmm_bad_line.csv");
    let e = trace::load(&path).unwrap_err().to_string();
    assert!(
        e.contains("rmm_bad_line.csv:4:") && e.contains("pointer"),
        "{e}"
    );
    for (text, want) in [
        (
            "Thread,Time,Action,Pointer,Size,Stream\n1,12:00,allocate,0x1,8,0x0\n",
            ":2: time",
        ),
        (
            "Thread,Time,Action,Pointer,Size,Stream\n1,12:00:00:0,alloc,0x1,8,0x0\n",
            ":2: action",
        ),
        (
            "Thread,Time,Action,Pointer,Size,Stream\n\n1,12:00:00:0,free,0x1,-8,0x0\n",
            ":3: size",
        ),
        (
            "Thread,Time,Action,Pointer,Size,Stream\n1,12:00:00:0,free,0x1\n",
            ":2: 4 fields",
        ),
        (
            "Thread,Time,Action,Pointer,Size,Stream\n1,12:00:00:0,free,0x1,8,zz\n",
            ":2: stream",
        ),
    ] {
        let e = rmm::from_bytes("r.csv", text.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("r.csv{want}")), "want {want}: {e}");
    }
    let e = rmm::from_bytes("r.csv", b"Thread,Time\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("r.csv:1: header"), "{e}");
}
