//! The track layer through `TorchArena` (the allocator the exports use), on simulated devices:
//! the live table against a model after random operations, steps and tags, site sampling and
//! thresholds, leak judgement on real allocations, the layout export against the live table, the
//! history ring, and native and Python site capture.

use std::collections::HashMap;

use proptest::prelude::*;
use torch_arena::TorchArena;
use torch_arena::arena::layout::BlockState;
use torch_arena::config::{Config, SitesMode};
use torch_arena::error::Error;
use torch_arena::track::sites::{self, Frame};
use torch_arena::track::{Action, Tracker};

const MIB: usize = 1 << 20;

fn arena(extra: &str) -> TorchArena {
    let text = format!("device:sim,sim_capacity_mb:2048,sim_devices:2{extra}");
    TorchArena::new(Config::parse(&text).unwrap())
}

// ---- the live table against a model ----------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: usize, stream: u64, dev: i32 },
    Free(usize),
    DoubleFree(usize),
    Step,
    Push(u8),
    Pop,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop_oneof![1usize..4096, 4096usize..MIB, MIB..8 * MIB], 0u64..3, 0i32..2)
            .prop_map(|(size, stream, dev)| Op::Alloc { size, stream, dev }),
        4 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::DoubleFree),
        1 => Just(Op::Step),
        1 => (0u8..3).prop_map(Op::Push),
        1 => Just(Op::Pop),
    ]
}

#[derive(Clone, Debug, PartialEq)]
struct Expect {
    requested: u64,
    stream: u64,
    step: u64,
    tag: Option<String>,
}

fn check(a: &TorchArena, model: &[HashMap<u64, Expect>; 2]) -> Result<(), TestCaseError> {
    let t = a.tracker();
    for (dev, want) in model.iter().enumerate() {
        let live = t.live(dev as i32);
        prop_assert_eq!(live.len(), want.len());
        let mut last_seq = None;
        for (ptr, e) in &live {
            let w = want.get(ptr);
            prop_assert!(w.is_some(), "unexpected live entry {:#x}", ptr);
            let w = w.unwrap();
            prop_assert_eq!(e.requested, w.requested);
            prop_assert_eq!(e.stream, w.stream);
            prop_assert_eq!(e.step, w.step);
            prop_assert_eq!(t.tag_name(e.tag), w.tag.clone());
            // The size is the arena's block, as the arena itself reports it.
            let (base, block) = a.arena(dev as i32).unwrap().base_alloc(*ptr).unwrap();
            prop_assert_eq!((base, e.size), (*ptr, block));
            prop_assert!(e.size >= e.requested && e.size % 512 == 0);
            prop_assert_eq!(e.site, 0);
            prop_assert!(last_seq < Some(e.seq), "oldest first");
            last_seq = Some(e.seq);
        }
        // Sizes agree with the arena's own accounting.
        let stats = a.stats(dev as i32).unwrap();
        let sum: u64 = live.iter().map(|(_, e)| e.size).sum();
        let req: u64 = live.iter().map(|(_, e)| e.requested).sum();
        prop_assert_eq!(sum as i64, stats.allocated_bytes.all().current);
        prop_assert_eq!(req as i64, stats.requested_bytes.all().current);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn live_table_matches_a_model(ops in prop::collection::vec(op(), 1..120)) {
        let a = arena("");
        let t = a.tracker();
        let mut model: [HashMap<u64, Expect>; 2] = Default::default();
        // (device, pointer, size, stream)
        let mut order: Vec<(i32, u64, usize, u64)> = Vec::new();
        let mut freed: Vec<(i32, u64, usize, u64)> = Vec::new();
        let mut tags: Vec<String> = Vec::new();
        let names = ["train", "eval \"x\"", "ünï\ncode"];
        for op in ops {
            match op {
                Op::Alloc { size, stream, dev } => {
                    let p = a.malloc(size, dev, stream).unwrap();
                    model[dev as usize].insert(p, Expect {
                        requested: size as u64,
                        stream,
                        step: t.current_step(),
                        tag: tags.last().cloned(),
                    });
                    order.push((dev, p, size, stream));
                    freed.retain(|&(d, q, _, _)| !(d == dev && q == p));
                }
                Op::Free(i) if !order.is_empty() => {
                    let (dev, p, size, stream) = order.swap_remove(i % order.len());
                    // The allocation's stream, as PyTorch passes it, or another one: the
                    // tracker keeps entries by stream and must find them either way.
                    let given = if i & (1 << 40) == 0 { stream } else { (stream + 1) % 3 };
                    a.free(p, size, dev, given).unwrap();
                    model[dev as usize].remove(&p);
                    freed.push((dev, p, size, stream));
                }
                Op::DoubleFree(i) if !freed.is_empty() => {
                    let (dev, p, size, stream) = freed[i % freed.len()];
                    let given = if i & (1 << 40) == 0 { stream } else { 0 };
                    prop_assert!(matches!(a.free(p, size, dev, given), Err(Error::BadPointer(..))));
                }
                Op::Step => {
                    let before = t.current_step();
                    prop_assert_eq!(t.step(), before + 1);
                }
                Op::Push(n) => {
                    t.tag_push(names[n as usize]);
                    tags.push(names[n as usize].to_string());
                }
                Op::Pop => {
                    prop_assert_eq!(t.tag_pop(), tags.pop().is_some());
                }
                _ => {}
            }
            check(&a, &model)?;
        }
        // A size mismatch still frees (and the entry goes).
        if let Some(&(dev, p, size, stream)) = order.first() {
            prop_assert!(a.free(p, size + 1, dev, stream).is_err());
            model[dev as usize].remove(&p);
            check(&a, &model)?;
        }
    }
}

// ---- steps, tags, threads --------------------------------------------------------------------

#[test]
fn steps_start_at_zero_and_tags_nest_per_thread() {
    let a = arena("");
    let t = a.tracker();
    assert_eq!(t.current_step(), 0);
    assert_eq!(t.step(), 1);
    assert_eq!(t.step(), 2);
    assert!(!t.tag_pop(), "empty stack");
    t.tag_push("outer");
    t.tag_push("inner");
    // Tags are per thread: another thread's allocation made meanwhile carries its own (none).
    let p1 = std::thread::scope(|s| s.spawn(|| a.malloc(4096, 0, 0).unwrap()).join().unwrap());
    let p0 = a.malloc(4096, 0, 0).unwrap();
    assert!(t.tag_pop());
    let p2 = a.malloc(4096, 0, 0).unwrap();
    assert!(t.tag_pop());
    let p3 = a.malloc(4096, 0, 0).unwrap();
    let e0 = t.entry(0, p0).unwrap();
    let e1 = t.entry(0, p1).unwrap();
    let e2 = t.entry(0, p2).unwrap();
    let e3 = t.entry(0, p3).unwrap();
    assert_eq!(t.tag_name(e0.tag).as_deref(), Some("inner"));
    assert_eq!(
        e1.tag, 0,
        "a tag pushed on one thread does not label another's allocations"
    );
    assert_eq!(t.tag_name(e2.tag).as_deref(), Some("outer"));
    assert_eq!(e3.tag, 0);
    assert_ne!(e1.thread, e2.thread, "another thread, another number");
    assert_eq!(e2.thread, e3.thread);
    assert!(e1.step == 2 && e2.step == 2);
    assert!(e1.seq < e2.seq && e2.seq < e3.seq);
    // Two threads inside their own tags at the same time: each allocation has its thread's.
    let barrier = std::sync::Barrier::new(2);
    let (pa, pb) = std::thread::scope(|s| {
        let run = |name: &'static str| {
            let (a, t, barrier) = (&a, t, &barrier);
            move || {
                t.tag_push(name);
                barrier.wait();
                let p = a.malloc(4096, 0, 0).unwrap();
                barrier.wait();
                assert!(t.tag_pop());
                p
            }
        };
        let ha = s.spawn(run("thread-a"));
        let hb = s.spawn(run("thread-b"));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_eq!(
        t.tag_name(t.entry(0, pa).unwrap().tag).as_deref(),
        Some("thread-a")
    );
    assert_eq!(
        t.tag_name(t.entry(0, pb).unwrap().tag).as_deref(),
        Some("thread-b")
    );
}

#[test]
fn a_disabled_tracker_records_nothing() {
    let a = TorchArena::with_tracker(
        Config::parse("device:sim,sim_capacity_mb:256").unwrap(),
        Tracker::disabled(),
    );
    let p = a.malloc(4096, 0, 0).unwrap();
    assert!(a.tracker().live(0).is_empty());
    a.free(p, 4096, 0, 0).unwrap();
}

// ---- sites: sampling, threshold, native frames ------------------------------------------------

#[test]
fn sampling_captures_one_in_every_and_respects_the_threshold() {
    let a = arena(",sites:native,sites_every:3");
    let t = a.tracker();
    let ptrs: Vec<u64> = (0..30).map(|_| a.malloc(8192, 0, 0).unwrap()).collect();
    let with_site = ptrs
        .iter()
        .filter(|&&p| t.entry(0, p).unwrap().site != 0)
        .count();
    assert_eq!(with_site, 10);
    t.set_sites(SitesMode::Native, 1, 64 << 10);
    let small = a.malloc(60 << 10, 0, 0).unwrap();
    let big = a.malloc(64 << 10, 0, 0).unwrap();
    assert_eq!(t.entry(0, small).unwrap().site, 0);
    assert_ne!(t.entry(0, big).unwrap().site, 0);
    t.set_sites(SitesMode::None, 1, 0);
    let none = a.malloc(1 << 20, 0, 0).unwrap();
    assert_eq!(t.entry(0, none).unwrap().site, 0);
    // The same call site interns to the same id; per-site live counters follow.
    t.set_sites(SitesMode::Native, 1, 0);
    let xy: Vec<u64> = (0..2).map(|_| same_place(&a)).collect();
    let (x, y) = (xy[0], xy[1]);
    let sx = t.entry(0, x).unwrap().site;
    assert_eq!(sx, t.entry(0, y).unwrap().site);
    assert_eq!(t.site_live(0, sx), (2 * 2 * MIB as u64, 2));
    a.free(x, 2 * MIB, 0, 0).unwrap();
    assert_eq!(t.site_live(0, sx), (2 * MIB as u64, 1));
}

#[inline(never)]
fn same_place(a: &TorchArena) -> u64 {
    std::hint::black_box(a.malloc(2 * MIB, 0, 0).unwrap())
}

#[inline(never)]
fn allocate_from_a_named_function(a: &TorchArena) -> u64 {
    std::hint::black_box(a.malloc(12345, 0, 0).unwrap())
}

#[test]
fn native_sites_resolve_to_function_names() {
    let a = arena(",sites:native");
    let p = allocate_from_a_named_function(&a);
    let site = a.tracker().entry(0, p).unwrap().site;
    assert_ne!(site, 0);
    let frames = a.tracker().site_text(site);
    let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
    assert!(
        names[0].contains("allocate_from_a_named_function"),
        "innermost frame first, torch-arena's own frames dropped: {names:?}"
    );
    assert!(names[0].contains("+0x"), "{names:?}");
    assert!(frames.iter().all(|f| f.kind == "native" && f.ip.is_some()));
    // The object holding the frame: this test binary (`library-<hash>`).
    assert!(
        frames[0].filename.contains("library-"),
        "{:?}",
        frames[0].filename
    );
}

/// Python frames need a Python interpreter in the process: in `cargo test` there is none, so this
/// checks that capture is skipped cleanly (site 0, no crash, no GIL). Inside Python (the Python
/// package's suite loads the library through ctypes) the same calls give Python frames.
#[test]
fn python_sites_are_skipped_cleanly_without_python() {
    let a = arena(",sites:python");
    let p = a.malloc(4096, 0, 0).unwrap();
    let site = a.tracker().entry(0, p).unwrap().site;
    if sites::python_present() {
        eprintln!("a Python interpreter is present: its frames are checked by the Python suite");
        return;
    }
    assert_eq!(site, 0, "no Python here: nothing captured");
    // With native frames too, the native part is still captured.
    a.tracker().set_sites(SitesMode::All, 1, 0);
    let q = a.malloc(4096, 0, 0).unwrap();
    let s = a.tracker().entry(0, q).unwrap().site;
    let frames = a.tracker().site_frames(s).unwrap();
    assert!(frames.iter().all(|f| matches!(f, Frame::Native(_))));
}

// ---- leaks on real allocations ---------------------------------------------------------------

#[inline(never)]
fn leaky(a: &TorchArena) -> u64 {
    std::hint::black_box(a.malloc(MIB, 0, 0).unwrap())
}

#[inline(never)]
fn steady(a: &TorchArena) -> u64 {
    std::hint::black_box(a.malloc(256 * MIB, 0, 0).unwrap())
}

#[inline(never)]
fn alternating(a: &TorchArena) -> u64 {
    std::hint::black_box(a.malloc(4 * MIB, 0, 0).unwrap())
}

#[inline(never)]
fn late_leak(a: &TorchArena) -> u64 {
    std::hint::black_box(a.malloc(3 * MIB, 0, 0).unwrap())
}

#[test]
fn planted_leaks_are_exact_and_steady_loops_are_silent() {
    let a = arena(",sites:native");
    let t = a.tracker();
    let _weights = steady(&a);
    let mut alt = None;
    for step in 0..12u64 {
        leaky(&a);
        match alt.take() {
            Some(p) => a.free(p, 4 * MIB, 0, 0).unwrap(),
            None => alt = Some(alternating(&a)),
        }
        if step >= 6 {
            late_leak(&a);
        }
        // A temporary that lives within the step.
        let tmp = a.malloc(64 * MIB, 0, 0).unwrap();
        a.free(tmp, 64 * MIB, 0, 0).unwrap();
        t.step();
    }
    let growing = t.growing(0, 2);
    let names: Vec<String> = growing
        .iter()
        .map(|(s, _)| t.site_text(*s)[0].name.clone())
        .collect();
    assert_eq!(growing.len(), 2, "{names:?}");
    assert!(names[0].contains("late_leak"), "{names:?}");
    assert_eq!(growing[0].1.bytes_per_step, (3 * MIB) as f64);
    assert_eq!(growing[0].1.from_step, 6, "its last boundary at zero");
    assert!(names[1].contains("leaky"), "{names:?}");
    assert_eq!(growing[1].1.bytes_per_step, MIB as f64);
    assert_eq!(growing[1].1.count_per_step, 1.0);
    // The report says the same, with the frames resolved and the live set counted.
    let r = t.leak_report(0, 2, 0);
    assert_eq!(r.growing.len(), 2);
    let (late, leaky) = (&r.growing[0], &r.growing[1]);
    assert!(late.frames[0].name.contains("late_leak"), "{late:?}");
    assert_eq!(late.bytes_per_step, (3 * MIB) as f64);
    assert_eq!(late.first_step, 6, "its last boundary at zero");
    assert!(leaky.frames[0].name.contains("leaky"), "{leaky:?}");
    assert_eq!(leaky.bytes_per_step, MIB as f64);
    assert_eq!(leaky.live_count, t.site_live(0, leaky.site).1);
    assert_eq!(leaky.live_bytes, t.site_live(0, leaky.site).0);
    assert!(leaky.example_sizes.len() <= 5 && !leaky.example_sizes.is_empty());
    // With an age asked, the old list is the live table's allocations at least that old,
    // oldest first.
    let now = t.current_step();
    let aged = t.leak_report(0, 2, 3);
    let want: Vec<u64> = t
        .live(0)
        .iter()
        .filter(|(_, e)| now - e.step >= 3)
        .map(|&(p, _)| p)
        .collect();
    assert!(!want.is_empty());
    assert_eq!(aged.old_count, want.len() as u64);
    assert_eq!(aged.old.iter().map(|o| o.ptr).collect::<Vec<_>>(), want);
    assert!(aged.old.iter().all(|o| o.age >= 3 && o.age == now - o.step));
}

// ---- layout ----------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn layout_tiles_reserved_memory_and_matches_the_live_table(
        ops in prop::collection::vec((0usize..4, 1usize..6 * MIB, 0u64..2, any::<usize>()), 1..80),
    ) {
        let a = arena("");
        let mut live: Vec<(u64, usize)> = Vec::new();
        for (kind, size, stream, pick) in ops {
            match kind {
                0 | 1 => {
                    let size = if kind == 0 { size % 8192 + 1 } else { size };
                    live.push((a.malloc(size, 0, stream).unwrap(), size));
                }
                2 if !live.is_empty() => {
                    let (p, s) = live.swap_remove(pick % live.len());
                    a.free(p, s, 0, 0).unwrap();
                }
                3 => {
                    a.defragment(0).unwrap();
                }
                _ => {}
            }
        }
        let layout = a.layout(0).unwrap();
        let stats = a.stats(0).unwrap();
        prop_assert_eq!(layout.reserved as i64, stats.reserved_bytes.all().current);
        let covered: u64 = layout.segments.iter().map(|s| s.total_size).sum();
        prop_assert_eq!(covered + layout.pooled, layout.reserved);
        let mut active: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut prev_end = 0;
        for s in &layout.segments {
            prop_assert!(s.address >= prev_end, "sorted, disjoint");
            prev_end = s.address + s.total_size;
            let mut at = s.address;
            for b in &s.blocks {
                prop_assert_eq!(b.address, at);
                prop_assert!(b.size > 0);
                at += b.size;
                if b.state == BlockState::ActiveAllocated {
                    active.insert(b.address, (b.size, b.requested));
                }
            }
            prop_assert_eq!(at, prev_end);
        }
        let tracked: HashMap<u64, (u64, u64)> = a
            .tracker()
            .live(0)
            .into_iter()
            .map(|(p, e)| (p, (e.size, e.requested)))
            .collect();
        prop_assert_eq!(active, tracked);
        prop_assert_eq!(layout.allocated as i64, stats.allocated_bytes.all().current);
    }
}

// ---- history ---------------------------------------------------------------------------------

#[test]
fn history_is_bounded_ordered_and_sees_segments() {
    let a = arena("");
    let t = a.tracker();
    t.history_enable(true, 1000);
    let p = a.malloc(16 * MIB, 0, 0).unwrap();
    a.free(p, 16 * MIB, 0, 0).unwrap();
    a.empty_cache().unwrap();
    let q = a.malloc(4096, 0, 0).unwrap();
    a.record_stream(q, 7).unwrap();
    a.free(q, 4096, 0, 0).unwrap();
    let h = t.history(0);
    let actions: Vec<Action> = h.iter().map(|e| e.action).collect();
    assert_eq!(
        actions,
        [
            Action::SegmentMap,
            Action::Alloc,
            Action::FreeRequested,
            Action::FreeCompleted,
            Action::SegmentMap,
            Action::Alloc,
            Action::FreeRequested,
            Action::FreeCompleted,
        ]
    );
    assert_eq!(h[0].size, 16 * MIB as u64);
    assert_eq!(h[0].addr, p);
    assert_eq!(h[1].size, 16 * MIB as u64);
    assert!(!h[3].pending);
    assert!(h[7].pending, "record_stream deferred the reuse");
    assert_eq!(h[7].addr, q);
    assert!(h.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    // Bounded: the oldest go first.
    t.history_enable(true, 5);
    for _ in 0..4 {
        let p = a.malloc(512, 0, 0).unwrap();
        a.free(p, 512, 0, 0).unwrap();
    }
    let h = t.history(0);
    assert_eq!(h.len(), 5);
    assert_eq!(h[4].action, Action::FreeCompleted);
    // Off: nothing more is recorded, what is there stays.
    t.history_enable(false, 0);
    a.free(a.malloc(512, 0, 0).unwrap(), 512, 0, 0).unwrap();
    assert_eq!(t.history(0), h);
}

#[test]
fn concurrent_threads_keep_the_table_exact() {
    let a = TorchArena::new(Config::parse("device:sim,sim_capacity_mb:8192").unwrap());
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let a = &a;
            s.spawn(move || {
                let mut mine = Vec::new();
                for i in 0..2000usize {
                    let size = 512 + (i * 997 + th as usize * 131) % (256 << 10);
                    mine.push((a.malloc(size, 0, th).unwrap(), size));
                    if i % 3 != 0 {
                        let (p, s) = mine.swap_remove((i * 7) % mine.len());
                        a.free(p, s, 0, th).unwrap();
                    }
                }
                for (p, s) in mine.drain(..mine.len() / 2) {
                    a.free(p, s, 0, th).unwrap();
                }
            });
        }
    });
    let live = a.tracker().live(0);
    let stats = a.stats(0).unwrap();
    assert_eq!(live.len() as i64, stats.allocation.all().current);
    let sum: u64 = live.iter().map(|(_, e)| e.size).sum();
    assert_eq!(sum as i64, stats.allocated_bytes.all().current);
}

#[test]
fn tracked_block_sizes_are_the_arenas_own_whatever_the_slab_threshold() {
    for extra in ["", ",slab_max_kb:64", ",slab_max_kb:4"] {
        let a = arena(extra);
        for size in [
            1u64,
            700,
            5000,
            70_000,
            100 << 10,
            1 << 20,
            (1 << 20) + 1,
            3 << 20,
        ] {
            let p = a.malloc(size as usize, 0, 0).unwrap();
            let (_, block) = a.base_alloc(p).unwrap();
            let e = a.tracker().entry(0, p).unwrap();
            assert_eq!(e.size, block, "{extra:?}: request {size}");
            assert_eq!(e.requested, size);
            a.free(p, size as usize, 0, 0).unwrap();
        }
    }
}

/// `record_stream` goes down the same stack as an allocation (`Resource::record_stream`): the
/// arena defers the block's reuse and the tracking layer marks its live entry, found from an
/// interior pointer; a resource with no streams refuses the call by name, as one with no private
/// pools refuses pool calls.
#[test]
fn record_stream_and_pool_calls_pass_through_the_stack() {
    use torch_arena::block::{Block, PoolCall, Request};
    use torch_arena::resource::Resource;

    let a = arena(",leaks:True");
    let p = a.malloc(3 << 20, 0, 5).unwrap();
    assert!(!a.tracker().entry(0, p).unwrap().recorded);
    a.record_stream(p + 4096, 9).unwrap();
    assert!(
        a.tracker().entry(0, p).unwrap().recorded,
        "marked from an interior pointer"
    );
    // A pointer no arena handed out is refused before any layer acts.
    assert!(a.record_stream(0xdead_0000, 9).is_err());
    // Pool calls: begin, end and release through the stack, in PyTorch's order.
    a.begin_pool(0, (1, 2)).unwrap();
    a.end_pool(0, (1, 2)).unwrap();
    a.release_pool(0, (1, 2)).unwrap();
    a.free(p, 3 << 20, 0, 5).unwrap();

    struct Plain;
    impl Resource for Plain {
        fn alloc(&self, req: &Request) -> torch_arena::Result<Block> {
            Ok(Block {
                ptr: 0x1000,
                size: req.size,
                seq: 1,
            })
        }
        fn free(&self, _: u64, _: u64, _: u64) -> torch_arena::Result<()> {
            Ok(())
        }
        fn reserved(&self) -> u64 {
            0
        }
    }
    let e = Plain.record_stream(0x1000, 3).unwrap_err().to_string();
    assert!(
        e.contains("record_stream(0x1000)") && e.contains("stream"),
        "{e}"
    );
    let e = Plain.pool((4, 5), PoolCall::End).unwrap_err().to_string();
    assert!(e.contains("End on pool (4, 5)"), "{e}");
}
