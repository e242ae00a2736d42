//! Failure injection: planned and random failures of chosen driver calls.

use super::state::*;

impl Faults {
    /// Counts a call of `kind` and returns its number.
    pub(super) fn begin(&mut self, kind: SimCall) -> u64 {
        self.calls[kind.index()] += 1;
        self.calls[kind.index()]
    }

    /// Whether call number `n` of `kind` (already validated) must fail.
    pub(super) fn fails(&mut self, kind: SimCall, n: u64) -> bool {
        let before = self.planned.len();
        self.planned.retain(|&(k, at)| !(k == kind && at == n));
        let mut fail = self.planned.len() != before;
        if matches!(kind, SimCall::Reserve | SimCall::Create | SimCall::Map)
            && let Some((state, one_in)) = &mut self.random
        {
            // xorshift64: deterministic for a given seed and call sequence.
            let mut x = *state;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *state = x;
            fail |= x.is_multiple_of(*one_in);
        }
        fail
    }
}

impl SimDevice {
    /// Makes the `n`-th future call of `call` fail (1 = the next one; 0 is taken as 1). Calls
    /// that break the contract count too, but return `Misuse` rather than the injected failure.
    pub fn fail_nth(&self, call: SimCall, n: u64) {
        let mut s = self.state.lock();
        let at = s.faults.calls[call.index()] + n.max(1);
        s.faults.planned.push((call, at));
    }

    /// Makes each Reserve, Create and Map call fail with probability `1/one_in`, from a
    /// deterministic generator seeded by `seed`. `one_in == 0` stops random failures.
    pub fn fail_randomly(&self, seed: u64, one_in: u64) {
        let mut s = self.state.lock();
        // xorshift's state must not be zero.
        s.faults.random = (one_in > 0).then_some((seed | 1, one_in));
    }

    /// Cancels every planned and random failure.
    pub fn stop_failing(&self) {
        let mut s = self.state.lock();
        s.faults.planned.clear();
        s.faults.random = None;
    }
}
