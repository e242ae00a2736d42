//! The tracker's reports: plain structs ([`LiveReport`], [`LeakReport`], [`HistoryReport`]), each
//! a read of the live table and the per-site series with every site's frames resolved, and
//! their JSON (the `torch_arena_*_json` exports), written in one place at the end of this file
//! through the crate's one writer ([`crate::json`]).

use std::sync::Arc;

use super::*;
use sites::FrameText;

/// The frames of one site, as text.
pub type Frames = Vec<Arc<FrameText>>;

/// One live allocation, as the live report lists it.
#[derive(Clone, Debug)]
pub struct LiveAllocation {
    pub ptr: DevPtr,
    pub entry: Entry,
    /// The tag's name (`None`: no tag).
    pub tag: Option<String>,
}

/// Every live allocation of a device, oldest first, and the frames of each site they name.
#[derive(Clone, Debug)]
pub struct LiveReport {
    pub device: i32,
    pub step: u64,
    pub allocations: Vec<LiveAllocation>,
    /// Site id → frames, ids ascending (0, "not captured", left out).
    pub sites: Vec<(u32, Frames)>,
}

/// A site whose live bytes grow step after step.
#[derive(Clone, Debug)]
pub struct GrowingSite {
    pub site: u32,
    pub frames: Frames,
    pub bytes_per_step: f64,
    pub count_per_step: f64,
    pub live_bytes: u64,
    pub live_count: u64,
    /// Since when it grows: where its live bytes last stood lowest (not the birth step of its
    /// oldest live allocation).
    pub first_step: u64,
    pub steps_grown: u64,
    /// Sizes and pointers of its newest live allocations (at most five).
    pub example_sizes: Vec<u64>,
    pub example_ptrs: Vec<DevPtr>,
    /// Distinct tags of its live allocations, newest first (at most eight).
    pub tags: Vec<String>,
}

/// A site that grew, then stayed flat: not a leak.
#[derive(Clone, Debug)]
pub struct PlateauedSite {
    pub site: u32,
    pub frames: Frames,
    pub bytes_per_step: f64,
    pub count_per_step: f64,
    pub first_step: u64,
    pub until_step: u64,
    pub live_bytes: u64,
    pub live_count: u64,
}

/// A live allocation at least `age_steps` steps old.
#[derive(Clone, Debug)]
pub struct OldAllocation {
    pub ptr: DevPtr,
    pub size: u64,
    pub requested: u64,
    pub step: u64,
    pub age: u64,
    pub site: u32,
    pub frames: Frames,
}

/// The leak verdict of one device.
#[derive(Clone, Debug)]
pub struct LeakReport {
    pub device: i32,
    pub step: u64,
    pub warmup: u64,
    /// Steps between the first and the last boundary judged.
    pub steps_observed: u64,
    /// Boundaries at or after the warmup.
    pub boundaries: u64,
    /// Strongest growth first.
    pub growing: Vec<GrowingSite>,
    pub plateaued: Vec<PlateauedSite>,
    /// Oldest first, at most [`MAX_OLD`].
    pub old: Vec<OldAllocation>,
    /// How many allocations were old (`old` may list fewer).
    pub old_count: u64,
}

/// The history ring of one device, oldest first, and the frames of each site it names.
#[derive(Clone, Debug)]
pub struct HistoryReport {
    pub device: i32,
    pub entries: Vec<HistEntry>,
    pub sites: Vec<(u32, Frames)>,
}

impl Tracker {
    // ----- reports ----------------------------------------------------------------------------

    /// The frames of every site in `ids` (sorted, deduplicated, 0 left out). Resolves frames:
    /// call with no lock held.
    fn sites_of(&self, ids: impl IntoIterator<Item = u32>) -> Vec<(u32, Frames)> {
        let mut ids: Vec<u32> = ids.into_iter().filter(|&s| s != 0).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().map(|id| (id, self.site_text(id))).collect()
    }

    /// Every live allocation of `device`, oldest first, with its tag's name and its site's
    /// frames.
    pub fn live_report(&self, device: i32) -> LiveReport {
        let live = self.live(device);
        let sites = self.sites_of(live.iter().map(|(_, e)| e.site));
        LiveReport {
            device,
            step: self.current_step(),
            allocations: live
                .into_iter()
                .map(|(ptr, entry)| LiveAllocation {
                    ptr,
                    entry,
                    tag: self.tag_name(entry.tag),
                })
                .collect(),
            sites,
        }
    }

    /// `torch_arena_live_json`: [`Tracker::live_report`] as JSON.
    pub fn live_json(&self, device: i32) -> String {
        self.live_report(device).to_json()
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

    /// Growing sites of `device` after `warmup`, plateaued ones (grew, then stayed flat: not
    /// leaks), and (with `age_steps` > 0) live allocations at least that many steps old.
    pub fn leak_report(&self, device: i32, warmup: u64, age_steps: u64) -> LeakReport {
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
        let growing = growing
            .into_iter()
            .map(|(site, g)| {
                let mine: Vec<&(DevPtr, Entry)> =
                    live.iter().filter(|(_, e)| e.site == site).collect();
                let newest: Vec<&&(DevPtr, Entry)> = mine.iter().rev().take(EXAMPLES).collect();
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
                GrowingSite {
                    site,
                    frames: self.site_text(site),
                    bytes_per_step: g.bytes_per_step,
                    count_per_step: g.count_per_step,
                    live_bytes: mine.iter().map(|(_, e)| e.size).sum(),
                    live_count: mine.len() as u64,
                    first_step: g.from_step,
                    steps_grown: g.steps_grown,
                    example_sizes: newest.iter().map(|(_, e)| e.size).collect(),
                    example_ptrs: newest.iter().map(|(p, _)| *p).collect(),
                    tags: tags.into_iter().filter_map(|t| self.tag_name(t)).collect(),
                }
            })
            .collect();
        let plateaued = plateaued
            .into_iter()
            .map(|(site, g)| {
                let (live_bytes, live_count) = live
                    .iter()
                    .filter(|(_, e)| e.site == site)
                    .fold((0u64, 0u64), |(b, c), (_, e)| (b + e.size, c + 1));
                PlateauedSite {
                    site,
                    frames: self.site_text(site),
                    bytes_per_step: g.bytes_per_step,
                    count_per_step: g.count_per_step,
                    first_step: g.from_step,
                    until_step: g.high_step,
                    live_bytes,
                    live_count,
                }
            })
            .collect();
        let old: Vec<&(DevPtr, Entry)> = if age_steps == 0 {
            Vec::new()
        } else {
            live.iter()
                .filter(|(_, e)| now.saturating_sub(e.step) >= age_steps)
                .collect()
        };
        LeakReport {
            device,
            step: now,
            warmup,
            steps_observed: observed,
            boundaries,
            growing,
            plateaued,
            old_count: old.len() as u64,
            old: old
                .iter()
                .take(MAX_OLD)
                .map(|(ptr, e)| OldAllocation {
                    ptr: *ptr,
                    size: e.size,
                    requested: e.requested,
                    step: e.step,
                    age: now.saturating_sub(e.step),
                    site: e.site,
                    frames: self.site_text(e.site),
                })
                .collect(),
        }
    }

    /// `torch_arena_leaks_json`: [`Tracker::leak_report`] as JSON.
    pub fn leaks_json(&self, device: i32, warmup: u64, age_steps: u64) -> String {
        self.leak_report(device, warmup, age_steps).to_json()
    }

    /// The history ring of `device`, oldest first, with the frames of every site it names.
    pub fn history_report(&self, device: i32) -> HistoryReport {
        let entries = self.history(device);
        HistoryReport {
            device,
            sites: self.sites_of(entries.iter().map(|e| e.site)),
            entries,
        }
    }

    /// `torch_arena_history_json`: [`Tracker::history_report`] as JSON.
    pub fn history_json(&self, device: i32) -> String {
        self.history_report(device).to_json()
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

// ----- JSON -------------------------------------------------------------------------------------

fn frames_json(f: &Frames) -> String {
    json::array(f.iter().map(|t| t.to_json()))
}

fn sites_json(sites: &[(u32, Frames)]) -> String {
    let mut o = json::Object::new();
    for (id, f) in sites {
        o.raw(&id.to_string(), &frames_json(f));
    }
    o.finish()
}

impl LiveReport {
    /// `{"device", "step", "allocations": [...], "sites": {id: frames}}`.
    pub fn to_json(&self) -> String {
        let allocations = json::array(self.allocations.iter().map(|a| {
            let e = &a.entry;
            json::Object::new()
                .num("ptr", a.ptr)
                .num("size", e.size)
                .num("requested", e.requested)
                .num("stream", e.stream)
                .num("thread", u64::from(e.thread))
                .num("seq", e.seq)
                .num("time_us", e.time_us)
                .num("step", e.step)
                .opt_str("tag", a.tag.as_deref())
                .num("site", u64::from(e.site))
                .finish()
        }));
        json::Object::new()
            .int("device", i64::from(self.device))
            .num("step", self.step)
            .raw("allocations", &allocations)
            .raw("sites", &sites_json(&self.sites))
            .finish()
    }
}

impl LeakReport {
    /// `{"device", "step", "warmup", "steps_observed", "boundaries", "growing", "plateaued",
    /// "old", "old_count"}`.
    pub fn to_json(&self) -> String {
        let growing = json::array(self.growing.iter().map(|g| {
            json::Object::new()
                .num("site", u64::from(g.site))
                .raw("frames", &frames_json(&g.frames))
                .float("bytes_per_step", g.bytes_per_step)
                .float("count_per_step", g.count_per_step)
                .num("live_bytes", g.live_bytes)
                .num("live_count", g.live_count)
                .num("first_step", g.first_step)
                .num("steps_grown", g.steps_grown)
                .raw(
                    "example_sizes",
                    &json::array(g.example_sizes.iter().map(u64::to_string)),
                )
                .raw(
                    "example_ptrs",
                    &json::array(g.example_ptrs.iter().map(u64::to_string)),
                )
                .raw("tags", &json::array(g.tags.iter().map(|t| json::string(t))))
                .finish()
        }));
        let plateaued = json::array(self.plateaued.iter().map(|p| {
            json::Object::new()
                .num("site", u64::from(p.site))
                .raw("frames", &frames_json(&p.frames))
                .float("bytes_per_step", p.bytes_per_step)
                .float("count_per_step", p.count_per_step)
                .num("first_step", p.first_step)
                .num("until_step", p.until_step)
                .num("live_bytes", p.live_bytes)
                .num("live_count", p.live_count)
                .finish()
        }));
        let old = json::array(self.old.iter().map(|o| {
            json::Object::new()
                .num("ptr", o.ptr)
                .num("size", o.size)
                .num("requested", o.requested)
                .num("step", o.step)
                .num("age", o.age)
                .num("site", u64::from(o.site))
                .raw("frames", &frames_json(&o.frames))
                .finish()
        }));
        json::Object::new()
            .int("device", i64::from(self.device))
            .num("step", self.step)
            .num("warmup", self.warmup)
            .num("steps_observed", self.steps_observed)
            .num("boundaries", self.boundaries)
            .raw("growing", &growing)
            .raw("plateaued", &plateaued)
            .raw("old", &old)
            .num("old_count", self.old_count)
            .finish()
    }
}

impl HistoryReport {
    /// `{"device", "entries": [...], "sites": {id: frames}}`; `"pending": true` only on a
    /// `free_completed` whose memory waits for other streams.
    pub fn to_json(&self) -> String {
        let entries = json::array(self.entries.iter().map(|e| {
            let mut o = json::Object::new();
            o.str("action", e.action.as_str())
                .num("addr", e.addr)
                .num("size", e.size)
                .num("stream", e.stream)
                .num("time_us", e.time_us)
                .num("site", u64::from(e.site));
            if e.pending {
                o.bool("pending", true);
            }
            o.finish()
        }));
        json::Object::new()
            .int("device", i64::from(self.device))
            .raw("entries", &entries)
            .raw("sites", &sites_json(&self.sites))
            .finish()
    }
}
