//! `CudaDevice::open` when the libcuda found is the CUDA toolkit's stub: every call returns
//! CUDA_ERROR_STUB_LIBRARY (34). Its own binary, because the driver init is cached per process.

#[path = "fixtures/fakecuda.rs"]
mod fakecuda;

use torch_arena::device::DeviceError;
use torch_arena::device::cuda::{self, CudaDevice};

#[test]
fn stub_library_is_no_driver_naming_error_34() {
    let (_g, fake) = fakecuda::session();
    fake.set_stub(true);
    for _ in 0..2 {
        let result = std::panic::catch_unwind(|| CudaDevice::open(0).map(|_| ()))
            .expect("CudaDevice::open panicked");
        match result {
            Err(DeviceError::NoDriver(why)) => {
                assert!(why.contains("cuInit"), "{why}");
                assert!(why.contains("34"), "{why}");
                assert!(why.contains("CUDA_ERROR_STUB_LIBRARY"), "{why}");
                assert!(why.contains("stub"), "{why}");
            }
            other => panic!("expected NoDriver, got {other:?}"),
        }
    }
    assert_eq!(
        fake.count("cuInit"),
        1,
        "the init result is cached, not retried"
    );
    assert_eq!(fake.count("cuDevicePrimaryCtxRetain"), 0);

    // The failure is for good in this process, even once the library would answer.
    fake.set_stub(false);
    assert!(matches!(
        cuda::driver_version(),
        Err(DeviceError::NoDriver(_))
    ));
    assert_eq!(fake.count("cuInit"), 1);
}
