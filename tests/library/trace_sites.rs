//! Sites of PyTorch snapshots are the frames people recognise (issue 15 item 6): replay and
//! `convert` of a snapshot recorded with Python frames name `file.py:line in function`, never
//! the unwinder (`torch::unwind::unwind()`) or an unresolved frame, as memory_viz skips them;
//! a stack with no Python frame names its first ATen frame.
//! Also the live set at a trace's peak, by site (`trace::live`).

use crate::snapshots;

use torch_arena_lab::live::{At, live_at};

#[test]
fn snapshot_sites_are_python_frames_not_the_unwinder() {
    let dir = snapshots::traces_dir();
    let mut checked = 0;
    for path in snapshots::indexed_files(&dir) {
        let name = path.display().to_string();
        if !name.contains(".pickle") || std::fs::metadata(&path).map_or(true, |m| m.len() > 8 << 20)
        {
            continue; // small snapshots only: enough to see the frames, cheap on 2 cores
        }
        let Ok(t) = torch_arena_lab::load(&path) else {
            continue;
        };
        let named: Vec<&String> = t.sites.iter().skip(1).collect();
        let bad: Vec<&&String> = named
            .iter()
            .filter(|s| {
                s.contains("unwind::unwind") || s.ends_with(" in unknown") || s.ends_with(" in ??")
            })
            .collect();
        assert!(bad.is_empty(), "{name}: {bad:?}");
        if named.iter().any(|s| s.contains(".py:")) {
            checked += 1;
            // The peak's live set names them too, largest first.
            let set = live_at(&t, At::Peak).unwrap();
            assert!(set.sites.windows(2).all(|w| w[0].bytes >= w[1].bytes));
            assert_eq!(set.sites.iter().map(|s| s.bytes).sum::<u64>(), set.bytes);
        }
        if checked >= 3 {
            break;
        }
    }
    assert!(
        checked > 0,
        "no real snapshot with Python frames under 8 MiB in {dir:?}"
    );
}
