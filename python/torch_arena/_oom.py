"""A memory snapshot written at out-of-memory, as PyTorch's OOM-observer recipe does
(``torch._C._cuda_attach_out_of_memory_observer`` + ``_dump_snapshot``, which a pluggable
allocator cannot use).

On with ``leaks:True`` in ``TORCH_ARENA_CONF``, or with ``TORCH_ARENA_OOM_SNAPSHOT`` set to a
file name (``{rank}`` and ``{pid}`` expanded; ``0`` turns it off even with ``leaks:True``).
The default name is ``torch-arena-oom-{rank}-{pid}.pickle`` in the working directory. Each OOM
overwrites the process's file with the state at that OOM.

Where it is written from:

* an OOM raised by torch_arena itself (``caching_allocator_alloc``, ``DeviceBuffer``): at
  once, with the allocation still failing, and the ``OutOfMemoryError`` message names the file;
* an OOM raised by a PyTorch operation (the plugin's C++ exception): PyTorch turns it into a
  ``RuntimeError`` that Python cannot see being raised, so the snapshot is written when the
  error reaches the top of a thread uncaught (``sys.excepthook`` / ``threading.excepthook``),
  while the traceback still holds the frames' tensors, and a line on stderr names the file. An
  OOM the program catches (a batch-size search) writes nothing.
"""

import os
import sys
import threading
from typing import Any

from . import _capture, _native, _paths

__all__ = ["install", "snapshot_path"]

ENV = "TORCH_ARENA_OOM_SNAPSHOT"
DEFAULT_NAME = "torch-arena-oom-{rank}-{pid}.pickle"
OOM_PREFIX = "CUDA out of memory."

_installed = False


def snapshot_path(conf: str | None = None) -> str | None:
    """The file an OOM snapshot goes to ({rank}/{pid} expanded), None when off."""
    name = os.environ.get(ENV)
    if name is not None:
        name = name.strip()
        return None if name in ("", "0") else _paths.expand(name)
    if _capture.leaks_configured(conf):
        return _paths.expand(DEFAULT_NAME)
    return None


def _dump(path: str) -> str:
    from .snapshots import dump_snapshot

    written = dump_snapshot(path)
    return (
        f"torch-arena: a memory snapshot at this out-of-memory error was written to {written} "
        "(open it at https://pytorch.org/memory_viz or python -m torch.cuda._memory_viz)"
    )


def _on_oom(message: str) -> str:
    path = snapshot_path()
    return _dump(path) if path else ""


def _is_oom(exc: BaseException | None) -> bool:
    return isinstance(exc, RuntimeError) and str(exc).startswith(OOM_PREFIX)


def _report_uncaught(exc: BaseException | None) -> None:
    if not _is_oom(exc) or "torch-arena: a memory snapshot" in str(exc):
        return
    path = snapshot_path()
    if path:
        try:
            print(_dump(path), file=sys.stderr)
        except Exception as e:  # never hide the OOM behind a failed dump
            print(f"torch-arena: the OOM snapshot could not be written: {e}", file=sys.stderr)


def install(conf: str | None = None) -> bool:
    """Write a snapshot at OOM from now on if ``conf`` (default: the configuration in force)
    or ``TORCH_ARENA_OOM_SNAPSHOT`` asks for it. Once per process; whether it is on."""
    global _installed
    if _installed:
        return True
    if snapshot_path(conf) is None:
        return False
    _installed = True
    _native.set_oom_hook(_on_oom)
    previous_hook = sys.excepthook

    def excepthook(tp: Any, value: BaseException, tb: Any) -> None:
        _report_uncaught(value)
        previous_hook(tp, value, tb)

    sys.excepthook = excepthook
    previous_thread_hook = threading.excepthook

    def thread_excepthook(args: Any) -> None:
        _report_uncaught(args.exc_value)
        previous_thread_hook(args)

    threading.excepthook = thread_excepthook
    return True
