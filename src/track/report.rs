//! The tracker's reports as JSON: live allocations with their sites, the leak verdict, the
//! history ring; each a plain read of the live table and the per-site series.

use std::fmt::Write as _;

use super::*;

impl Tracker {
    // ----- reports ----------------------------------------------------------------------------

    /// `"sites":{...}` for `ids` (sorted, 0 left out). Resolves frames: call with no lock held.
    fn sites_json(&self, out: &mut String, ids: impl IntoIterator<Item = u32>) {
        let mut ids: Vec<u32> = ids.into_iter().filter(|&s| s != 0).collect();
        ids.sort_unstable();
        ids.dedup();
        out.push_str("\"sites\":{");
        for (i, id) in ids.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "\"{id}\":");
            self.frames_json(*id, out);
        }
        out.push('}');
    }

    fn frames_json(&self, id: u32, out: &mut String) {
        match self.interner.stack(id) {
            Some(f) => self.symbols.json(&f, out),
            None => out.push_str("[]"),
        }
    }

    fn tag_json(&self, id: u32, out: &mut String) {
        match self.tag_name(id) {
            Some(t) => json::push_str(out, &t),
            None => out.push_str("null"),
        }
    }

    /// `torch_arena_live_json`: every live allocation of `device`, oldest first, and the frames
    /// of every site they name.
    pub fn live_json(&self, device: i32) -> String {
        let live = self.live(device);
        let mut out = String::with_capacity(128 + live.len() * 160);
        let _ = write!(
            out,
            "{{\"device\":{device},\"step\":{},\"allocations\":[",
            self.current_step()
        );
        for (i, (ptr, e)) in live.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                "{{\"ptr\":{ptr},\"size\":{},\"requested\":{},\"stream\":{},\"thread\":{},\
                 \"seq\":{},\"time_us\":{},\"step\":{},\"tag\":",
                e.size, e.requested, e.stream, e.thread, e.seq, e.time_us, e.step
            );
            self.tag_json(e.tag, &mut out);
            let _ = write!(out, ",\"site\":{}}}", e.site);
        }
        out.push_str("],");
        self.sites_json(&mut out, live.iter().map(|(_, e)| e.site));
        out.push('}');
        out
    }

    /// The per-site series at boundaries at or after `warmup`, and those boundaries' steps.
    fn series(&self, d: &DeviceTrack, warmup: u64) -> (Vec<u64>, PtrMap<u32, Vec<Point>>) {
        let b = d.boundaries.lock();
        let kept: Vec<&Boundary> = b.iter().filter(|x| x.step >= warmup).collect();
        let steps: Vec<u64> = kept.iter().map(|x| x.step).collect();
        let mut all: PtrMap<u32, Vec<Point>> = PtrMap::default();
        for (i, x) in kept.iter().enumerate() {
            for &(site, live) in &x.sites {
                let s = all.entry(site).or_insert_with(|| {
                    steps[..i]
                        .iter()
                        .map(|&step| Point {
                            step,
                            bytes: 0,
                            count: 0,
                        })
                        .collect()
                });
                s.push(Point {
                    step: x.step,
                    bytes: live.bytes,
                    count: live.count,
                });
            }
            // Sites absent at this boundary had nothing live.
            for s in all.values_mut() {
                if s.len() == i {
                    s.push(Point {
                        step: x.step,
                        bytes: 0,
                        count: 0,
                    });
                }
            }
        }
        (steps, all)
    }

    /// Growing sites of `device` after `warmup` steps (see [`leaks`]), strongest first.
    pub fn growing(&self, device: i32, warmup: u64) -> Vec<(u32, leaks::Growth)> {
        self.judged(device, warmup).growing
    }

    /// Every site of `device` judged over the boundaries at or after `warmup`.
    fn judged(&self, device: i32, warmup: u64) -> Judged {
        let Some(d) = self.device_if_open(device) else {
            return Judged::default();
        };
        let (steps, series) = self.series(d, warmup);
        let mut j = Judged {
            boundaries: steps.len() as u64,
            observed: match (steps.first(), steps.last()) {
                (Some(a), Some(b)) => b - a,
                _ => 0,
            },
            ..Judged::default()
        };
        for (&site, s) in &series {
            match leaks::verdict(s) {
                Some(leaks::Verdict::Growing(g)) => j.growing.push((site, g)),
                Some(leaks::Verdict::Plateaued(g)) => j.plateaued.push((site, g)),
                None => {}
            }
        }
        for v in [&mut j.growing, &mut j.plateaued] {
            v.sort_by(|a, b| {
                b.1.bytes_per_step
                    .total_cmp(&a.1.bytes_per_step)
                    .then(a.0.cmp(&b.0))
            });
        }
        j
    }

    /// `torch_arena_leaks_json`: growing sites after `warmup`, plateaued ones (grew, then
    /// stayed flat: not leaks), and (with `age_steps` > 0) live allocations at least that many
    /// steps old.
    pub fn leaks_json(&self, device: i32, warmup: u64, age_steps: u64) -> String {
        let now = self.current_step();
        let Judged {
            growing,
            plateaued,
            boundaries,
            observed,
        } = self.judged(device, warmup);
        let live = if growing.is_empty() && plateaued.is_empty() && age_steps == 0 {
            Vec::new()
        } else {
            self.live(device)
        };
        let mut out = String::with_capacity(1024);
        let _ = write!(
            out,
            "{{\"device\":{device},\"step\":{now},\"warmup\":{warmup},\"steps_observed\":{observed},\
             \"boundaries\":{boundaries},\"growing\":["
        );
        for (i, (site, g)) in growing.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let mine: Vec<&(DevPtr, Entry)> =
                live.iter().filter(|(_, e)| e.site == *site).collect();
            let (live_bytes, live_count) = (
                mine.iter().map(|(_, e)| e.size).sum::<u64>(),
                mine.len() as u64,
            );
            // Since when it grows: where its live bytes last stood lowest, not the birth step
            // of its oldest live allocation.
            let first_step = g.from_step;
            let newest: Vec<&&(DevPtr, Entry)> = mine.iter().rev().take(EXAMPLES).collect();
            let _ = write!(out, "{{\"site\":{site},\"frames\":");
            self.frames_json(*site, &mut out);
            let _ = write!(
                out,
                ",\"bytes_per_step\":{},\"count_per_step\":{},\"live_bytes\":{live_bytes},\
                 \"live_count\":{live_count},\"first_step\":{first_step},\"steps_grown\":{},\
                 \"example_sizes\":[{}],\"example_ptrs\":[{}],\"tags\":[",
                json::float(g.bytes_per_step),
                json::float(g.count_per_step),
                g.steps_grown,
                join(newest.iter().map(|(_, e)| e.size)),
                join(newest.iter().map(|(p, _)| *p)),
            );
            let mut tags: Vec<u32> = Vec::new();
            let mut seen = HashSet::new();
            for (_, e) in mine.iter().rev() {
                if e.tag != 0 && seen.insert(e.tag) {
                    tags.push(e.tag);
                    if tags.len() == MAX_TAGS {
                        break;
                    }
                }
            }
            for (j, t) in tags.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                self.tag_json(*t, &mut out);
            }
            out.push_str("]}");
        }
        out.push_str("],\"plateaued\":[");
        for (i, (site, g)) in plateaued.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let (live_bytes, live_count) = live
                .iter()
                .filter(|(_, e)| e.site == *site)
                .fold((0u64, 0u64), |(b, c), (_, e)| (b + e.size, c + 1));
            let _ = write!(out, "{{\"site\":{site},\"frames\":");
            self.frames_json(*site, &mut out);
            let _ = write!(
                out,
                ",\"bytes_per_step\":{},\"count_per_step\":{},\"first_step\":{},\
                 \"until_step\":{},\"live_bytes\":{live_bytes},\"live_count\":{live_count}}}",
                json::float(g.bytes_per_step),
                json::float(g.count_per_step),
                g.from_step,
                g.high_step,
            );
        }
        out.push_str("],\"old\":[");
        let old: Vec<&(DevPtr, Entry)> = if age_steps == 0 {
            Vec::new()
        } else {
            live.iter()
                .filter(|(_, e)| now.saturating_sub(e.step) >= age_steps)
                .collect()
        };
        for (i, (ptr, e)) in old.iter().take(MAX_OLD).enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                "{{\"ptr\":{ptr},\"size\":{},\"requested\":{},\"step\":{},\"age\":{},\"site\":{},\
                 \"frames\":",
                e.size,
                e.requested,
                e.step,
                now - e.step,
                e.site
            );
            self.frames_json(e.site, &mut out);
            out.push('}');
        }
        let _ = write!(out, "],\"old_count\":{}}}", old.len());
        out
    }

    /// `torch_arena_history_json`: the history ring of `device`, oldest first.
    pub fn history_json(&self, device: i32) -> String {
        let h = self.history(device);
        let mut out = String::with_capacity(64 + h.len() * 110);
        let _ = write!(out, "{{\"device\":{device},\"entries\":[");
        for (i, e) in h.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                "{{\"action\":\"{}\",\"addr\":{},\"size\":{},\"stream\":{},\"time_us\":{},\
                 \"site\":{}",
                e.action.as_str(),
                e.addr,
                e.size,
                e.stream,
                e.time_us,
                e.site
            );
            if e.pending {
                out.push_str(",\"pending\":true");
            }
            out.push('}');
        }
        out.push_str("],");
        self.sites_json(&mut out, h.iter().map(|e| e.site));
        out.push('}');
        out
    }
}

/// Sites judged over one window of boundaries.
#[derive(Default)]
struct Judged {
    growing: Vec<(u32, leaks::Growth)>,
    plateaued: Vec<(u32, leaks::Growth)>,
    /// Boundaries at or after the warmup.
    boundaries: u64,
    /// Steps between the first and the last of them.
    observed: u64,
}

fn join(v: impl Iterator<Item = u64>) -> String {
    let mut s = String::new();
    for (i, x) in v.enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{x}");
    }
    s
}
