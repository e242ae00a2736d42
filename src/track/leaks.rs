//! Leak judgement: which allocation sites keep growing from step to step.
//!
//! Input: for one site, its live bytes and count sampled at each step boundary
//! (`torch_arena_step`) from the first boundary at or after the warmup on, oldest first. Nothing
//! else is used: not the birth steps of the allocations live now (a bounded cache's live items
//! are all young, yet it does not grow). A site is **growing** when
//!
//! 1. its live bytes at the last boundary exceed those at the first (it rose overall): growth
//!    `G = v_last - v_first > 0`;
//! 2. it never fell by as much as it grew: the largest fall from an earlier boundary to a later
//!    one (the deepest drawdown, `max over i < j of v_i - v_j`) is below `G`. A sawtooth (a
//!    cache that fills and is emptied), memory that is allocated and freed on alternate steps,
//!    and memory that grew and was then freed all fail this, however large they are;
//! 3. it rose in at least two of the intervals ([`MIN_STEPS_GROWN`]): one allocation made once
//!    after the warmup and then kept (optimizer state created on the first `step()`) is not
//!    "growing";
//! 4. it is still rising: the intervals since it first reached its highest value (its flat
//!    tail) are fewer than [`PLATEAU_MIN_STEPS`] or fewer than the intervals it took to get
//!    there from where the growth started. A site that grew and has since stayed flat at
//!    least as long as it grew (a cache filling up to its bound, a `deque(maxlen=N)`, an LRU
//!    dict capped at N) is **plateaued**: reported apart, as a note, never as a leak.
//!
//! The rate is measured from where the growth started: the last boundary at which the site stood
//! at its lowest (`start`), to the last boundary: `bytes_per_step = (v_last - v_start) /
//! (k_last - k_start)`, and the same for counts. A site that adds 1 MiB every step from the first
//! boundary gives exactly 1048576.0; one that starts leaking mid-run gives its true rate, not the
//! average over the whole run. For a plateaued site the rate is the one it grew at, up to its
//! highest value.

/// One site's value at one step boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    /// The step that began at this boundary (`torch_arena_step`'s return value).
    pub step: u64,
    pub bytes: u64,
    pub count: u64,
}

/// A site judged to be growing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Growth {
    pub bytes_per_step: f64,
    pub count_per_step: f64,
    /// Boundary the rate is measured from (where the growth started).
    pub from_step: u64,
    /// Intervals between consecutive boundaries in which the live bytes rose.
    pub steps_grown: u64,
    /// Boundary at which the site first stood at its highest live bytes.
    pub high_step: u64,
}

/// What [`judge`] concluded about a site that rose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// Still rising: a leak.
    Growing(Growth),
    /// Grew, then stayed flat at least as long as it grew: a bounded cache, not a leak.
    Plateaued(Growth),
}

impl Verdict {
    pub fn growth(&self) -> &Growth {
        match self {
            Verdict::Growing(g) | Verdict::Plateaued(g) => g,
        }
    }
}

/// Intervals in which a site must have risen to be reported.
pub const MIN_STEPS_GROWN: u64 = 2;

/// A flat tail shorter than this many intervals never makes a site plateaued.
pub const PLATEAU_MIN_STEPS: u64 = 3;

/// Judge one site's series (boundaries oldest first, at or after the warmup): `Some(Growing)`
/// for a leak, `Some(Plateaued)` for growth that stopped, None for a steady site.
pub fn verdict(series: &[Point]) -> Option<Verdict> {
    let (first, last) = (series.first()?, series.last()?);
    if series.len() < 2 || last.bytes <= first.bytes {
        return None;
    }
    let growth = last.bytes - first.bytes;
    let mut peak = 0u64;
    let mut drawdown = 0u64;
    let mut grown = 0u64;
    for (i, p) in series.iter().enumerate() {
        peak = peak.max(p.bytes);
        drawdown = drawdown.max(peak - p.bytes);
        if i > 0 && p.bytes > series[i - 1].bytes {
            grown += 1;
        }
    }
    if drawdown >= growth || grown < MIN_STEPS_GROWN {
        return None;
    }
    let low = series.iter().map(|p| p.bytes).min()?;
    let start = series.iter().rposition(|p| p.bytes == low)?;
    let from = series[start];
    let high = series[start..].iter().position(|p| p.bytes == peak)? + start;
    let top = series[high];
    let tail = last.step.saturating_sub(top.step);
    let span = top.step.saturating_sub(from.step);
    let plateaued = tail >= PLATEAU_MIN_STEPS && tail >= span;
    let end = if plateaued { top } else { *last };
    let steps = end.step.checked_sub(from.step).filter(|&s| s > 0)?;
    let g = Growth {
        bytes_per_step: (end.bytes - from.bytes) as f64 / steps as f64,
        count_per_step: (end.count as f64 - from.count as f64) / steps as f64,
        from_step: from.step,
        steps_grown: grown,
        high_step: top.step,
    };
    Some(if plateaued {
        Verdict::Plateaued(g)
    } else {
        Verdict::Growing(g)
    })
}

/// The growth of a site judged growing (a leak), None for steady or plateaued sites.
pub fn judge(series: &[Point]) -> Option<Growth> {
    match verdict(series)? {
        Verdict::Growing(g) => Some(g),
        Verdict::Plateaued(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn series(bytes: &[u64]) -> Vec<Point> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| Point {
                step: 2 + i as u64,
                bytes: b,
                count: b / MIB,
            })
            .collect()
    }

    #[test]
    fn steady_sites_are_silent() {
        assert_eq!(judge(&series(&[64 << 30; 10])), None);
        assert_eq!(judge(&series(&[0; 10])), None);
        assert_eq!(judge(&series(&[5 * MIB])), None);
        assert_eq!(judge(&[]), None);
    }

    #[test]
    fn a_planted_leak_is_exact() {
        let s: Vec<u64> = (0..10).map(|i| 3 * MIB + i * MIB).collect();
        let g = judge(&series(&s)).expect("growing");
        assert_eq!(g.bytes_per_step, 1048576.0);
        assert_eq!(g.count_per_step, 1.0);
        assert_eq!(g.from_step, 2);
        assert_eq!(g.steps_grown, 9);
    }

    #[test]
    fn alternating_and_sawtooth_are_silent() {
        assert_eq!(judge(&series(&[0, MIB, 0, MIB, 0, MIB])), None);
        assert_eq!(judge(&series(&[MIB, 0, MIB, 0, MIB, 0, MIB])), None);
        let saw: Vec<u64> = (0..20).map(|i| (i % 5) * MIB).collect();
        assert_eq!(judge(&series(&saw)), None);
    }

    #[test]
    fn growth_that_was_freed_is_silent() {
        assert_eq!(judge(&series(&[0, MIB, 2 * MIB, 3 * MIB, 0, 0])), None);
        assert_eq!(judge(&series(&[0, MIB, 2 * MIB, 3 * MIB, MIB, MIB])), None);
    }

    #[test]
    fn a_leak_starting_mid_run_has_its_true_rate() {
        let g = judge(&series(&[0, 0, 0, 0, MIB, 2 * MIB, 3 * MIB, 4 * MIB])).expect("growing");
        assert_eq!(g.bytes_per_step, MIB as f64);
        assert_eq!(g.from_step, 5);
        assert_eq!(g.steps_grown, 4);
    }

    #[test]
    fn a_noisy_leak_is_found() {
        // 1 MiB per step plus a 512 KiB temporary present at odd boundaries.
        let s: Vec<u64> = (0..12)
            .map(|i| i * MIB + if i % 2 == 1 { MIB / 2 } else { 0 })
            .collect();
        let g = judge(&series(&s)).expect("growing");
        assert!(g.bytes_per_step > 0.9 * MIB as f64 && g.bytes_per_step < 1.1 * MIB as f64);
    }

    #[test]
    fn a_single_jump_is_not_growth() {
        assert_eq!(judge(&series(&[0, 0, 0, 8 * MIB, 8 * MIB, 8 * MIB])), None);
    }

    #[test]
    fn a_cache_that_filled_and_stays_flat_is_plateaued_not_growing() {
        // Grows 1 MiB a step for 8 steps, then flat for 20: a bounded cache.
        let s: Vec<u64> = (0..29).map(|i| i.min(8) * MIB).collect();
        assert_eq!(judge(&series(&s)), None);
        let Some(Verdict::Plateaued(g)) = verdict(&series(&s)) else {
            panic!("plateaued expected: {:?}", verdict(&series(&s)));
        };
        assert_eq!(g.bytes_per_step, MIB as f64);
        assert_eq!((g.from_step, g.high_step), (2, 10));
        // Flat for fewer intervals than it grew: still a leak (a leak that paused).
        let s: Vec<u64> = (0..14).map(|i| i.min(8) * MIB).collect();
        assert!(matches!(verdict(&series(&s)), Some(Verdict::Growing(_))));
        // Flat for only two intervals never plateaus, however short the growth.
        assert!(judge(&series(&[0, MIB, 2 * MIB, 2 * MIB, 2 * MIB])).is_some());
        assert_eq!(
            judge(&series(&[0, MIB, 2 * MIB, 2 * MIB, 2 * MIB, 2 * MIB])),
            None
        );
    }

    #[test]
    fn a_leak_every_few_steps_stays_growing() {
        // +1 MiB every 5th step over 30 steps: flat tails of 4 between rises.
        let s: Vec<u64> = (0..30).map(|i| (i / 5) * MIB).collect();
        let g = judge(&series(&s)).expect("growing");
        assert!((g.bytes_per_step - MIB as f64 / 5.0).abs() < 0.25 * MIB as f64);
    }

    #[test]
    fn a_sawtooth_with_a_rising_floor_is_growth() {
        // Floor rises 1 MiB per step, plus a temporary 2 MiB swing: drawdown 2 MiB < growth.
        let s: Vec<u64> = (0..12)
            .map(|i| i * MIB + if i % 3 == 2 { 2 * MIB } else { 0 })
            .collect();
        assert!(judge(&series(&s)).is_some());
    }
}
