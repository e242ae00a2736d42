//! `trace::fit`: the smallest capacity each allocator needs, on hand-built traces whose answer is
//! worked out by hand, and checked against replays at and just below it.

use crate::trace_replay::{S, trace};
use torch_arena::config::Config;
use torch_arena_lab::fit::{self, Allocator, STEP};
use torch_arena_lab::native::NativeOptions;
use torch_arena_lab::replay::Timing;

const MIB: u64 = 1 << 20;

fn native(conf: &str) -> Allocator {
    Allocator::Native {
        options: NativeOptions::with_conf(0, "--native-conf", conf).unwrap(),
        label: conf.into(),
    }
}

fn arena() -> Allocator {
    Allocator::Arena {
        conf: Config::default(),
        label: String::new(),
    }
}

/// 30 + 30 MiB, the first freed, then 40 MiB: native caches the freed 30 MiB segment, which the
/// 40 MiB request cannot use; on a device under 100 MiB its cudaMalloc fails, the cached segment
/// is released and the retry takes 30 + 40 = 70 MiB. So native needs exactly 70 MiB, and twice
/// that under a memory fraction of one half.
#[test]
fn native_needs_what_its_out_of_memory_path_can_reach() {
    let t = trace(&[
        S::A(1, 30 * MIB),
        S::A(2, 30 * MIB),
        S::F(1),
        S::A(3, 40 * MIB),
    ]);
    let timing = Timing::default();
    let f = fit::fit(&t, &native(""), &timing, &mut |_| {}).unwrap();
    assert_eq!((f.allocator, f.conf.as_str()), ("native", ""));
    assert_eq!(f.min_capacity, Some(70 * MIB));
    let at = f.at_min.unwrap();
    assert!(at.fits && at.capacity == 70 * MIB);
    // The last step released the cached segment and created two: 3 cudaMalloc, 1 cudaFree.
    assert_eq!(
        (at.last_step.calls.mem_alloc, at.last_step.calls.mem_free),
        (3, 1)
    );
    let half = native("per_process_memory_fraction:0.5");
    let f = fit::fit(&t, &half, &timing, &mut |_| {}).unwrap();
    assert_eq!(f.min_capacity, Some(140 * MIB));
}

/// What `fit` reports fits, and one page less does not (for a small trace the precision is one
/// page), for the arena and for native under a few settings.
#[test]
fn the_reported_minimum_fits_and_one_page_less_does_not() {
    let mut steps = Vec::new();
    for i in 0..40u64 {
        steps.push(S::A(i, (1 + i % 7) * 3 * MIB + i * 4096));
        if i % 3 == 2 {
            steps.push(S::F(i - 1));
        }
    }
    let t = trace(&steps);
    let timing = Timing {
        repeat: 3,
        ..Timing::default()
    };
    for a in [
        arena(),
        native(""),
        native("expandable_segments:True"),
        native("max_split_size_mb:20"),
    ] {
        let mut seen = 0;
        let f = fit::fit(&t, &a, &timing, &mut |n| seen = n).unwrap();
        let min = f.min_capacity.unwrap();
        assert_eq!(seen, f.trials);
        assert!(
            min >= t.peak_requested(),
            "{} {}: {min}",
            f.allocator,
            f.conf
        );
        assert!(fit::trial(&t, &a, min, &timing).unwrap().fits);
        assert!(
            !fit::trial(&t, &a, min - STEP, &timing).unwrap().fits,
            "{}",
            f.conf
        );
    }
}

#[test]
fn a_request_larger_than_any_device_never_fits() {
    let t = trace(&[S::A(1, 1 << 51)]);
    for a in [arena(), native("")] {
        let f = fit::fit(&t, &a, &Timing::default(), &mut |_| {}).unwrap();
        assert_eq!((f.min_capacity, f.at_min.is_none()), (None, true));
    }
}

/// What a step leaves live stays live in the next (`replay --repeat` repeats only what a pass
/// both allocates and frees): the peak requested a fit reports is over every step.
#[test]
fn the_requested_peak_is_over_every_step() {
    // Pass 1: 4 MiB then freed, then 10 MiB kept (peak 10 MiB). Pass 2 repeats the 4 MiB on top.
    let t = trace(&[S::A(2, 4 * MIB), S::F(2), S::A(1, 10 * MIB)]);
    assert_eq!(t.peak_requested(), 10 * MIB);
    let timing = Timing {
        repeat: 3,
        ..Timing::default()
    };
    let f = fit::fit(&t, &native(""), &timing, &mut |_| {}).unwrap();
    assert_eq!(f.at_min.unwrap().peak_requested, 14 * MIB);
    // The 4 MiB request takes a 20 MiB segment; the 10 MiB block and the next 4 MiB ones split
    // it: 20 MiB in all.
    assert_eq!(f.min_capacity, Some(20 * MIB));
}
