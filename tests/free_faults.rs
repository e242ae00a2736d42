//! A free that a driver fault interrupts, over the fake CUDA driver (`tests/fixtures/fakecuda.c`),
//! with and without VMM: one failed call anywhere in the free of a block used on another stream
//! (`record_stream`) — the context guard (cuCtxGetCurrent, cuCtxSetCurrent, the capture-mode
//! exchange), cuStreamIsCapturing, the event and synchronisation calls — must leave the block
//! either freed or pending and retried, never half-way: once the other stream's work is done and
//! one more call has run, the statistics, the bytes the driver holds and a refill to capacity
//! agree with a free that saw no fault.
//!
//! Every position is tried, in the free and in the next allocation (which polls the pending
//! free): a first run with no fault counts the calls of each kind the window makes, then one run
//! per (call, n) fails the n-th of them.

#[path = "fixtures/fakecuda.rs"]
mod fakecuda;

use std::ffi::{CString, c_int, c_void};
use std::sync::Arc;

use fakecuda::Fake;
use torch_arena::arena::Arena;
use torch_arena::config::Config;
use torch_arena::device::Device;
use torch_arena::device::cuda::CudaDevice;
use torch_arena::error::Error;

const MIB: u64 = 1 << 20;
/// The fake device's capacity and the block freed: the device fits exactly four.
const CAPACITY: u64 = 96 * MIB;
const BLOCK: u64 = 24 * MIB;
/// The stream that allocates and frees, and the one the block was also used on.
const OWNER: u64 = 7;
const OTHER: u64 = 9;

/// Every call of the fake driver (its `FAKE_CALLS` table).
const CALLS: [&str; 35] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemUnmap",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuStreamSynchronize",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuThreadExchangeStreamCaptureMode",
];

/// How the other stream is using the block when it is freed.
#[derive(Clone, Copy, Debug)]
enum Use {
    /// Work queued on it that has not finished (the free records an event and stays pending).
    Busy,
    /// It is being captured into a CUDA graph (nothing may be recorded on it until it ends).
    Capturing,
    /// Nothing pending (the event recorded completes at once).
    Done,
}

/// The fake's capture calls, looked up in the process (the fake is loaded RTLD_GLOBAL).
fn capture_call<T: Copy>(name: &str) -> T {
    let c = CString::new(name).unwrap();
    // SAFETY: dlsym over the global scope; T is the symbol's function pointer type.
    unsafe {
        let p = libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr());
        assert!(!p.is_null(), "the fake driver lacks {name}");
        std::mem::transmute_copy::<*mut c_void, T>(&p)
    }
}

fn begin_capture(fake: &Fake, dev: &CudaDevice, stream: u64) {
    let begin: unsafe extern "C" fn(*mut c_void, c_int) -> c_int =
        capture_call("cuStreamBeginCapture_v2");
    let before = fake.current_context();
    fake.set_current_context(dev.context());
    // SAFETY: the fake's entry point, a context current; mode 0 is global (torch's default).
    assert_eq!(unsafe { begin(stream as usize as *mut c_void, 0) }, 0);
    fake.set_current_context(before);
}

fn end_capture(fake: &Fake, dev: &CudaDevice, stream: u64) {
    let end: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> c_int =
        capture_call("cuStreamEndCapture");
    let before = fake.current_context();
    fake.set_current_context(dev.context());
    let mut graph = std::ptr::null_mut();
    // SAFETY: as above.
    let rc = unsafe { end(stream as usize as *mut c_void, &mut graph) };
    fake.set_current_context(before);
    assert_eq!(rc, 0, "the capture was invalidated");
}

fn counts(fake: &Fake) -> Vec<i64> {
    CALLS.iter().map(|c| fake.count(c)).collect()
}

/// Where the injected fault falls.
#[derive(Clone, Copy, Debug)]
enum Window {
    /// The free itself.
    Free,
    /// The next allocation after the free, which polls the pending free (records on the streams
    /// left waiting, queries the events).
    Poll,
}

/// One free of a `BLOCK` used on `OTHER` as `how` says, with the `n`-th next call of `call`
/// failing in `window` (`None`: no fault), then the checks. Returns how many calls of each kind
/// the window made, or what disagreed.
fn free_with_fault(
    vmm: bool,
    how: Use,
    window: Window,
    fault: Option<(&str, i32)>,
) -> Result<Vec<i64>, String> {
    let (_guard, fake) = fakecuda::session();
    fake.set_vmm(vmm);
    fake.set_capacity(CAPACITY);
    let dev = Arc::new(CudaDevice::open(0).unwrap());
    let arena = Arena::new(dev.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let at = format!("vmm={vmm} {how:?} {window:?} fault={fault:?}");

    let p = arena.malloc(BLOCK, OWNER).unwrap();
    arena.record_stream(p, OTHER).unwrap();
    match how {
        Use::Busy => fake.set_stream_busy(OTHER, true),
        Use::Capturing => begin_capture(fake, &dev, OTHER),
        Use::Done => {}
    }
    let arm = || {
        if let Some((call, n)) = fault {
            fake.fail_nth(call, n);
        }
    };
    let disarm = || {
        if let Some((call, _)) = fault {
            fake.fail_nth(call, 0);
        }
    };

    let before = counts(fake);
    if let Window::Free = window {
        arm();
    }
    let freed = arena.free(p, Some(BLOCK), OWNER);
    let mut made = counts(fake);
    disarm();
    // A driver fault is the arena's to retry: PyTorch ignores what a free returns (checked
    // last, so that what a failed free left shows first).
    let free_error = freed.err();
    arena
        .check_consistency()
        .map_err(|e| format!("{at}: after the free: {e}"))?;
    let st = arena.stats();
    if st.allocated_bytes.all().current != 0 {
        return Err(format!("{at}: still allocated after the free"));
    }
    if let Window::Poll = window {
        // The capture ends first, so that the poll records on the stream left waiting.
        if let Use::Capturing = how {
            end_capture(fake, &dev, OTHER);
        }
        let before = counts(fake);
        arm();
        let small = arena.malloc(4096, OWNER);
        made = counts(fake);
        disarm();
        for (m, b) in made.iter_mut().zip(before) {
            *m -= b;
        }
        arena
            .check_consistency()
            .map_err(|e| format!("{at}: after the poll: {e}"))?;
        // A fault may fail the allocation; one that succeeded is freed again.
        if let Ok(q) = small {
            arena.free(q, None, OWNER).unwrap();
        }
    } else {
        for (m, b) in made.iter_mut().zip(before) {
            *m -= b;
        }
    }

    // The other stream's use ends; one more call (empty_cache) gives everything back.
    match (how, window) {
        (Use::Busy, _) => fake.set_stream_busy(OTHER, false),
        (Use::Capturing, Window::Free) => end_capture(fake, &dev, OTHER),
        _ => {}
    }
    arena
        .empty_cache()
        .map_err(|e| format!("{at}: empty_cache: {e}"))?;
    arena
        .check_consistency()
        .map_err(|e| format!("{at}: after empty_cache: {e}"))?;
    let st = arena.stats();
    let (active, reserved) = (
        st.active_bytes.all().current,
        st.reserved_bytes.all().current,
    );
    let driver = fake.live("bytes");
    if active != 0 || reserved != 0 || driver != 0 {
        return Err(format!(
            "{at}: after empty_cache active {active}, reserved {reserved}, the driver holds \
             {driver} bytes (all should be 0)"
        ));
    }

    // The whole device is usable again: exactly CAPACITY / BLOCK blocks fit.
    let mut refill = Vec::new();
    loop {
        match arena.malloc(BLOCK, OWNER) {
            Ok(q) => refill.push(q),
            Err(Error::OutOfMemory(_)) => break,
            Err(e) => return Err(format!("{at}: refill: {e}")),
        }
        if refill.len() as u64 > CAPACITY / BLOCK {
            return Err(format!("{at}: more blocks than the device holds"));
        }
    }
    if refill.len() as u64 != CAPACITY / BLOCK {
        return Err(format!(
            "{at}: the device fits {} blocks of {} MiB after the free, not {}",
            refill.len(),
            BLOCK / MIB,
            CAPACITY / BLOCK
        ));
    }
    let reserved = arena.stats().reserved_bytes.all().current;
    if reserved != fake.live("bytes") {
        return Err(format!(
            "{at}: reserved {reserved} but the driver holds {} bytes",
            fake.live("bytes")
        ));
    }
    for q in refill {
        arena.free(q, Some(BLOCK), OWNER).unwrap();
    }
    arena.empty_cache().unwrap();
    for what in ["handles", "mappings", "allocs", "bytes"] {
        if fake.live(what) != 0 {
            return Err(format!("{at}: {what} left in the driver at the end"));
        }
    }
    match free_error {
        Some(e) => Err(format!("{at}: the free failed: {e}")),
        None => Ok(made),
    }
}

/// Every fault position of the free, for each way the block was used, VMM or not.
fn every_fault_position(vmm: bool) {
    let mut failures = Vec::new();
    let mut positions = 0;
    for how in [Use::Busy, Use::Capturing, Use::Done] {
        for window in [Window::Free, Window::Poll] {
            let made = free_with_fault(vmm, how, window, None).unwrap();
            for (call, &k) in CALLS.iter().zip(&made) {
                for n in 1..=k as i32 {
                    positions += 1;
                    if let Err(e) = free_with_fault(vmm, how, window, Some((call, n))) {
                        failures.push(e);
                    }
                }
            }
        }
    }
    eprintln!("vmm={vmm}: {positions} fault positions");
    assert!(positions >= 10, "only {positions} fault positions");
    assert!(
        failures.is_empty(),
        "{} of {positions} fault positions:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_driver_fault_during_a_free_with_vmm_strands_nothing() {
    every_fault_position(true);
}

#[test]
fn a_driver_fault_during_a_free_without_vmm_strands_nothing() {
    every_fault_position(false);
}
