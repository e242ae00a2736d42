//! The tracking exports (docs/tracking-abi.md) called in-process, as the Python layer calls them:
//! every JSON report parses, has the contract's keys, and escapes strings.

use std::ffi::{CString, c_char, c_void};
use std::sync::{Mutex, MutexGuard, Once};

use torch_arena::abi::*;

#[path = "common/json.rs"]
mod json;
use json::{Json, parse};

const CONF: &str = "device:sim,sim_capacity_mb:256,sites:native";

fn session() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    static CONFIGURE: Once = Once::new();
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    CONFIGURE.call_once(|| {
        let conf = CString::new(CONF).unwrap();
        assert_eq!(
            unsafe { torch_arena_configure(conf.as_ptr()) },
            TORCH_ARENA_OK
        );
    });
    guard
}

fn last_error() -> String {
    let n = unsafe { torch_arena_last_error(std::ptr::null_mut(), 0) };
    let mut buf = vec![0u8; n + 1];
    unsafe { torch_arena_last_error(buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

/// Read a report the way a C caller does: probe the size, then a buffer that fits.
fn report(f: impl Fn(*mut c_char, usize) -> usize) -> String {
    let n = f(std::ptr::null_mut(), 0);
    assert!(n > 0, "report failed: {}", last_error());
    let mut small = vec![0x55u8; 8];
    assert_eq!(f(small.as_mut_ptr().cast(), small.len()), n);
    assert_eq!(small[7], 0, "truncated text is NUL-terminated");
    let mut buf = vec![0x55u8; n + 1];
    assert_eq!(f(buf.as_mut_ptr().cast(), buf.len()), n);
    assert_eq!(buf[n], 0);
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

fn live() -> Json {
    let t = report(|b, c| unsafe { torch_arena_live_json(0, b, c) });
    parse(&t).unwrap_or_else(|e| panic!("{e}: {t}"))
}

fn malloc(size: usize) -> *mut c_void {
    let mut p = std::ptr::null_mut();
    let rc = unsafe { torch_arena_try_malloc(size, 0, std::ptr::null_mut(), &mut p) };
    assert_eq!(rc, TORCH_ARENA_OK, "{}", last_error());
    p
}

fn free(p: *mut c_void, size: usize) {
    assert_eq!(
        torch_arena_try_free(p, size, 0, std::ptr::null_mut()),
        TORCH_ARENA_OK,
        "{}",
        last_error()
    );
}

fn push(tag: &str) {
    let c = CString::new(tag).unwrap();
    assert_eq!(unsafe { torch_arena_tag_push(c.as_ptr()) }, TORCH_ARENA_OK);
}

fn find(live: &Json, p: *mut c_void) -> Option<Json> {
    live.get("allocations")
        .arr()
        .iter()
        .find(|a| a.get("ptr").u64() == p as u64)
        .cloned()
}

#[test]
fn live_json_lists_allocations_with_tags_steps_and_sites() {
    let _g = session();
    let step0 = torch_arena_current_step();
    let weird = "ev\"al\n\\ é🦀\u{1}";
    push(weird);
    let a = malloc(3000);
    assert_eq!(torch_arena_tag_pop(), TORCH_ARENA_OK);
    assert_eq!(torch_arena_step(), step0 + 1);
    assert_eq!(torch_arena_current_step(), step0 + 1);
    let b = malloc(5 << 20);
    let j = live();
    assert_eq!(j.get("device").u64(), 0);
    assert_eq!(j.get("step").u64(), step0 + 1);
    let ea = find(&j, a).expect("a is live");
    assert_eq!(ea.get("size").u64(), 3072);
    assert_eq!(ea.get("requested").u64(), 3000);
    assert_eq!(ea.get("step").u64(), step0);
    assert_eq!(ea.get("tag").str(), weird);
    assert_eq!(ea.get("stream").u64(), 0);
    let eb = find(&j, b).expect("b is live");
    assert_eq!(eb.get("tag"), &Json::Null);
    assert_eq!(eb.get("size").u64(), 5 << 20);
    assert_eq!(eb.get("step").u64(), step0 + 1);
    assert!(eb.get("seq").u64() > ea.get("seq").u64());
    for key in ["thread", "time_us"] {
        eb.get(key).u64();
    }
    // sites:native: both have a site, and "sites" names every site referenced.
    let sites = j.get("sites");
    for e in [&ea, &eb] {
        let id = e.get("site").u64();
        assert_ne!(id, 0);
        let frames = sites.get(&id.to_string()).arr();
        assert!(!frames.is_empty());
        for f in frames {
            assert_eq!(f.get("kind").str(), "native");
            assert!(f.get("ip").str().starts_with("0x"));
            f.get("filename").str();
            f.get("name").str();
            f.get("line").u64();
        }
    }
    free(a, 3000);
    free(b, 5 << 20);
    let j = live();
    assert!(find(&j, a).is_none() && find(&j, b).is_none());
}

#[test]
fn tag_pop_on_empty_is_an_error() {
    let _g = session();
    while torch_arena_tag_pop() == TORCH_ARENA_OK {}
    assert_eq!(torch_arena_tag_pop(), TORCH_ARENA_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("empty"), "{}", last_error());
    assert_eq!(
        unsafe { torch_arena_tag_push(std::ptr::null()) },
        TORCH_ARENA_ERR_INVALID_ARGUMENT
    );
}

#[test]
fn set_sites_checks_its_arguments() {
    let _g = session();
    let m = |s: &str| CString::new(s).unwrap();
    assert_eq!(
        unsafe { torch_arena_set_sites(m("sometimes").as_ptr(), 1, 0) },
        TORCH_ARENA_ERR_CONFIG
    );
    assert!(last_error().contains("none, python, native or all"));
    assert_eq!(
        unsafe { torch_arena_set_sites(m("native").as_ptr(), 0, 0) },
        TORCH_ARENA_ERR_CONFIG
    );
    // Only requests of at least 1 MiB get a site now.
    assert_eq!(
        unsafe { torch_arena_set_sites(m("native").as_ptr(), 1, 1 << 20) },
        TORCH_ARENA_OK
    );
    let small = malloc(4096);
    let big = malloc(2 << 20);
    let j = live();
    assert_eq!(find(&j, small).unwrap().get("site").u64(), 0);
    assert_ne!(find(&j, big).unwrap().get("site").u64(), 0);
    free(small, 4096);
    free(big, 2 << 20);
    assert_eq!(
        unsafe { torch_arena_set_sites(m("native").as_ptr(), 1, 0) },
        TORCH_ARENA_OK
    );
}

#[test]
fn leaks_json_reports_a_planted_leak() {
    let _g = session();
    let warmup = torch_arena_current_step() + 1;
    let mut kept = Vec::new();
    // An opaque trip count: an unrolled loop would call `leak_one_mib` from 8 return addresses,
    // that is 8 sites (as unrolling by the compiler did here once).
    for _ in 0..std::hint::black_box(8) {
        kept.push(leak_one_mib());
        let t = malloc(3 << 20); // steady: allocated and freed every step
        free(t, 3 << 20);
        torch_arena_step();
    }
    let t = report(|b, c| unsafe { torch_arena_leaks_json(0, warmup, 3, b, c) });
    let j = parse(&t).unwrap_or_else(|e| panic!("{e}: {t}"));
    assert_eq!(j.get("warmup").u64(), warmup);
    assert_eq!(j.get("steps_observed").u64(), 7);
    let growing = j.get("growing").arr();
    assert_eq!(growing.len(), 1, "{t}");
    let g = &growing[0];
    assert_eq!(g.get("bytes_per_step").f64(), 1048576.0);
    assert_eq!(g.get("count_per_step").f64(), 1.0);
    assert_eq!(g.get("live_count").u64(), 8);
    assert_eq!(g.get("live_bytes").u64(), 8 << 20);
    assert_eq!(g.get("example_sizes").arr().len(), 5);
    let frames = g.get("frames").arr();
    assert!(
        frames
            .iter()
            .any(|f| f.get("name").str().contains("leak_one_mib")),
        "{t}"
    );
    // The oldest ones are at least 3 steps old.
    let old = j.get("old").arr();
    assert_eq!(j.get("old_count").u64(), old.len() as u64);
    assert!(old.len() >= 5);
    for o in old {
        assert!(o.get("age").u64() >= 3);
    }
    for p in kept {
        free(p, 1 << 20);
    }
}

#[inline(never)]
fn leak_one_mib() -> *mut c_void {
    std::hint::black_box(malloc(1 << 20))
}

#[test]
fn layout_json_tiles_the_reserved_memory() {
    let _g = session();
    let a = malloc(700);
    let b = malloc(3 << 20);
    let t = report(|b, c| unsafe { torch_arena_layout_json(0, b, c) });
    let j = parse(&t).unwrap_or_else(|e| panic!("{e}: {t}"));
    let segs = j.get("segments").arr();
    let total: u64 = segs.iter().map(|s| s.get("total_size").u64()).sum();
    assert_eq!(total + j.get("pooled").u64(), j.get("reserved").u64());
    let mut found = 0;
    for s in segs {
        let mut at = s.get("address").u64();
        for b in s.get("blocks").arr() {
            assert_eq!(b.get("address").u64(), at);
            at += b.get("size").u64();
            if b.get("state").str() == "active_allocated" {
                found += 1;
            }
        }
        assert_eq!(at, s.get("address").u64() + s.get("total_size").u64());
    }
    assert!(found >= 2);
    free(a, 700);
    free(b, 3 << 20);
}

#[test]
fn history_records_allocs_and_frees_in_order() {
    let _g = session();
    assert_eq!(torch_arena_history_enable(1, 8), TORCH_ARENA_OK);
    let a = malloc(64 << 20);
    free(a, 64 << 20);
    let t = report(|b, c| unsafe { torch_arena_history_json(0, b, c) });
    let j = parse(&t).unwrap_or_else(|e| panic!("{e}: {t}"));
    let actions: Vec<&str> = j
        .get("entries")
        .arr()
        .iter()
        .map(|e| e.get("action").str())
        .collect();
    assert!(
        actions.ends_with(&["alloc", "free_requested", "free_completed"]),
        "{t}"
    );
    for _ in 0..10 {
        free(malloc(512), 512);
    }
    let t = report(|b, c| unsafe { torch_arena_history_json(0, b, c) });
    let j = parse(&t).unwrap();
    assert_eq!(j.get("entries").arr().len(), 8, "bounded");
    assert_eq!(torch_arena_history_enable(0, 0), TORCH_ARENA_OK);
}

#[test]
fn bad_devices_fail_cleanly() {
    let _g = session();
    let mut buf = [0x55 as c_char; 16];
    assert_eq!(
        unsafe { torch_arena_live_json(-1, buf.as_mut_ptr(), buf.len()) },
        0
    );
    assert_eq!(buf[0], 0);
    assert!(last_error().contains("out of range"), "{}", last_error());
    assert_eq!(
        unsafe { torch_arena_layout_json(64, buf.as_mut_ptr(), buf.len()) },
        0
    );
    // A device in range that was never opened: valid, empty reports.
    let t = report(|b, c| unsafe { torch_arena_live_json(5, b, c) });
    let j = parse(&t).unwrap();
    assert!(j.get("allocations").arr().is_empty());
    let t = report(|b, c| unsafe { torch_arena_layout_json(5, b, c) });
    assert!(parse(&t).unwrap().get("segments").arr().is_empty());
}
