//! The Rust exports called directly, in-process. They share one process-wide instance, so every
//! test first takes [`setup`]'s lock (which configures it once, with a simulated device) and the
//! tests never depend on each other's order.

use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::MutexGuard;

use torch_arena::abi::*;

#[path = "common/abi_session.rs"]
mod abi_session;
use abi_session::{CONF, last_error};

fn setup() -> MutexGuard<'static, ()> {
    abi_session::session()
}

fn configure(conf: &str) -> i32 {
    let c = CString::new(conf).unwrap();
    unsafe { torch_arena_configure(c.as_ptr()) }
}

fn check_config(conf: &str) -> i32 {
    let c = CString::new(conf).unwrap();
    unsafe { torch_arena_check_config(c.as_ptr()) }
}

fn stat(key: &str) -> i64 {
    let count = torch_arena_stats_count();
    let mut values = vec![0i64; count as usize];
    let rc = unsafe { torch_arena_stats(0, values.as_mut_ptr(), values.len()) };
    assert_eq!(rc, TORCH_ARENA_OK, "{}", last_error());
    let i = (0..count)
        .find(|&i| {
            unsafe { CStr::from_ptr(torch_arena_stats_key(i)) }
                .to_str()
                .unwrap()
                == key
        })
        .unwrap_or_else(|| panic!("no key {key}"));
    values[i as usize]
}

#[test]
fn null_out_pointers_are_errors_not_crashes() {
    let _g = setup();
    torch_arena_clear_last_error();
    assert_eq!(
        unsafe { torch_arena_stats(0, std::ptr::null_mut(), 122) },
        TORCH_ARENA_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("NULL"), "{}", last_error());
    assert_eq!(
        unsafe { torch_arena_defragment(0, std::ptr::null_mut()) },
        TORCH_ARENA_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { torch_arena_growth(0, std::ptr::null_mut()) },
        TORCH_ARENA_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { torch_arena_pages(0, std::ptr::null_mut()) },
        TORCH_ARENA_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { torch_arena_empty_cache_report(std::ptr::null_mut()) },
        TORCH_ARENA_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { torch_arena_configure(std::ptr::null()) },
        TORCH_ARENA_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { torch_arena_check_config(std::ptr::null()) },
        TORCH_ARENA_ERR_INVALID_ARGUMENT
    );
    // try_malloc with out == NULL: an error (2), and nothing is allocated.
    let live = stat("allocation.all.current");
    let rc = unsafe { torch_arena_try_malloc(4096, 0, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert_eq!(rc, TORCH_ARENA_ERR_OTHER);
    assert_eq!(stat("allocation.all.current"), live);
    // base_alloc with size == NULL returns ptr and records an error.
    let p = 0x1234_0000usize as *mut c_void;
    torch_arena_clear_last_error();
    assert_eq!(
        unsafe { torch_arena_base_alloc(p, std::ptr::null_mut()) },
        p
    );
    assert!(!last_error().is_empty());
    // A too-small stats buffer is refused, not overrun.
    let mut few = [7i64; 4];
    assert_eq!(
        unsafe { torch_arena_stats(0, few.as_mut_ptr(), few.len()) },
        TORCH_ARENA_ERR_INVALID_ARGUMENT
    );
    assert_eq!(few, [7; 4]);
    // Bad device ordinals are errors.
    let mut values = vec![0i64; 122];
    assert_eq!(
        unsafe { torch_arena_stats(-1, values.as_mut_ptr(), values.len()) },
        TORCH_ARENA_ERR_BAD_DEVICE
    );
    assert_eq!(
        unsafe { torch_arena_stats(1000, values.as_mut_ptr(), values.len()) },
        TORCH_ARENA_ERR_BAD_DEVICE
    );
    assert!(last_error().contains("1000"), "{}", last_error());
}

#[test]
fn last_error_is_snprintf_style() {
    let _g = setup();
    torch_arena_clear_last_error();
    assert_eq!(
        unsafe { torch_arena_last_error(std::ptr::null_mut(), 0) },
        0
    );
    assert_eq!(last_error(), "");
    assert_ne!(check_config("no_such_key_xyz:1"), TORCH_ARENA_OK);
    let full = last_error();
    assert!(!full.is_empty());
    // Truncated copies: cap - 1 bytes and a NUL, the full length returned.
    let mut buf = [0x55 as c_char; 8];
    let n = unsafe { torch_arena_last_error(buf.as_mut_ptr(), buf.len()) };
    assert_eq!(n, full.len());
    let got = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    assert_eq!(got, &full[..7]);
    // cap 1: just the NUL.
    let mut one = [0x55 as c_char; 1];
    assert_eq!(
        unsafe { torch_arena_last_error(one.as_mut_ptr(), 1) },
        full.len()
    );
    assert_eq!(one[0], 0);
}

#[test]
fn last_error_falls_back_to_the_most_recent_one_of_the_process() {
    let _g = setup();
    torch_arena_clear_last_error();
    std::thread::spawn(|| {
        assert_ne!(
            torch_arena_try_free(
                0x4000_0000usize as *mut c_void,
                512,
                0,
                std::ptr::null_mut()
            ),
            0
        );
    })
    .join()
    .unwrap();
    let e = last_error();
    assert!(e.contains("0x40000000"), "{e}");
}

#[test]
fn try_malloc_and_try_free_round_trip() {
    let _g = setup();
    let mut p: *mut c_void = std::ptr::null_mut();
    let stream = 3usize as *mut c_void;
    assert_eq!(
        unsafe { torch_arena_try_malloc(100_000, 0, stream, &mut p) },
        TORCH_ARENA_OK,
        "{}",
        last_error()
    );
    assert!(!p.is_null());
    assert_eq!(p as usize % 512, 0);
    let mut size = 0usize;
    let base = unsafe { torch_arena_base_alloc((p as usize + 4096) as *mut c_void, &mut size) };
    assert_eq!(base, p);
    assert!(size >= 100_000);
    assert_eq!(
        torch_arena_try_free(p, 100_000, 0, stream),
        TORCH_ARENA_OK,
        "{}",
        last_error()
    );
    // Size 0: NULL, and freeing NULL is a no-op.
    let mut z: *mut c_void = 0x200usize as *mut c_void;
    assert_eq!(
        unsafe { torch_arena_try_malloc(0, 0, stream, &mut z) },
        TORCH_ARENA_OK
    );
    assert!(z.is_null());
    assert_eq!(
        torch_arena_try_free(std::ptr::null_mut(), 0, 0, stream),
        TORCH_ARENA_OK
    );
}

#[test]
fn out_of_memory_is_status_1_with_pytorchs_text() {
    let _g = setup();
    let mut p: *mut c_void = std::ptr::null_mut();
    let rc = unsafe { torch_arena_try_malloc(1 << 40, 0, std::ptr::null_mut(), &mut p) };
    assert_eq!(rc, TORCH_ARENA_ERR_OOM);
    assert!(p.is_null());
    let e = last_error();
    assert!(
        e.starts_with("CUDA out of memory. Tried to allocate"),
        "{e}"
    );
    // A bad device is another error (2), not an OOM.
    let rc = unsafe { torch_arena_try_malloc(512, 77, std::ptr::null_mut(), &mut p) };
    assert_eq!(rc, TORCH_ARENA_ERR_OTHER);
    assert!(last_error().contains("77"), "{}", last_error());
}

#[test]
fn bad_frees_name_the_pointer_and_are_counted() {
    let _g = setup();
    let before = torch_arena_bad_free_count();
    let rc = torch_arena_try_free(
        0x7000_1234_0000usize as *mut c_void,
        4096,
        0,
        std::ptr::null_mut(),
    );
    assert_eq!(rc, TORCH_ARENA_ERR_BAD_POINTER);
    assert!(last_error().contains("0x700012340000"), "{}", last_error());
    let mut p: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        unsafe { torch_arena_try_malloc(8192, 0, std::ptr::null_mut(), &mut p) },
        TORCH_ARENA_OK
    );
    assert_eq!(
        torch_arena_try_free(p, 8192, 0, std::ptr::null_mut()),
        TORCH_ARENA_OK
    );
    assert_eq!(
        torch_arena_try_free(p, 8192, 0, std::ptr::null_mut()),
        TORCH_ARENA_ERR_BAD_POINTER
    );
    assert!(last_error().contains(&format!("{p:p}")), "{}", last_error());
    assert_eq!(torch_arena_bad_free_count(), before + 2);
}

#[test]
fn stats_keys_are_the_122_sorted_memory_stats_keys() {
    let _g = setup();
    assert_eq!(torch_arena_stats_count(), 122);
    let keys: Vec<String> = (0..122)
        .map(|i| {
            unsafe { CStr::from_ptr(torch_arena_stats_key(i)) }
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "not sorted");
    for k in [
        "allocated_bytes.all.current",
        "reserved_bytes.large_pool.peak",
        "num_ooms",
        "max_split_size",
    ] {
        assert!(keys.iter().any(|x| x == k), "missing {k}");
    }
    assert!(torch_arena_stats_key(122).is_null());
    assert!(torch_arena_stats_key(-1).is_null());
    // The pointers are static: the same on every call.
    assert_eq!(torch_arena_stats_key(5), torch_arena_stats_key(5));
}

/// `torch_arena_growth` counts what the arena creates: with its cache given back, a 32 MiB block
/// needs new pages, at least its own 32 MiB in one handle or more.
#[test]
fn growth_counts_the_memory_created() {
    let _g = setup();
    let total = |g: &TorchArenaGrowth| {
        (
            g.at_peak_handles + g.below_peak_handles,
            g.at_peak_bytes + g.below_peak_bytes,
        )
    };
    let mut r = TorchArenaReclaimReport::default();
    assert_eq!(
        unsafe { torch_arena_empty_cache_report(&mut r) },
        TORCH_ARENA_OK
    );
    let mut before = TorchArenaGrowth::default();
    assert_eq!(
        unsafe { torch_arena_growth(0, &mut before) },
        TORCH_ARENA_OK,
        "{}",
        last_error()
    );
    let mut p: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        unsafe { torch_arena_try_malloc(32 << 20, 0, std::ptr::null_mut(), &mut p) },
        TORCH_ARENA_OK
    );
    let mut after = TorchArenaGrowth::default();
    assert_eq!(unsafe { torch_arena_growth(0, &mut after) }, TORCH_ARENA_OK);
    let (b, a) = (total(&before), total(&after));
    assert!(a.0 > b.0, "no handle counted: {before:?} then {after:?}");
    assert!(a.1 >= b.1 + (32 << 20), "{before:?} then {after:?}");
    assert_eq!(
        torch_arena_try_free(p, 32 << 20, 0, std::ptr::null_mut()),
        TORCH_ARENA_OK
    );
    assert_eq!(
        unsafe { torch_arena_growth(99, &mut after) },
        TORCH_ARENA_ERR_BAD_DEVICE
    );
}

/// `torch_arena_pages` says where the reserved bytes are: a live block's pages are in use, and
/// with VMM the four parts add up to `reserved_bytes.all.current`.
#[test]
fn pages_add_up_to_what_is_reserved() {
    let _g = setup();
    let mut p: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        unsafe { torch_arena_try_malloc(32 << 20, 0, std::ptr::null_mut(), &mut p) },
        TORCH_ARENA_OK
    );
    let mut pages = TorchArenaPages::default();
    assert_eq!(
        unsafe { torch_arena_pages(0, &mut pages) },
        TORCH_ARENA_OK,
        "{}",
        last_error()
    );
    let parts =
        pages.in_use_bytes + pages.idle_mapped_bytes + pages.held_bytes + pages.pooled_bytes;
    assert_eq!(
        parts,
        stat("reserved_bytes.all.current") as u64,
        "{pages:?}"
    );
    assert!(pages.in_use_bytes >= 32 << 20, "{pages:?}");
    assert_eq!(pages.page_size, 2 << 20);
    assert_eq!(
        torch_arena_try_free(p, 32 << 20, 0, std::ptr::null_mut()),
        TORCH_ARENA_OK
    );
    assert_eq!(
        unsafe { torch_arena_pages(99, &mut pages) },
        TORCH_ARENA_ERR_BAD_DEVICE
    );
}

#[test]
fn stats_follow_allocations() {
    let _g = setup();
    let base = stat("allocated_bytes.all.current");
    let mut p: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        unsafe { torch_arena_try_malloc(1 << 20, 0, std::ptr::null_mut(), &mut p) },
        TORCH_ARENA_OK
    );
    assert!(stat("allocated_bytes.all.current") >= base + (1 << 20));
    assert!(stat("requested_bytes.all.current") >= 1 << 20);
    assert_eq!(
        torch_arena_try_free(p, 1 << 20, 0, std::ptr::null_mut()),
        TORCH_ARENA_OK
    );
    assert_eq!(stat("allocated_bytes.all.current"), base);
    assert_eq!(torch_arena_reset_peak_stats(0), TORCH_ARENA_OK);
    assert_eq!(
        stat("allocated_bytes.all.peak"),
        stat("allocated_bytes.all.current")
    );
    assert_eq!(torch_arena_reset_accumulated_stats(0), TORCH_ARENA_OK);
    assert_eq!(stat("allocation.all.allocated"), 0);
    let mut r = TorchArenaReclaimReport::default();
    assert_eq!(
        unsafe { torch_arena_defragment(0, &mut r) },
        TORCH_ARENA_OK,
        "{}",
        last_error()
    );
    assert_eq!(
        unsafe { torch_arena_empty_cache_report(&mut r) },
        TORCH_ARENA_OK,
        "{}",
        last_error()
    );
}

#[test]
fn summary_is_snprintf_style() {
    let _g = setup();
    let n = unsafe { torch_arena_summary(0, 0, std::ptr::null_mut(), 0) };
    assert!(n > 0, "empty summary: {}", last_error());
    let mut buf = vec![0 as c_char; n + 1];
    assert_eq!(
        unsafe { torch_arena_summary(0, 0, buf.as_mut_ptr(), buf.len()) },
        n
    );
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    assert_eq!(text.len(), n);
    // A failure returns 0 and writes "".
    let mut small = [0x55 as c_char; 4];
    assert_eq!(
        unsafe { torch_arena_summary(999, 0, small.as_mut_ptr(), small.len()) },
        0
    );
    assert_eq!(small[0], 0);
}

#[test]
fn configure_accepts_the_same_conf_and_refuses_another() {
    let _g = setup();
    assert_eq!(configure(CONF), TORCH_ARENA_OK, "{}", last_error());
    assert_eq!(
        configure("device:sim,sim_capacity_mb:512,sim_backing:True"),
        TORCH_ARENA_ERR_CONFIG
    );
    let e = last_error();
    assert!(e.contains("already initialised"), "{e}");
    // Still the first configuration: 256 MiB, so 300 MiB does not fit.
    let mut p: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        unsafe { torch_arena_try_malloc(300 << 20, 0, std::ptr::null_mut(), &mut p) },
        TORCH_ARENA_ERR_OOM
    );
}

#[test]
fn bad_confs_are_errors_that_name_the_key() {
    let _g = setup();
    assert_eq!(configure("no_such_key_xyz:1"), TORCH_ARENA_ERR_CONFIG);
    assert!(last_error().contains("no_such_key_xyz"), "{}", last_error());
    assert_eq!(check_config("sim_capacity_mb:lots"), TORCH_ARENA_ERR_CONFIG);
    let e = last_error();
    assert!(e.contains("sim_capacity_mb") && e.contains("lots"), "{e}");
    assert_eq!(check_config("sim_backing:yes"), TORCH_ARENA_ERR_CONFIG);
    assert!(last_error().contains("sim_backing"), "{}", last_error());
    assert_eq!(check_config(CONF), TORCH_ARENA_OK, "{}", last_error());
    assert_eq!(check_config(""), TORCH_ARENA_OK, "{}", last_error());
    // Not valid UTF-8: an error, not a crash.
    let bad = [0xffu8, 0xfe, b':', b'1', 0];
    assert_eq!(
        unsafe { torch_arena_check_config(bad.as_ptr().cast()) },
        TORCH_ARENA_ERR_CONFIG
    );
}

#[test]
fn hooks_never_fail_loudly() {
    let _g = setup();
    torch_arena_init(1);
    torch_arena_clear_last_error();
    torch_arena_set_memory_fraction(f64::NAN, 0);
    assert!(!last_error().is_empty());
    torch_arena_set_memory_fraction(1.0, 99);
    torch_arena_record_stream(0x5000_0000usize as *mut c_void, 9usize as *mut c_void);
    assert!(last_error().contains("0x50000000"), "{}", last_error());
    torch_arena_set_memory_fraction(1.0, 0);
    torch_arena_empty_cache();
    let v = unsafe { CStr::from_ptr(torch_arena_version()) }
        .to_str()
        .unwrap();
    assert_eq!(v, env!("CARGO_PKG_VERSION"));
}

#[test]
fn config_reads_back_the_configuration_in_force() {
    let _g = setup();
    let mut buf = vec![0u8; 4096];
    let n = unsafe { torch_arena_config(buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0 && n < buf.len(), "{}", last_error());
    let text = std::str::from_utf8(&buf[..n]).unwrap();
    // Every key spelled out, and what the session installed.
    let parsed = torch_arena::Config::parse(text).unwrap();
    assert_eq!(parsed, torch_arena::Config::parse(CONF).unwrap());
    assert!(text.contains("sim_capacity_mb:256") && text.contains("leak_warmup:2"));
    // snprintf style: the length without a buffer.
    assert_eq!(unsafe { torch_arena_config(std::ptr::null_mut(), 0) }, n);
}

/// What the header promises for a pool that is not recording: torch_arena_try_malloc_pool serves
/// general memory (it once said it failed), and releasing a recording pool's last use ends its
/// recording.
#[test]
fn try_malloc_pool_off_recording_gives_general_memory_and_release_ends_recording() {
    let _g = setup();
    let pool_of = |p: *mut c_void| unsafe {
        torch_arena_pool_of(p, 0, std::ptr::null_mut(), std::ptr::null_mut())
    };
    let malloc_pool = |id0: u64| {
        let mut p: *mut c_void = std::ptr::null_mut();
        let rc =
            unsafe { torch_arena_try_malloc_pool(4096, 0, std::ptr::null_mut(), id0, 0, &mut p) };
        assert_eq!(rc, TORCH_ARENA_OK, "{}", last_error());
        p
    };
    // Never begun.
    let a = malloc_pool(9001);
    assert_eq!(pool_of(a), 0);
    // Recording, then its last use released while it records.
    assert_eq!(torch_arena_pool_begin(0, 9002, 0), TORCH_ARENA_OK);
    let b = malloc_pool(9002);
    assert_eq!(pool_of(b), 1);
    assert_eq!(torch_arena_pool_release(0, 9002, 0), TORCH_ARENA_OK);
    let mut info = TorchArenaPoolInfo::default();
    assert_eq!(
        unsafe { torch_arena_pool_info(0, 9002, 0, &mut info) },
        TORCH_ARENA_OK
    );
    assert_eq!((info.recording, info.released), (0, 1));
    let c = malloc_pool(9002);
    assert_eq!(pool_of(c), 0, "a released pool takes no new memory");
    assert_ne!(torch_arena_pool_end(0, 9002, 0), TORCH_ARENA_OK);
    assert!(last_error().contains("not recording"), "{}", last_error());
    for p in [a, b, c] {
        assert_eq!(
            torch_arena_try_free(p, 4096, 0, std::ptr::null_mut()),
            TORCH_ARENA_OK
        );
    }
    torch_arena_empty_cache();
}
