"""Snapshots in PyTorch's _snapshot() schema, on the simulated device: they load in
torch.cuda._memory_viz and match the live set (same addresses and sizes)."""

import gc
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch_arena
from torch_arena import _capture, _native
from torch_arena.testing import DeviceBuffer

pytestmark = pytest.mark.skipif(
    not _native.has_track(), reason="this torch-arena library has no tracking exports"
)

MiB = 1 << 20
SIZES = [512, 4096, 100_000, MiB, 3 * MiB, 24 * MiB]


@pytest.fixture
def buffers():
    gc.collect()  # earlier tests' garbage must not be freed while the live set is compared
    _capture.set_capture("python", 1, 0)
    bufs = [DeviceBuffer(n) for n in SIZES]  # the allocating line
    try:
        yield bufs
    finally:
        _capture.restore()
        for b in bufs:
            b.free()


def active_blocks(snap):
    return {
        b["address"]: b
        for seg in snap["segments"]
        for b in seg["blocks"]
        if b["state"] == "active_allocated"
    }


def test_snapshot_has_pytorchs_top_level_keys_and_segment_fields(buffers):
    snap = torch_arena.snapshot()
    assert set(snap) >= {"segments", "device_traces", "allocator_settings", "external_annotations"}
    assert isinstance(snap["device_traces"], list) and isinstance(snap["device_traces"][0], list)
    for seg in snap["segments"]:
        assert {"device", "address", "total_size", "stream", "segment_type", "blocks"} <= set(seg)
        assert seg["segment_type"] in ("large", "small")
        # Blocks cover the segment contiguously.
        addr = seg["address"]
        for b in seg["blocks"]:
            assert b["address"] == addr
            addr += b["size"]
            assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
        assert addr == seg["address"] + seg["total_size"]


def test_snapshot_matches_the_live_set(buffers):
    snap = torch_arena.snapshot()
    live = _native.live_json(0)["allocations"]
    blocks = active_blocks(snap)
    assert {a["ptr"]: a["size"] for a in live} == {p: b["size"] for p, b in blocks.items()}
    for buf in buffers:
        block = blocks[buf.ptr]
        assert block["requested_size"] == buf.size
        assert block["size"] >= buf.size
        # The frames of the allocating site, innermost first, the test file among them.
        assert any(f["filename"].endswith("test_snapshot.py") for f in block["frames"]), block
    allocated = sum(b["size"] for b in blocks.values())
    assert allocated == torch_arena.memory_allocated(0)


def test_a_dumped_snapshot_loads_in_memory_viz(buffers, tmp_path):
    torch = pytest.importorskip("torch")  # noqa: F841 - _memory_viz is part of torch
    from torch.cuda import _memory_viz

    path = torch_arena.dump_snapshot(str(tmp_path / "snap.pickle"))
    with open(path, "rb") as f:
        data = pickle.load(f)
    assert active_blocks(data).keys() == active_blocks(torch_arena.snapshot()).keys()
    summary = _memory_viz.segsum(data)  # checks blocks add up to each segment
    assert f"segments: {len(data['segments'])}" in summary

    # The flame-graph input (format_flamegraph would download flamegraph.pl to render it).
    def raw(lines):
        return lines

    assert "test_snapshot.py" in _memory_viz.memory(data, format_flamegraph=raw)
    assert "test_snapshot.py" in _memory_viz.segments(data, format_flamegraph=raw)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "stats", path],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "total_reserved" in proc.stdout


def test_history_fills_device_traces_and_memory_viz_reads_it(tmp_path):
    pytest.importorskip("torch")
    from torch.cuda import _memory_viz

    torch_arena.record_memory_history(enabled="all", context="all", stacks="python")
    try:
        a = DeviceBuffer(2 * MiB)
        b = DeviceBuffer(MiB)
        ptr_a = a.ptr
        del a
        snap = torch_arena.snapshot()
    finally:
        torch_arena.record_memory_history(enabled=None)
    # Off again: nothing more is recorded.
    stopped = torch_arena.snapshot()["device_traces"][0]
    c = DeviceBuffer(MiB)
    assert torch_arena.snapshot()["device_traces"][0] == stopped
    c.free()
    trace = snap["device_traces"][0]
    actions = [(e["action"], e["addr"]) for e in trace]
    assert ("alloc", ptr_a) in actions and ("alloc", b.ptr) in actions
    assert any(a == "free_requested" and p == ptr_a for a, p in actions) or any(
        a == "free_completed" and p == ptr_a for a, p in actions
    )
    alloc_a = next(e for e in trace if e["action"] == "alloc" and e["addr"] == ptr_a)
    assert alloc_a["size"] == 2 * MiB
    assert any(f["filename"].endswith("test_snapshot.py") for f in alloc_a["frames"])
    text = _memory_viz.trace(snap)
    assert isinstance(text, str) and text.strip()
    b.free()


def test_memory_snapshot_is_the_segments(buffers):
    from torch_arena.snapshots import memory_snapshot

    assert active_blocks({"segments": memory_snapshot()}) == active_blocks(torch_arena.snapshot())


def _line_of(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    (n,) = [i for i, t in enumerate(lines, 1) if t.rstrip().endswith(f"# {marker}")]
    return n


def test_free_events_carry_their_own_stack_and_microsecond_times():
    torch_arena.record_memory_history(enabled="all", context="all", stacks="python")
    try:
        bufs = [DeviceBuffer(64 << 10) for _ in range(50)]  # ALLOC HERE
        ptr = bufs[0].ptr
        bufs.clear()  # FREE HERE
        trace = torch_arena.snapshot()["device_traces"][0]
    finally:
        torch_arena.record_memory_history(enabled=None)
    alloc = next(e for e in trace if e["action"] == "alloc" and e["addr"] == ptr)
    free = next(e for e in trace if e["action"] == "free_requested" and e["addr"] == ptr)
    mine = [f for f in free["frames"] if f["filename"].endswith("test_snapshot.py")]
    assert mine and mine[0]["line"] == _line_of("FREE HERE"), free["frames"]
    assert any(f["line"] == _line_of("ALLOC HERE") for f in alloc["frames"])
    assert free["time_us"] >= alloc["time_us"]
    # Microsecond resolution: a kernel-tick clock would put every stamp on a multiple of 1000.
    times = [e["time_us"] for e in trace]
    assert any(t % 1000 for t in times), times
