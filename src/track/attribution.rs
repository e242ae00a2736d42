//! What an allocation is attributed to, captured as it is made: the step (`step`), the tag
//! stack of the calling thread (`tag_push`, `tag_pop`), and the call site (`capture_site`,
//! sampled as the settings say).

use super::*;

impl Tracker {
    /// Advance the step; record every site's live bytes at this boundary. Returns the new step.
    pub fn step(&self) -> u64 {
        let _g = self.step_lock.lock();
        let new = self.step.fetch_add(1, Ordering::SeqCst) + 1;
        for d in self.devices.iter().filter_map(OnceCell::get) {
            let mut sites: Vec<(u32, SiteLive)> =
                d.site_live.lock().iter().map(|(&s, &l)| (s, l)).collect();
            sites.sort_unstable_by_key(|&(s, _)| s);
            let mut b = d.boundaries.lock();
            if b.len() == MAX_BOUNDARIES {
                b.pop_front();
            }
            b.push_back(Boundary { step: new, sites });
        }
        new
    }

    pub fn current_step(&self) -> u64 {
        self.step.load(Ordering::SeqCst)
    }

    /// Push `tag` on the calling thread's stack: this thread's new allocations carry it until
    /// it is popped.
    pub fn tag_push(&self, tag: &str) {
        let id = {
            let mut t = self.tags.lock();
            match t.ids.get(tag) {
                Some(&id) => id,
                None => {
                    t.names.push(tag.to_string());
                    let id = t.names.len() as u32;
                    t.ids.insert(tag.to_string(), id);
                    id
                }
            }
        };
        let me = self.id;
        let _ = HERE.try_with(|h| h.tags.borrow_mut().push((me, id)));
    }

    /// Pop the calling thread's innermost tag; false when its stack is empty.
    pub fn tag_pop(&self) -> bool {
        let me = self.id;
        HERE.try_with(|h| {
            let mut s = h.tags.borrow_mut();
            match s.iter().rposition(|&(t, _)| t == me) {
                Some(i) => {
                    s.remove(i);
                    true
                }
                None => false,
            }
        })
        .unwrap_or(false)
    }

    /// The calling thread's number ([`thread_number`]) and innermost tag (0: none), from one
    /// reading of the thread-local ([`Here`]). While the thread is being torn down: (0, 0).
    #[inline]
    pub(super) fn thread_and_tag(&self) -> (u32, u32) {
        let me = self.id;
        HERE.try_with(|h| (h.number(), h.tag(me))).unwrap_or((0, 0))
    }

    /// The name of tag `id` (None for 0).
    pub fn tag_name(&self, id: u32) -> Option<String> {
        let t = self.tags.lock();
        t.names.get((id as usize).checked_sub(1)?).cloned()
    }

    // ----- sites ------------------------------------------------------------------------------

    /// Change site capture: `mode`, one allocation in `every` (>= 1), requests of at least
    /// `min_bytes`.
    pub fn set_sites(&self, mode: SitesMode, every: u64, min_bytes: u64) {
        if !self.enabled {
            return;
        }
        self.settings.every.store(every.max(1), Ordering::Relaxed);
        self.settings.min_bytes.store(min_bytes, Ordering::Relaxed);
        self.settings.mode.store(mode_bits(mode), Ordering::Relaxed);
    }

    /// `(mode bits, every, min_bytes)`.
    pub fn sites_settings(&self) -> (u8, u64, u64) {
        (
            self.settings.mode.load(Ordering::Relaxed),
            self.settings.every.load(Ordering::Relaxed),
            self.settings.min_bytes.load(Ordering::Relaxed),
        )
    }

    /// The site of an allocation of `size` bytes about to be made (0: not captured). Call it with
    /// no arena or tracker lock held: it may take the GIL.
    #[inline]
    pub fn capture_site(&self, size: u64) -> u32 {
        let mode = self.settings.mode.load(Ordering::Relaxed);
        if mode == 0 {
            return 0;
        }
        self.capture_site_slow(size, mode)
    }

    #[inline(never)]
    pub(super) fn capture_site_slow(&self, size: u64, mode: u8) -> u32 {
        if size < self.settings.min_bytes.load(Ordering::Relaxed) {
            return 0;
        }
        let every = self.settings.every.load(Ordering::Relaxed);
        if every > 1 {
            let n = HERE
                .try_with(|h| {
                    let n = h.sample.get();
                    h.sample.set(n.wrapping_add(1));
                    n
                })
                .unwrap_or(1);
            if !n.is_multiple_of(every) {
                return 0;
            }
        }
        self.capture_now(mode)
    }

    /// The calling thread's stack as a site, under `mode`, with no sampling.
    pub(super) fn capture_now(&self, mode: u8) -> u32 {
        let mut frames = Vec::new();
        if mode & SITES_NATIVE != 0 {
            sites::capture_native(&mut frames);
        }
        if mode & SITES_PYTHON != 0
            && let Some(id) = sites::capture_python(&frames, &self.interner)
        {
            return id;
        }
        self.interner.intern(&frames).0
    }

    /// The frames of site `id`.
    pub fn site_frames(&self, id: u32) -> Option<std::sync::Arc<[Frame]>> {
        self.interner.stack(id)
    }

    /// The frames of site `id` as text (leading torch-arena frames dropped). May take the GIL:
    /// call with no lock held.
    pub fn site_text(&self, id: u32) -> Vec<std::sync::Arc<sites::FrameText>> {
        self.interner
            .stack(id)
            .map(|f| self.symbols.resolve(&f))
            .unwrap_or_default()
    }

    // ----- the hooks --------------------------------------------------------------------------
}
