"""The torch integration: switch torch-arena on as PyTorch's CUDA allocator, or use it in a pool.

Two modes (docs/python.md has the details):

* **Global** -- :func:`enable` (or ``TORCH_ARENA=1`` in the environment, see ``_autostart``):
  every CUDA tensor of the process comes from torch-arena. PyTorch allows this only before CUDA
  initialises, and only once per process. ``torch.cuda.memory_stats()`` and the other statistics
  functions, which raise under any pluggable allocator, are redirected to torch-arena's figures
  (same keys, meanings and text).
* **Pool** -- ``with torch_arena.pool():``: PyTorch's native allocator stays global and carves
  the block's tensors from segments that torch-arena supplies (``torch.cuda.MemPool``). Stats,
  snapshots and OOM handling stay PyTorch's own.

This module never imports torch at import time: only its functions do, when called.
"""

import contextlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from . import _cpu_tensors, _native

__all__ = [
    "TorchArenaWarning",
    "enable",
    "installed_hooks",
    "is_enabled",
    "original",
    "pool",
    "step_hook",
]

_log = logging.getLogger("torch_arena")


class TorchArenaWarning(UserWarning):
    """A PyTorch feature or setting that does not work, or no longer applies, under torch-arena.
    The message says what to do instead."""


# PyTorch's optional hooks: (setter on torch._C._CUDAPluggableAllocator, our export). A setter
# missing from this torch, or an export missing from this library, is skipped. The three pool
# hooks (CUDA graph capture, docs/cuda-graphs.md) are C++ functions of the shim: begin takes the
# capture's filter as a std::function, by value, built by PyTorch's libstdc++ code.
_HOOKS: tuple[tuple[str, str], ...] = (
    ("set_init_fn", "torch_arena_init"),
    ("set_reset_fn", "torch_arena_empty_cache"),
    ("set_memory_fraction_fn", "torch_arena_set_memory_fraction"),
    ("set_record_stream_fn", "torch_arena_record_stream"),
    ("set_base_alloc_fn", "torch_arena_base_alloc"),
    ("set_begin_allocate_to_pool", "torch_arena_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "torch_arena_end_allocate_to_pool"),
    ("set_release_pool", "torch_arena_release_pool"),
)

# torch.cuda.memory's statistics functions that raise under a pluggable allocator, each replaced
# (in torch.cuda and torch.cuda.memory) by the function of the same name in torch_arena.stats.
# The deprecated aliases (memory_cached, max_memory_cached, reset_max_memory_cached) call these
# through torch.cuda.memory's globals, so they follow.
PATCHED_NAMES: tuple[str, ...] = (
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_summary",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "reset_accumulated_memory_stats",
)

# torch.cuda's maintenance functions that reach the allocator only through CUDA: on a GPU they
# arrive at the pluggable allocator's hooks (reset, memory fraction), but on the simulated device
# torch's CUDA never initialises, so empty_cache() did nothing and
# set_per_process_memory_fraction() raised "Found no NVIDIA driver". Replaced there only.
SIM_NAMES: tuple[str, ...] = (
    "empty_cache",
    "set_per_process_memory_fraction",
)

# torch.accelerator's memory functions (PyTorch 2.9+), replaced the same way when present, in
# torch.accelerator and torch.accelerator.memory. They reach the allocator registered for CUDA
# with c10::SetAllocator, which change_current_allocator does not update (it swaps only
# c10::cuda::CUDACachingAllocator's pointer), so under torch-arena they would read the unused
# native allocator. Their device_index argument is positional-only, so ours fit.
ACCELERATOR_NAMES: tuple[str, ...] = (
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "empty_cache",
)

# torch.cuda.memory's snapshot and history functions, which raise under a pluggable allocator,
# each replaced (in torch.cuda.memory, and in torch.cuda where it has the name) by torch-arena's.
SNAPSHOT_NAMES: tuple[str, ...] = (
    "_snapshot",
    "_dump_snapshot",
    "_record_memory_history",
    "memory_snapshot",
)

_MALLOC = "torch_arena_malloc"
_FREE = "torch_arena_free"

_lock = threading.RLock()


class _Global:
    """What :func:`enable` installed. One instance, never reset: PyTorch cannot go back."""

    def __init__(self) -> None:
        self.enabled = False
        # The CUDAPluggableAllocator object. Held for the life of the process: PyTorch keeps only
        # the C++ object, and the library must stay loaded while any tensor lives (vLLM PR
        # #23477).
        self.allocator: Any = None
        # The configuration text in force ("" = defaults), to tell a repeated enable() from a
        # conflicting one.
        self.conf = ""
        # Setter names that were set on the allocator, in _HOOKS order.
        self.hooks: tuple[str, ...] = ()
        # (module name, function name) -> PyTorch's original function.
        self.originals: dict[tuple[str, str], Any] = {}
        # The handle of the global optimizer step hook that advances torch-arena's step.
        self.step_hook: Any = None


_global = _Global()

# Pool mode: the allocator object and one MemPool per device, built on first use and kept for the
# life of the process (a MemPool must not outlive its allocator: pytorch#146431).
_pool_allocator: Any = None
_pools: dict[int, Any] = {}


# ---------------------------------------------------------------------------------------------
# Helpers.


def _normalise(conf: str) -> str:
    """A configuration text compared the way the parser reads it: whitespace is insignificant."""
    return "".join(conf.split())


def _effective_conf(conf: str | None) -> str:
    """The text that applies: ``conf``, else TORCH_ARENA_CONF, else "" (the defaults)."""
    return os.environ.get("TORCH_ARENA_CONF", "") if conf is None else conf


def _install_conf(conf: str | None) -> str:
    """Validate, then install, the configuration; return the text in force.

    A bad text raises ValueError naming the key, the value and the accepted forms (nothing is
    installed). A good text that differs from the one the library already runs with (the
    library starts on its first use, e.g. a statistics call) raises RuntimeError.
    """
    text = _effective_conf(conf)
    if not isinstance(text, str):
        raise TypeError(f"conf must be a str or None, not {type(text).__name__}")
    _native.check_config(text)  # ValueError naming the key
    try:
        _native.configure(text)
    except ValueError as exc:
        raise RuntimeError(
            f"torch-arena cannot use the configuration {text!r}: the allocator already runs in "
            f"this process with another one ({exc}). The configuration is process-wide and "
            "fixed at first use: set TORCH_ARENA_CONF before the program starts, or pass conf "
            "to the first torch_arena call."
        ) from exc
    return text


def _symbol(name: str) -> int:
    """The address of export ``name`` of the library, 0 when the library lacks it."""
    try:
        return int(_native.symbol_address(name) or 0)
    except AttributeError:
        return 0


def _stats_functions(names: tuple[str, ...]) -> dict[str, Any]:
    """torch_arena.stats's replacement for each of ``names``."""
    from . import stats

    missing = [name for name in names if not callable(getattr(stats, name, None))]
    if missing:
        raise RuntimeError(f"torch_arena.stats lacks {', '.join(missing)}: a broken install")
    return {name: getattr(stats, name) for name in names}


def _snapshot_functions() -> dict[str, Any]:
    """Replacements for SNAPSHOT_NAMES, with PyTorch's signatures."""
    from . import snapshots as snapshot

    def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
        return snapshot.snapshot(device)

    def _dump_snapshot(
        filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False
    ) -> None:
        snapshot.dump_snapshot(filename)

    def memory_snapshot(mempool_id: Any = None) -> list[dict[str, Any]]:
        return snapshot.memory_snapshot()

    for fn, name in (
        (_snapshot, "_snapshot"),
        (_dump_snapshot, "_dump_snapshot"),
        (memory_snapshot, "memory_snapshot"),
    ):
        fn.__doc__ = (
            f"torch-arena's replacement for torch.cuda.memory.{name} (torch_arena.snapshots)"
        )
    return {
        "_snapshot": _snapshot,
        "_dump_snapshot": _dump_snapshot,
        "_record_memory_history": snapshot.record_memory_history,
        "memory_snapshot": memory_snapshot,
    }


def _patch_plan(torch: Any, sim: bool = False) -> list[tuple[Any, str, str, Any]]:
    """(module, module name, function name, replacement) for every function to replace
    (``sim``: the configuration's device is the simulated one)."""
    plan = []
    cuda = _stats_functions(PATCHED_NAMES + (SIM_NAMES if sim else ()))
    snapshots = _snapshot_functions()
    for module, module_name in (
        (torch.cuda, "torch.cuda"),
        (torch.cuda.memory, "torch.cuda.memory"),
    ):
        plan += [(module, module_name, name, fn) for name, fn in cuda.items()]
        plan += [
            (module, module_name, name, fn)
            for name, fn in snapshots.items()
            if module is torch.cuda.memory or callable(getattr(module, name, None))
        ]
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        acc = _stats_functions(ACCELERATOR_NAMES)
        modules = [(accelerator, "torch.accelerator")]
        if getattr(accelerator, "memory", None) is not None:
            modules.append((accelerator.memory, "torch.accelerator.memory"))
        for module, module_name in modules:
            plan += [
                (module, module_name, name, fn)
                for name, fn in acc.items()
                if callable(getattr(module, name, None))
            ]
    return plan


def _check_torch(torch: Any) -> None:
    """Raise RuntimeError when this torch cannot take a pluggable CUDA allocator."""
    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    needed = ("CUDAPluggableAllocator", "change_current_allocator")
    if memory is None or not all(hasattr(memory, name) for name in needed):
        raise RuntimeError(
            f"torch-arena needs torch.cuda.memory.CUDAPluggableAllocator (PyTorch 2.0 or newer); "
            f"this is torch {getattr(torch, '__version__', '?')}"
        )
    if not hasattr(torch._C, "_cuda_customAllocator"):
        raise RuntimeError(
            f"torch {torch.__version__} was built without CUDA, so it has no pluggable CUDA "
            "allocator to install torch-arena as; install a CUDA build of torch"
        )


def _cuda_initialised_error(detail: str = "") -> RuntimeError:
    return RuntimeError(
        "torch-arena cannot be switched on: CUDA is already initialised in this process"
        f"{detail}, and PyTorch can swap its allocator only before CUDA starts (and only once). "
        "Switch torch-arena on before the first CUDA call: set TORCH_ARENA=1 in the environment "
        "(the allocator is then installed as torch is imported), or call torch_arena.enable() "
        "before any torch.cuda use (model.cuda(), torch.cuda.init(), torch.cuda.set_device(), "
        "a tensor created on 'cuda', a CUDA extension loaded with load_inline(with_cuda=True), "
        "...). Nothing was changed."
    )


def _enable_warnings(torch: Any) -> list[str]:
    """Messages for what can be seen at enable time that will not work, or no longer applies."""
    messages = []
    try:
        benchmark = bool(torch.backends.cudnn.benchmark)
    except Exception:
        benchmark = False
    if benchmark:
        messages.append(_CUDNN_BENCHMARK_MESSAGE)
    if _inductor_cudagraph_trees():
        messages.append(_CUDAGRAPH_TREES_MESSAGE)
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        text = os.environ.get(var, "")
        # pinned_* options configure the pinned host allocator, which stays PyTorch's.
        ignored = [key for key in _native.conf_items(text) if not key.startswith("pinned_")]
        if ignored:
            messages.append(
                f"{var}={text!r} no longer applies to CUDA memory ({', '.join(ignored)}): "
                "torch-arena replaces PyTorch's caching allocator. Set torch-arena's options in "
                "TORCH_ARENA_CONF instead (the same key:value grammar, its own keys: "
                "device, stitch, release_idle_ms, memory_fraction, page_size_mb, ...)."
            )
    return messages


def _inductor_cudagraph_trees() -> bool:
    """Whether torch.compile is already set to use CUDA graphs through cudagraph trees: by
    TORCHINDUCTOR_CUDAGRAPHS=1, or by torch._inductor.config if something imported it (it is not
    imported here: that would slow every enable() down). mode="reduce-overhead" decides it only
    at compile time, out of sight."""
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        try:
            return bool(config.triton.cudagraphs and config.triton.cudagraph_trees)
        except Exception:
            return False
    return os.environ.get("TORCHINDUCTOR_CUDAGRAPHS") == "1"


_CUDAGRAPH_TREES_MESSAGE = (
    "torch.compile is set to use CUDA graphs (TORCHINDUCTOR_CUDAGRAPHS=1 or "
    "torch._inductor.config.triton.cudagraphs, as mode='reduce-overhead' sets): its cudagraph "
    "trees need the allocator's checkpoint and live-allocation queries (getCheckpointState, "
    "checkPoolLiveAllocations), which PyTorch does not offer for any pluggable allocator "
    "(pytorch/pytorch#163257), so compiled functions will fail with 'does not yet support "
    "getCheckpointState'. Set torch._inductor.config.triton.cudagraph_trees = False (inductor "
    "then captures with torch.cuda.graph, which torch-arena supports), or compile without CUDA "
    "graphs (mode='max-autotune-no-cudagraphs'). torch.cuda.graph and "
    "torch.cuda.make_graphed_callables work as they are."
)

_CUDNN_BENCHMARK_MESSAGE = (
    "torch.backends.cudnn.benchmark is True: cuDNN's benchmark mode sizes its workspace with "
    "the allocator's cacheInfo, which PyTorch does not offer for pluggable allocators, so "
    "convolutions will fail with 'CUDAPluggableAllocator does not yet support cacheInfo'. "
    "Set torch.backends.cudnn.benchmark = False (Lightning: Trainer(benchmark=False))."
)


class _WarnOnBenchmark:
    """Stands in for ``CudnnModule.benchmark`` (a data descriptor) after enable(): reads and
    writes go to PyTorch's descriptor; setting it True warns once."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.warned = False

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self.inner.__get__(obj, objtype)

    def __set__(self, obj: Any, value: Any) -> None:
        self.inner.__set__(obj, value)
        if value and not self.warned:
            self.warned = True
            warnings.warn(_CUDNN_BENCHMARK_MESSAGE, TorchArenaWarning, stacklevel=2)


def _watch_cudnn_benchmark(torch: Any) -> None:
    """Make a later ``torch.backends.cudnn.benchmark = True`` warn. Best effort: if torch's
    module layout is not the expected one, nothing changes."""
    try:
        cls = type(torch.backends.cudnn)
        inner = cls.__dict__.get("benchmark")
        if inner is None or isinstance(inner, _WarnOnBenchmark):
            return
        if not (hasattr(inner, "__get__") and hasattr(inner, "__set__")):
            return
        wrapper = _WarnOnBenchmark(inner)
        wrapper.warned = bool(torch.backends.cudnn.benchmark)  # already warned at enable
        setattr(cls, "benchmark", wrapper)  # noqa: B010 (a descriptor, set on the class)
    except Exception:  # pragma: no cover - defensive
        _log.debug("torch-arena: cannot watch torch.backends.cudnn.benchmark", exc_info=True)


def _rank_text() -> str:
    parts = [f"{name}={os.environ[name]}" for name in ("RANK", "LOCAL_RANK") if name in os.environ]
    return ", ".join(parts) if parts else "single process"


# ---------------------------------------------------------------------------------------------
# Global mode.


def is_enabled() -> bool:
    """Whether torch-arena is PyTorch's CUDA allocator in this process (global mode)."""
    return _global.enabled


def enable(conf: str | None = None) -> None:
    """Make torch-arena PyTorch's CUDA allocator for the rest of the process.

    ``conf`` is a configuration text (``TORCH_ARENA_CONF`` grammar, e.g. ``"release_idle_ms:500"``);
    None uses ``TORCH_ARENA_CONF`` (or the defaults). The allocator gets every optional hook
    PyTorch offers and this library implements (init, empty_cache, memory fraction,
    record_stream, base allocation, the three pool hooks of CUDA graph capture), then replaces
    PyTorch's; then
    ``torch.cuda.memory_stats`` and the other statistics functions (in ``torch.cuda``,
    ``torch.cuda.memory`` and ``torch.accelerator``) are redirected to torch-arena's figures,
    ``torch.cuda.memory._snapshot``, ``_dump_snapshot``, ``_record_memory_history`` and
    ``memory_snapshot`` to :mod:`torch_arena.snapshots`, and every ``optimizer.step()`` ends a
    torch-arena step (leak hunting); with ``leaks:True`` the leak report prints at exit. With
    ``cpu_tensors:True`` (a test mode of the simulated device) the storage of every CPU tensor
    made from then on comes from simulated device 0 too, so real models run through the arena
    without a GPU (its small C++ allocator is compiled on first use, see docs/python.md).
    Settings visible now that will not work (``torch.backends.cudnn.benchmark``, torch.compile's
    CUDA graph trees: ``TORCHINDUCTOR_CUDAGRAPHS=1``) or no longer apply
    (``PYTORCH_CUDA_ALLOC_CONF``) give a :class:`TorchArenaWarning` before the swap.

    Must run before CUDA initialises: ``TORCH_ARENA=1`` in the environment does it as torch is
    imported. Calling it again with the same (or no) configuration does nothing.

    Raises:
        ValueError: a bad configuration (the message names the key); nothing is changed.
        RuntimeError: CUDA is already initialised, another pluggable allocator is installed, this
            torch has no pluggable allocator, a second call asks for another configuration, or
            ``cpu_tensors:True`` finds no C++ compiler or torch headers. Nothing is changed.
    """
    with _lock:
        if _global.enabled:
            if conf is not None and _normalise(conf) != _normalise(_global.conf):
                raise RuntimeError(
                    f"torch-arena is already enabled with the configuration {_global.conf!r}; "
                    f"it cannot switch to {conf!r}: the allocator and its configuration are "
                    "process-wide and PyTorch allows one allocator swap per process. Pass the "
                    "configuration to the first enable() call, or set TORCH_ARENA_CONF."
                )
            return
        _enable_locked(conf)


def _enable_locked(conf: str | None) -> None:
    # 1. Everything that can fail, before any change to torch.
    text = _effective_conf(conf)
    if not isinstance(text, str):
        raise TypeError(f"conf must be a str or None, not {type(text).__name__}")
    _native.check_config(text)  # ValueError naming the key, before touching torch

    import torch

    _check_torch(torch)
    if torch.cuda.is_initialized():
        raise _cuda_initialised_error()
    backend = torch.cuda.get_allocator_backend()
    if backend == "pluggable":
        raise RuntimeError(
            "torch-arena cannot be switched on: another pluggable CUDA allocator is already "
            "installed in this process (torch.cuda.get_allocator_backend() == 'pluggable'), and "
            "PyTorch allows one swap per process. Remove the other allocator's "
            "change_current_allocator call, or use torch_arena.pool() under the native one."
        )
    plan = _patch_plan(torch, _native.conf_items(text).get("device") == "sim")
    cpu_tensors = _cpu_tensors.enabled_in(_native.conf_items(_normalise(text)))
    if cpu_tensors:
        _cpu_tensors.prepare(torch)  # compiles on first use; RuntimeError if it cannot
    addresses = {export: _symbol(export) for _, export in _HOOKS}
    if not (_symbol(_MALLOC) and _symbol(_FREE)):
        raise RuntimeError(f"{_native.library_path()} lacks {_MALLOC}/{_FREE}: a broken install")
    memory = torch.cuda.memory

    text = _install_conf(conf)
    allocator = memory.CUDAPluggableAllocator(_native.library_path(), _MALLOC, _FREE)
    raw = allocator.allocator()
    hooks = []
    for setter, export in _HOOKS:
        if addresses[export] and hasattr(raw, setter):
            getattr(raw, setter)(addresses[export])
            hooks.append(setter)
    # Warnings before the swap: under -W error they stop enable() with nothing installed.
    for message in _enable_warnings(torch):
        warnings.warn(message, TorchArenaWarning, stacklevel=3)

    # 2. The swaps: CPU tensors to the arena (cpu_tensors:True; undone if the next fails), then
    # CUDA's allocator, atomic in PyTorch (it either happens or raises), and the last step that
    # can fail. It raises if the native allocator was initialised behind torch.cuda's back (a
    # C++ extension that touched CUDA).
    if cpu_tensors:
        _cpu_tensors.install()
    try:
        memory.change_current_allocator(allocator)
    except BaseException as exc:
        if cpu_tensors:
            _cpu_tensors.uninstall()
        if isinstance(exc, RuntimeError) and "already initialized" in str(exc):
            raise _cuda_initialised_error(f" (PyTorch: {exc})") from exc
        raise

    # 3. Irreversible from here on; plain assignments only.
    _global.allocator = allocator
    _global.conf = text
    _global.hooks = tuple(hooks)
    for module, module_name, name, replacement in plan:
        _global.originals.setdefault((module_name, name), getattr(module, name, None))
        setattr(module, name, replacement)
    _global.enabled = True
    if cpu_tensors:
        from . import referrers

        referrers.count_cpu_tensors()
    from . import stats

    stats.answer_as_pytorch_before_cuda()
    _watch_cudnn_benchmark(torch)
    _global.step_hook = _register_step_hook(torch)
    from . import _exit, _explain

    _exit.set_devices(_cuda_devices)
    _explain.set_devices(_cuda_devices)
    _exit.install(text)
    from . import _oom

    _oom.install(text)
    if _native.conf_items(text).get("explain") == "True":
        _explain.track_modules()
    _log.info(
        "torch-arena is the CUDA allocator%s (%s, pid %d, conf %r, hooks: %s)",
        f" and CPU tensors' (simulated device {_cpu_tensors.DEVICE})" if cpu_tensors else "",
        _rank_text(),
        os.getpid(),
        text,
        ", ".join(hooks) or "none",
    )


def _cuda_devices() -> list[int]:
    """The devices torch-arena may have served: every simulated device (``device:sim``, where
    torch's CUDA never initialises and the memory comes from torch_arena's own calls), else
    every CUDA device once CUDA initialised (none before: no CUDA memory was allocated, and a
    report would open a device at exit)."""
    import torch

    from . import _capture

    items = _capture.conf()
    if items.get("device") == "sim":
        return list(range(max(1, _capture.conf_int(items, "sim_devices", 1))))
    if not torch.cuda.is_initialized():
        return []
    return list(range(torch.cuda.device_count()))


def _step_after_optimizer(optimizer: Any, args: Any, kwargs: Any) -> None:
    from . import _explain, _native

    if _native.has_track():
        _native.step()
    _explain.note_step()


def _register_step_hook(torch: Any) -> Any:
    """Advance torch-arena's step after every ``optimizer.step()`` (a global post hook); the
    handle, or None when this torch lacks the hook or the library lacks steps."""
    from . import _native

    if not _native.has_track():
        return None
    try:
        import torch.optim.optimizer as optimizer_module

        register = optimizer_module.register_optimizer_step_post_hook
    except (ImportError, AttributeError):
        _log.debug("torch-arena: no global optimizer step hook in this torch", exc_info=True)
        return None
    return register(_step_after_optimizer)


def step_hook() -> Any:
    """The handle of the optimizer step hook :func:`enable` registered (None if none)."""
    return _global.step_hook


def original(name: str, module: str = "torch.cuda.memory") -> Any:
    """PyTorch's own function ``name`` from ``module`` as it was before :func:`enable` replaced
    it (None if it was not replaced). Under a pluggable allocator it raises when called."""
    return _global.originals.get((module, name))


def installed_hooks() -> tuple[str, ...]:
    """The names of the PyTorch hook setters :func:`enable` called (empty when not enabled)."""
    return _global.hooks


# ---------------------------------------------------------------------------------------------
# Pool mode.


@contextlib.contextmanager
def pool(conf: str | None = None, device: Any = None) -> Iterator[Any]:
    """Route this block's CUDA allocations (on this thread) through torch-arena, while PyTorch's
    native allocator stays the process's allocator::

        with torch_arena.pool():
            kv_cache = torch.empty(n, device="cuda")   # in a segment torch-arena supplied

    PyTorch's native allocator carves the tensors from segments (2 MiB, 20 MiB or 2 MiB
    multiples) that it requests from torch-arena through ``torch.cuda.MemPool``; it caches and
    splits them itself, and ``torch.cuda.memory_stats()`` and the OOM message stay PyTorch's.
    Threads started inside the block (autograd's backward, for one) are not routed.

    ``conf`` as in :func:`enable`; ``device`` is the CUDA device (default: the current one).
    Yields the ``torch.cuda.MemPool`` (one per device, kept for the life of the process).

    Raises:
        RuntimeError: torch-arena (or another pluggable allocator) is the global allocator,
            where MemPool cannot work and every allocation already goes to torch-arena; or this
            torch has no ``torch.cuda.MemPool`` (PyTorch 2.5 or newer).
        ValueError: a bad configuration.
    """
    import torch

    global _pool_allocator
    if _global.enabled:
        raise RuntimeError(
            "torch_arena.pool() is for when torch-arena is NOT the global allocator: "
            "torch_arena.enable() (or TORCH_ARENA=1) already routes every CUDA allocation of "
            "this process through torch-arena, and PyTorch's MemPool needs its native allocator "
            "as the global one. Drop the pool() block, or unset TORCH_ARENA to use pool mode."
        )
    cuda = torch.cuda
    if not (hasattr(cuda, "MemPool") and hasattr(cuda, "use_mem_pool")):
        raise RuntimeError(
            "torch_arena.pool() needs torch.cuda.MemPool and torch.cuda.use_mem_pool "
            f"(PyTorch 2.5 or newer); this is torch {torch.__version__}. Upgrade torch, or use "
            "torch_arena.enable() (global mode) instead."
        )
    _check_torch(torch)
    backend = cuda.get_allocator_backend()
    if backend != "native":
        raise RuntimeError(
            f"torch_arena.pool() needs PyTorch's native caching allocator as the global one, "
            f"but torch.cuda.get_allocator_backend() is {backend!r} (MemPool raises under it). "
            "Remove the other allocator (or PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync)."
        )
    with _lock:
        _install_conf(conf)
        index = (
            cuda.current_device()
            if device is None
            else torch.cuda._utils._get_device_index(device, optional=True)
        )
        mem_pool = _pools.get(index)
        if mem_pool is None:
            if _pool_allocator is None:
                _pool_allocator = cuda.memory.CUDAPluggableAllocator(
                    _native.library_path(), _MALLOC, _FREE
                )
            with cuda.device(index):
                mem_pool = cuda.MemPool(_pool_allocator.allocator())
            _pools[index] = mem_pool
    with cuda.use_mem_pool(mem_pool, device=index):
        yield mem_pool
