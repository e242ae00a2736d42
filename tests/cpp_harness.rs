//! Runs the C++ harness (`tests/harness/harness.cpp`, built by build.rs) against the cdylib:
//! the library is loaded with dlopen and called exactly as PyTorch's CUDAPluggableAllocator calls
//! it (raw function pointers, several threads, OOM caught as a C++ `std::exception`).
//! Each scenario runs in its own process, over a simulated device.

#[path = "common/cdylib.rs"]
mod cdylib;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cdylib::cdylib;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Run one scenario with `conf` as TORCH_ARENA_CONF, killing it after `limit`.
fn run(scenario: &str, conf: &str, limit: Duration) -> Run {
    let mut child = Command::new(env!("TORCH_ARENA_HARNESS"))
        .arg(cdylib())
        .arg(scenario)
        .env("TORCH_ARENA_CONF", conf)
        .env("FAKE_LIBCUDA", env!("FAKE_LIBCUDA"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("could not start the harness");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for the harness") {
            break Some(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let run = Run {
        code: status.and_then(|s| s.code()),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    };
    assert!(
        status.is_some(),
        "harness {scenario} did not finish within {limit:?} (deadlock?)\nstdout:\n{}\nstderr:\n{}",
        run.stdout,
        tail(&run.stderr)
    );
    run
}

fn tail(s: &str) -> &str {
    let start = s.len().saturating_sub(4000);
    let start = (start..=s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    &s[start..]
}

fn assert_ok(scenario: &str, r: &Run) {
    assert!(
        r.code == Some(0) && r.stdout.contains(&format!("harness {scenario}: ok")),
        "harness {scenario} failed (exit {:?})\nstdout:\n{}\nstderr:\n{}",
        r.code,
        r.stdout,
        tail(&r.stderr)
    );
}

#[test]
fn threads_allocate_and_free_concurrently_without_overlap() {
    let r = run(
        "threads",
        "device:sim,sim_capacity_mb:32768,sim_backing:True",
        Duration::from_secs(300),
    );
    assert_ok("threads", &r);
}

#[test]
fn oom_is_a_cpp_exception_and_the_process_goes_on() {
    let r = run(
        "oom",
        "device:sim,sim_capacity_mb:64,sim_backing:True",
        Duration::from_secs(120),
    );
    assert_ok("oom", &r);
    assert!(
        r.stdout.contains("CUDA out of memory. Tried to allocate"),
        "{}",
        r.stdout
    );
}

#[test]
fn hooks_behave_as_pytorch_expects() {
    let r = run(
        "hooks",
        "device:sim,sim_capacity_mb:1024,sim_backing:True",
        Duration::from_secs(120),
    );
    assert_ok("hooks", &r);
}

#[test]
fn bad_frees_are_reported_never_thrown() {
    let r = run(
        "badfree",
        "device:sim,sim_capacity_mb:1024,sim_backing:True",
        Duration::from_secs(120),
    );
    assert_ok("badfree", &r);
    // Reported on stderr, and rate-limited: 2500+ bad frees give a few dozen lines, not thousands.
    let lines = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("torch-arena: warning: bad free"))
        .count();
    assert!(
        lines > 0,
        "no bad free was logged to stderr:\n{}",
        tail(&r.stderr)
    );
    assert!(
        lines < 60,
        "{lines} bad-free lines: the log is not rate-limited"
    );
    assert!(
        r.stderr.contains("0x7000f00d0000"),
        "the log does not name the pointer:\n{}",
        tail(&r.stderr)
    );
}

/// Sizes near SIZE_MAX and beyond the device, stream (void*)-1 and a thousand short-lived streams,
/// from 4 threads: every refusal is PyTorch's OOM exception, nothing overlaps, nothing stays held.
#[test]
fn hostile_sizes_and_streams_are_clean_ooms() {
    let r = run(
        "hostile",
        "device:sim,sim_capacity_mb:1024,sim_backing:True",
        Duration::from_secs(300),
    );
    assert_ok("hostile", &r);
    assert!(!r.stderr.contains("panicked"), "{}", tail(&r.stderr));
}

/// CUDA graph capture as torch.cuda.graph drives the hooks (begin with a filter, then the
/// capture; allocations and frees on the capturing stream and another; the capture ends, then
/// end; frees after capture; a second capture sharing the pool; a second pool at once; release),
/// on host-backed sim pages: nothing general lands on pool memory or on what the pool freed,
/// every pool block keeps its bytes, the pool's pages are refused to a general request until
/// the last release and serve it after.
#[test]
fn graph_capture_pools_on_the_sim() {
    let r = run(
        "graph",
        "device:sim,sim_capacity_mb:256,sim_backing:True",
        Duration::from_secs(120),
    );
    assert_ok("graph", &r);
}

/// The same on the cuda device over the fake driver with the streams really in capture (global
/// mode, as torch.cuda.graph's default): the captures end valid, no call the driver refuses
/// during capture reached it, no event was recorded on a capturing stream, and the fake does
/// refuse such calls (checked at the end).
#[test]
fn graph_capture_pools_on_the_fake_driver_make_no_forbidden_call() {
    let r = run("graph_cuda", "device:cuda", Duration::from_secs(120));
    assert_ok("graph_cuda", &r);
    assert!(r.stdout.contains("no forbidden call"), "{}", r.stdout);
}

#[test]
fn pools_general_allocations_and_admin_calls_run_at_once_on_their_own_streams() {
    let r = run(
        "mixed",
        "device:sim,sim_capacity_mb:32768,sim_backing:True",
        Duration::from_secs(300),
    );
    assert_ok("mixed", &r);
}

#[test]
fn pools_general_allocations_and_admin_calls_run_at_once_with_workers_on_one_stream() {
    let r = run(
        "mixed_one_stream",
        "device:sim,sim_capacity_mb:32768,sim_backing:True",
        Duration::from_secs(300),
    );
    assert_ok("mixed_one_stream", &r);
}

#[test]
fn pools_general_allocations_and_admin_calls_run_at_once_on_the_fake_driver() {
    let r = run("mixed", "device:cuda", Duration::from_secs(300));
    assert_ok("mixed", &r);
}
