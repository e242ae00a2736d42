//! Replay through the arena, the native allocator's emulation, and the synthetic traces.

use crate::snapshots;
use torch_arena::config::Config;
use torch_arena_lab::native::{self, NativeOptions, allocation_size, round_size};
use torch_arena_lab::replay::{ReplayOptions, replay};
use torch_arena_lab::{Event, Kind, NativeReserved, Op, Source, Trace, synth};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Hand-built trace steps: `A(id, size)` / `F(id)` on stream 0, or `As(id, size, stream)`.
pub(crate) enum S {
    A(u64, u64),
    As(u64, u64, u64),
    F(u64),
}

pub(crate) fn trace(steps: &[S]) -> Trace {
    let mut sizes = std::collections::HashMap::new();
    let mut streams = std::collections::HashMap::new();
    let events = steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (op, id, size, stream) = match *s {
                S::A(id, size) => (Op::Alloc, id, size, 0),
                S::As(id, size, stream) => (Op::Alloc, id, size, stream),
                S::F(id) => (
                    Op::Free,
                    id,
                    sizes.get(&id).copied().unwrap_or(0),
                    streams.get(&id).copied().unwrap_or(0),
                ),
            };
            if op == Op::Alloc {
                sizes.insert(id, size);
                streams.insert(id, stream);
            }
            Event {
                op,
                id,
                size,
                stream,
                time_us: i as i64,
                site: (id % 3) as u32,
            }
        })
        .collect();
    Trace {
        name: "hand-built".into(),
        source: Source::Synthetic,
        kind: Kind::Fresh,
        device: 0,
        seeded: 0,
        events,
        sites: vec!["unknown".into(), "a.py:1 in f".into(), "b.py:2 in g".into()],
        native: None,
        steps: None,
    }
}

fn nat(t: &Trace, capacity: u64) -> native::NativeResult {
    native::simulate(t, &NativeOptions::new(capacity)).unwrap()
}

fn opts(capacity: u64, check: bool, backing: bool) -> ReplayOptions {
    ReplayOptions {
        capacity,
        conf: Config::default(),
        conf_label: String::new(),
        backing,
        check,
        consistency_every: 1,
        series_points: 50,
        timing: Default::default(),
    }
}

// ---- native emulation: one test per rule ------------------------------------------------------

/// Both allocators' growth, as the replay reports it, by what each request did to the bytes
/// requested: three 30 MiB blocks take them to a peak of 90 MiB; with the first and last freed,
/// a 40 MiB block (70 MiB requested) fits neither hole. Native gives it a segment of its own;
/// the arena maps the 10 MiB it lacks past the last hole. Both are growth below the peak.
#[test]
fn replay_counts_growth_below_the_peak_apart_for_both_allocators() {
    use S::*;
    let t = trace(&[
        A(1, 30 * MIB),
        A(2, 30 * MIB),
        A(3, 30 * MIB),
        F(1),
        F(3),
        A(4, 40 * MIB),
    ]);
    let growth = |handles, mib| torch_arena::arena::Growth {
        handles,
        bytes: mib * MIB,
    };
    let n = nat(&t, 80 * GIB);
    let g = n.growth.unwrap();
    assert_eq!((g.at_peak, g.below_peak), (growth(3, 90), growth(1, 40)));
    let r = replay(&t, &opts(80 * GIB, true, true), &mut |_, _| {}).unwrap();
    let g = r.growth.unwrap();
    assert_eq!((g.at_peak, g.below_peak), (growth(3, 90), growth(1, 10)));
    assert_eq!(r.steps.len(), 1);
    assert_eq!(r.steps[0].growth, r.growth);
    assert_eq!(r.calls.mem_create, 4);
}

#[test]
fn native_rounds_to_512_and_picks_segment_sizes() {
    assert_eq!(round_size(1), 512);
    assert_eq!(round_size(512), 512);
    assert_eq!(round_size(513), 1024);
    assert_eq!(allocation_size(512, 20 * MIB), 2 * MIB);
    assert_eq!(allocation_size(MIB, 20 * MIB), 2 * MIB);
    assert_eq!(allocation_size(MIB + 512, 20 * MIB), 20 * MIB);
    assert_eq!(allocation_size(10 * MIB - 512, 20 * MIB), 20 * MIB);
    assert_eq!(allocation_size(10 * MIB, 20 * MIB), 10 * MIB);
    assert_eq!(allocation_size(11 * MIB, 20 * MIB), 12 * MIB);
    // Allocated bytes are rounded: 1 byte takes 512.
    let r = nat(&trace(&[S::A(1, 1)]), GIB);
    assert_eq!(r.peak_allocated, 512);
}

#[test]
fn native_small_pool_uses_2mib_segments() {
    // Four 512 KiB tensors fit one 2 MiB segment; a fifth needs another.
    let steps: Vec<S> = (1..=4).map(|i| S::A(i, 512 << 10)).collect();
    assert_eq!(nat(&trace(&steps), GIB).peak_reserved, 2 * MIB);
    let steps: Vec<S> = (1..=5).map(|i| S::A(i, 512 << 10)).collect();
    assert_eq!(nat(&trace(&steps), GIB).peak_reserved, 4 * MIB);
}

#[test]
fn native_medium_requests_share_20mib_segments() {
    // 1–10 MiB: one 20 MiB segment, split; three 6 MiB tensors share it.
    let r = nat(
        &trace(&[S::A(1, 6 * MIB), S::A(2, 6 * MIB), S::A(3, 6 * MIB)]),
        GIB,
    );
    assert_eq!(r.peak_reserved, 20 * MIB);
    assert_eq!(r.segments_created, 1);
    // >= 10 MiB: rounded up to 2 MiB, a segment of its own.
    let r = nat(&trace(&[S::A(1, 11 * MIB)]), GIB);
    assert_eq!(r.peak_reserved, 12 * MIB);
}

#[test]
fn native_large_pool_splits_only_above_1mib_remainder() {
    // 19 MiB in a 20 MiB segment: remainder 1 MiB is not > 1 MiB, so the block is not split and
    // the whole segment counts as allocated; a second 1 MiB+ request needs a new segment.
    let r = nat(&trace(&[S::A(1, 19 * MIB), S::A(2, 2 * MIB)]), GIB);
    assert_eq!(r.peak_allocated, 20 * MIB + 2 * MIB);
    assert_eq!(r.peak_reserved, 40 * MIB);
    // A cached 12 MiB block: 10.5 MiB splits (remainder 1.5 MiB > 1 MiB) and the remainder serves
    // a 1.5 MiB request; 11 MiB does not split (remainder 1 MiB), so 1.5 MiB needs a new segment.
    let half = MIB / 2;
    let r = nat(
        &trace(&[
            S::A(1, 12 * MIB),
            S::F(1),
            S::A(2, 10 * MIB + half),
            S::A(3, MIB + half),
        ]),
        GIB,
    );
    assert_eq!(r.peak_reserved, 12 * MIB);
    let r = nat(
        &trace(&[
            S::A(1, 12 * MIB),
            S::F(1),
            S::A(2, 11 * MIB),
            S::A(3, MIB + half),
        ]),
        GIB,
    );
    assert_eq!(r.peak_reserved, 32 * MIB);
    assert_eq!(r.peak_allocated, 12 * MIB + MIB + half);
}

#[test]
fn native_small_pool_splits_512_byte_remainders() {
    // 2 MiB - 512 then 512 bytes: both in one small segment.
    let r = nat(
        &trace(&[S::A(1, MIB), S::A(2, MIB - 512), S::A(3, 512)]),
        GIB,
    );
    assert_eq!(r.peak_reserved, 2 * MIB);
    assert_eq!(r.peak_allocated, 2 * MIB);
}

#[test]
fn native_reuses_free_blocks_on_the_same_stream_only() {
    // Same stream: the freed block is reused, no new segment.
    let r = nat(
        &trace(&[S::A(1, 12 * MIB), S::F(1), S::A(2, 12 * MIB)]),
        GIB,
    );
    assert_eq!(r.peak_reserved, 12 * MIB);
    // Another stream: a second segment.
    let r = nat(
        &trace(&[S::A(1, 12 * MIB), S::F(1), S::As(2, 12 * MIB, 7)]),
        GIB,
    );
    assert_eq!(r.peak_reserved, 24 * MIB);
}

#[test]
fn native_merges_free_neighbours() {
    // Three 6 MiB blocks of one segment freed in any order merge back into one 20 MiB block, so a
    // 20 MiB... rather a 19 MiB request (large pool, 20 MiB alloc size) fits without a new segment.
    let r = nat(
        &trace(&[
            S::A(1, 6 * MIB),
            S::A(2, 6 * MIB),
            S::A(3, 6 * MIB),
            S::F(1),
            S::F(3),
            S::F(2),
            S::A(4, 19 * MIB),
        ]),
        GIB,
    );
    assert_eq!(r.peak_reserved, 20 * MIB);
    assert_eq!(r.oom_event, None);
}

#[test]
fn native_releases_unsplit_cached_segments_on_oom() {
    // 60 MiB device: a cached (free, unsplit) 40 MiB segment is released so 50 MiB fits.
    let t = trace(&[S::A(1, 40 * MIB), S::F(1), S::A(2, 50 * MIB)]);
    let r = nat(&t, 60 * MIB);
    assert_eq!(r.oom_event, None);
    assert_eq!(r.alloc_retries, 1);
    assert_eq!(r.segments_released, 1);
    assert_eq!(r.peak_reserved, 50 * MIB);
    assert_eq!(r.final_reserved, 50 * MIB);
}

#[test]
fn native_ooms_when_split_segments_block_release() {
    // 3 × 6 MiB in one 20 MiB segment; two freed but the middle one stays: the segment cannot be
    // released, and a 30 MiB request does not fit in the 40 MiB device.
    let t = trace(&[
        S::A(1, 6 * MIB),
        S::A(2, 6 * MIB),
        S::A(3, 6 * MIB),
        S::F(1),
        S::F(3),
        S::A(4, 30 * MIB),
    ]);
    let r = nat(&t, 40 * MIB);
    assert_eq!(r.oom_event, Some(5));
    assert_eq!(r.segments_released, 0);
}

#[test]
fn native_max_split_size_keeps_big_blocks_whole() {
    let mut o = NativeOptions::new(GIB);
    o.max_split_size = Some(40 * MIB);
    // A cached 64 MiB block is not used for an 8 MiB request (< max_split, block >= max_split).
    let t = trace(&[S::A(1, 64 * MIB), S::F(1), S::A(2, 8 * MIB)]);
    assert_eq!(native::simulate(&t, &o).unwrap().peak_reserved, 84 * MIB);
    // Nor for a 40 MiB one when it is 20 MiB or more bigger.
    let t = trace(&[S::A(1, 64 * MIB), S::F(1), S::A(2, 40 * MIB)]);
    assert_eq!(native::simulate(&t, &o).unwrap().peak_reserved, 104 * MIB);
    // An oversize cached segment is released first when the device is full.
    // (42 MiB: the 64 MiB block is 20 MiB or more bigger, so it is not reused.)
    o.capacity = 100 * MIB;
    let t = trace(&[S::A(1, 64 * MIB), S::F(1), S::A(2, 42 * MIB)]);
    let r = native::simulate(&t, &o).unwrap();
    assert_eq!(r.oom_event, None);
    assert_eq!(r.alloc_retries, 0, "released before the full flush");
    assert_eq!(r.segments_released, 1);
    assert_eq!(r.final_reserved, 42 * MIB);
}

#[test]
fn native_expandable_segments_grow_and_unmap() {
    let mut o = NativeOptions::new(GIB);
    o.expandable_segments = true;
    // 3 × 6 MiB: one 20 MiB chunk holds two, a second chunk the third.
    let t = trace(&[
        S::A(1, 6 * MIB),
        S::A(2, 6 * MIB),
        S::A(3, 6 * MIB),
        S::A(4, 6 * MIB),
    ]);
    let r = native::simulate(&t, &o).unwrap();
    assert_eq!(r.peak_reserved, 40 * MIB);
    // 12 × 6 MiB fill four chunks (80 MiB); ids 4..=12 freed: one free mapped block [18, 80) MiB.
    o.capacity = 80 * MIB;
    let mut steps: Vec<S> = (1..=12).map(|i| S::A(i, 6 * MIB)).collect();
    steps.extend((4..=12).map(S::F));
    // 50 MiB on the same stream fits in the merged free mapped space: nothing new is mapped.
    let mut same = trace(&steps);
    same.events.extend(trace(&[S::A(100, 50 * MIB)]).events);
    let r = native::simulate(&same, &o).unwrap();
    assert_eq!(
        (r.oom_event, r.peak_reserved, r.segments_released),
        (None, 80 * MIB, 0)
    );
    // 40 MiB on another stream: its own segment; the device is full, so the three fully free
    // chunks of stream 0 are unmapped and two are mapped for stream 7.
    steps.push(S::As(100, 40 * MIB, 7));
    let r = native::simulate(&trace(&steps), &o).unwrap();
    assert_eq!(r.oom_event, None, "{r:?}");
    assert_eq!(r.segments_released, 3);
    assert_eq!(r.final_reserved, 20 * MIB + 40 * MIB);
}

#[test]
fn native_recorded_series_follows_the_trace() {
    let mut t = trace(&[S::A(1, MIB), S::A(2, MIB), S::F(1), S::F(2)]);
    assert!(native::recorded_series(&t, 10).is_none());
    t.native = Some(NativeReserved {
        initial: 0,
        changes: vec![(0, 2 * MIB), (3, 0)],
        peak: 2 * MIB,
        ..Default::default()
    });
    let s = native::recorded_series(&t, 10).unwrap();
    assert_eq!(s.len(), 4);
    assert_eq!(s[0].reserved, 2 * MIB);
    assert_eq!(s[1].requested, 2 * MIB);
    assert_eq!(s[3].reserved, 0);
    // At most `points` points, the peak kept.
    let s = native::recorded_series(&t, 2).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].requested, 2 * MIB);
}

// ---- replay through the arena -----------------------------------------------------------------

#[test]
fn replay_hand_built_trace_with_check_and_backing() {
    let mut steps = Vec::new();
    for i in 1..=40u64 {
        steps.push(S::A(i, (i * 37_001) % (3 * MIB) + 1));
        if i % 3 == 0 {
            steps.push(S::F(i - 1));
        }
    }
    steps.push(S::A(200, 0)); // size 0: NULL, no arena call
    steps.push(S::F(999)); // never allocated: counted and skipped
    steps.push(S::As(300, 5 * MIB, 7));
    steps.push(S::F(300));
    let t = trace(&steps);
    let r = replay(&t, &opts(512 * MIB, true, true), &mut |_, _| {}).unwrap();
    assert!(r.oom.is_none());
    assert_eq!(r.unmatched_frees, 1);
    assert_eq!(r.peak_requested, t.peak_requested());
    assert!(r.peak_reserved >= r.peak_requested);
    assert!(r.driver_calls > 0);
    assert!(!r.series.is_empty() && r.series.len() <= 50);
    let max_req = r.series.iter().map(|p| p.requested).max().unwrap();
    assert_eq!(max_req, r.peak_requested, "the series keeps the peak");
    let max_res = r.series.iter().map(|p| p.reserved).max().unwrap();
    assert_eq!(max_res, r.peak_reserved);
    assert!(
        (r.fragmentation - (r.peak_reserved as f64 / r.peak_requested as f64 - 1.0)).abs() < 1e-12
    );
}

#[test]
fn replay_reports_progress_and_exact_peaks() {
    // 200 × 1 MiB live at once, then all freed: exact peak, progress reaches the end.
    let mut steps: Vec<S> = (1..=200).map(|i| S::A(i, MIB)).collect();
    steps.extend((1..=200).map(S::F));
    let t = trace(&steps);
    let mut calls = Vec::new();
    let r = replay(&t, &opts(GIB, true, false), &mut |d, n| calls.push((d, n))).unwrap();
    assert_eq!(r.peak_requested, 200 * MIB);
    assert_eq!(r.events, 400);
    assert_eq!(r.live_at_end, 0);
    assert!(calls.len() >= 100);
    assert_eq!(*calls.last().unwrap(), (400, 400));
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0));
}

#[test]
fn replay_oom_report_names_what_is_live() {
    // 64 MiB device: 3 × 16 MiB live (sites 1, 2, 0), then 40 MiB cannot fit.
    let t = trace(&[
        S::A(1, 16 * MIB),
        S::A(2, 16 * MIB),
        S::A(3, 16 * MIB),
        S::A(4, 40 * MIB),
    ]);
    let r = replay(&t, &opts(64 * MIB, true, false), &mut |_, _| {}).unwrap();
    let oom = r.oom.expect("40 MiB does not fit next to 48 MiB in 64 MiB");
    assert_eq!(oom.event, 3);
    assert_eq!(oom.size, 40 * MIB);
    assert_eq!(oom.stream, 0);
    assert_eq!(oom.live_bytes, 48 * MIB);
    assert_eq!(oom.live_count, 3);
    assert!(oom.reserved >= 48 * MIB && oom.reserved <= 64 * MIB);
    assert!(
        oom.message
            .starts_with("CUDA out of memory. Tried to allocate"),
        "{}",
        oom.message
    );
    assert_eq!(oom.largest_live.len(), 3);
    let mut sites: Vec<&str> = oom.largest_live.iter().map(|(_, s)| s.as_str()).collect();
    sites.sort();
    assert_eq!(sites, ["a.py:1 in f", "b.py:2 in g", "unknown"]);
    assert!(oom.largest_live.iter().all(|(s, _)| *s == 16 * MIB));
}

/// The report's "cached" is the message's: idle and pooled pages, not every reserved byte that is
/// not allocated. Blocks a little over 16 MiB leave most of a page free in each partially used
/// page; the report once called that "cached: 1.99 MiB" where the message said "0 bytes cached".
#[test]
fn replay_oom_report_counts_cached_as_the_message_does() {
    use torch_arena::stats::summary::format_size;
    let big = 16 * MIB + 4096;
    let t = trace(&[S::A(1, big), S::A(2, big), S::A(3, big), S::A(4, 40 * MIB)]);
    let r = replay(&t, &opts(64 * MIB, true, false), &mut |_, _| {}).unwrap();
    let oom = r
        .oom
        .expect("40 MiB does not fit next to 3 × 16 MiB in 64 MiB");
    assert!(oom.reserved > 3 * big, "{oom:?}");
    let said = format!("{} cached (", format_size(oom.cached));
    assert!(
        oom.message.contains(&said),
        "{said:?} not in {}",
        oom.message
    );
}

#[test]
fn replay_keeps_the_five_largest_live() {
    let steps: Vec<S> = (1..=9)
        .map(|i| S::A(i, i * MIB))
        .chain([S::A(10, 1 << 40)])
        .collect();
    let r = replay(
        &trace(&steps),
        &opts(256 * MIB, false, false),
        &mut |_, _| {},
    )
    .unwrap();
    let oom = r.oom.unwrap();
    let sizes: Vec<u64> = oom.largest_live.iter().map(|l| l.0).collect();
    assert_eq!(sizes, [9 * MIB, 8 * MIB, 7 * MIB, 6 * MIB, 5 * MIB]);
}

// ---- synthetic traces -------------------------------------------------------------------------

fn frees_everything(t: &Trace) {
    let mut live = std::collections::HashSet::new();
    for e in &t.events {
        match e.op {
            Op::Alloc => assert!(live.insert(e.id), "id {} allocated twice", e.id),
            Op::Free => assert!(live.remove(&e.id), "id {} freed but not live", e.id),
        }
    }
    assert!(live.is_empty(), "{} allocations never freed", live.len());
}

#[test]
fn adversarial_trace_ooms_native_but_fits_the_arena() {
    for capacity in [GIB, 8 * GIB] {
        let t = synth::adversarial(capacity);
        frees_everything(&t);
        let n = nat(&t, capacity);
        assert!(n.oom_event.is_some(), "native fits at {capacity}: {n:?}");
        let r = replay(&t, &opts(capacity, capacity <= GIB, false), &mut |_, _| {}).unwrap();
        assert!(r.oom.is_none(), "arena OOM at {capacity}: {:?}", r.oom);
        assert!(r.peak_reserved <= capacity);
        // Native with the same trace on an unlimited device needs more than the capacity.
        let big = nat(&t, 4 * capacity);
        assert!(big.oom_event.is_none() && big.peak_reserved > capacity);
    }
}

#[test]
fn rmm_random_is_deterministic_and_frees_everything() {
    let a = synth::rmm_random(1000, MIB, 42);
    let b = synth::rmm_random(1000, MIB, 42);
    let c = synth::rmm_random(1000, MIB, 43);
    assert_eq!(a.events, b.events);
    assert_ne!(a.events, c.events);
    frees_everything(&a);
    let allocs = a.events.iter().filter(|e| e.op == Op::Alloc).count();
    assert!(allocs > 500 && allocs <= 1000, "{allocs}");
    assert!(a.events.iter().all(|e| e.size >= 1 && e.size <= MIB));
    // 2n steps: about 73 % allocate.
    let r = replay(&a, &opts(512 * MIB, true, true), &mut |_, _| {}).unwrap();
    assert!(r.oom.is_none());
    assert_eq!(r.live_at_end, 0);
}

/// Release-mode throughput figure (not an assertion): `cargo test --release --test library trace_replay::
/// replay_speed -- --ignored --nocapture`.
#[test]
#[ignore]
fn replay_speed() {
    let t = synth::rmm_random(100_000, 4 * MIB, 1);
    let r = replay(&t, &opts(80 * GIB, false, false), &mut |_, _| {}).unwrap();
    let secs = r.elapsed.as_secs_f64();
    println!(
        "arena replay: {} events in {:.3} s = {:.0} events/s (peak req {} MiB, reserved {} MiB)",
        r.events,
        secs,
        r.events as f64 / secs,
        r.peak_requested >> 20,
        r.peak_reserved >> 20
    );
    // `check` + `backing` on a ~30k-event trace (up to ~7k live allocations).
    let small = synth::rmm_random(15_000, 64 << 10, 2);
    let r = replay(&small, &opts(512 * MIB, true, true), &mut |_, _| {}).unwrap();
    println!(
        "checked replay (check + backing): {} events in {:.3} s",
        r.events,
        r.elapsed.as_secs_f64()
    );
    let start = std::time::Instant::now();
    let n = nat(&t, 80 * GIB);
    let secs = start.elapsed().as_secs_f64();
    println!(
        "native emulation: {:.0} events/s (peak reserved {} MiB)",
        t.events.len() as f64 / secs,
        n.peak_reserved >> 20
    );
}

// ---- real traces (traces/snapshots) ------------------------------------------------------------

/// At the limit a large block goes where its pages are already mapped whenever one of the 128
/// best fits by size has them (`LIMIT_PLACEMENT_CANDIDATES`), rather than into a tighter fit
/// whose pages must be moved there: Wedsonlin `medium_1024_inference` at its smallest device
/// (2,754 MiB, five steps, GPU lag 0) makes 365 memory calls in its fifth step, against 1,493
/// when only the 8 best fits were weighed.
#[test]
fn at_the_limit_a_block_goes_where_its_pages_are_mapped() {
    let file =
        "Wedsonlin__assignment2-systems__8630bcf__medium_1024_inference_memory_snapshot.pickle.gz";
    let t = torch_arena_lab::load(&snapshots::traces_dir().join(file)).expect(file);
    // The consistency check every 100 events (after every one: minutes in a debug build).
    let o = ReplayOptions {
        consistency_every: 100,
        ..timed(2754 * MIB, 5, 0)
    };
    let r = replay(&t, &o, &mut |_, _| {}).unwrap();
    assert!(r.oom.is_none(), "{:?}", r.oom);
    let calls = r.steps[4].calls.memory_calls();
    assert!(calls <= 600, "fifth step: {calls} memory calls");
}

/// The 9 "fresh" PyTorch snapshots of `traces/snapshots`: the emulated native peak reserved should
/// be close to the one each trace recorded.
#[test]
fn native_emulation_matches_fresh_snapshots() {
    let dir = snapshots::traces_dir();
    let index = std::fs::read_to_string(dir.join("index.csv")).expect("index.csv");
    let mut checked = 0;
    for line in index.lines().skip(1) {
        let file = line.split(',').next().unwrap();
        if !line.contains(",\"fresh") && !line.contains(",fresh") {
            continue;
        }
        let t = torch_arena_lab::load(&dir.join(file)).expect(file);
        let recorded = t
            .native
            .as_ref()
            .map(|n| n.peak)
            .expect("fresh traces record segments");
        let r = nat(&t, 80 * GIB);
        let ratio = r.peak_reserved as f64 / recorded as f64;
        println!(
            "{file}: native recorded {} MiB, emulated {} MiB, ratio {ratio:.3}",
            recorded >> 20,
            r.peak_reserved >> 20
        );
        assert!((0.98..=1.02).contains(&ratio), "{file}: ratio {ratio}");
        checked += 1;
    }
    assert_eq!(checked, 9);
}

/// Snapshots of torch ≥ 2.5 say which settings the native allocator ran with; the four traces
/// recorded with `expandable_segments:True` import with it, and emulating them under it lands
/// within 1 % of what they recorded (under the default rules it was up to 10 % off).
#[test]
fn native_settings_come_from_the_snapshot() {
    let dir = snapshots::traces_dir();
    let mut checked = 0;
    for f in snapshots::indexed_files(&dir) {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("bolongcheng__") {
            continue;
        }
        let t = torch_arena_lab::load(&f).expect(&name);
        let n = t.native.as_ref().expect("snapshots record native reserved");
        assert!(
            n.expandable_segments,
            "{name}: recorded with expandable_segments:True"
        );
        assert_eq!(
            n.max_split_size, None,
            "{name}: max_split_size -1 is unlimited"
        );
        assert_eq!(
            n.conf.as_deref(),
            Some("expandable_segments:True"),
            "{name}"
        );
        // The recorded text gives the same settings as the recorded fields.
        let opts =
            NativeOptions::with_conf(80 * GIB, "recorded", n.conf.as_deref().unwrap()).unwrap();
        assert_eq!(
            opts,
            NativeOptions {
                expandable_segments: true,
                ..NativeOptions::new(80 * GIB)
            }
        );
        let r = native::simulate(&t, &opts).unwrap();
        let ratio = r.peak_reserved as f64 / n.peak as f64;
        println!(
            "{name}: recorded {} MiB, emulated {} MiB",
            n.peak >> 20,
            r.peak_reserved >> 20
        );
        assert!((0.99..=1.01).contains(&ratio), "{name}: ratio {ratio}");
        checked += 1;
    }
    assert_eq!(checked, 4);
}

// ---- the lab's timing model: driver costs, steps, GPU lag ---------------------------------------

use torch_arena::arena::Arena;
use torch_arena::device::costs::DriverCosts;
use torch_arena::device::sim::{SimConfig, SimDevice};
use torch_arena::device::{Device, DriverCounters};
use torch_arena_lab::replay::{Checked, SimArena, Timing, run};

fn timed(capacity: u64, repeat: u32, lag_ns: u64) -> ReplayOptions {
    ReplayOptions {
        timing: Timing {
            repeat,
            gpu_lag_ns: lag_ns,
            ..Timing::default()
        },
        ..opts(capacity, true, false)
    }
}

/// Whether `c` has calls only of the kinds the hand count in
/// `counts_by_kind_are_the_devices_counters_and_priced_by_the_table` prices.
fn only_hand_priced_kinds(c: &DriverCounters) -> bool {
    c.address_free
        + c.mem_alloc
        + c.mem_free
        + c.event_destroy
        + c.event_synchronize
        + c.stream_synchronize
        + c.device_synchronize
        + c.mem_get_info
        == 0
}

/// A step of a training loop: weights stay, activations come and go on stream 0.
fn training_step() -> Trace {
    let mut steps = vec![S::A(1, 300 * MIB), S::A(2, 3 * MIB)];
    for i in 0..6 {
        steps.push(S::A(10 + i, (40 + 7 * i) * MIB));
        steps.push(S::A(20 + i, 100 << 10));
    }
    for i in 0..6 {
        steps.push(S::F(10 + i));
        steps.push(S::F(20 + i));
    }
    trace(&steps)
}

#[test]
fn counts_by_kind_are_the_devices_counters_and_priced_by_the_table() {
    let t = training_step();
    let o = timed(GIB, 2, 0);
    let p = Checked::new(SimArena::new(&o, &t).unwrap(), &o, &t);
    let before = p.inner().device().counters();
    let r = run(&t, &p, &o.timing, 0, &mut |_, _| {}).unwrap();
    let dev = p.inner().device().counters().since(&before);
    assert_eq!(r.calls, dev);
    assert_eq!(r.driver_calls, dev.total());
    assert!(dev.mem_create > 0 && dev.mem_map > 0, "{dev:?}");
    // The steps add up to the whole run, kind by kind.
    let mut sum = DriverCounters::default();
    for s in &r.steps {
        sum.add(&s.calls);
    }
    assert_eq!(sum, r.calls);
    // Modelled time is Σ count × latency (grants per handle) plus the per-GiB terms, under the
    // defaults (measured on an H200) and under an override.
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let by_hand = |c: &DriverCounters, create_us: f64| {
        (c.address_reserve as f64 * 3.25
            + c.mem_create as f64 * create_us
            + gib(c.mem_create_bytes) * 27.5
            + c.mem_map as f64 * 3.1
            + c.set_access_handles.max(c.set_access) as f64 * 33.04
            + c.mem_unmap as f64 * 18.21
            + c.mem_release as f64 * 11.2
            + gib(c.mem_release_bytes) * 375.5
            + c.event_create as f64 * 1.03
            + c.event_record as f64 * 1.53
            + c.event_query as f64 * 0.62)
            / 1e6
    };
    assert!(only_hand_priced_kinds(&r.calls), "{:?}", r.calls);
    assert!((r.modelled_driver_s - by_hand(&r.calls, 13.54)).abs() < 1e-9);
    let mut o2 = o.clone();
    o2.timing.costs = DriverCosts::parse("cuMemCreate = 7.6\n", "test").unwrap();
    let r2 = replay(&t, &o2, &mut |_, _| {}).unwrap();
    assert_eq!(r2.calls, r.calls);
    assert!((r2.modelled_driver_s - by_hand(&r2.calls, 7.6)).abs() < 1e-9);
    assert!(r2.modelled_driver_s < r.modelled_driver_s);
}

#[test]
fn repeat_replays_the_freed_part_as_steps_with_equal_peaks() {
    let t = training_step();
    let r = replay(&t, &timed(GIB, 3, 0), &mut |_, _| {}).unwrap();
    assert_eq!(r.steps.len(), 3);
    let req: Vec<u64> = r.steps.iter().map(|s| s.peak_requested).collect();
    assert_eq!(req, [req[0]; 3], "{req:?}");
    assert_eq!(req[0], t.peak_requested());
    // What stays live (the weights) is allocated once: a warm step needs no new memory.
    assert_eq!(r.steps[1].peak_reserved, r.steps[2].peak_reserved);
    assert_eq!(r.steps[2].calls.memory_calls(), 0, "{:?}", r.steps[2]);
    assert_eq!(r.events, t.events.len() + 2 * (t.events.len() - 2));
    assert_eq!(r.live_at_end, 2);
    // The native emulation runs through the same loop, with the same steps.
    let n = native::simulate_timed(
        &t,
        &NativeOptions::new(GIB),
        &timed(GIB, 3, 0).timing,
        &mut |_, _| {},
    )
    .unwrap();
    let nreq: Vec<u64> = n.steps.iter().map(|s| s.peak_requested).collect();
    assert_eq!(nreq, req);
    assert_eq!(n.steps[2].calls.total(), 0);
}

/// The emulator's driver calls on a hand-made trace, counted by hand.
#[test]
fn native_call_counts_match_a_hand_count() {
    // Without expandable segments: a small segment, a 20 MiB segment, a 30 MiB segment; at
    // 60 MiB the next 30 MiB does not fit, the OOM path frees the two unsplit cached segments
    // (cudaFree × 2, one release episode) and retries.
    let t = trace(&[
        S::A(1, 4096),
        S::A(2, 5 * MIB),
        S::A(3, 30 * MIB),
        S::F(2),
        S::F(3),
        S::A(4, 36 * MIB),
    ]);
    let timing = Timing {
        gpu_lag_ns: 1_000_000,
        ..Timing::default()
    };
    let r =
        native::simulate_timed(&t, &NativeOptions::new(60 * MIB), &timing, &mut |_, _| {}).unwrap();
    let c = r.calls;
    assert_eq!((c.mem_alloc, c.mem_free), (4, 2), "{c:?}");
    // Segments of 2, 20, 30 and 36 MiB; the 20 and 30 MiB ones freed.
    assert_eq!((c.mem_alloc_bytes, c.mem_free_bytes), (88 * MIB, 50 * MIB));
    assert_eq!(c.total(), 6);
    assert_eq!(
        r.modelled_stall_s, 0.001,
        "one release episode waits one lag"
    );
    let want = 4.0 * 39.91 + 2.0 * 34.77 + (88.0 / 1024.0) * 55.4 + (50.0 / 1024.0) * 358.7;
    assert!((r.modelled_driver_s - want / 1e6).abs() < 1e-12);
    // Expandable segments: the large pool grows by 20 MiB handles, one cuMemSetAccess per
    // growth, one reservation per (stream, pool); an OOM unmaps after a stream synchronisation.
    let t = trace(&[S::A(1, 30 * MIB), S::A(2, 4096), S::F(1), S::A(3, 50 * MIB)]);
    let o = NativeOptions {
        expandable_segments: true,
        ..NativeOptions::new(100 * MIB)
    };
    let r = native::simulate(&t, &o).unwrap();
    let c = r.calls;
    // 30 MiB → 2 handles of 20 MiB (one map call); 4 KiB → one 2 MiB small handle; 50 MiB
    // reuses the 40 MiB mapped and maps 1 more 20 MiB handle.
    assert_eq!(c.address_reserve, 2, "{c:?}");
    assert_eq!(c.mem_create, 2 + 1 + 1, "{c:?}");
    assert_eq!(c.mem_map, c.mem_create);
    assert_eq!(c.set_access, 3);
    assert_eq!(c.set_access_handles, 4);
    assert_eq!(c.mem_create_bytes, (2 * 20 + 2 + 20) * MIB);
    assert_eq!(
        (c.mem_unmap, c.mem_release, c.stream_synchronize),
        (0, 0, 0)
    );
}

/// With a GPU lag, a page freed on one stream and needed at once on another is not taken
/// before the lag: the arena grows or waits (a stall), and the check sees no early reuse.
#[test]
fn gpu_lag_delays_cross_stream_reuse() {
    let t = trace(&[
        S::As(1, 600 * MIB, 1),
        S::F(1),
        S::As(2, 600 * MIB, 2),
        S::F(2),
    ]);
    // Lag 0: the page moves to stream 2 at once.
    let r0 = replay(&t, &timed(GIB, 1, 0), &mut |_, _| {}).unwrap();
    assert_eq!(r0.peak_reserved, 600 * MIB);
    assert_eq!(r0.modelled_stall_s, 0.0);
    // 5 ms lag, room for both: it grows instead of waiting.
    let r = replay(&t, &timed(2 * GIB, 1, 5_000_000), &mut |_, _| {}).unwrap();
    assert!(r.peak_reserved >= 1200 * MIB, "{}", r.peak_reserved);
    assert_eq!(r.modelled_stall_s, 0.0);
    // 5 ms lag, no room for both: it takes what is free, then waits for stream 1's work (about
    // the lag less the event times) to take the rest from stream 1.
    let r = replay(&t, &timed(GIB, 1, 5_000_000), &mut |_, _| {}).unwrap();
    assert!(r.oom.is_none());
    assert!(r.peak_reserved <= GIB);
    assert!(
        (0.004..=0.005).contains(&r.modelled_stall_s),
        "{}",
        r.modelled_stall_s
    );
    let waits = r.calls.device_synchronize + r.calls.stream_synchronize + r.calls.event_synchronize;
    assert!(waits > 0, "{:?}", r.calls);
}

/// `--gpu-lag 0` (the default timing) replays exactly as a plain loop of malloc and free over
/// the arena does, on every real trace.
#[test]
fn zero_lag_is_the_plain_replay_on_every_real_trace() {
    let dir = snapshots::traces_dir();
    let mut checked = 0;
    for f in snapshots::indexed_files(&dir) {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let t = torch_arena_lab::load(&f).expect(&name);
        let capacity = 80 * GIB;
        let o = ReplayOptions {
            series_points: 0,
            ..opts(capacity, false, false)
        };
        let r = replay(&t, &o, &mut |_, _| {}).unwrap();
        // The plain loop, as the replayer was before the timing model.
        let sim =
            std::sync::Arc::new(SimDevice::new(SimConfig::new(capacity, 2 * MIB, false)).unwrap());
        let arena = Arena::new(sim.clone(), &Config::default()).unwrap();
        let before = sim.counters();
        let mut live = std::collections::HashMap::new();
        let mut oom = None;
        for (i, e) in t.events.iter().enumerate() {
            match e.op {
                Op::Alloc if e.size == 0 => {}
                Op::Alloc => match arena.malloc(e.size, e.stream) {
                    Ok(p) => {
                        live.insert(e.id, (p, e.size));
                    }
                    Err(_) => {
                        oom = Some(i);
                        break;
                    }
                },
                Op::Free => {
                    if let Some((p, s)) = live.remove(&e.id) {
                        arena.free(p, Some(s), e.stream).unwrap();
                    }
                }
            }
        }
        let peak = arena.stats().reserved_bytes.all().peak as u64;
        assert_eq!(r.peak_reserved, peak, "{name}");
        assert_eq!(
            r.driver_calls,
            sim.counters().since(&before).total(),
            "{name}"
        );
        assert_eq!(r.oom.map(|o| o.event), oom, "{name}");
        assert_eq!(r.modelled_stall_s, 0.0, "{name}");
        checked += 1;
    }
    assert!(checked >= 100, "{checked} traces");
}

/// A replay error names the event (and, after the first pass, the step) it happened at.
#[test]
fn replay_errors_name_the_event() {
    let t = trace(&[S::A(1, MIB), S::A(2, MIB), S::A(1, MIB)]);
    let e = replay(&t, &opts(GIB, false, false), &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("event 2 allocates id 1 again"), "{e}");
    let e = native::simulate(&t, &NativeOptions::new(GIB))
        .unwrap_err()
        .to_string();
    assert!(e.contains("event 2"), "{e}");
}

/// The steps workload of the GPU suite (`tests/gpu/workloads.py`): 20 training steps at one
/// sequence length, then 20 that cycle through four. Its runs on an H200, recorded by
/// torch-arena (`bench/traces/`, see BENCHMARKS.md, "On a GPU"), each under the library of its
/// day. The workload's requests come in one order run after run (runs 2 and 3 recorded the same
/// sequence of sizes, allocations and frees), but its code moved one training step into a
/// function between runs 1 and 2 (28320b6): `logits` then died at the function's return, not at
/// the next step's assignment, and 37,366 of the 52,095 events changed places.
struct GpuRun {
    trace: &'static str,
    /// The memory driver calls the H200 counted under torch-arena in each of the 40 steps
    /// (`results.steps.arena.steps[i].calls` of the run's results file), as (step, calls);
    /// every other step made none.
    gpu: &'static [(usize, u64)],
}

/// 2026-11-26, library a40ef95 (`bench/results/gpu-check-2026-11-26-H200-4.json`).
const RUN_1: GpuRun = GpuRun {
    trace: "steps-h200-arena.trace.gz",
    gpu: &[(1, 171), (2, 72), (3, 3), (25, 6), (37, 3)],
};
/// 2026-11-27, library 0a1884e (`bench/results/gpu-check-2026-11-27-H200-1.json`).
const RUN_2: GpuRun = GpuRun {
    trace: "steps-h200-arena-2.trace.gz",
    gpu: &[(1, 171), (2, 69), (7, 3), (25, 3), (29, 3), (33, 3)],
};
/// 2026-11-27, the library with the layout spare and `DISSOLVE_EMPTY_SPAN`
/// (`bench/results/gpu-check-2026-11-27-H200-2.json`), the requests of run 2. PyTorch's
/// allocator grew in step 33 of this run (and of run 2) too, and both reserved 4,846,518,272
/// bytes at the end.
const RUN_3: GpuRun = GpuRun {
    trace: "steps-h200-arena-2.trace.gz",
    gpu: &[(1, 171), (2, 69), (33, 3)],
};

/// Calls per step as a run lists them: `[i]` is step `i`, `[0]` building the model.
fn per_step(calls: &[(usize, u64)]) -> [u64; 41] {
    let mut out = [0; 41];
    for &(step, n) in calls {
        out[step] = n;
    }
    out
}

/// A trace the project keeps in `bench/traces/`.
fn bench_trace(name: &str) -> Trace {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("bench/traces")
        .join(name);
    torch_arena_lab::load(&path).unwrap()
}

/// The events of a recording of the steps workload where its 40 training steps start: each
/// draws its batch of token ids, an int64 tensor of 8 × (length + 1), 32,832 bytes at length
/// 512, 24,640 at 384, 16,448 at 256 and 28,736 at 448. No other request of the run has those
/// sizes. Event `i` belongs to step `starts.partition_point(|&s| s <= i)` (0: before the first).
fn step_starts(t: &Trace) -> Vec<usize> {
    const BATCH_BYTES: [u64; 4] = [32_832, 24_640, 16_448, 28_736];
    let starts: Vec<usize> = (0..t.events.len())
        .filter(|&i| t.events[i].op == Op::Alloc && BATCH_BYTES.contains(&t.events[i].size))
        .collect();
    assert_eq!(starts.len(), 40, "40 steps");
    starts
}

/// A recording driven through the arena on the simulated device, event by event, as the GPU
/// suite drove the GPU: the memory driver calls made in each step (`[0]`: building the model,
/// which the suite does not count) and the bytes reserved at the end.
fn lab_calls_per_step(t: &Trace) -> ([u64; 41], u64) {
    use torch_arena::arena::Arena;
    use torch_arena::device::Device;
    use torch_arena::device::sim::{SimConfig, SimDevice};

    let starts = step_starts(t);
    let dev =
        std::sync::Arc::new(SimDevice::new(SimConfig::new(80 * GIB, 2 * MIB, false)).unwrap());
    let arena = Arena::new(dev.clone(), &Config::default()).unwrap();
    let mut live = std::collections::HashMap::new();
    let mut calls = [0u64; 41];
    let mut before = 0;
    for (i, e) in t.events.iter().enumerate() {
        match e.op {
            Op::Alloc => {
                live.insert(e.id, arena.malloc(e.size, e.stream).unwrap());
            }
            Op::Free => {
                let ptr = live
                    .remove(&e.id)
                    .expect("the recording frees what it allocated");
                arena.free(ptr, Some(e.size), e.stream).unwrap();
            }
        }
        let now = dev.counters().memory_calls();
        calls[starts.partition_point(|&s| s <= i)] += now - before;
        before = now;
    }
    let reserved = arena.stats().reserved_bytes.all().current as u64;
    (calls, reserved)
}

/// The lab against the GPU, step by step, on the last run the H200 made (run 3). Under the
/// library it ran, the lab made exactly the calls the H200 counted, in the same steps, and ended
/// with the bytes the H200 reserved (BENCHMARKS.md, "GPU runs of 2026-11-27"). Under this one:
/// - blocks climbing to a new peak grow ahead while the growth costs more than native's would
///   (`ahead_spare`): warm-up takes fewer handles;
/// - requests of 64 KiB to 1 MiB take 512-byte blocks of the page heap instead of slabs
///   (`slab_max_kb:64`, for bytes at the limit): warm-up takes fewer handles again (165 and 57
///   calls against the H200's 171 and 69), but the 128 MiB blocks of steps 3, 25 and 37 find
///   their free range cut by those blocks and each takes a handle (3 calls), where the H200 grew
///   once, in step 33 (a cycle pass in which PyTorch's own allocator grew as well).
///
/// In all, fewer calls than the H200 counted; the run ends with 10 MiB (0.2 %) more reserved
/// than the H200, on an 80 GiB device where nothing is short. At the limit the two settings fit
/// this trace within 10 MiB of each other (`torch-arena fit`).
#[test]
fn the_lab_replays_the_last_gpu_run_with_fewer_calls_and_the_gpus_bytes() {
    let (calls, reserved) = lab_calls_per_step(&bench_trace(RUN_3.trace));
    assert_eq!(calls[0], 62, "the model: two reservations and 20 handles");
    assert_eq!(
        calls[1..],
        per_step(&[(1, 165), (2, 57), (3, 3), (25, 3), (37, 3)])[1..]
    );
    let gpu = per_step(RUN_3.gpu);
    assert!(calls[1] + calls[2] < gpu[1] + gpu[2], "warm-up");
    assert!(calls[1..].iter().sum::<u64>() < gpu[1..].iter().sum::<u64>());
    assert_eq!(reserved, 4_857_004_032, "the H200 reserved 4,846,518,272");
}

/// The runs made under older libraries, replayed under this one: warm-up (steps 1 and 2) with
/// fewer calls than the H200's (blocks climbing to the peak grow ahead, and requests of 64 KiB to
/// 1 MiB take the page heap), and after it one handle in steps 3, 25 and 37 (the 128 MiB blocks
/// whose free range those blocks cut; see the test above), fewer calls in all than the GPU
/// counted. Run 1's GPU grew in those same steps, with as many calls or more.
#[test]
fn the_older_gpu_runs_grow_after_warm_up_less_than_the_gpu_did() {
    for (run, expected) in [
        (RUN_1, per_step(&[(1, 165), (2, 57), (3, 3), (25, 3)])),
        (
            RUN_2,
            per_step(&[(1, 165), (2, 57), (3, 3), (25, 3), (37, 3)]),
        ),
    ] {
        let (calls, _) = lab_calls_per_step(&bench_trace(run.trace));
        assert_eq!(calls[1..], expected[1..], "{}", run.trace);
        let gpu = per_step(run.gpu);
        assert!(
            calls[1..].iter().sum::<u64>() < gpu[1..].iter().sum::<u64>(),
            "{}: fewer calls than the GPU counted",
            run.trace
        );
    }
    // Run 1 grew in steps 3, 25 and 37 on the GPU too: there the lab makes no more calls than
    // the GPU did in any step.
    let (calls, _) = lab_calls_per_step(&bench_trace(RUN_1.trace));
    let gpu = per_step(RUN_1.gpu);
    assert!((1..=40).all(|s| calls[s] <= gpu[s]));
}

/// The first run replayed as a trace, twice: two reservations and 96 handles created, mapped
/// and granted (the H200 counted 105 under a40ef95, see above), none unmapped; the second pass
/// of the 40 steps makes no call.
#[test]
fn the_trace_recorded_on_a_gpu_replays_with_a_quiet_second_pass() {
    let t = bench_trace(RUN_1.trace);
    let mut o = timed(80 * GIB, 2, 0);
    o.consistency_every = 10_000; // the stats after every event, the full walk now and then
    let r = replay(&t, &o, &mut |_, _| {}).unwrap();
    let first = r.steps[0].calls;
    assert_eq!(
        (
            first.address_reserve,
            first.mem_create,
            first.mem_map,
            first.set_access
        ),
        (2, 96, 96, 96),
        "{first:?}"
    );
    assert_eq!(first.set_access_handles, 96);
    assert_eq!(first.mem_unmap + first.mem_release, 0);
    assert_eq!(r.steps[1].calls.memory_calls(), 0, "{:?}", r.steps[1]);
}

/// `t` with the order of its events perturbed, as a change in a training script's code moves its
/// frees (see [`GpuRun`]): each pair
/// of neighbouring events that do not belong to one allocation is swapped with probability
/// `per_mille` / 1000, from a seeded generator (xorshift). What each allocation asks and how
/// long it lives stay as they were, to within a few events.
fn perturbed(t: &Trace, seed: u64, per_mille: u64) -> Trace {
    let mut t = t.clone();
    let mut x = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407)
        | 1;
    for i in 0..t.events.len().saturating_sub(1) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if x % 1000 < per_mille && t.events[i].id != t.events[i + 1].id {
            t.events.swap(i, i + 1);
        }
    }
    t
}

/// Nearby orders: the two recordings, each perturbed with five seeds (2 % of neighbouring
/// events swapped), replayed as the GPU suite runs them: workloads as close to the measured one
/// as run 2's was to run 1's. Quiet steps must not hang on one exact order. Without the layout
/// spare and `DISSOLVE_EMPTY_SPAN`, 8 of these 10 grew in steps 4 to 20, and 34 and 35 of 40 per
/// recording in `scripts/bench-orders`; PyTorch's allocator, emulated, 1 of 40 (BENCHMARKS.md,
/// "Nearby orders"). Here at most 2 of the 10 may.
#[test]
fn perturbed_runs_of_one_shape_rarely_grow_after_warm_up() {
    let mut grew = Vec::new();
    for run in [RUN_1, RUN_2] {
        let t = bench_trace(run.trace);
        for seed in 0..5 {
            let (calls, _) = lab_calls_per_step(&perturbed(&t, seed, 20));
            if calls[4..=20].iter().any(|&c| c > 0) {
                grew.push((run.trace, seed, calls));
            }
        }
    }
    assert!(grew.len() <= 2, "{} of 10 grew: {grew:?}", grew.len());
}

/// `scripts/bench-orders`: how often perturbed orders of the two GPU recordings grow after warm-up,
/// under the arena (the lab) and under PyTorch's allocator (the emulation), as JSON lines on
/// stdout. `BENCH_ORDERS_SEEDS` (default 40) seeds per recording, `BENCH_ORDERS_PER_MILLE`
/// (default 20) swaps per thousand pairs of events.
#[test]
#[ignore = "a benchmark: run by scripts/bench-orders"]
fn bench_nearby_orders() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (seeds, per_mille) = (
        env("BENCH_ORDERS_SEEDS", 40),
        env("BENCH_ORDERS_PER_MILLE", 20),
    );
    for run in [RUN_1, RUN_2] {
        let t = bench_trace(run.trace);
        // Runs (of `seeds`) that grow in steps 4–20 and in 29–40, and steps that grow after 3.
        let (mut arena, mut native) = ([0u64; 3], [0u64; 3]);
        for seed in 0..seeds {
            let v = perturbed(&t, seed, per_mille);
            let (a, _) = lab_calls_per_step(&v);
            let n = native_growth_per_step(&v);
            for (counts, steps) in [(&mut arena, &a), (&mut native, &n)] {
                counts[0] += steps[4..=20].iter().any(|&c| c > 0) as u64;
                counts[1] += steps[29..=40].iter().any(|&c| c > 0) as u64;
                counts[2] += steps[4..=40].iter().filter(|&&c| c > 0).count() as u64;
            }
        }
        println!(
            "{{\"recording\": \"{}\", \"seeds\": {seeds}, \"swaps_per_mille\": {per_mille}, \
             \"arena\": {{\"runs_growing_in_steps_4_20\": {}, \"runs_growing_in_steps_29_40\": {}, \
             \"steps_growing_after_3\": {}}}, \
             \"native_emulated\": {{\"runs_growing_in_steps_4_20\": {}, \"runs_growing_in_steps_29_40\": {}, \
             \"steps_growing_after_3\": {}}}}}",
            run.trace, arena[0], arena[1], arena[2], native[0], native[1], native[2]
        );
    }
}

/// The cudaMallocs PyTorch's allocator, emulated, makes in each step of a recording (`[0]`:
/// building the model). No segment is released in these runs, so each rise of the reserved
/// bytes is one.
fn native_growth_per_step(t: &Trace) -> [u64; 41] {
    let starts = step_starts(t);
    let mut o = NativeOptions::new(140 * GIB);
    // A point per event: no bucket merges two events.
    o.series_points = 4 * t.events.len();
    let r = native::simulate(t, &o).unwrap();
    let mut grew = [0u64; 41];
    let mut reserved = 0;
    for p in &r.series {
        if p.reserved > reserved {
            grew[starts.partition_point(|&s| s <= p.event)] += 1;
        }
        reserved = p.reserved;
    }
    assert_eq!(r.segments_released, 0);
    assert_eq!(grew.iter().sum::<u64>(), r.segments_created);
    grew
}

/// The native side of the first run: PyTorch's own snapshot of it
/// (`bench/traces/steps-h200-native.pickle.gz`, recorded from just before the first step, where
/// the GPU suite began counting), replayed with native's emulation. The H200 counted 77, 26 and 1
/// cudaMalloc in steps 1, 2 and 25 (`results.steps.native.steps[i].calls` in
/// `bench/results/gpu-check-2026-11-26-H200-4.json`) and none in any other step. The emulation
/// makes its cudaMallocs in the same steps, with one more in step 2: 27. Its seed rebuilds the 26
/// segments that held the model from the blocks live when recording began; free space cached in
/// the real ones is not in the snapshot's events, and is the likely place of the one request the
/// GPU served without a cudaMalloc.
#[test]
fn the_native_emulation_of_the_gpu_run_grows_in_the_gpus_steps() {
    let grew = native_growth_per_step(&bench_trace("steps-h200-native.pickle.gz"));
    assert_eq!(grew[0], 26, "the seed: the segments that held the model");
    let mut h200 = [0u64; 40];
    (h200[0], h200[1], h200[24]) = (77, 26, 1);
    h200[1] += 1; // the emulation's one extra, in step 2 (see above)
    assert_eq!(
        grew[1..],
        h200,
        "the emulation's cudaMallocs per step against the H200's"
    );
}
