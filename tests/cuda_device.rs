//! `CudaDevice` against the fake CUDA driver (`tests/fixtures/fakecuda.c`): the real driver-facing
//! code, run without a GPU.
//!
//! The fake is process-global, so every test takes `fakecuda::session()` first (a lock plus a
//! reset of the fake) and drops its devices before it ends.

#[path = "fixtures/fakecuda.rs"]
mod fakecuda;

use std::sync::Arc;

use torch_arena::device::cuda::{self, CudaDevice};
use torch_arena::device::{Device, DeviceError, PageHandle};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 2 * MIB;

fn open0() -> CudaDevice {
    CudaDevice::open(0).expect("open device 0 of the fake driver")
}

fn driver_error(e: DeviceError) -> (&'static str, i32, String) {
    match e {
        DeviceError::Driver {
            call,
            code,
            message,
        } => (call, code, message),
        other => panic!("expected DeviceError::Driver, got {other:?}"),
    }
}

#[test]
fn open_reads_device_info_and_holds_the_primary_context() {
    let (_g, fake) = fakecuda::session();
    let dev = open0();
    let info = dev.info().clone();
    assert_eq!(info.ordinal, 0);
    assert_eq!(info.name, "Fake CUDA Device 0");
    assert_eq!(info.total_bytes, 1 << 30);
    assert_eq!(info.granularity, PAGE);
    assert!(info.vmm);
    assert_eq!(dev.driver_version(), 13000);
    assert_eq!(cuda::driver_version(), Ok(13000));
    assert_ne!(dev.context(), 0);
    assert_eq!(fake.live("contexts"), 1);
    assert_eq!(dev.mem_get_info(), Ok((1 << 30, 1 << 30)));

    let dev1 = CudaDevice::open(1).expect("open device 1");
    assert_eq!(dev1.info().name, "Fake CUDA Device 1");
    assert_ne!(dev1.context(), dev.context());
    assert_eq!(fake.live("contexts"), 2);
    drop(dev1);
    drop(dev);
    assert_eq!(
        fake.live("contexts"),
        0,
        "Drop releases the primary context"
    );
    assert_eq!(fake.count("cuDevicePrimaryCtxRelease_v2"), 2);
}

#[test]
fn bad_ordinal_names_the_ordinal_and_the_device_count() {
    let (_g, fake) = fakecuda::session();
    for ordinal in [2, -1, 1000] {
        let err = CudaDevice::open(ordinal)
            .err()
            .expect("a bad ordinal is an error");
        let (call, code, message) = driver_error(err);
        assert_eq!(call, "cuDeviceGet");
        assert_eq!(code, 101);
        assert!(message.contains(&format!("ordinal {ordinal}")), "{message}");
        assert!(message.contains("2 device(s)"), "{message}");
        assert!(message.contains("CUDA_ERROR_INVALID_DEVICE"), "{message}");
    }
    assert_eq!(
        fake.live("contexts"),
        0,
        "no context retained for a bad ordinal"
    );
}

#[test]
fn vmm_round_trip_writes_through_the_mapping_and_remaps_the_same_page() {
    let (_g, fake) = fakecuda::session();
    let dev = open0();
    let va1 = dev.reserve(4 * PAGE, PAGE).unwrap();
    let va2 = dev.reserve(2 * PAGE, 4 * PAGE).unwrap();
    assert_eq!(va1 % PAGE, 0);
    assert_eq!(va2 % (4 * PAGE), 0, "the requested alignment is honoured");
    assert_eq!(fake.live("reservations"), 2);

    let page = dev.create_page(PAGE).unwrap();
    assert_eq!(fake.live("handles"), 1);
    assert_eq!(dev.mem_get_info().unwrap().0, (1 << 30) - PAGE);

    let at = va1 + PAGE; // second page slot of the first reservation
    dev.map(at, PAGE, page).unwrap();
    assert_eq!(fake.mapping_access(at), 3, "map grants read/write access");
    assert_eq!(fake.live("mappings"), 1);
    // SAFETY: the fake maps device memory at the same host address, read/write.
    let bytes = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, PAGE as usize) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    dev.unmap(at, PAGE).unwrap();
    assert_eq!(fake.mapping_access(at), -1);
    assert_eq!(fake.live("mappings"), 0);

    // The same physical page at another address shows the same bytes.
    dev.map(va2, PAGE, page).unwrap();
    // SAFETY: as above.
    let again = unsafe { std::slice::from_raw_parts(va2 as *const u8, PAGE as usize) };
    assert!(
        again.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8),
        "bytes survive a remap"
    );
    dev.unmap(va2, PAGE).unwrap();

    dev.release_page(page).unwrap();
    dev.free_address(va1, 4 * PAGE).unwrap();
    dev.free_address(va2, 2 * PAGE).unwrap();
    for what in ["handles", "mappings", "reservations"] {
        assert_eq!(fake.live(what), 0, "{what} left behind");
    }
    assert_eq!(dev.mem_get_info().unwrap().0, 1 << 30);
}

#[test]
fn misuse_is_reported_by_the_driver_with_the_call_and_its_name() {
    let (_g, fake) = fakecuda::session();
    let dev = open0();
    let va = dev.reserve(2 * PAGE, 0).unwrap();

    let (call, code, message) = driver_error(dev.unmap(va, PAGE).unwrap_err());
    assert_eq!((call, code), ("cuMemUnmap", 1));
    assert_eq!(message, "CUDA_ERROR_INVALID_VALUE: invalid argument");

    let page = dev.create_page(PAGE).unwrap();
    dev.map(va, PAGE, page).unwrap();
    let (call, _, _) = driver_error(dev.release_page(page).unwrap_err());
    assert_eq!(call, "cuMemRelease", "a mapped page cannot be released");
    let (call, _, _) = driver_error(dev.free_address(va, 2 * PAGE).unwrap_err());
    assert_eq!(
        call, "cuMemAddressFree",
        "a reservation with mappings cannot be freed"
    );
    let (call, _, _) = driver_error(dev.map(va, PAGE, page).unwrap_err());
    assert_eq!(call, "cuMemMap", "mapping over a mapping fails");
    let (call, _, _) = driver_error(dev.map(va + PAGE, PAGE, PageHandle(12345)).unwrap_err());
    assert_eq!(call, "cuMemMap", "an unknown handle fails");
    assert_eq!(fake.live("mappings"), 1);

    dev.unmap(va, PAGE).unwrap();
    dev.release_page(page).unwrap();
    dev.free_address(va, 2 * PAGE).unwrap();
    let (call, code, _) = driver_error(dev.release_page(page).unwrap_err());
    assert_eq!((call, code), ("cuMemRelease", 1), "double release");
}

#[test]
fn plain_allocations_when_vmm_is_unsupported() {
    let (_g, fake) = fakecuda::session();
    fake.set_vmm(false);
    let dev = open0();
    assert!(!dev.info().vmm);
    assert_eq!(dev.info().granularity, PAGE);
    assert!(matches!(dev.create_page(PAGE), Err(DeviceError::Misuse(_))));
    assert!(matches!(dev.reserve(PAGE, 0), Err(DeviceError::Misuse(_))));
    assert_eq!(
        fake.count("cuMemCreate"),
        0,
        "no VMM call reaches the driver"
    );

    let ptr = dev.alloc_plain(3 * MIB).unwrap();
    assert_ne!(ptr, 0);
    assert_eq!(fake.live("allocs"), 1);
    assert_eq!(dev.mem_get_info().unwrap().0, (1 << 30) - 4 * MIB);
    // SAFETY: the fake backs cuMemAlloc with host memory at the returned address.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, (3 * MIB) as usize) };
    bytes.fill(0x5a);
    assert!(bytes.iter().all(|b| *b == 0x5a));
    dev.free_plain(ptr).unwrap();
    assert_eq!(fake.live("allocs"), 0);
    let (call, code, _) = driver_error(dev.free_plain(ptr).unwrap_err());
    assert_eq!((call, code), ("cuMemFree_v2", 1), "double free");

    fake.set_capacity(4 * MIB);
    let a = dev.alloc_plain(4 * MIB).unwrap();
    assert_eq!(dev.alloc_plain(1), Err(DeviceError::OutOfMemory));
    dev.free_plain(a).unwrap();
}

#[test]
fn plain_allocations_also_work_with_vmm() {
    let (_g, fake) = fakecuda::session();
    let dev = open0();
    let p = dev.alloc_plain(512).unwrap();
    dev.free_plain(p).unwrap();
    assert_eq!(fake.count("cuMemAlloc_v2"), 1);
    assert_eq!(fake.count("cuMemFree_v2"), 1);
}

#[test]
fn events_complete_with_the_work_of_their_stream() {
    let (_g, fake) = fakecuda::session();
    let dev = open0();
    let stream = 0x7000u64;
    let ev = dev.create_event().unwrap();
    assert_eq!(fake.live("events"), 1);
    assert_eq!(
        dev.query_event(ev),
        Ok(true),
        "a never-recorded event is complete"
    );

    dev.record_event(ev, stream).unwrap();
    assert_eq!(dev.query_event(ev), Ok(true));

    fake.set_stream_busy(stream, true);
    dev.record_event(ev, stream).unwrap();
    assert_eq!(
        dev.query_event(ev),
        Ok(false),
        "work queued before the record is still running"
    );
    dev.synchronize_event(ev).unwrap();
    assert_eq!(dev.query_event(ev), Ok(true));

    fake.set_stream_busy(stream, true);
    dev.record_event(ev, stream).unwrap();
    dev.record_event(ev, 0).unwrap(); // re-recording on an idle stream replaces the capture
    assert_eq!(dev.query_event(ev), Ok(true));

    dev.record_event(ev, stream).unwrap();
    assert_eq!(dev.query_event(ev), Ok(false));
    dev.synchronize_stream(stream).unwrap();
    assert_eq!(dev.query_event(ev), Ok(true));

    fake.set_stream_busy(stream, true);
    dev.record_event(ev, stream).unwrap();
    assert_eq!(dev.query_event(ev), Ok(false));
    dev.synchronize().unwrap();
    assert_eq!(dev.query_event(ev), Ok(true));

    fake.set_stream_busy(stream, true);
    dev.record_event(ev, stream).unwrap();
    fake.set_stream_busy(stream, false);
    assert_eq!(
        dev.query_event(ev),
        Ok(true),
        "released work completes the event"
    );

    dev.destroy_event(ev).unwrap();
    assert_eq!(fake.live("events"), 0);
    let (call, code, _) = driver_error(dev.query_event(ev).unwrap_err());
    assert_eq!(
        (call, code),
        ("cuEventQuery", 400),
        "other errors are not 'not ready'"
    );
    let (call, code, _) = driver_error(dev.destroy_event(ev).unwrap_err());
    assert_eq!((call, code), ("cuEventDestroy_v2", 400));
}

#[test]
fn injected_out_of_memory_from_cu_mem_create() {
    let (_g, fake) = fakecuda::session();
    let dev = open0();
    fake.fail_nth("cuMemCreate", 2);
    let first = dev.create_page(PAGE).unwrap();
    assert_eq!(dev.create_page(PAGE), Err(DeviceError::OutOfMemory));
    let third = dev.create_page(PAGE).unwrap();
    assert_eq!(fake.live("handles"), 2);
    dev.release_page(first).unwrap();
    dev.release_page(third).unwrap();

    fake.set_capacity(2 * PAGE);
    let a = dev.create_page(PAGE).unwrap();
    let b = dev.create_page(PAGE).unwrap();
    assert_eq!(
        dev.create_page(PAGE),
        Err(DeviceError::OutOfMemory),
        "capacity exhausted"
    );
    assert_eq!(dev.mem_get_info(), Ok((0, 2 * PAGE)));
    dev.release_page(a).unwrap();
    dev.release_page(b).unwrap();

    fake.fail_nth("cuMemAlloc_v2", 1);
    assert_eq!(dev.alloc_plain(MIB), Err(DeviceError::OutOfMemory));
}

#[test]
fn injected_driver_errors_keep_their_code_and_call() {
    let (_g, fake) = fakecuda::session();
    let dev = open0();
    fake.fail_nth_code("cuMemCreate", 1, 999);
    let (call, code, message) = driver_error(dev.create_page(PAGE).unwrap_err());
    assert_eq!(
        (call, code),
        ("cuMemCreate", 999),
        "only error 2 is OutOfMemory"
    );
    assert_eq!(message, "CUDA_ERROR_UNKNOWN: unknown error");

    fake.fail_nth("cuMemAddressReserve", 1);
    let (call, code, _) = driver_error(dev.reserve(PAGE, 0).unwrap_err());
    assert_eq!((call, code), ("cuMemAddressReserve", 999));
    assert_eq!(fake.live("reservations"), 0);
}

#[test]
fn failed_map_leaves_no_mapping() {
    let (_g, fake) = fakecuda::session();
    let dev = open0();
    let va = dev.reserve(PAGE, 0).unwrap();
    let page = dev.create_page(PAGE).unwrap();

    fake.fail_nth("cuMemMap", 1);
    let (call, code, _) = driver_error(dev.map(va, PAGE, page).unwrap_err());
    assert_eq!((call, code), ("cuMemMap", 999));
    assert_eq!(fake.live("mappings"), 0);
    assert_eq!(
        fake.count("cuMemSetAccess"),
        0,
        "no access is set on a failed map"
    );

    dev.map(va, PAGE, page).unwrap();
    dev.unmap(va, PAGE).unwrap();
    dev.release_page(page).unwrap();
    dev.free_address(va, PAGE).unwrap();
}

#[test]
fn failed_set_access_undoes_the_map() {
    let (_g, fake) = fakecuda::session();
    let dev = open0();
    let va = dev.reserve(2 * PAGE, 0).unwrap();
    let page = dev.create_page(PAGE).unwrap();
    let other = dev.create_page(PAGE).unwrap();
    dev.map(va + PAGE, PAGE, other).unwrap();
    let mappings = fake.live("mappings");
    let unmaps = fake.count("cuMemUnmap");

    fake.fail_nth("cuMemSetAccess", 1);
    let (call, code, _) = driver_error(dev.map(va, PAGE, page).unwrap_err());
    assert_eq!((call, code), ("cuMemSetAccess", 999));
    assert_eq!(
        fake.live("mappings"),
        mappings,
        "the half-done mapping was undone"
    );
    assert_eq!(fake.mapping_access(va), -1);
    assert_eq!(fake.count("cuMemUnmap"), unmaps + 1);
    assert_eq!(dev.counters().mem_unmap, 1, "the undo is counted");

    // Nothing is left half done: the same map succeeds now, and the page can be released.
    dev.map(va, PAGE, page).unwrap();
    dev.unmap(va, 2 * PAGE).unwrap();
    dev.release_page(page).unwrap();
    dev.release_page(other).unwrap();
    dev.free_address(va, 2 * PAGE).unwrap();
    assert_eq!(
        fake.live("handles") + fake.live("mappings") + fake.live("reservations"),
        0
    );
}

#[test]
fn counters_match_the_calls_the_driver_saw() {
    let (_g, fake) = fakecuda::session();
    let dev = open0();
    let va = dev.reserve(4 * PAGE, 0).unwrap();
    let pages: Vec<_> = (0..3).map(|_| dev.create_page(PAGE).unwrap()).collect();
    for (i, p) in pages.iter().enumerate() {
        dev.map(va + i as u64 * PAGE, PAGE, *p).unwrap();
    }
    fake.fail_nth("cuMemSetAccess", 1);
    let extra = dev.create_page(PAGE).unwrap();
    assert!(dev.map(va + 3 * PAGE, PAGE, extra).is_err());
    dev.unmap(va, 3 * PAGE).unwrap();
    for p in pages.into_iter().chain([extra]) {
        dev.release_page(p).unwrap();
    }
    dev.free_address(va, 4 * PAGE).unwrap();
    assert!(dev.unmap(va, PAGE).is_err(), "failed calls count too");
    let ptr = dev.alloc_plain(MIB).unwrap();
    dev.free_plain(ptr).unwrap();
    let ev = dev.create_event().unwrap();
    dev.record_event(ev, 3).unwrap();
    dev.query_event(ev).unwrap();
    dev.synchronize_event(ev).unwrap();
    dev.destroy_event(ev).unwrap();
    dev.synchronize_stream(3).unwrap();
    dev.synchronize().unwrap();
    dev.mem_get_info().unwrap();

    let counters = dev.counters();
    for (name, value) in counters.entries() {
        assert_eq!(fake.count(name), value as i64, "{name}");
        assert!(value > 0, "{name} was exercised");
    }
    assert_eq!(counters.mem_map, 4);
    assert_eq!(counters.set_access, 4);
    assert_eq!(counters.set_access_handles, 4); // single-handle grants
    assert_eq!(counters.mem_unmap, 3);
}

#[test]
fn fake_rejects_driver_calls_without_a_current_context() {
    // The other tests rely on this: a call that reached the fake without our context current
    // would fail with CUDA_ERROR_INVALID_CONTEXT.
    let (_g, fake) = fakecuda::session();
    let dev = open0();
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(
                fake.current_context(),
                0,
                "a new thread has no current context"
            );
            assert_eq!(fake.raw_mem_get_info(), 201);
            assert!(
                dev.mem_get_info().is_ok(),
                "CudaDevice makes its context current"
            );
        });
    });
}

#[test]
fn calls_from_many_threads_make_the_context_current_and_restore_the_previous_one() {
    let (_g, fake) = fakecuda::session();
    let dev = Arc::new(open0());
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let dev = Arc::clone(&dev);
            std::thread::spawn(move || {
                let fake = fakecuda::fake();
                assert_eq!(fake.current_context(), 0);
                for round in 0..10u64 {
                    let va = dev.reserve(PAGE, 0).unwrap();
                    let page = dev.create_page(PAGE).unwrap();
                    dev.map(va, PAGE, page).unwrap();
                    let tag = (t << 32) | round;
                    // SAFETY: mapped read/write at the same host address by the fake.
                    unsafe {
                        (va as *mut u64).write(tag);
                        assert_eq!((va as *const u64).read(), tag);
                    }
                    let ev = dev.create_event().unwrap();
                    dev.record_event(ev, t).unwrap();
                    assert_eq!(dev.query_event(ev), Ok(true));
                    dev.destroy_event(ev).unwrap();
                    dev.unmap(va, PAGE).unwrap();
                    dev.release_page(page).unwrap();
                    dev.free_address(va, PAGE).unwrap();
                }
                assert_eq!(
                    fake.current_context(),
                    0,
                    "the thread's (empty) context is restored"
                );
            })
        })
        .collect();
    // Join every worker before judging, so none is left running into the next test.
    let failed = threads
        .into_iter()
        .map(|t| t.join())
        .filter(Result::is_err)
        .count();
    assert_eq!(failed, 0, "{failed} worker thread(s) failed");
    for what in ["handles", "mappings", "reservations", "events"] {
        assert_eq!(fake.live(what), 0, "{what} left behind");
    }
    assert_eq!(dev.counters().mem_create, 80);
    assert!(
        fake.count("cuCtxSetCurrent") >= 2 * 8 * 10,
        "every call switched in and back"
    );

    // A thread whose current context is another device's keeps it.
    let dev1 = CudaDevice::open(1).unwrap();
    fake.set_current_context(dev1.context());
    let page = dev.create_page(PAGE).unwrap();
    assert_eq!(
        fake.current_context(),
        dev1.context(),
        "device 1's context is current again"
    );
    dev.release_page(page).unwrap();
    // With our context already current, no switch happens.
    fake.set_current_context(dev.context());
    let switches = fake.count("cuCtxSetCurrent");
    dev.mem_get_info().unwrap();
    assert_eq!(fake.count("cuCtxSetCurrent"), switches);
    fake.set_current_context(0);
}

#[test]
fn device_is_send_and_sync_and_usable_as_a_trait_object() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CudaDevice>();
    let (_g, _fake) = fakecuda::session();
    let dev: Arc<dyn Device> = Arc::new(open0());
    assert_eq!(dev.info().granularity, PAGE);
}
