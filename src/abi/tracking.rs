//! Tracking exports: steps, tags, sites, live/leak/layout/history JSON.

use super::shared::*;

// ---------------------------------------------------------------------------------------------
// Tracking: steps, tags, sites and the JSON reports (see `crate::track`).

/// A device ordinal for the reports: 0..MAX_DEVICES (the device need not be open).
fn report_device(device: c_int, what: &str) -> Outcome<()> {
    if usize::try_from(device).is_ok_and(|d| d < MAX_DEVICES) {
        Ok(())
    } else {
        Err(Failure::new(
            TORCH_ARENA_ERR_BAD_DEVICE,
            format!("{what}: device {device} is out of range: expected 0..{MAX_DEVICES}"),
        ))
    }
}

/// A JSON report into `buf` (snprintf style); 0 on failure with the last error set.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
unsafe fn json_out(
    name: &str,
    device: c_int,
    buf: *mut c_char,
    cap: usize,
    make: impl FnOnce(&TorchArena) -> Outcome<String>,
) -> usize {
    let text = guarded(name, || {
        report_device(device, name)?;
        make(instance()?)
    });
    match text {
        // SAFETY: the caller's contract.
        Ok(t) => unsafe { copy_out(&t, buf, cap) },
        Err(_) => {
            // SAFETY: as above.
            unsafe { copy_out("", buf, cap) };
            0
        }
    }
}

/// Advance the process-wide step (every site's live bytes are recorded at the boundary); returns
/// the new step (steps start at 0, so the first call returns 1). 0 on failure (last error set).
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_step() -> u64 {
    guarded("torch_arena_step", || Ok(instance()?.tracker().step())).unwrap_or(0)
}

/// The current step (0 before the first `torch_arena_step`; also 0 on failure).
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_current_step() -> u64 {
    guarded("torch_arena_current_step", || {
        Ok(instance()?.tracker().current_step())
    })
    .unwrap_or(0)
}

/// Push `tag` on the calling thread's tag stack: new allocations made on this thread carry its innermost
/// tag (tags are per thread, so two threads' labels never swap). 0, or
/// `TORCH_ARENA_ERR_INVALID_ARGUMENT` (NULL), `TORCH_ARENA_ERR_CONFIG` (not UTF-8).
///
/// # Safety
/// `tag` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_tag_push(tag: *const c_char) -> c_int {
    status("torch_arena_tag_push", || {
        // SAFETY: the caller's contract.
        let text = unsafe { c_str(tag, "torch_arena_tag_push") }?;
        instance()?.tracker().tag_push(text);
        Ok(())
    })
}

/// Pop the calling thread's innermost tag. 0, or `TORCH_ARENA_ERR_INVALID_ARGUMENT` when its stack is
/// empty.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_tag_pop() -> c_int {
    status("torch_arena_tag_pop", || {
        if instance()?.tracker().tag_pop() {
            Ok(())
        } else {
            Err(Failure::invalid(
                "torch_arena_tag_pop: the tag stack is empty (more pops than pushes)",
            ))
        }
    })
}

/// Change site capture at run time: `mode` as the `sites` key (`none`, `python`, `native`,
/// `all`), one allocation in `every` (>= 1), requests of at least `min_bytes`. 0, or
/// `TORCH_ARENA_ERR_CONFIG` (bad mode or `every` 0; nothing changes),
/// `TORCH_ARENA_ERR_INVALID_ARGUMENT` (NULL mode).
///
/// # Safety
/// `mode` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_set_sites(
    mode: *const c_char,
    every: u64,
    min_bytes: u64,
) -> c_int {
    status("torch_arena_set_sites", || {
        // SAFETY: the caller's contract.
        let text = unsafe { c_str(mode, "torch_arena_set_sites") }?;
        let m = crate::config::SitesMode::parse(text).ok_or_else(|| {
            Failure::new(
                TORCH_ARENA_ERR_CONFIG,
                format!(
                    "torch_arena_set_sites({text:?}, {every}, {min_bytes}): bad mode {text:?}: \
                     expected none, python, native or all"
                ),
            )
        })?;
        if every == 0 {
            return Err(Failure::new(
                TORCH_ARENA_ERR_CONFIG,
                format!(
                    "torch_arena_set_sites({text:?}, 0, {min_bytes}): every must be >= 1 (1 = \
                     every allocation)"
                ),
            ));
        }
        instance()?.tracker().set_sites(m, every, min_bytes);
        Ok(())
    })
}

/// Live allocations of `device` as JSON (schema in docs/tracking-abi.md), snprintf style: the full
/// length is returned; 0 = failure (last error set).
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_live_json(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: the caller's contract.
    unsafe {
        json_out("torch_arena_live_json", device, buf, cap, |i| {
            Ok(i.tracker().live_json(device))
        })
    }
}

/// Leak report of `device` as JSON: sites growing after `warmup` steps, and (with `age_steps`
/// > 0) live allocations at least that old. snprintf style; 0 = failure.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_leaks_json(
    device: c_int,
    warmup: u64,
    age_steps: u64,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: the caller's contract.
    unsafe {
        json_out("torch_arena_leaks_json", device, buf, cap, |i| {
            Ok(i.tracker().leaks_json(device, warmup, age_steps))
        })
    }
}

/// Segments and blocks of `device` as JSON (PyTorch snapshot schema). snprintf style; 0 =
/// failure.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_layout_json(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: the caller's contract.
    unsafe {
        json_out("torch_arena_layout_json", device, buf, cap, |i| {
            let layout = i.layout(device)?;
            Ok(crate::arena::layout::layout_json(device, &layout))
        })
    }
}

/// Start (`enabled` nonzero: the ring is cleared) or stop recording the history ring of at most
/// `max_entries` entries per device (0 = 100000). 0 or an error code.
#[unsafe(no_mangle)]
pub extern "C" fn torch_arena_history_enable(enabled: c_int, max_entries: u64) -> c_int {
    status("torch_arena_history_enable", || {
        instance()?
            .tracker()
            .history_enable(enabled != 0, max_entries);
        Ok(())
    })
}

/// The history ring of `device` as JSON, oldest first. snprintf style; 0 = failure.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn torch_arena_history_json(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: the caller's contract.
    unsafe {
        json_out("torch_arena_history_json", device, buf, cap, |i| {
            Ok(i.tracker().history_json(device))
        })
    }
}

// ---------------------------------------------------------------------------------------------
