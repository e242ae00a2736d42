"""Memory snapshots in PyTorch's ``torch.cuda.memory._snapshot()`` schema, from torch-arena.

``snapshot()`` returns the dict PyTorch's ``_snapshot()`` returns: ``segments`` (each with its
``blocks``, and each live block with the ``frames`` of the site that allocated it, when site
capture is on), ``device_traces`` (one list per device: the history ring's entries while
recording is on, see :func:`record_memory_history`, else empty), ``allocator_settings`` and
``external_annotations``. ``dump_snapshot(path)`` pickles it, as ``_dump_snapshot`` does, for
https://pytorch.org/memory_viz or ``python -m torch.cuda._memory_viz``. Once torch-arena is
enabled, torch.cuda.memory's ``_snapshot``, ``_dump_snapshot``, ``_record_memory_history`` and
``memory_snapshot`` answer from here. No torch needed.
"""

import os
import pickle
import sys
from typing import Any

from . import _capture, _native
from .stats import _device_index

__all__ = ["dump_snapshot", "memory_snapshot", "record_memory_history", "snapshot"]

# Ring size used for max_entries=sys.maxsize ("unbounded" in PyTorch): the library's ring is
# allocated as it fills, but a bound keeps a forgotten recording from growing forever.
UNBOUNDED_ENTRIES = 1 << 24


def _frames(site_frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """PyTorch's frame dicts: filename, line, name (native frames keep their symbol)."""
    return [
        {
            "filename": str(f.get("filename", "")),
            "line": int(f.get("line", 0)),
            "name": str(f.get("name", "")),
        }
        for f in site_frames
    ]


def _devices(device: Any) -> list[int]:
    if device is not None:
        return [_device_index(device)]
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        if cuda is not None and cuda.is_initialized():
            return list(range(cuda.device_count()))
    except Exception:
        pass
    return [0]


def _segments(device: int) -> list[dict[str, Any]]:
    layout = _native.layout_json(device)
    live = _native.live_json(device)
    sites = live.get("sites", {})
    by_ptr = {int(a["ptr"]): a for a in live.get("allocations", ())}
    segments = []
    for seg in layout.get("segments", ()):
        blocks = []
        allocated = requested = 0
        for b in seg.get("blocks", ()):
            state = b.get("state", "inactive")
            alloc = by_ptr.get(int(b["address"])) if state != "inactive" else None
            frames = _frames(sites.get(str(alloc.get("site", 0)), [])) if alloc else []
            block = {
                "address": int(b["address"]),
                "size": int(b["size"]),
                "requested_size": int(
                    b.get("requested_size", b["size"] if state != "inactive" else 0)
                ),
                "state": state,
                "frames": frames,
            }
            if state != "inactive":
                allocated += block["size"]
                requested += block["requested_size"]
            blocks.append(block)
        segments.append(
            {
                "device": device,
                "address": int(seg["address"]),
                "total_size": int(seg["total_size"]),
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": requested,
                "stream": int(seg.get("stream", 0)),
                "segment_type": seg.get("segment_type", "large"),
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
    return segments


def _trace(device: int) -> list[dict[str, Any]]:
    history = _native.history_json(device)
    sites = history.get("sites", {})
    return [
        {
            "action": e["action"],
            "addr": int(e.get("addr", 0)),
            "size": int(e.get("size", 0)),
            "stream": int(e.get("stream", 0)),
            "time_us": int(e.get("time_us", 0)),
            "frames": _frames(sites.get(str(e.get("site", 0)), [])),
        }
        for e in history.get("entries", ())
    ]


def snapshot(device: Any = None) -> dict[str, Any]:
    """The allocator's state in ``torch.cuda.memory._snapshot()``'s schema, for ``device`` (None:
    every device torch has initialised, else device 0). ``device_traces`` has one list per
    device index up to the highest one reported (empty lists for the others)."""
    devices = _devices(device)
    segments = [s for d in devices for s in _segments(d)]
    traces: list[list[dict[str, Any]]] = [[] for _ in range(max(devices) + 1)]
    for d in devices:
        traces[d] = _trace(d)
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "TORCH_ARENA_CONF": _native.installed_conf(),
            "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {},
        },
        "external_annotations": [],
    }


def memory_snapshot(device: Any = None) -> list[dict[str, Any]]:
    """``torch.cuda.memory_snapshot()``: the segments of :func:`snapshot`."""
    return snapshot(device)["segments"]


def dump_snapshot(path: str = "dump_snapshot.pickle", device: Any = None) -> str:
    """Pickle :func:`snapshot` to ``path`` (``{rank}`` and ``{pid}`` expanded), as
    ``torch.cuda.memory._dump_snapshot`` does; returns the path written. The file is replaced
    whole or not at all."""
    from ._paths import expand, write_whole

    path = expand(os.fspath(path))
    data = snapshot(device)
    # Whole or not at all: a kill or a full disk leaves the previous file, never half a pickle.
    write_whole(path, lambda f: pickle.dump(data, f), binary=True)
    return path


def record_memory_history(
    enabled: Any = "all",
    context: Any = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
    **ignored: Any,
) -> None:
    """``torch.cuda.memory._record_memory_history``: ``enabled="all"`` starts the history ring
    (``max_entries`` entries; PyTorch's unbounded default is capped at ``UNBOUNDED_ENTRIES``)
    and clears it; ``enabled=None`` stops it. ``context`` other than None captures the site of
    every allocation from now on (``stacks="python"``: Python frames; ``"all"``: Python and
    native); ``None`` leaves site capture as configured. ``enabled="state"`` records no trace
    (snapshots always show the live state). The legacy form ``(True/False, ...)`` is accepted.
    Every device shares one ring setting."""
    if isinstance(enabled, bool):  # legacy signature: _record_memory_history(True, ...)
        enabled = "all" if enabled else None
    if enabled not in (None, "state", "all"):
        raise ValueError(f"enabled must be None, 'state' or 'all', not {enabled!r}")
    if context not in (None, "state", "alloc", "all"):
        raise ValueError(f"context must be None, 'state', 'alloc' or 'all', not {context!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
    if enabled == "all":
        entries = max(1, min(int(max_entries), UNBOUNDED_ENTRIES))
        _native.history_enable(True, entries)
    else:
        _native.history_enable(False, 0)
    if enabled is not None and context is not None:
        _capture.set_capture("python" if stacks == "python" else "all", 1, 0)
    elif enabled is None:
        _capture.restore()
