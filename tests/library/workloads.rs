//! The dynamic-shape workloads (`trace::workloads`): deterministic, well formed, replayable by
//! the arena and the native emulation, and shaped as their doc says.

use std::collections::HashMap;

use torch_arena_lab::native::{NativeOptions, simulate};
use torch_arena_lab::replay::{ReplayOptions, replay};
use torch_arena_lab::workloads::{KINDS, build};
use torch_arena_lab::{Op, Trace};

const MIB: u64 = 1 << 20;

/// Every free ends a live allocation of the same size on the same stream; ids are unique;
/// nothing is left live.
fn well_formed(t: &Trace) {
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
    for (i, e) in t.events.iter().enumerate() {
        match e.op {
            Op::Alloc => {
                assert!(e.size > 0, "{}: event {i} allocates 0 bytes", t.name);
                assert!(
                    live.insert(e.id, (e.size, e.stream)).is_none(),
                    "{}: id {} reused",
                    t.name,
                    e.id
                );
            }
            Op::Free => {
                let got = live.remove(&e.id);
                assert_eq!(got, Some((e.size, e.stream)), "{}: event {i}", t.name);
            }
        }
    }
    assert!(live.is_empty(), "{}: {} left live", t.name, live.len());
}

#[test]
fn every_workload_is_deterministic_well_formed_and_replays() {
    for kind in KINDS {
        let a = build(kind, 2, 7).unwrap();
        let b = build(kind, 2, 7).unwrap();
        let c = build(kind, 2, 8).unwrap();
        assert_eq!(a.events, b.events, "{kind}: the same seed, the same trace");
        assert_ne!(a.events, c.events, "{kind}: another seed, another trace");
        assert_eq!(a.name, format!("{kind}-2-7"));
        well_formed(&a);
        let peak = a.peak_requested();
        assert!(peak > 256 * MIB, "{kind}: peak {peak}");
        let r = replay(&a, &ReplayOptions::new(2 * peak), &mut |_, _| {}).unwrap();
        assert!(
            r.oom.is_none(),
            "{kind}: the arena ran out at twice the peak"
        );
        let n = simulate(&a, &NativeOptions::new(2 * peak)).unwrap();
        assert!(
            n.oom_event.is_none(),
            "{kind}: native ran out at twice the peak"
        );
    }
    assert!(build("no-such-kind", 1, 1).is_none());
}

/// Each workload marks its steps (for `torch-arena diff --steps`): STEPS ends, in order, the last
/// before the teardown that frees the model.
#[test]
fn every_workload_marks_its_steps() {
    for kind in KINDS {
        let t = build(kind, 3, 1).unwrap();
        let s = t.steps.as_ref().expect("steps");
        assert_eq!(s.ends.len(), 3, "{kind}");
        assert!(
            s.ends.windows(2).all(|w| w[0] < w[1]),
            "{kind}: {:?}",
            s.ends
        );
        assert!(*s.ends.last().unwrap() < t.events.len(), "{kind}");
        assert_eq!(s.before_window, 0);
    }
}

/// Training steps differ in their token counts, so their peaks differ.
#[test]
fn varlen_training_steps_peak_differently() {
    let t = build("varlen-train", 4, 3).unwrap();
    // A step starts at each batch of input ids.
    let site = t.sites.iter().position(|s| s == "input_ids").unwrap() as u32;
    let starts: Vec<usize> = (0..t.events.len())
        .filter(|&i| t.events[i].op == Op::Alloc && t.events[i].site == site)
        .collect();
    assert_eq!(starts.len(), 4);
    let sizes: Vec<u64> = starts.iter().map(|&i| t.events[i].size).collect();
    let distinct: std::collections::HashSet<_> = sizes.iter().collect();
    assert!(distinct.len() >= 3, "token counts {sizes:?}");
}

/// Each decode step grows a request's K by one token per layer: a `torch.cat` allocates the
/// longer tensor and frees the old one.
#[test]
fn llm_serving_grows_the_kv_cache_a_token_at_a_time() {
    let t = build("llm-serve", 1, 5).unwrap();
    let cat = t
        .sites
        .iter()
        .position(|s| s == "kv cache k (torch.cat)")
        .unwrap() as u32;
    let token = 4 * 64 * 2; // 4 KV heads of 64, fp16
    let mut grown = 0;
    for w in t.events.windows(2) {
        if w[0].op == Op::Alloc && w[0].site == cat {
            assert_eq!(w[1].op, Op::Free, "the old K goes right after");
            assert_eq!(w[0].size, w[1].size + token, "one token longer");
            grown += 1;
        }
    }
    assert!(grown > 1_000, "{grown} growths");
}

/// DDP's all-reduce buffers live on the second stream; everything else on the first.
#[test]
fn two_stream_training_allocates_on_two_streams() {
    let t = build("two-stream-train", 2, 1).unwrap();
    let comm: Vec<_> = t.events.iter().filter(|e| e.stream == 1).collect();
    assert!(!comm.is_empty());
    assert!(comm.iter().all(|e| e.size == 25 * MIB));
    assert!(t.events.iter().any(|e| e.stream == 0));
}

/// Expert buffers change size from step to step with the routing.
#[test]
fn moe_expert_buffers_vary_with_the_routing() {
    let t = build("moe-train", 3, 2).unwrap();
    let site = t
        .sites
        .iter()
        .position(|s| s == "expert hidden (activation)")
        .unwrap() as u32;
    let sizes: std::collections::HashSet<u64> = t
        .events
        .iter()
        .filter(|e| e.op == Op::Alloc && e.site == site)
        .map(|e| e.size)
        .collect();
    assert!(sizes.len() > 50, "{} distinct expert sizes", sizes.len());
}
