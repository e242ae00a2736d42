//! Logging through the C exports: levels, the queue the Python package drains, its line format,
//! its bounds, and (in child processes, which start with a fresh process-wide state) the
//! environment variable and what reaches stderr.
//!
//! The level, the attach flag and the queue are process-wide, so every in-process test takes
//! [`setup`]'s lock, which also puts them back to a known state: level warn, attached, queue
//! empty.

use std::ffi::{CString, c_char, c_void};
use std::process::Command;
use std::sync::MutexGuard;

use torch_arena::abi::*;
use torch_arena::log as arena_log;

#[path = "common/abi_session.rs"]
mod abi_session;
use abi_session::{CONF, last_error};
/// Set in a child process: which scenario [`child_process`] runs.
const CHILD_ENV: &str = "TORCH_ARENA_LOG_TEST_CHILD";

fn setup() -> MutexGuard<'static, ()> {
    let guard = abi_session::session();
    assert_eq!(set_level("warn"), TORCH_ARENA_OK);
    torch_arena_log_attach(1);
    drain();
    guard
}

fn set_level(name: &str) -> i32 {
    let c = CString::new(name).unwrap();
    unsafe { torch_arena_set_log_level(c.as_ptr()) }
}

/// One drained line, split.
#[derive(Debug)]
struct Line {
    level: String,
    target: String,
    message: String,
}

/// Everything queued, as raw text, through `torch_arena_log_drain` with a 4096-byte buffer.
fn drain_text() -> String {
    let mut text = String::new();
    loop {
        let mut buf = vec![0x55u8; 4096];
        let n = unsafe { torch_arena_log_drain(buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
        if n == 0 {
            return text;
        }
        assert!(
            n < buf.len(),
            "a 4096-byte buffer did not hold a record ({n})"
        );
        assert_eq!(buf[n], 0, "the drained bytes are not NUL-terminated");
        text.push_str(std::str::from_utf8(&buf[..n]).expect("UTF-8"));
    }
}

/// Everything queued, parsed; checks that every line has the `LEVEL\tTARGET\tMESSAGE\n` shape.
fn drain() -> Vec<Line> {
    let text = drain_text();
    assert!(text.is_empty() || text.ends_with('\n'), "{text:?}");
    text.lines()
        .map(|l| {
            let parts: Vec<&str> = l.split('\t').collect();
            assert_eq!(parts.len(), 3, "not LEVEL\\tTARGET\\tMESSAGE: {l:?}");
            assert!(
                ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&parts[0]),
                "bad level in {l:?}"
            );
            Line {
                level: parts[0].to_string(),
                target: parts[1].to_string(),
                message: parts[2].to_string(),
            }
        })
        .collect()
}

fn malloc(size: usize) -> *mut c_void {
    let mut p = std::ptr::null_mut();
    let rc = unsafe { torch_arena_try_malloc(size, 0, std::ptr::null_mut(), &mut p) };
    assert_eq!(rc, TORCH_ARENA_OK, "{}", last_error());
    p
}

#[test]
fn warn_passes_and_info_is_dropped_at_the_warn_level() {
    let _g = setup();
    assert_eq!(torch_arena_log_level(), 2);
    tracing::info!(target: "probe", "info probe");
    tracing::debug!(target: "probe", "debug probe");
    tracing::warn!(target: "probe", n = 7, "warn probe");
    tracing::error!(target: "probe", "error probe");
    let lines = drain();
    let got: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l.level.as_str(), l.message.as_str()))
        .collect();
    assert_eq!(
        got,
        [("WARN", "warn probe n=7"), ("ERROR", "error probe")],
        "{lines:?}"
    );
    assert!(lines.iter().all(|l| l.target == "probe"), "{lines:?}");
}

#[test]
fn a_bad_free_is_a_warn_record_naming_the_pointer() {
    let _g = setup();
    let bogus = 0x7000_f00d_0000usize as *mut c_void;
    torch_arena_try_free(bogus, 4096, 0, std::ptr::null_mut());
    let p = malloc(8192);
    assert_eq!(
        torch_arena_try_free(p, 8192, 0, std::ptr::null_mut()),
        TORCH_ARENA_OK
    );
    torch_arena_try_free(p, 8192, 0, std::ptr::null_mut());
    let lines = drain();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for l in &lines {
        assert_eq!(l.level, "WARN", "{l:?}");
        assert_eq!(l.target, "torch_arena::abi", "{l:?}");
    }
    assert!(
        lines[0].message.starts_with("bad free (unknown pointer) #")
            && lines[0].message.contains("0x7000f00d0000"),
        "{lines:?}"
    );
    assert!(
        lines[1].message.starts_with("bad free (double free) #")
            && lines[1].message.contains(&format!("{p:p}")),
        "{lines:?}"
    );
}

#[test]
fn an_unknown_record_stream_pointer_is_a_warn_record() {
    let _g = setup();
    torch_arena_record_stream(0x7000_abc0_0000usize as *mut c_void, std::ptr::null_mut());
    let lines = drain();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].level, "WARN");
    assert!(
        lines[0]
            .message
            .starts_with("record_stream (unknown pointer) #")
            && lines[0].message.contains("0x7000abc00000"),
        "{lines:?}"
    );
}

#[test]
fn out_of_memory_is_a_warn_record_with_the_oom_message() {
    let _g = setup();
    let mut p = std::ptr::null_mut();
    let rc = unsafe { torch_arena_try_malloc(1 << 40, 0, std::ptr::null_mut(), &mut p) };
    assert_eq!(rc, TORCH_ARENA_ERR_OOM);
    let lines = drain();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].level, "WARN");
    assert!(
        lines[0]
            .message
            .starts_with("out of memory #1: CUDA out of memory. Tried to allocate"),
        "{lines:?}"
    );
}

#[test]
fn debug_level_reports_empty_cache_and_defragment() {
    let _g = setup();
    let mut report = TorchArenaReclaimReport::default();
    assert_eq!(
        unsafe { torch_arena_empty_cache_report(&mut report) },
        TORCH_ARENA_OK
    );
    assert!(drain().is_empty(), "a debug record at the warn level");

    assert_eq!(set_level("DeBuG"), TORCH_ARENA_OK);
    assert_eq!(torch_arena_log_level(), 4);
    assert_eq!(
        unsafe { torch_arena_empty_cache_report(&mut report) },
        TORCH_ARENA_OK
    );
    torch_arena_empty_cache();
    assert_eq!(
        unsafe { torch_arena_defragment(0, &mut report) },
        TORCH_ARENA_OK
    );
    let lines = drain();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines.iter().all(|l| l.level == "DEBUG"), "{lines:?}");
    assert!(lines[0].message.starts_with("empty_cache: "), "{lines:?}");
    assert!(
        lines[1].message.starts_with("empty_cache (reset hook): "),
        "{lines:?}"
    );
    assert!(
        lines[2].message.starts_with("defragment(device 0): "),
        "{lines:?}"
    );
}

#[test]
fn a_bad_level_is_refused_naming_the_value_and_the_accepted_ones() {
    let _g = setup();
    torch_arena_clear_last_error();
    assert_eq!(set_level("loud"), TORCH_ARENA_ERR_CONFIG);
    let err = last_error();
    assert!(err.contains("\"loud\""), "{err}");
    for accepted in ["error", "warn", "info", "debug", "trace", "off"] {
        assert!(err.contains(accepted), "{err} does not name {accepted}");
    }
    assert_eq!(torch_arena_log_level(), 2, "a bad name changed the level");
    assert_eq!(
        unsafe { torch_arena_set_log_level(std::ptr::null()) },
        TORCH_ARENA_ERR_INVALID_ARGUMENT
    );
}

#[test]
fn off_silences_even_errors() {
    let _g = setup();
    assert_eq!(set_level("off"), TORCH_ARENA_OK);
    assert_eq!(torch_arena_log_level(), 0);
    tracing::error!(target: "probe", "silenced");
    torch_arena_try_free(
        0x7000_0ff0_0000usize as *mut c_void,
        512,
        0,
        std::ptr::null_mut(),
    );
    assert!(drain().is_empty());
}

#[test]
fn the_queue_keeps_the_newest_records_and_counts_drops() {
    let _g = setup();
    let extra = 76;
    let before = torch_arena_log_dropped();
    for i in 0..arena_log::QUEUE_CAP + extra {
        tracing::warn!(target: "probe", "record {i}");
    }
    assert_eq!(torch_arena_log_dropped() - before, extra as u64);
    let lines = drain();
    assert_eq!(lines.len(), arena_log::QUEUE_CAP);
    for (k, l) in lines.iter().enumerate() {
        assert_eq!(l.message, format!("record {}", k + extra));
    }
}

#[test]
fn detached_records_are_not_queued() {
    let _g = setup();
    torch_arena_log_attach(0);
    // This one goes to stderr.
    tracing::warn!(target: "probe", "to stderr, not queued");
    torch_arena_log_attach(1);
    tracing::warn!(target: "probe", "queued");
    let lines = drain();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].message, "queued");
}

#[test]
fn drain_is_snprintf_style_and_never_splits_a_record() {
    let _g = setup();
    tracing::warn!(target: "probe", "first");
    tracing::warn!(target: "probe", "second");
    let first = "WARN\tprobe\tfirst\n";
    // A probe: the length the first record needs, nothing popped.
    let need = unsafe { torch_arena_log_drain(std::ptr::null_mut(), 0) };
    assert_eq!(need, first.len());
    // One byte short (no room for the NUL): nothing popped, buf[0] = NUL, length returned.
    let mut buf = vec![0x55u8; first.len()];
    let n = unsafe { torch_arena_log_drain(buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    assert_eq!(n, first.len());
    assert_eq!(buf[0], 0);
    // Room for the first and part of the second: only the first.
    let mut buf = vec![0x55u8; first.len() + 5];
    let n = unsafe { torch_arena_log_drain(buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    assert_eq!(&buf[..n], first.as_bytes());
    assert_eq!(buf[n], 0);
    assert_eq!(drain_text(), "WARN\tprobe\tsecond\n");
    assert_eq!(unsafe { torch_arena_log_drain(std::ptr::null_mut(), 0) }, 0);
}

#[test]
fn separators_are_escaped_and_long_messages_cut() {
    let _g = setup();
    tracing::warn!(target: "probe", "a\tb\nc\\d");
    tracing::warn!(target: "probe", "{}", "x\n".repeat(10_000));
    let text = drain_text();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("WARN\tprobe\ta\\tb\\nc\\\\d"));
    let long = lines.next().unwrap();
    assert!(long.len() <= arena_log::MAX_LINE_BYTES, "{}", long.len());
    assert!(long.ends_with("x\\n... [truncated]"), "{long}");
    assert!(long.len() > 2900, "cut too short: {}", long.len());
    assert_eq!(lines.next(), None);
}

#[test]
fn records_carry_a_monotonic_sequence_number_and_an_integer_level() {
    let _g = setup();
    tracing::error!(target: "probe", "one");
    tracing::warn!(target: "probe", "two");
    assert_eq!(arena_log::queued(), 2);
    let records = arena_log::drain_records();
    assert_eq!(arena_log::queued(), 0);
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records[1].seq, records[0].seq + 1, "{records:?}");
    assert_eq!((records[0].level, records[1].level), (1, 2));
    assert_eq!(records[1].line(), "WARN\tprobe\ttwo\n");
}

// ---------------------------------------------------------------------------------------------
// Child processes: a fresh process-wide state, and stderr we can read.

/// Runs one scenario when started by [`run_child`]; passes trivially otherwise.
#[test]
fn child_process() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let conf = CString::new(CONF).unwrap();
    assert_eq!(
        unsafe { torch_arena_configure(conf.as_ptr()) },
        TORCH_ARENA_OK
    );
    println!("level={}", torch_arena_log_level());
    if mode != "delivery" {
        return;
    }
    let free = |p: usize| torch_arena_try_free(p as *mut c_void, 512, 0, std::ptr::null_mut());
    free(0x7000_dead_0000);
    tracing::info!(target: "probe", "child info probe");
    torch_arena_log_attach(1);
    free(0x7000_beef_0000);
    for line in drain_text().lines() {
        println!("drained: {line}");
    }
    torch_arena_log_attach(0);
    free(0x7000_cafe_0000);
}

struct Child {
    stdout: String,
    stderr: String,
}

/// This test binary, running only [`child_process`] in `mode`, with `TORCH_ARENA_LOG` set to
/// `log` (`None`: unset).
fn run_child(mode: &str, log: Option<&str>) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child_process",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, mode)
    .env_remove("TORCH_ARENA_CONF");
    match log {
        Some(v) => cmd.env("TORCH_ARENA_LOG", v),
        None => cmd.env_remove("TORCH_ARENA_LOG"),
    };
    let out = cmd.output().expect("run the child");
    let child = Child {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        out.status.success(),
        "child {mode} failed\nstdout:\n{}\nstderr:\n{}",
        child.stdout,
        child.stderr
    );
    child
}

#[test]
fn by_default_warnings_reach_stderr_and_stop_once_attached() {
    let c = run_child("delivery", None);
    assert!(c.stdout.contains("level=2"), "{}", c.stdout);
    let ours: Vec<&str> = c
        .stderr
        .lines()
        .filter(|l| l.starts_with("torch-arena: "))
        .collect();
    assert_eq!(ours.len(), 2, "{}", c.stderr);
    assert!(
        ours[0].starts_with("torch-arena: warning: bad free (unknown pointer) #1: ")
            && ours[0].contains("0x7000dead0000"),
        "{ours:?}"
    );
    assert!(
        ours[1].starts_with("torch-arena: warning: bad free (unknown pointer) #3: ")
            && ours[1].contains("0x7000cafe0000"),
        "{ours:?}"
    );
    // Quiet by default: no info (configuration, device) and no probe.
    assert!(!c.stderr.contains("torch-arena: info"), "{}", c.stderr);
    // Attached: queued, not printed.
    assert!(!c.stderr.contains("0x7000beef0000"), "{}", c.stderr);
    assert!(
        c.stdout
            .contains("drained: WARN\ttorch_arena::abi\tbad free (unknown pointer) #2: ")
            && c.stdout.contains("0x7000beef0000"),
        "{}",
        c.stdout
    );
}

#[test]
fn a_bad_environment_value_gives_warn_and_one_warning() {
    let c = run_child("level", Some("Loud"));
    assert!(c.stdout.contains("level=2"), "{}", c.stdout);
    let warnings: Vec<&str> = c
        .stderr
        .lines()
        .filter(|l| l.starts_with("torch-arena: "))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", c.stderr);
    let w = warnings[0];
    assert!(
        w.starts_with("torch-arena: warning: TORCH_ARENA_LOG=\"Loud\" is not a log level")
            && w.contains("error, warn, info, debug, trace, off"),
        "{w}"
    );
}

#[test]
fn the_environment_sets_the_level_case_insensitively() {
    let c = run_child("level", Some("INFO"));
    assert!(c.stdout.contains("level=3"), "{}", c.stdout);
    assert!(
        c.stderr
            .contains("torch-arena: info: configured from torch_arena_configure: \"device:sim,"),
        "{}",
        c.stderr
    );
    let c = run_child("level", Some("off"));
    assert!(c.stdout.contains("level=0"), "{}", c.stdout);
    assert!(!c.stderr.contains("torch-arena: "), "{}", c.stderr);
}
