//! `CudaDevice::open` on a machine without libcuda: a clean `NoDriver` error, no panic.
//!
//! This binary never loads the fake driver (that would make a libcuda present for good).

use torch_arena::device::DeviceError;
use torch_arena::device::cuda::{self, CudaDevice};

#[test]
fn open_without_libcuda_is_no_driver_not_a_panic() {
    // SAFETY: only tries to dlopen the candidate names.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        // A real driver on this machine: we cannot test its absence, only that open does not
        // panic whatever the outcome.
        eprintln!("a libcuda is present on this machine; only checking that open does not panic");
        let _ = std::panic::catch_unwind(|| CudaDevice::open(0).map(|_| ()))
            .expect("CudaDevice::open panicked");
        return;
    }
    for _ in 0..2 {
        // Twice: the cached error is returned the second time.
        let result = std::panic::catch_unwind(|| CudaDevice::open(0).map(|_| ()))
            .expect("CudaDevice::open panicked");
        match result {
            Err(DeviceError::NoDriver(why)) => {
                assert!(why.contains("libcuda.so.1 not found"), "{why}");
                assert!(
                    why.contains("device:sim"),
                    "the message points to the simulator: {why}"
                );
            }
            other => panic!("expected NoDriver, got {other:?}"),
        }
    }
    assert!(matches!(
        cuda::driver_version(),
        Err(DeviceError::NoDriver(_))
    ));
    assert!(matches!(
        CudaDevice::open(1).map(|_| ()),
        Err(DeviceError::NoDriver(_))
    ));
}
