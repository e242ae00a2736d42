//! The native emulation's settings (`PYTORCH_CUDA_ALLOC_CONF`, `--native-conf`): each parsed as
//! PyTorch parses it, each rule checked on a hand-built trace whose figures are worked out in the
//! comments from PyTorch's code (`c10/core/AllocatorConfig.cpp`, `CUDACachingAllocator.cpp`).

use crate::trace_replay::{S, trace};
use torch_arena_lab::native::{self, NativeOptions};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn conf(text: &str) -> NativeOptions {
    NativeOptions::with_conf(GIB, "--native-conf", text)
        .unwrap_or_else(|e| panic!("{text:?} refused: {e}"))
}

fn refused(text: &str) -> String {
    match NativeOptions::with_conf(GIB, "--native-conf", text) {
        Ok(o) => panic!("{text:?} accepted: {o:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn no_settings_are_pytorchs_defaults() {
    assert_eq!(conf(""), NativeOptions::new(GIB));
    let o = conf("max_split_size_mb:512,expandable_segments:True,large_segment_size_mb:64");
    assert_eq!(o.max_split_size, Some(512 * MIB));
    assert!(o.expandable_segments);
    assert_eq!(o.large_segment_size, 64 * MIB);
    // Settings that change no device memory of a replay are taken and change nothing.
    assert_eq!(
        conf("release_lock_on_cudamalloc:True,pinned_num_register_threads:8,backend:native"),
        NativeOptions::new(GIB)
    );
}

#[test]
fn bad_settings_are_refused_naming_what_pytorch_accepts() {
    for (text, says) in [
        ("max_split_size_mb:10", "at least 20"),
        ("max_non_split_rounding_mb:19", "at least 20"),
        ("large_segment_size_mb:10", "more than 10"),
        ("garbage_collection_threshold:1.0", "between 0 and 1"),
        ("garbage_collection_threshold:0", "between 0 and 1"),
        ("per_process_memory_fraction:1.5", "from 0 to 1"),
        ("roundup_power2_divisions:3", "a power of two"),
        ("roundup_power2_divisions:[256:3]", "N 0 or a power of two"),
        ("roundup_power2_divisions:[300:2]", "SIZE_MB a power of two"),
        ("expandable_segments:yes", "True or False"),
        ("backend:cudaMallocAsync", "does not emulate"),
        ("max_split_mb:512", "unknown setting 'max_split_mb'"),
        ("max_split_size_mb:512,max_split_size_mb:256", "given twice"),
        ("max_split_size_mb:[512]", "a whole number of MiB"),
        ("max_split_size_mb", "missing ':'"),
    ] {
        let e = refused(text);
        assert!(e.contains(says), "{text:?}: {e}");
        assert!(e.starts_with("--native-conf"), "{text:?}: {e}");
    }
}

/// `parseRoundUpPower2Divisions`: a list's first entry also fills every interval below it, each
/// `SIZE_MB` names interval log2(SIZE_MB), and `>` fills from the last named interval (that one
/// included) to the end. Intervals are powers of two from 1 MiB.
#[test]
fn roundup_power2_divisions_fill_the_intervals_as_pytorch_does() {
    assert_eq!(
        conf("roundup_power2_divisions:4").roundup_power2_divisions,
        [4; 16]
    );
    // 256 MiB is interval 8: 0..=8 get 1; 512 MiB is 9: 2, then `>` overwrites 9.. with 4.
    assert_eq!(
        conf("roundup_power2_divisions:[256:1,512:2,>:4]").roundup_power2_divisions,
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 4, 4, 4, 4, 4, 4]
    );
    // PyTorch's own example: interval 7 (128 MiB) is never named and stays 0.
    assert_eq!(
        conf("roundup_power2_divisions:[64:8,256:4,1024:4,>:1]").roundup_power2_divisions,
        [8, 8, 8, 8, 8, 8, 8, 0, 4, 0, 1, 1, 1, 1, 1, 1]
    );
}

/// `round_size` with divisions: the next of `divisions` steps between two powers of two, only
/// when `divisions > 1` and the size is over 512 × divisions; powers of two stay.
#[test]
fn roundup_power2_divisions_round_requests_up() {
    let four = conf("roundup_power2_divisions:4");
    // 1,300,000 B: floor 1 MiB, step 256 KiB, 1 MiB + 256 KiB = 1,310,720.
    assert_eq!(four.round_size(1_300_000), 1_310_720);
    assert_eq!(four.round_size(MIB), MIB);
    // 1,500 B is not over 512 × 4: plain 512-byte rounding.
    assert_eq!(four.round_size(1_500), 1_536);
    // 5,000 B with 2 divisions: floor 4,096, step 2,048: 6,144 (plain rounding gives 5,120).
    assert_eq!(conf("roundup_power2_divisions:2").round_size(5_000), 6_144);
    // Per interval: [2 MiB, 4 MiB) rounds in quarters, the rest in 512-byte steps.
    let per = conf("roundup_power2_divisions:[1:0,2:4]");
    assert_eq!(per.round_size(3_000_000), 3 * MIB);
    assert_eq!(per.round_size(5_000_000), 5_000_192);
    assert_eq!(per.round_size(1_300_000), 1_300_480);
    // The emulation allocates the rounded size.
    let t = trace(&[S::A(1, 1_300_000)]);
    assert_eq!(
        native::simulate(&t, &four).unwrap().peak_allocated,
        1_310_720
    );
    assert_eq!(
        native::simulate(&t, &NativeOptions::new(GIB))
            .unwrap()
            .peak_allocated,
        1_300_480
    );
}

/// A cached oversize block serves a request of at least `max_split_size` only while it is less
/// than `max_non_split_rounding` bigger than the request.
#[test]
fn max_non_split_rounding_lets_bigger_cached_blocks_serve() {
    let t = trace(&[S::A(1, 64 * MIB), S::F(1), S::A(2, 40 * MIB)]);
    // Default 20 MiB: 64 ≥ 40 + 20, so a new 40 MiB segment (104 MiB in all).
    let o = conf("max_split_size_mb:40");
    assert_eq!(native::simulate(&t, &o).unwrap().peak_reserved, 104 * MIB);
    // 40 MiB: 64 < 40 + 40, the cached block serves.
    let o = conf("max_split_size_mb:40,max_non_split_rounding_mb:40");
    assert_eq!(native::simulate(&t, &o).unwrap().peak_reserved, 64 * MIB);
}

#[test]
fn large_segment_size_sets_the_medium_requests_segment() {
    let t = trace(&[S::A(1, 2 * MIB), S::A(2, 3 * MIB)]);
    let r = native::simulate(&t, &conf("large_segment_size_mb:32")).unwrap();
    assert_eq!((r.peak_reserved, r.segments_created), (32 * MIB, 1));
}

/// Under a memory fraction the allocator may reserve `fraction × total` and no more.
#[test]
fn a_memory_fraction_caps_what_may_be_reserved() {
    let t = trace(&[S::A(1, 300 * MIB), S::A(2, 300 * MIB)]);
    let r = native::simulate(&t, &NativeOptions::new(GIB)).unwrap();
    assert_eq!((r.oom_event, r.peak_reserved), (None, 600 * MIB));
    let half = conf("per_process_memory_fraction:0.5");
    assert_eq!(half.limit(), 512 * MIB);
    let r = native::simulate(&t, &half).unwrap();
    assert_eq!((r.oom_event, r.peak_reserved), (Some(1), 300 * MIB));
}

/// `garbage_collect_cached_blocks` on a 400 MiB device, fraction 1, threshold 0.5 (200 MiB): it
/// runs on a miss once reserved is over the threshold, and frees the unsplit cached segments at
/// least as old as their average age (searches of the large pool since each was cached).
#[test]
fn garbage_collection_frees_the_oldest_cached_segments_first() {
    let steps = [
        S::A(1, 40 * MIB), // search 1; reserved 40
        S::A(2, 42 * MIB), // search 2; 82
        S::A(3, 40 * MIB), // search 3; 122
        S::F(1),           // id 1 cached at count 3
        S::A(4, 50 * MIB), // search 4 misses; 122 <= 200: no collection; 172
        S::F(2),           // id 2 cached at count 4
        S::A(5, 60 * MIB), // search 5 misses; 172 <= 200; 232
        // Search 6 misses; 232 > 200 by 32. Ages: id 1 6-3 = 3, id 2 6-4 = 2, average 2.5:
        // id 1 (40 MiB) goes, which covers the 32; id 2 stays. 192 + 70 = 262.
        S::A(6, 70 * MIB),
    ];
    let t = trace(&steps);
    let mut o = NativeOptions::with_conf(
        400 * MIB,
        "--native-conf",
        "garbage_collection_threshold:0.5,per_process_memory_fraction:1.0",
    )
    .unwrap();
    let r = native::simulate(&t, &o).unwrap();
    assert_eq!(r.oom_event, None);
    assert_eq!((r.segments_released, r.final_reserved), (1, 262 * MIB));
    // Without a fraction PyTorch never collects: everything stays cached (302 MiB).
    o.memory_fraction = None;
    let r = native::simulate(&t, &o).unwrap();
    assert_eq!((r.segments_released, r.final_reserved), (0, 302 * MIB));
}
