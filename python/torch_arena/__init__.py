"""torch-arena: a CUDA caching allocator for PyTorch, written in Rust.

With no code change: ``pip install .`` then ``TORCH_ARENA=1 python train.py`` (settings in
``TORCH_ARENA_CONF``). From code, before CUDA initialises::

    import torch, torch_arena
    torch_arena.enable()                      # or TORCH_ARENA=1 in the environment
    x = torch.empty(1 << 20, device="cuda")   # served by torch-arena
    print(torch_arena.memory_summary())       # torch's table, plus the arena's section
    print(torch_arena.max_memory_allocated(), torch_arena.defragment())

Leak hunting (``TORCH_ARENA_CONF=leaks:True`` reports at exit): ``step()``, ``tag()``,
``leak_report()``, ``live_report()``, ``no_leaks()``, the pytest marker ``gpu_leaks``;
``snapshot()`` and ``dump_snapshot()`` write PyTorch's memory-snapshot schema
(docs/python.md, "Hunting leaks").

The statistics functions have torch.cuda.memory's names, signatures and keys, and work on the
simulated device (``TORCH_ARENA_CONF=device:sim``) without a GPU or torch. Importing this package
never imports torch: ``enable``, ``pool`` and ``is_enabled`` load the torch integration on first
use.
"""

from typing import Any

from ._exit import install as _install_exit_report
from ._explain import categorize, explain, track_modules
from ._native import OutOfMemoryError, configure, library_path
from ._native import version as _library_version
from ._oom import install as _install_oom_snapshot
from .leaks import (
    LeakError,
    current_step,
    leak_report,
    live_report,
    no_leaks,
    step,
    tag,
)
from .referrers import register_holder_type
from .snapshots import dump_snapshot, record_memory_history, snapshot
from .stats import (
    caching_allocator_alloc,
    caching_allocator_delete,
    defragment,
    empty_cache,
    growth,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    pages,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)

__version__ = _library_version()

# TORCH_ARENA_CONF=leaks:True: the leak report at exit, and a snapshot at out-of-memory (also
# with TORCH_ARENA_OOM_SNAPSHOT); enable(conf) checks its own text too.
_install_exit_report()
_install_oom_snapshot()

# Names served by the torch integration (._torch), imported on first access so that importing
# torch_arena does not import torch.
_TORCH_NAMES = ("enable", "is_enabled", "pool", "TorchArenaWarning")

__all__ = [
    "LeakError",
    "OutOfMemoryError",
    "TorchArenaWarning",
    "__version__",
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "categorize",
    "configure",
    "current_step",
    "defragment",
    "dump_snapshot",
    "empty_cache",
    "explain",
    "enable",
    "growth",
    "is_enabled",
    "leak_report",
    "library_path",
    "live_report",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "no_leaks",
    "pages",
    "pool",
    "record_memory_history",
    "register_holder_type",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
    "snapshot",
    "step",
    "tag",
    "track_modules",
]


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        from . import _torch

        value = getattr(_torch, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_TORCH_NAMES))
