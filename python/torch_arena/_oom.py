"""A memory snapshot written at out-of-memory, as PyTorch's OOM-observer recipe does
(``torch._C._cuda_attach_out_of_memory_observer`` + ``_dump_snapshot``, which a pluggable
allocator cannot use).

On with ``leaks:True`` or ``explain:True`` in ``TORCH_ARENA_CONF``, or with
``TORCH_ARENA_OOM_SNAPSHOT`` set to a file name (``{rank}`` and ``{pid}`` expanded; ``0`` turns
it off even with ``leaks:True``).
The default name is ``torch-arena-oom-{rank}-{pid}.pickle`` in the working directory. Each OOM
overwrites the process's file with the state at that OOM, whole or not at all. A snapshot that
cannot be written (a missing folder, a full disk) says so in the error's message, with the
reason, and leaves the file written at an earlier OOM as it was.

It is written from the library's out-of-memory observer (``torch_arena_set_oom_observer``),
at the moment a request fails, before the error is raised: for an OOM inside a PyTorch
operation (the plugin's C++ exception, which PyTorch turns into ``torch.OutOfMemoryError``) as
for one of torch_arena's own (``caching_allocator_alloc``, ``DeviceBuffer``). The error's
message names the file. An OOM the program catches and recovers from (a batch-size search)
writes one too, overwriting the file.

With ``leaks:True`` or ``explain:True``, the message also gains one line from
:func:`torch_arena.explain` at that moment (the largest categories and the top remedy, with the
``smaller_batch`` and ``fragmentation`` remedies that need the failed request), and the whole
report is written as JSON beside the snapshot (``….explain.json``; without a snapshot,
``torch-arena-oom-{rank}-{pid}.explain.json``) and named in the line.
"""

import os

from . import _capture, _cpu_tensors, _native, _paths

__all__ = ["install", "snapshot_path"]

ENV = "TORCH_ARENA_OOM_SNAPSHOT"
DEFAULT_NAME = "torch-arena-oom-{rank}-{pid}.pickle"
OOM_PREFIX = "CUDA out of memory."

_installed = False


def explain_configured(conf: str | None = None) -> bool:
    """Whether ``conf`` (default: the configuration in force) asks for explain() at OOM:
    ``explain:True`` or ``leaks:True``."""
    items = _capture.conf(conf)
    return "True" in (items.get("explain"), items.get("leaks"))


def snapshot_path(conf: str | None = None) -> str | None:
    """The file an OOM snapshot goes to ({rank}/{pid} expanded), None when off."""
    name = os.environ.get(ENV)
    if name is not None:
        name = name.strip()
        return None if name in ("", "0") else _paths.expand(name)
    if _capture.leaks_configured(conf) or _capture.conf(conf).get("explain") == "True":
        return _paths.expand(DEFAULT_NAME)
    return None


def report_path(snapshot: str | None) -> str:
    """Where the explain() report at OOM goes: beside the snapshot, else the default name."""
    base = snapshot if snapshot else _paths.expand(DEFAULT_NAME)
    stem = base[: -len(".pickle")] if base.endswith(".pickle") else base
    return stem + ".explain.json"


def _dump(path: str) -> str:
    from .snapshots import dump_snapshot

    written = dump_snapshot(path)
    return (
        f"torch-arena: a memory snapshot at this out-of-memory error was written to {written} "
        "(open it at https://pytorch.org/memory_viz or python -m torch.cuda._memory_viz)"
    )


def _on_oom(device: int, size: int) -> str:
    lines = []
    path = snapshot_path()
    if path:
        try:
            lines.append(_dump(path))
        except Exception as exc:  # a missing folder, a full disk: say so in the error's message
            what = " ".join(str(exc).split()) or type(exc).__name__
            lines.append(
                f"torch-arena: the memory snapshot at this out-of-memory error could not be "
                f"written to {path}: {what} (set {ENV} to a writable file, or to 0 to turn it "
                "off)"
            )
    if explain_configured():
        lines.append(_explain_line(device, size, path))
    return "\n".join(lines)


def _explain_line(device: int, size: int, snapshot: str | None) -> str:
    """explain()'s line for the message, its report written beside the snapshot. Never raises:
    a report that cannot be made or written says why in the line."""
    import json

    from . import _explain

    try:
        on = "cpu" if _cpu_tensors.active() else f"cuda:{device}"
        report = _explain.report_at_oom(device, size, on)
    except Exception as exc:
        return f"torch-arena explain: no report ({type(exc).__name__}: {exc})"
    out = report_path(snapshot)
    try:
        _paths.write_whole(out, lambda f: json.dump(report, f, indent=1))
    except Exception as exc:
        what = " ".join(str(exc).split()) or type(exc).__name__
        return (
            _explain.oom_line(report, None) + f"; the report could not be written to {out}: {what}"
        )
    return _explain.oom_line(report, out)


def install(conf: str | None = None) -> bool:
    """Write a snapshot at OOM from now on if ``conf`` (default: the configuration in force)
    or ``TORCH_ARENA_OOM_SNAPSHOT`` asks for it. Once per process; whether it is on."""
    global _installed
    if _installed:
        return True
    if snapshot_path(conf) is None and not explain_configured(conf):
        return False
    _installed = True
    _native.set_oom_hook(_on_oom)
    return True
