//! The simulated device keeps the driver's contract, models stream asynchrony, injects failures
//! and accounts for every byte; the arena's tests rely on all four.

use torch_arena::device::sim::*;
use torch_arena::device::{DevPtr, Device, DeviceError, EventHandle, PageHandle};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 2 * MIB;

fn sim(capacity: u64, backing: bool) -> SimDevice {
    SimDevice::new(SimConfig::new(capacity, PAGE, backing)).expect("sim device")
}

fn is_misuse<T: std::fmt::Debug>(r: Result<T, DeviceError>) -> String {
    match r {
        Err(DeviceError::Misuse(why)) => why,
        other => panic!("expected Misuse, got {other:?}"),
    }
}

/// Reserves `pages` pages of VA and maps one fresh page at each.
fn mapped_range(d: &SimDevice, pages: u64) -> (DevPtr, Vec<PageHandle>) {
    let va = d.reserve(pages * PAGE, 0).unwrap();
    let handles: Vec<_> = (0..pages)
        .map(|i| {
            let p = d.create_page(PAGE).unwrap();
            d.map(va + i * PAGE, PAGE, p).unwrap();
            p
        })
        .collect();
    (va, handles)
}

unsafe fn fill(ptr: DevPtr, len: u64, byte: u8) {
    unsafe { std::ptr::write_bytes(ptr as *mut u8, byte, len as usize) };
}

unsafe fn all_equal(ptr: DevPtr, len: u64, byte: u8) -> bool {
    let s = unsafe { std::slice::from_raw_parts(ptr as *const u8, len as usize) };
    s.iter().all(|&b| b == byte)
}

#[test]
fn new_rejects_bad_configs() {
    for (capacity, granularity) in [(0, PAGE), (8 * MIB, 0), (8 * MIB, 3 * MIB)] {
        let why = is_misuse(SimDevice::new(SimConfig::new(capacity, granularity, false)));
        assert!(
            why.contains("capacity") || why.contains("granularity"),
            "{why}"
        );
    }
    // Backed memory is mapped by the host MMU: the granularity must be whole host pages.
    let why = is_misuse(SimDevice::new(SimConfig::new(8 * MIB, 512, true)));
    assert!(why.contains("host page"), "{why}");
    let d = SimDevice::new(SimConfig {
        ordinal: 3,
        ..SimConfig::new(8 * MIB, PAGE, false)
    })
    .unwrap();
    let info = d.info();
    assert_eq!(
        (
            info.ordinal,
            info.name.as_str(),
            info.total_bytes,
            info.granularity,
            info.vmm
        ),
        (3, "sim", 8 * MIB, PAGE, true)
    );
}

#[test]
fn from_conf_reads_the_sim_settings() {
    let conf = torch_arena::Config {
        sim_capacity_mb: 64,
        sim_granularity_kb: 4096,
        sim_backing: true,
        sim_vmm: false,
        ..Default::default()
    };
    let c = conf.sim_config(2);
    assert_eq!(
        (c.ordinal, c.capacity, c.granularity, c.backing, c.vmm),
        (2, 64 * MIB, 4 * MIB, true, false)
    );
}

#[test]
fn capacity_is_enforced_for_pages_and_plain_allocations() {
    let d = sim(6 * MIB, false);
    let a = d.create_page(PAGE).unwrap();
    let b = d.create_page(2 * PAGE).unwrap();
    assert_eq!(d.mem_get_info().unwrap(), (0, 6 * MIB));
    assert_eq!(d.create_page(PAGE), Err(DeviceError::OutOfMemory));
    assert_eq!(d.alloc_plain(PAGE), Err(DeviceError::OutOfMemory));
    assert_eq!(d.live_pages(), 2);
    d.release_page(b).unwrap();
    assert_eq!(d.mem_get_info().unwrap(), (4 * MIB, 6 * MIB));
    let p = d.alloc_plain(2 * PAGE).unwrap();
    assert_eq!(d.used_bytes(), 6 * MIB);
    assert_eq!(d.create_page(PAGE), Err(DeviceError::OutOfMemory));
    d.free_plain(p).unwrap();
    d.release_page(a).unwrap();
    assert_eq!((d.used_bytes(), d.live_pages(), d.live_plain()), (0, 0, 0));
    assert_eq!(d.mem_get_info().unwrap(), (6 * MIB, 6 * MIB));
}

#[test]
fn a_page_remapped_elsewhere_shows_the_same_bytes() {
    let d = sim(16 * MIB, true);
    let (va, pages) = mapped_range(&d, 2);
    assert_eq!(va % PAGE, 0);
    unsafe {
        fill(va, PAGE, 0xA5);
        fill(va + PAGE, PAGE, 0x5A);
    }
    // Unmap both pages in one call, then map them swapped in a second reservation.
    d.unmap(va, 2 * PAGE).unwrap();
    assert_eq!(d.mapped_pages(), 0);
    let other = d.reserve(2 * PAGE, 4 * PAGE).unwrap();
    assert_eq!(other % (4 * PAGE), 0, "alignment honoured");
    d.map(other, PAGE, pages[1]).unwrap();
    d.map(other + PAGE, PAGE, pages[0]).unwrap();
    unsafe {
        assert!(all_equal(other, PAGE, 0x5A));
        assert!(all_equal(other + PAGE, PAGE, 0xA5));
    }
    // And back at the first address: writes made through the second mapping are seen there.
    unsafe { fill(other + PAGE, 4096, 0x11) };
    d.unmap(other + PAGE, PAGE).unwrap();
    d.map(va, PAGE, pages[0]).unwrap();
    unsafe {
        assert!(all_equal(va, 4096, 0x11));
        assert!(all_equal(va + 4096, PAGE - 4096, 0xA5));
    }
    assert!(d.violations().is_empty());
}

#[test]
fn plain_allocations_are_writable_and_aligned_with_backing() {
    let d = sim(16 * MIB, true);
    let a = d.alloc_plain(PAGE).unwrap();
    let b = d.alloc_plain(2 * PAGE).unwrap();
    assert_eq!((a % PAGE, b % PAGE), (0, 0));
    assert!(
        a + PAGE <= b || b + 2 * PAGE <= a,
        "plain allocations overlap"
    );
    unsafe {
        fill(a, PAGE, 1);
        fill(b, 2 * PAGE, 2);
        assert!(all_equal(a, PAGE, 1));
        assert!(all_equal(b, 2 * PAGE, 2));
    }
    d.free_plain(a).unwrap();
    d.free_plain(b).unwrap();
    assert_eq!(d.used_bytes(), 0);
}

#[test]
fn release_gives_host_memory_back() {
    let d = sim(64 * MIB, true);
    let (va, pages) = mapped_range(&d, 4);
    assert_eq!(
        d.backing_resident_bytes(),
        Some(0),
        "pages are sparse until written"
    );
    unsafe { fill(va, 4 * PAGE, 7) };
    assert!(d.backing_resident_bytes().unwrap() >= 4 * PAGE);
    d.unmap(va, 4 * PAGE).unwrap();
    // Unmapped pages keep their bytes (they may be mapped again).
    assert!(d.backing_resident_bytes().unwrap() >= 4 * PAGE);
    for p in &pages[..3] {
        d.release_page(*p).unwrap();
    }
    assert_eq!(d.used_bytes(), PAGE);
    assert_eq!(d.backing_resident_bytes(), Some(PAGE));
    // A page created in the released space reads as zeros, not as the old bytes.
    let fresh = d.create_page(PAGE).unwrap();
    d.map(va, PAGE, fresh).unwrap();
    unsafe { assert!(all_equal(va, PAGE, 0)) };
    d.map(va + PAGE, PAGE, pages[3]).unwrap();
    unsafe { assert!(all_equal(va + PAGE, PAGE, 7)) };
}

#[test]
fn pages_of_mixed_sizes_reuse_freed_space() {
    let d = sim(16 * MIB, true);
    let small = d.create_page(PAGE).unwrap();
    let big = d.create_page(3 * PAGE).unwrap();
    let last = d.create_page(PAGE).unwrap();
    d.release_page(big).unwrap();
    // Two pages fit in the hole of the big one and are distinct memory.
    let a = d.create_page(PAGE).unwrap();
    let b = d.create_page(2 * PAGE).unwrap();
    let va = d.reserve(6 * PAGE, 0).unwrap();
    for (at, p, size, byte) in [
        (0, small, PAGE, 1u8),
        (1, a, PAGE, 2),
        (2, b, 2 * PAGE, 3),
        (4, last, PAGE, 4),
    ] {
        d.map(va + at * PAGE, size, p).unwrap();
        unsafe { fill(va + at * PAGE, size, byte) };
    }
    for (at, size, byte) in [(0, PAGE, 1u8), (1, PAGE, 2), (2, 2 * PAGE, 3), (4, PAGE, 4)] {
        unsafe {
            assert!(
                all_equal(va + at * PAGE, size, byte),
                "page at {at} clobbered"
            )
        };
    }
}

#[test]
fn contract_misuse_is_refused_and_changes_nothing() {
    let d = sim(32 * MIB, true);
    let va = d.reserve(4 * PAGE, 0).unwrap();
    let p = d.create_page(PAGE).unwrap();
    let q = d.create_page(2 * PAGE).unwrap();

    // Granularity.
    is_misuse(d.reserve(PAGE + 4096, 0));
    is_misuse(d.reserve(PAGE, 4096));
    is_misuse(d.create_page(4096));
    is_misuse(d.create_page(0));
    is_misuse(d.map(va + 4096, PAGE, p));
    is_misuse(d.alloc_plain(100));
    // Map: wrong size, unknown page, outside a reservation, straddling its end.
    assert!(is_misuse(d.map(va, 2 * PAGE, p)).contains("has size"));
    is_misuse(d.map(va, PAGE, PageHandle(999)));
    let outside = is_misuse(d.map(va + 4 * PAGE, PAGE, p));
    assert!(
        outside.contains(&format!("{:#x}", va + 4 * PAGE)),
        "{outside}"
    );
    is_misuse(d.map(va + 3 * PAGE, 2 * PAGE, q));
    // Map over a mapping.
    d.map(va + PAGE, PAGE, p).unwrap();
    is_misuse(d.map(va, 2 * PAGE, q));
    // Unmap: not mapped, part of a mapping, running past the mappings.
    is_misuse(d.unmap(va, PAGE));
    d.map(va + 2 * PAGE, 2 * PAGE, q).unwrap();
    is_misuse(d.unmap(va + 2 * PAGE, PAGE));
    is_misuse(d.unmap(va, 4 * PAGE));
    is_misuse(d.unmap(va + 3 * PAGE, PAGE));
    // Release of a mapped page, free of a reservation with mappings or of the wrong size.
    assert!(is_misuse(d.release_page(p)).contains("still mapped"));
    is_misuse(d.free_address(va, 4 * PAGE));
    is_misuse(d.free_address(va, 2 * PAGE));
    is_misuse(d.free_address(va + PAGE, 3 * PAGE));
    // Plain pointers and events that do not exist.
    is_misuse(d.free_plain(va));
    is_misuse(d.query_event(EventHandle(42)));
    is_misuse(d.record_event(EventHandle(42), 1));
    is_misuse(d.destroy_event(EventHandle(42)));
    is_misuse(d.synchronize_event(EventHandle(42)));

    // Nothing above changed the state: the two valid mappings are all there is.
    assert_eq!(
        (d.live_pages(), d.mapped_pages(), d.live_reservations()),
        (2, 2, 1)
    );
    assert_eq!(d.used_bytes(), 3 * PAGE);
    // Several mappings come off in one unmap; then everything can be given back.
    d.unmap(va + PAGE, 3 * PAGE).unwrap();
    d.release_page(p).unwrap();
    d.release_page(q).unwrap();
    is_misuse(d.release_page(q));
    d.free_address(va, 4 * PAGE).unwrap();
    is_misuse(d.free_address(va, 4 * PAGE));
    assert_eq!(
        (
            d.live_pages(),
            d.mapped_pages(),
            d.live_reservations(),
            d.used_bytes()
        ),
        (0, 0, 0, 0)
    );
    assert!(d.violations().is_empty());
}

#[test]
fn unmap_release_or_free_while_a_stream_is_busy_is_a_violation() {
    let d = sim(32 * MIB, true);
    let (va, pages) = mapped_range(&d, 2);
    d.launch(7, va + 4096, 100);
    assert_eq!(d.busy_ranges(), vec![(7, va + 4096, 100)]);
    assert_eq!(d.busy_overlapping(va + PAGE, PAGE), vec![]);
    assert_eq!(d.busy_overlapping(va, 8192), vec![(7, va + 4096, 100)]);
    // The second page is not in use: unmapping it is fine.
    d.unmap(va + PAGE, PAGE).unwrap();
    assert!(d.violations().is_empty());
    // The first is: the call succeeds, as on a GPU, but is recorded.
    d.unmap(va, PAGE).unwrap();
    let v = d.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("cuMemUnmap") && v[0].contains("stream 7"),
        "{}",
        v[0]
    );
    assert!(v[0].contains(&format!("{va:#x}")), "{}", v[0]);
    // Releasing the physical page the launch used is caught too, though it is no longer mapped.
    d.release_page(pages[0]).unwrap();
    assert_eq!(d.violations().len(), 2);
    assert!(d.violations()[1].contains("cuMemRelease"));

    // After the stream completes, the same sequence is clean.
    let d = sim(32 * MIB, true);
    let (va, pages) = mapped_range(&d, 1);
    let plain = d.alloc_plain(PAGE).unwrap();
    d.launch(7, va, PAGE);
    d.launch(3, plain, PAGE);
    d.complete(7);
    assert_eq!(d.busy_ranges(), vec![(3, plain, PAGE)]);
    d.unmap(va, PAGE).unwrap();
    d.release_page(pages[0]).unwrap();
    assert!(d.violations().is_empty());
    d.free_plain(plain).unwrap();
    let v = d.violations();
    assert!(
        v.len() == 1 && v[0].contains("cuMemFree") && v[0].contains("stream 3"),
        "{v:?}"
    );
}

#[test]
fn a_launch_over_unmapped_memory_is_a_violation() {
    let d = sim(32 * MIB, false);
    let (va, _) = mapped_range(&d, 2);
    d.launch(1, va, 2 * PAGE);
    assert!(d.violations().is_empty());
    d.launch(1, va + PAGE, 2 * PAGE);
    let v = d.violations();
    assert!(
        v.len() == 1 && v[0].contains(&format!("{:#x}", va + 2 * PAGE)),
        "{v:?}"
    );
}

#[test]
fn events_complete_only_when_the_recorded_work_has() {
    let d = sim(32 * MIB, false);
    let (va, _) = mapped_range(&d, 1);
    let e = d.create_event().unwrap();
    assert!(
        d.query_event(e).unwrap(),
        "a never-recorded event is complete"
    );
    d.record_event(e, 5).unwrap();
    assert!(
        d.query_event(e).unwrap(),
        "nothing was queued before the record"
    );

    d.launch(5, va, 64);
    d.record_event(e, 5).unwrap();
    d.launch(5, va + 64, 64);
    assert!(!d.query_event(e).unwrap());
    d.complete(6); // another stream: no effect
    assert!(!d.query_event(e).unwrap());
    // Synchronising the event completes what it captured, not the later launch.
    d.synchronize_event(e).unwrap();
    assert!(d.query_event(e).unwrap());
    assert_eq!(d.busy_ranges(), vec![(5, va + 64, 64)]);
    assert_eq!(d.stream_progress(5), (2, 1));

    d.launch(6, va, 8);
    d.record_event(e, 6).unwrap();
    d.synchronize_stream(6).unwrap();
    assert!(d.query_event(e).unwrap());
    d.launch(6, va, 8);
    d.record_event(e, 6).unwrap();
    d.synchronize().unwrap();
    assert!(d.query_event(e).unwrap());
    assert!(d.busy_ranges().is_empty());

    d.launch(9, va, 8);
    d.record_event(e, 9).unwrap();
    d.complete_all();
    assert!(d.query_event(e).unwrap());
    assert_eq!(d.live_events(), 1);
    d.destroy_event(e).unwrap();
    assert_eq!(d.live_events(), 0);
    is_misuse(d.query_event(e));
}

#[test]
fn injected_failures_have_no_effect_but_are_counted() {
    let d = sim(32 * MIB, true);
    let va = d.reserve(4 * PAGE, 0).unwrap();

    d.fail_nth(SimCall::Create, 2);
    let p = d.create_page(PAGE).unwrap();
    assert_eq!(d.create_page(PAGE), Err(DeviceError::OutOfMemory));
    let q = d.create_page(PAGE).unwrap();
    assert_eq!((d.live_pages(), d.used_bytes()), (2, 2 * PAGE));

    d.fail_nth(SimCall::Map, 1);
    match d.map(va, PAGE, p) {
        Err(DeviceError::Driver {
            call: "cuMemMap",
            message,
            ..
        }) => {
            assert_eq!(message, "injected failure")
        }
        other => panic!("{other:?}"),
    }
    d.fail_nth(SimCall::SetAccess, 1);
    assert!(matches!(
        d.map(va, PAGE, p),
        Err(DeviceError::Driver {
            call: "cuMemSetAccess",
            ..
        })
    ));
    assert_eq!(d.mapped_pages(), 0);
    // Neither failure left `p` mapped or `va` occupied.
    d.map(va, PAGE, p).unwrap();
    d.map(va + PAGE, PAGE, q).unwrap();

    d.fail_nth(SimCall::Reserve, 1);
    assert_eq!(d.reserve(PAGE, 0), Err(DeviceError::OutOfMemory));
    assert_eq!(d.live_reservations(), 1);
    d.fail_nth(SimCall::AllocPlain, 1);
    assert_eq!(d.alloc_plain(PAGE), Err(DeviceError::OutOfMemory));
    assert_eq!(d.live_plain(), 0);
    d.fail_nth(SimCall::EventCreate, 1);
    assert!(matches!(
        d.create_event(),
        Err(DeviceError::Driver {
            call: "cuEventCreate",
            ..
        })
    ));
    assert_eq!(d.live_events(), 0);

    let c = d.counters();
    assert_eq!((c.mem_create, c.mem_map, c.set_access), (3, 4, 3));
    assert_eq!(c.set_access_handles, 3); // one handle per grant here
    assert_eq!((c.address_reserve, c.mem_alloc, c.event_create), (2, 1, 1));

    // A planned failure can be cancelled.
    d.fail_nth(SimCall::Create, 1);
    d.stop_failing();
    d.release_page(d.create_page(PAGE).unwrap()).unwrap();
}

#[test]
fn random_failures_are_deterministic_and_leave_nothing_behind() {
    let run = |seed| {
        let d = sim(256 * MIB, false);
        d.fail_randomly(seed, 3);
        let mut outcomes = Vec::new();
        for _ in 0..60 {
            let va = d.reserve(PAGE, 0);
            let page = d.create_page(PAGE);
            let mapped = match (&va, &page) {
                (Ok(va), Ok(p)) => d.map(*va, PAGE, *p).is_ok(),
                _ => false,
            };
            outcomes.push((va.is_ok(), page.is_ok(), mapped));
            if mapped {
                d.unmap(*va.as_ref().unwrap(), PAGE).unwrap();
            }
            if let Ok(p) = page {
                d.release_page(p).unwrap();
            }
            if let Ok(va) = va {
                d.free_address(va, PAGE).unwrap();
            }
        }
        let leaks = (
            d.live_pages(),
            d.mapped_pages(),
            d.live_reservations(),
            d.used_bytes(),
        );
        assert_eq!(leaks, (0, 0, 0, 0));
        d.stop_failing();
        assert!(d.create_page(PAGE).is_ok());
        outcomes
    };
    let a = run(42);
    assert_eq!(a, run(42));
    let failures = a.iter().filter(|(v, p, m)| !(*v && *p && *m)).count();
    assert!(
        failures > 0 && failures < a.len(),
        "{failures} of {} failed",
        a.len()
    );
    assert_ne!(a, run(7));
}

#[test]
fn the_clock_completes_launches_when_due_and_waits_count_as_stalls() {
    let d = sim(64 * MIB, false);
    let (va, _) = mapped_range(&d, 2);
    let ev = d.create_event().unwrap();
    d.launch_until(1, va, PAGE, 1_000);
    d.launch_until(1, va + PAGE, PAGE, 3_000);
    d.record_event(ev, 1).unwrap();
    d.advance_to(500);
    assert_eq!(d.stream_progress(1), (2, 0));
    assert!(!d.query_event(ev).unwrap());
    d.advance_to(1_000);
    assert_eq!(d.stream_progress(1), (2, 1));
    assert!(!d.query_event(ev).unwrap());
    // The clock never goes back.
    d.advance_to(10);
    assert_eq!(d.now_ns(), 1_000);
    // Waiting for the event blocks until the second launch is due: a 2 µs stall.
    d.synchronize_event(ev).unwrap();
    assert!(d.query_event(ev).unwrap());
    assert_eq!((d.stall_ns(), d.now_ns()), (2_000, 3_000));
    // Work already due costs no wait; a device synchronisation waits for the latest launch.
    d.launch_until(2, va, PAGE, 2_500);
    d.launch_until(3, va, PAGE, 7_000);
    d.synchronize().unwrap();
    assert_eq!((d.stall_ns(), d.now_ns()), (6_000, 7_000));
    assert!(d.busy_ranges().is_empty());
    // `complete` is the GPU finishing by itself: no host wait.
    d.launch_until(4, va, PAGE, 99_000);
    d.complete(4);
    assert_eq!(d.stall_ns(), 6_000);
    // Unmapping before the work is due is a violation; after it, not.
    d.launch_until(5, va, PAGE, 8_000);
    d.advance_to(8_000);
    d.unmap(va, PAGE).unwrap();
    assert!(d.violations().is_empty(), "{:?}", d.violations());
}

#[test]
fn counters_count_every_call() {
    let d = sim(32 * MIB, false);
    let (va, pages) = mapped_range(&d, 2);
    d.unmap(va, 2 * PAGE).unwrap();
    for p in pages {
        d.release_page(p).unwrap();
    }
    d.free_address(va, 2 * PAGE).unwrap();
    let p = d.alloc_plain(PAGE).unwrap();
    d.free_plain(p).unwrap();
    let e = d.create_event().unwrap();
    d.record_event(e, 1).unwrap();
    d.query_event(e).unwrap();
    d.synchronize_event(e).unwrap();
    d.destroy_event(e).unwrap();
    d.synchronize_stream(1).unwrap();
    d.synchronize().unwrap();
    d.mem_get_info().unwrap();
    is_misuse(d.unmap(va, PAGE)); // refused calls are counted as the driver would see them

    let c = d.counters();
    let expected = [
        ("cuMemAddressReserve", 1),
        ("cuMemAddressFree", 1),
        ("cuMemCreate", 2),
        ("cuMemRelease", 2),
        ("cuMemMap", 2),
        ("cuMemUnmap", 2),
        ("cuMemSetAccess", 2),
        ("cuMemAlloc", 1),
        ("cuMemFree", 1),
        ("cuEventCreate", 1),
        ("cuEventDestroy", 1),
        ("cuEventRecord", 1),
        ("cuEventQuery", 1),
        ("cuEventSynchronize", 1),
        ("cuStreamSynchronize", 1),
        ("cuCtxSynchronize", 1),
        ("cuMemGetInfo", 1),
    ];
    assert_eq!(c.entries(), expected);
    // Test-only methods are not driver calls.
    d.launch(1, 0, 0);
    d.complete_all();
    let _ = (d.live_pages(), d.used_bytes(), d.violations());
    assert_eq!(d.counters(), c);
}

#[test]
fn without_backing_addresses_are_fake_and_never_reused() {
    let d = sim(1 << 40, false);
    assert_eq!(d.backing_resident_bytes(), None);
    let a = d.reserve(4 * PAGE, 0).unwrap();
    assert!(a >= FAKE_VA_BASE);
    d.free_address(a, 4 * PAGE).unwrap();
    let b = d.reserve(PAGE, 8 * PAGE).unwrap();
    assert_eq!(b % (8 * PAGE), 0);
    assert!(b >= a + 4 * PAGE, "address {b:#x} reused");
    let c = d.alloc_plain(PAGE).unwrap();
    assert!(c >= b + PAGE);
    // Much more than host memory can be "created" and mapped: nothing is touched.
    let big = d.create_page(512 << 30).unwrap();
    let va = d.reserve(512 << 30, 0).unwrap();
    d.map(va, 512 << 30, big).unwrap();
    assert_eq!(d.used_bytes(), (512 << 30) + PAGE);
    assert_eq!(
        d.mem_get_info().unwrap(),
        ((1 << 40) - (512 << 30) - PAGE, 1 << 40)
    );
}

#[test]
fn without_vmm_only_plain_allocations_work() {
    for backing in [false, true] {
        let d = SimDevice::new(SimConfig {
            vmm: false,
            ..SimConfig::new(8 * MIB, PAGE, backing)
        })
        .unwrap();
        assert!(!d.info().vmm);
        for why in [
            is_misuse(d.reserve(PAGE, 0)),
            is_misuse(d.create_page(PAGE)),
            is_misuse(d.map(FAKE_VA_BASE, PAGE, PageHandle(1))),
            is_misuse(d.unmap(FAKE_VA_BASE, PAGE)),
            is_misuse(d.release_page(PageHandle(1))),
            is_misuse(d.free_address(FAKE_VA_BASE, PAGE)),
        ] {
            assert!(why.contains("VMM not supported"), "{why}");
        }
        let p = d.alloc_plain(2 * PAGE).unwrap();
        assert_eq!(d.used_bytes(), 2 * PAGE);
        if backing {
            unsafe {
                fill(p, 2 * PAGE, 9);
                assert!(all_equal(p, 2 * PAGE, 9));
            }
        }
        d.free_plain(p).unwrap();
        assert_eq!((d.live_plain(), d.used_bytes()), (0, 0));
    }
}

#[test]
fn is_shareable_across_threads() {
    let d = std::sync::Arc::new(sim(256 * MIB, true));
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let d = d.clone();
            std::thread::spawn(move || {
                for _ in 0..20 {
                    let (va, pages) = mapped_range(&d, 2);
                    unsafe { fill(va, 2 * PAGE, t) };
                    d.launch(t as u64, va, 2 * PAGE);
                    unsafe { assert!(all_equal(va, 2 * PAGE, t)) };
                    d.synchronize_stream(t as u64).unwrap();
                    d.unmap(va, 2 * PAGE).unwrap();
                    pages.into_iter().for_each(|p| d.release_page(p).unwrap());
                    d.free_address(va, 2 * PAGE).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(
        (d.live_pages(), d.live_reservations(), d.used_bytes()),
        (0, 0, 0)
    );
    assert!(d.violations().is_empty(), "{:?}", d.violations());
}

#[test]
fn a_grant_counts_the_handles_it_covers() {
    // One cuMemSetAccess for a run of three handles, one for the two mapped before a failure:
    // two calls, five mappings (the cost model prices grants by the mappings they cover).
    let d = sim(64 * MIB, false);
    let va = d.reserve(8 * PAGE, 0).unwrap();
    let whole = |h| torch_arena::device::Piece::whole(h, PAGE);
    let run: Vec<_> = (0..3)
        .map(|_| whole(d.create_page(PAGE).unwrap()))
        .collect();
    assert!(d.map_run(va, &run).is_ok());
    let tail: Vec<_> = (0..3)
        .map(|_| whole(d.create_page(PAGE).unwrap()))
        .collect();
    d.fail_nth(SimCall::Map, 3);
    let Err(err) = d.map_run(va + 3 * PAGE, &tail) else {
        panic!("the third map fails")
    };
    assert_eq!(err.mapped, 2);
    let c = d.counters();
    assert_eq!((c.mem_map, c.set_access, c.set_access_handles), (6, 2, 5));
}

#[test]
fn the_bytes_created_released_allocated_and_freed_are_counted() {
    // The cost model's per-GiB terms price these; a call that fails counts no bytes.
    let d = sim(16 * MIB, false);
    let p = d.create_page(PAGE).unwrap();
    let q = d.create_page(2 * PAGE).unwrap();
    d.release_page(p).unwrap();
    let plain = d.alloc_plain(4 * MIB).unwrap();
    d.free_plain(plain).unwrap();
    assert_eq!(d.create_page(64 * MIB), Err(DeviceError::OutOfMemory));
    let c = d.counters();
    assert_eq!(
        (
            c.mem_create_bytes,
            c.mem_release_bytes,
            c.mem_alloc_bytes,
            c.mem_free_bytes
        ),
        (3 * PAGE, PAGE, 4 * MIB, 4 * MIB)
    );
    assert_eq!(c.mem_create, 3);
    d.release_page(q).unwrap();
    assert_eq!(d.counters().since(&c).mem_release_bytes, 2 * PAGE);
}

/// A piece of a handle maps at an offset, and the same bytes may be mapped at two addresses at
/// once (CUDA allows it; the arena lends idle pages so): a write through one shows through the
/// other, and the handle is released only once both are unmapped.
#[test]
fn pieces_of_a_handle_map_at_offsets_and_may_alias() {
    let d = sim(32 * MIB, true);
    let va = d.reserve(8 * PAGE, 0).unwrap();
    let h = d.create_page(4 * PAGE).unwrap();
    let piece = |offset: u64, size: u64| torch_arena::device::Piece {
        page: h,
        offset,
        size,
    };
    // Its last two pages at the start, its first two after them.
    d.map_run(va, &[piece(2 * PAGE, 2 * PAGE), piece(0, 2 * PAGE)])
        .unwrap();
    unsafe { fill(va, 2 * PAGE, 0x11) };
    unsafe { fill(va + 2 * PAGE, 2 * PAGE, 0x22) };
    // Its page 3 again, further on: the bytes written at va + PAGE.
    d.map_run(va + 5 * PAGE, &[piece(3 * PAGE, PAGE)]).unwrap();
    assert!(unsafe { all_equal(va + 5 * PAGE, PAGE, 0x11) });
    unsafe { fill(va + 5 * PAGE, PAGE, 0x33) };
    assert!(unsafe { all_equal(va + PAGE, PAGE, 0x33) });
    assert!(unsafe { all_equal(va, PAGE, 0x11) });
    // A piece past the handle's end, or not at a page boundary, is refused.
    assert!(
        is_misuse(
            d.map_run(va + 6 * PAGE, &[piece(4 * PAGE, PAGE)])
                .map_err(|e| e.error)
        )
        .contains("has size")
    );
    is_misuse(
        d.map_run(va + 6 * PAGE, &[piece(4096, PAGE)])
            .map_err(|e| e.error),
    );
    d.unmap(va, 4 * PAGE).unwrap();
    assert!(is_misuse(d.release_page(h)).contains("still mapped"));
    d.unmap(va + 5 * PAGE, PAGE).unwrap();
    d.release_page(h).unwrap();
    d.free_address(va, 8 * PAGE).unwrap();
    assert_eq!(
        (d.live_pages(), d.mapped_pages(), d.used_bytes()),
        (0, 0, 0)
    );
}
