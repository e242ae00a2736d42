//! The simulated GPU's asynchrony: streams, queued launches, the modelled host clock and events.

use super::state::*;
use crate::device::{DevPtr, DeviceResult, EventHandle, StreamId};

impl State {
    /// Uncompleted launches overlapping `[ptr, ptr+len)`.
    pub(super) fn busy_over(&self, ptr: DevPtr, len: u64) -> Vec<(StreamId, &Launch)> {
        let mut found: Vec<(StreamId, &Launch)> = self
            .streams
            .iter()
            .flat_map(|(&s, st)| st.pending.iter().map(move |l| (s, l)))
            .filter(|(_, l)| overlaps(ptr, len, l.ptr, l.len))
            .collect();
        found.sort_by_key(|&(s, l)| (s, l.seq));
        found
    }

    /// Records a violation if memory `[ptr, ptr+len)` is given back while a launch may use it.
    pub(super) fn note_busy_release(&mut self, call: &str, ptr: DevPtr, len: u64) {
        let found: Vec<String> = self
            .busy_over(ptr, len)
            .into_iter()
            .map(|(s, l)| describe_use(s, l))
            .collect();
        for use_ in found {
            self.violations
                .push(format!("{call} of {ptr:#x}+{len} while {use_}"));
        }
        self.note_graph_release(call, ptr, len);
    }

    /// Completes the work of `stream` up to its `submitted` count `upto`. With `wait` (a
    /// synchronising driver call), the host blocks until the last of that work is due on the
    /// modelled clock: the wait is added to `stall_ns` and the clock moves on to then.
    pub(super) fn complete_upto(&mut self, stream: StreamId, upto: u64, wait: bool) {
        let mut due = 0;
        if let Some(st) = self.streams.get_mut(&stream) {
            st.completed = st.completed.max(upto.min(st.submitted));
            while st.pending.front().is_some_and(|l| l.seq <= upto) {
                let l = st.pending.pop_front().expect("checked");
                due = due.max(l.due_ns.unwrap_or(0));
            }
        }
        if wait {
            self.wait_until(due);
        }
    }

    /// The host waits until `due_ns` on the modelled clock (nothing if that has passed).
    pub(super) fn wait_until(&mut self, due_ns: u64) {
        if due_ns > self.now_ns {
            self.stall_ns += due_ns - self.now_ns;
            self.now_ns = due_ns;
        }
    }

    pub(super) fn complete_stream(&mut self, stream: StreamId, wait: bool) {
        let upto = self.streams.get(&stream).map_or(0, |st| st.submitted);
        self.complete_upto(stream, upto, wait);
    }

    pub(super) fn complete_all(&mut self, wait: bool) {
        let mut due = 0;
        for st in self.streams.values_mut() {
            st.completed = st.submitted;
            for l in st.pending.drain(..) {
                due = due.max(l.due_ns.unwrap_or(0));
            }
        }
        if wait {
            self.wait_until(due);
        }
    }

    pub(super) fn event(
        &self,
        call: &str,
        event: EventHandle,
    ) -> DeviceResult<Option<(StreamId, u64)>> {
        match self.events.get(&event.0) {
            Some(&last) => Ok(last),
            None => Err(misuse(format!(
                "{call}: event {:#x} does not exist",
                event.0
            ))),
        }
    }
}

pub(super) fn describe_use(stream: StreamId, launch: &Launch) -> String {
    format!(
        "stream {stream} may still use {:#x}+{} (launch #{} on that stream, not completed)",
        launch.ptr, launch.len, launch.seq
    )
}

impl SimDevice {
    /// Queues a "kernel" on `stream` that uses `[ptr, ptr+len)` until the stream completes it.
    /// A range not entirely covered by mappings and plain allocations is recorded as a
    /// violation, as the kernel would fault on a real GPU.
    pub fn launch(&self, stream: StreamId, ptr: DevPtr, len: u64) {
        self.launch_at(stream, ptr, len, None);
    }

    /// Like [`SimDevice::launch`], but the GPU finishes the work by itself at `due_ns` on the
    /// modelled clock (once [`SimDevice::advance_to`] reaches it, or when a synchronising call
    /// waits for it). Launches on one stream finish in order, so give each stream's launches
    /// non-decreasing due times.
    pub fn launch_until(&self, stream: StreamId, ptr: DevPtr, len: u64, due_ns: u64) {
        self.launch_at(stream, ptr, len, Some(due_ns));
    }

    pub(super) fn launch_at(&self, stream: StreamId, ptr: DevPtr, len: u64, due_ns: Option<u64>) {
        let mut s = self.state.lock();
        let end = ptr.saturating_add(len);
        let mut pages = Vec::new();
        let mut at = ptr;
        while at < end {
            if let Some((start, m)) = s.mapping_at(at) {
                pages.push(m.page);
                at = start + m.size;
            } else if let Some((start, size)) = s.plain_at(at) {
                at = start + size;
            } else {
                s.violations.push(format!(
                    "launch on stream {stream} of {ptr:#x}+{len} touches {at:#x}, which is not \
                     mapped"
                ));
                break;
            }
        }
        if s.capture_launch(stream, ptr, len, &pages) {
            return;
        }
        let st = s.streams.entry(stream).or_default();
        st.submitted += 1;
        let seq = st.submitted;
        st.pending.push_back(Launch {
            seq,
            ptr,
            len,
            pages,
            due_ns,
        });
    }

    /// Moves the modelled host clock to `now_ns` (never backwards) and completes, on every
    /// stream, the launches due by then, in stream order.
    pub fn advance_to(&self, now_ns: u64) {
        let mut s = self.state.lock();
        s.now_ns = s.now_ns.max(now_ns);
        let now = s.now_ns;
        for st in s.streams.values_mut() {
            let mut popped = false;
            while st
                .pending
                .front()
                .is_some_and(|l| l.due_ns.is_some_and(|d| d <= now))
            {
                st.pending.pop_front();
                popped = true;
            }
            if popped {
                st.completed = st.pending.front().map_or(st.submitted, |l| l.seq - 1);
            }
        }
    }

    /// The modelled host clock in nanoseconds: the latest `advance_to`, plus any time the host
    /// spent waiting in a synchronising call.
    pub fn now_ns(&self) -> u64 {
        self.state.lock().now_ns
    }

    /// Host time spent blocked in synchronising calls (cuEventSynchronize, cuStreamSynchronize,
    /// cuCtxSynchronize) for launches not yet due on the modelled clock, in nanoseconds.
    pub fn stall_ns(&self) -> u64 {
        self.state.lock().stall_ns
    }

    /// Completes all work queued on `stream` so far (the GPU finished it; no host wait).
    pub fn complete(&self, stream: StreamId) {
        self.state.lock().complete_stream(stream, false);
    }

    /// Completes all work on every stream (no host wait).
    pub fn complete_all(&self) {
        self.state.lock().complete_all(false);
    }

    /// `(stream, ptr, len)` of every uncompleted launch, by stream then launch order.
    pub fn busy_ranges(&self) -> Vec<(StreamId, DevPtr, u64)> {
        self.busy_overlapping(0, u64::MAX)
    }

    /// `(stream, ptr, len)` of every uncompleted launch overlapping `[ptr, ptr+len)`: a block the
    /// arena hands out on stream S must not overlap one of another stream.
    pub fn busy_overlapping(&self, ptr: DevPtr, len: u64) -> Vec<(StreamId, DevPtr, u64)> {
        let s = self.state.lock();
        s.busy_over(ptr, len)
            .into_iter()
            .map(|(st, l)| (st, l.ptr, l.len))
            .collect()
    }

    /// `(submitted, completed)` work counts of `stream` (0, 0 for a stream never used).
    pub fn stream_progress(&self, stream: StreamId) -> (u64, u64) {
        let s = self.state.lock();
        s.streams
            .get(&stream)
            .map_or((0, 0), |st| (st.submitted, st.completed))
    }

    /// Every stream-safety violation seen so far, oldest first.
    pub fn violations(&self) -> Vec<String> {
        self.state.lock().violations.clone()
    }
}
