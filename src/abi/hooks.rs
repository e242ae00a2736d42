//! PyTorch's optional hooks: init, empty_cache, memory fraction, record_stream, base alloc.

use super::shared::*;

// ---------------------------------------------------------------------------------------------
// PyTorch's optional hooks.

/// `set_init_fn`: `void(int device_count)`. Records the count and reads the configuration (a bad
/// one is reported here, at CUDA init, and again on every allocation); opens no device.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_init(device_count: c_int) {
    hook("torch_arena_init", || {
        DEVICE_COUNT.store(device_count, Ordering::Relaxed);
        instance().map(drop)
    });
}

/// `set_reset_fn`: `void(void)`, called by `torch.cuda.empty_cache()`.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_empty_cache() {
    hook("torch_arena_empty_cache", || {
        let r = instance()?.empty_cache()?;
        tracing::debug!("empty_cache (reset hook): {}", reclaim_text(&r));
        Ok(())
    });
}

/// `set_memory_fraction_fn`: `void(double fraction, int device)`.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_set_memory_fraction(fraction: f64, device: c_int) {
    hook("torch_arena_set_memory_fraction", || {
        let inst = instance()?;
        let r = inst.set_memory_fraction(fraction, device);
        let logged = watch_device(inst, device, &r);
        r.map_err(|e| {
            Failure::with_context(
                &e,
                &format!("torch_arena_set_memory_fraction({fraction}, {device})"),
            )
            .logged(logged)
        })
    });
}

/// `set_record_stream_fn`: `void(void* ptr, cudaStream_t stream)`.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    hook("torch_arena_record_stream", || {
        instance()?
            .record_stream(dev_ptr(ptr), stream_id(stream))
            .map_err(|e| {
                let fail = Failure::with_context(
                    &e,
                    &format!("torch_arena_record_stream(ptr={ptr:p}, stream={stream:p})"),
                );
                if fail.code == TORCH_ARENA_ERR_BAD_POINTER {
                    WARN_RECORD_STREAM.report(&fail.msg);
                    fail.logged(true)
                } else {
                    fail
                }
            })
    });
}

/// `set_base_alloc_fn`: `void*(void* ptr, size_t* size)`. The base pointer of the allocation that
/// contains `ptr`, its size written to `*size`. An unknown pointer gives `ptr` and size 0, with
/// the last error set.
///
/// # Safety
/// `size` is NULL or valid for one `size_t` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_base_alloc(ptr: *mut c_void, size: *mut usize) -> *mut c_void {
    let r = guarded("torch_arena_base_alloc", || {
        if !size.is_null() {
            // SAFETY: non-null, valid by the caller's contract.
            unsafe { *size = 0 };
        }
        let (base, len) = instance()?.base_alloc(dev_ptr(ptr)).map_err(|e| {
            Failure::with_context(&e, &format!("torch_arena_base_alloc(ptr={ptr:p})"))
        })?;
        if size.is_null() {
            return Err(Failure::invalid(format!(
                "torch_arena_base_alloc(ptr={ptr:p}): size is NULL"
            )));
        }
        // SAFETY: as above.
        unsafe { *size = len as usize };
        Ok(base as usize as *mut c_void)
    });
    r.unwrap_or(ptr)
}

// ---------------------------------------------------------------------------------------------
