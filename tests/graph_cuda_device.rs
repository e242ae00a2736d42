//! `CudaDevice` during stream capture, over the fake driver (`tests/fixtures/fakecuda.c`):
//! `is_capturing` answers from `cuStreamIsCapturing`; every driver call runs in relaxed capture
//! mode and puts the thread's own mode back afterwards; what conflicts with capture in any mode
//! is still refused; and the arena over it makes no such call while streams capture.

#[path = "fixtures/fakecuda.rs"]
mod fakecuda;

use std::ffi::{CString, c_int, c_void};
use std::sync::Arc;

use torch_arena::arena::Arena;
use torch_arena::config::Config;
use torch_arena::device::cuda::CudaDevice;
use torch_arena::device::{Device, DeviceError};

const MIB: u64 = 1 << 20;

/// The fake's capture entry points, looked up in the process (the fake is loaded RTLD_GLOBAL).
struct Capture {
    begin: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
    end: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> c_int,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> c_int,
    violations: unsafe extern "C" fn() -> i64,
    captured_records: unsafe extern "C" fn() -> i64,
}

fn capture() -> Capture {
    fn sym<T: Copy>(name: &str) -> T {
        let c = CString::new(name).unwrap();
        // SAFETY: dlsym over the global scope; T is the symbol's function pointer type.
        unsafe {
            let p = libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr());
            assert!(!p.is_null(), "the fake driver lacks {name}");
            std::mem::transmute_copy::<*mut c_void, T>(&p)
        }
    }
    Capture {
        begin: sym("cuStreamBeginCapture_v2"),
        end: sym("cuStreamEndCapture"),
        mem_alloc: sym("cuMemAlloc_v2"),
        violations: sym("fake_cuda_capture_violations"),
        captured_records: sym("fake_cuda_captured_records"),
    }
}

const GLOBAL: c_int = 0;
const CAPTURE_UNSUPPORTED: c_int = 900;
const INVALIDATED: c_int = 901;

fn stream(s: u64) -> *mut c_void {
    s as usize as *mut c_void
}

#[test]
fn driver_calls_are_relaxed_and_the_threads_mode_is_restored() {
    let (_guard, fake) = fakecuda::session();
    let dev = CudaDevice::open(0).unwrap();
    fake.set_current_context(dev.context());
    let cap = capture();
    // SAFETY: the fake's entry points with valid arguments; a context is current.
    unsafe {
        assert_eq!((cap.begin)(stream(0x51), GLOBAL), 0);
        assert!(dev.is_capturing(0x51).unwrap());
        assert!(!dev.is_capturing(0x52).unwrap());
        // Memory calls during a global capture on this very thread: allowed (relaxed).
        let va = dev.reserve(4 * MIB, 0).unwrap();
        let page = dev.create_page(2 * MIB).unwrap();
        dev.map(va, 2 * MIB, page).unwrap();
        let e = dev.create_event().unwrap();
        dev.record_event(e, 0x52).unwrap();
        assert!(dev.query_event(e).unwrap());
        dev.synchronize_stream(0x52).unwrap();
        assert_eq!((cap.violations)(), 0);
        // The thread is back in global mode: the fake refuses a raw cudaMalloc-like call, which
        // invalidates the capture as on a GPU.
        let mut ptr = 0u64;
        assert_eq!((cap.mem_alloc)(&mut ptr, MIB as usize), CAPTURE_UNSUPPORTED);
        assert_eq!((cap.violations)(), 1);
        let mut graph = std::ptr::null_mut();
        assert_eq!((cap.end)(stream(0x51), &mut graph), INVALIDATED);

        // What conflicts with capture in any mode stays refused through the device.
        assert_eq!((cap.begin)(stream(0x51), GLOBAL), 0);
        let refused = dev.synchronize_stream(0x51).unwrap_err();
        assert!(
            matches!(
                refused,
                DeviceError::Driver {
                    code: CAPTURE_UNSUPPORTED,
                    ..
                }
            ),
            "{refused}"
        );
        assert!(dev.synchronize().is_err());
        dev.record_event(e, 0x51).unwrap(); // legal: becomes a graph node
        assert_eq!((cap.captured_records)(), 1);
        assert!(dev.query_event(e).is_err()); // CUDA_ERROR_CAPTURED_EVENT
        assert_eq!((cap.end)(stream(0x51), &mut graph), INVALIDATED);

        dev.unmap(va, 2 * MIB).unwrap();
        dev.release_page(page).unwrap();
        dev.free_address(va, 4 * MIB).unwrap();
        dev.destroy_event(e).unwrap();
    }
}

/// The arena over the fake while two streams capture in global mode: pool and general traffic,
/// frees, record_stream, empty_cache and an out-of-memory ladder; the captures end valid and
/// no forbidden call and no event record on a capturing stream reached the driver.
#[test]
fn the_arena_makes_no_forbidden_call_during_capture() {
    let (_guard, fake) = fakecuda::session();
    fake.set_capacity(96 * MIB);
    let dev = Arc::new(CudaDevice::open(0).unwrap());
    fake.set_current_context(dev.context());
    let arena = Arena::new(dev.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let cap = capture();
    let (c, side, other) = (0x61u64, 0x62u64, 0x63u64);
    // Memory used and freed on the capture streams just before the capture: idle, not proven.
    let before: Vec<u64> = (0..6)
        .map(|i| arena.malloc((3 + i) * MIB, c).unwrap())
        .collect();
    for p in before {
        arena.free(p, None, c).unwrap();
    }
    let pool = (1, 0);
    arena.begin_pool(pool).unwrap();
    // SAFETY: the fake's entry points; a context is current.
    unsafe {
        assert_eq!((cap.begin)(stream(c), GLOBAL), 0);
        assert_eq!((cap.begin)(stream(side), GLOBAL), 0);
    }
    let mut pooled = Vec::new();
    let mut general = Vec::new();
    for i in 0..12u64 {
        pooled.push(
            arena
                .malloc_pool((1 + i % 5) * MIB + 4096, c, pool)
                .unwrap(),
        );
        pooled.push(arena.malloc_pool(3000 + i * 512, side, pool).unwrap());
        general.push(arena.malloc(2 * MIB + i * 4096, other).unwrap());
        if i % 3 == 0 {
            let p = pooled.remove(0);
            arena.record_stream(p, side).unwrap();
            arena.free(p, None, c).unwrap();
        }
    }
    let ctx_syncs = fake.count("cuCtxSynchronize");
    let stream_syncs = fake.count("cuStreamSynchronize");
    arena.empty_cache().unwrap();
    // Fill the device until a request fails: the last runs the whole out-of-memory ladder
    // during capture.
    let mut filler = Vec::new();
    loop {
        match arena.malloc(8 * MIB, other) {
            Ok(p) => filler.push(p),
            Err(torch_arena::error::Error::OutOfMemory(_)) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(filler.len() < 64, "96 MiB never ran out");
    }
    assert!(
        arena.stats().num_alloc_retries > 0,
        "the ladder did not run"
    );
    // Streams that are not capturing were synchronised one by one, never the device.
    assert_eq!(fake.count("cuCtxSynchronize"), ctx_syncs);
    assert!(fake.count("cuStreamSynchronize") > stream_syncs);
    for p in filler {
        arena.free(p, None, other).unwrap();
    }
    // SAFETY: as above.
    unsafe {
        let mut graph = std::ptr::null_mut();
        assert_eq!(
            (cap.end)(stream(side), &mut graph),
            0,
            "side capture invalidated"
        );
        assert_eq!((cap.end)(stream(c), &mut graph), 0, "capture invalidated");
        assert_eq!((cap.violations)(), 0);
        assert_eq!((cap.captured_records)(), 0);
    }
    arena.end_pool(pool).unwrap();
    arena.release_pool(pool).unwrap();
    for p in pooled.into_iter().chain(general) {
        arena.free(p, None, 0).unwrap();
    }
    arena.empty_cache().unwrap();
    arena.check_consistency().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
    assert_eq!(arena.pool_info(pool), None);
    assert!(fake.count("cuThreadExchangeStreamCaptureMode") > 0);
}
