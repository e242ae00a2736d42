//! Leak judgement: which allocation sites keep growing from step to step.
//!
//! Input: for one site, its live bytes and count at each step boundary (`torch_arena_step`)
//! from the first boundary at or after the warmup on, oldest first. A site is **growing** when
//!
//! 1. its live bytes at the last boundary exceed those at the first (it rose overall): growth
//!    `G = v_last - v_first > 0`;
//! 2. it never fell by as much as it grew: the largest fall from an earlier boundary to a later
//!    one (the deepest drawdown, `max over i < j of v_i - v_j`) is below `G`. A sawtooth (a
//!    cache that fills and is emptied), memory that is allocated and freed on alternate steps,
//!    and memory that grew and was then freed all fail this, however large they are;
//! 3. it rose in at least two of the intervals ([`MIN_STEPS_GROWN`]): one allocation made once
//!    after the warmup and then kept (optimizer state created on the first `step()`) is not
//!    "growing".
//!
//! The rate is measured from where the growth started: the last boundary at which the site stood
//! at its lowest (`start`), to the last boundary: `bytes_per_step = (v_last - v_start) /
//! (k_last - k_start)`, and the same for counts. A site that adds 1 MiB every step from the first
//! boundary gives exactly 1048576.0; one that starts leaking mid-run gives its true rate, not the
//! average over the whole run.

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
}

/// Intervals in which a site must have risen to be reported.
pub const MIN_STEPS_GROWN: u64 = 2;

/// Judge one site's series (boundaries oldest first, at or after the warmup).
pub fn judge(series: &[Point]) -> Option<Growth> {
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
    let steps = last.step.checked_sub(from.step).filter(|&s| s > 0)?;
    Some(Growth {
        bytes_per_step: (last.bytes - from.bytes) as f64 / steps as f64,
        count_per_step: (last.count as f64 - from.count as f64) / steps as f64,
        from_step: from.step,
        steps_grown: grown,
    })
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
    fn a_sawtooth_with_a_rising_floor_is_growth() {
        // Floor rises 1 MiB per step, plus a temporary 2 MiB swing: drawdown 2 MiB < growth.
        let s: Vec<u64> = (0..12)
            .map(|i| i * MIB + if i % 3 == 2 { 2 * MIB } else { 0 })
            .collect();
        assert!(judge(&series(&s)).is_some());
    }
}
