//! CUDA graph capture on the simulated GPU: what the driver forbids while a stream is captured,
//! and which memory a captured graph keeps using until it is destroyed.
//!
//! The model (from the CUDA programming guide's "Prohibited and Unhandled Operations" of stream
//! capture and the driver API's `cuThreadExchangeStreamCaptureMode`; a guess where those are
//! silent, marked so):
//! - [`SimDevice::begin_capture`] puts a stream in capture. Work launched on it is not run: it is
//!   recorded into the graph being built. [`SimDevice::end_capture`] ends the capture and returns
//!   the graph; [`SimDevice::replay`] launches the graph's work on any stream (as
//!   `cudaGraphLaunch` may); [`SimDevice::destroy_graph`] forgets it.
//! - Synchronising or querying a capturing stream, synchronising the device while any stream
//!   captures, and querying or waiting for an event last recorded on a capturing stream are
//!   refused (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, 900; `CUDA_ERROR_CAPTURED_EVENT`, 907 for
//!   the event) and recorded as violations: on a GPU they also invalidate the user's capture.
//! - Recording an event on a capturing stream succeeds, as on a GPU (it becomes a graph node),
//!   but is recorded as a violation: the allocator must never do it, since the event then says
//!   nothing about when memory is free.
//! - Unmapping, or releasing a physical page, that the work of a live graph (captured and not
//!   destroyed) uses is a violation: every later replay would fault or corrupt.
//! - Memory calls (create, map, unmap, reserve, release) are allowed during capture: the sim
//!   stands for a device whose implementation switches the calling thread to relaxed capture
//!   mode around them, as `CudaDevice` does. That the cuda device really does so is shown over
//!   the fake driver (`tests/fixtures/fakecuda.c`), which refuses them in global mode.

use super::state::*;
use crate::device::{DevPtr, DeviceError, DeviceResult, EventHandle, StreamId};

/// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
const CAPTURE_UNSUPPORTED: i32 = 900;
/// CUDA_ERROR_CAPTURED_EVENT.
const CAPTURED_EVENT: i32 = 907;

fn refused(call: &'static str, code: i32, what: String) -> DeviceError {
    DeviceError::Driver {
        call,
        code,
        message: what,
    }
}

impl State {
    /// A launch on a capturing stream goes into its graph instead of running. Returns whether it
    /// was captured.
    pub(super) fn capture_launch(
        &mut self,
        stream: StreamId,
        ptr: DevPtr,
        len: u64,
        pages: &[u64],
    ) -> bool {
        let Some(&g) = self.captures.active.get(&stream) else {
            return false;
        };
        self.captures
            .graphs
            .entry(g)
            .or_default()
            .push(GraphLaunch {
                ptr,
                len,
                pages: pages.to_vec(),
            });
        true
    }

    /// An event recorded on `stream`: remembered as captured if the stream is capturing.
    pub(super) fn capture_record(&mut self, event: EventHandle, stream: StreamId) {
        if self.captures.active.contains_key(&stream) {
            self.violations.push(format!(
                "cuEventRecord of event {:#x} on stream {stream} while it is being captured (the \
                 record becomes a graph node; its completion can never be queried)",
                event.0
            ));
            self.captures.captured_events.insert(event.0);
        } else {
            self.captures.captured_events.remove(&event.0);
        }
    }

    /// Refuses a query of or wait for an event last recorded on a capturing stream.
    pub(super) fn capture_check_event(
        &mut self,
        call: &'static str,
        event: EventHandle,
    ) -> DeviceResult<()> {
        if self.captures.captured_events.contains(&event.0) {
            let what = format!(
                "{call} of event {:#x}, last recorded on a capturing stream",
                event.0
            );
            self.violations.push(what.clone());
            return Err(refused(call, CAPTURED_EVENT, what));
        }
        Ok(())
    }

    /// Refuses a synchronisation of a capturing stream (`Some`) or of the device while any stream
    /// captures (`None`).
    pub(super) fn capture_check_sync(
        &mut self,
        call: &'static str,
        stream: Option<StreamId>,
    ) -> DeviceResult<()> {
        let conflict = match stream {
            Some(s) => self.captures.active.contains_key(&s).then_some(s),
            None => self.captures.active.keys().next().copied(),
        };
        if let Some(s) = conflict {
            let what = format!("{call} while stream {s} is being captured");
            self.violations.push(what.clone());
            return Err(refused(call, CAPTURE_UNSUPPORTED, what));
        }
        Ok(())
    }

    /// Records a violation if `[ptr, ptr+len)` (unmapped or freed) is used by a live graph.
    pub(super) fn note_graph_release(&mut self, call: &str, ptr: DevPtr, len: u64) {
        let mut found = Vec::new();
        for (g, launches) in &self.captures.graphs {
            for l in launches.iter().filter(|l| overlaps(ptr, len, l.ptr, l.len)) {
                found.push(format!(
                    "{call} of {ptr:#x}+{len} while graph {g} (captured, not destroyed) uses \
                     {:#x}+{}",
                    l.ptr, l.len
                ));
            }
        }
        self.violations.extend(found);
    }

    /// Records a violation if physical `page` (released) is used by a live graph.
    pub(super) fn note_graph_page_release(&mut self, page: u64) {
        let mut found = Vec::new();
        for (g, launches) in &self.captures.graphs {
            if launches.iter().any(|l| l.pages.contains(&page)) {
                found.push(format!(
                    "cuMemRelease of page {page:#x} while graph {g} (captured, not destroyed) \
                     uses it"
                ));
            }
        }
        self.violations.extend(found);
    }
}

impl SimDevice {
    /// Puts `stream` in capture (`cuStreamBeginCapture`). Fails if it is capturing already.
    pub fn begin_capture(&self, stream: StreamId) -> DeviceResult<()> {
        let mut s = self.state.lock();
        if s.captures.active.contains_key(&stream) {
            return Err(misuse(format!(
                "cuStreamBeginCapture: stream {stream} is already capturing"
            )));
        }
        s.captures.next_graph += 1;
        let g = s.captures.next_graph;
        s.captures.active.insert(stream, g);
        s.captures.graphs.insert(g, Vec::new());
        Ok(())
    }

    /// Ends the capture of `stream` (`cuStreamEndCapture`) and returns its graph, which keeps its
    /// memory in use until [`SimDevice::destroy_graph`].
    pub fn end_capture(&self, stream: StreamId) -> DeviceResult<u64> {
        let mut s = self.state.lock();
        s.captures.active.remove(&stream).ok_or_else(|| {
            misuse(format!(
                "cuStreamEndCapture: stream {stream} is not capturing"
            ))
        })
    }

    /// Launches every piece of work of graph `g` on `stream` (`cudaGraphLaunch`).
    pub fn replay(&self, g: u64, stream: StreamId) {
        let work: Vec<(DevPtr, u64)> = {
            let s = self.state.lock();
            s.captures
                .graphs
                .get(&g)
                .map(|ls| ls.iter().map(|l| (l.ptr, l.len)).collect())
                .unwrap_or_default()
        };
        for (ptr, len) in work {
            self.launch(stream, ptr, len);
        }
    }

    /// Forgets graph `g` (`cudaGraphExecDestroy`); its memory may be given back from now on,
    /// once the replays already launched have completed.
    pub fn destroy_graph(&self, g: u64) {
        self.state.lock().captures.graphs.remove(&g);
    }

    /// Streams capturing now.
    pub fn capturing_streams(&self) -> Vec<StreamId> {
        let mut v: Vec<StreamId> = self.state.lock().captures.active.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

impl SimDevice {
    /// Whether `stream` is capturing now (the answer of `Device::is_capturing`).
    pub fn is_stream_capturing(&self, stream: StreamId) -> bool {
        self.state.lock().captures.active.contains_key(&stream)
    }
}

impl SimDevice {
    /// Whether every byte of `[ptr, ptr+len)` is mapped (or in a plain allocation): a test reads
    /// host-backed memory only where this holds, instead of faulting.
    pub fn is_mapped(&self, ptr: DevPtr, len: u64) -> bool {
        let s = self.state.lock();
        let end = ptr.saturating_add(len);
        let mut at = ptr;
        while at < end {
            if let Some((start, m)) = s.mapping_at(at) {
                at = start + m.size;
            } else if let Some((start, size)) = s.plain_at(at) {
                at = start + size;
            } else {
                return false;
            }
        }
        true
    }
}
