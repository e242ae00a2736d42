"""``torch.cuda.memory``'s statistics functions, computed from torch-arena's allocator.

Under a pluggable allocator every statistics call of PyTorch raises ("CUDAPluggableAllocator
does not yet support getDeviceStats"). These functions have the same names, signatures, keys and
text as PyTorch's, read from the arena instead, and work on the simulated device without a GPU
or torch. ``memory_stats()`` returns torch 2.11's 122 keys in sorted order; ``max_split_size`` is
-1 (no limit), as torch reports it.

``device`` may be None (the current device), an int, a ``torch.device`` or a string such as
``"cuda"`` or ``"cuda:1"``. The current device is ``torch.cuda.current_device()`` when torch is
already imported and CUDA is initialised, else 0; this module never imports torch.
"""

import ctypes
import functools
import sys
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from . import _native

__all__ = [
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "current_device",
    "defragment",
    "empty_cache",
    "growth",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
]

_F = TypeVar("_F", bound=Callable[..., Any])


def _public(fn: _F) -> _F:
    """Forward the library's queued log records after each call of a public function."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            _native.drain_logs()

    return call  # type: ignore[return-value]


def _torch_cuda() -> Any:
    """``torch.cuda`` if torch is already imported and CUDA is initialised, else None."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            return cuda
    except Exception:  # a half-imported torch: behave as if it were absent
        return None
    return None


def current_device() -> int:
    """``torch.cuda.current_device()`` when torch is imported and CUDA initialised, else 0."""
    cuda = _torch_cuda()
    return int(cuda.current_device()) if cuda is not None else 0


# Device ordinals are C ints in the library's exports; ctypes would wrap anything larger
# (2**32 became device 0).
MAX_DEVICE_INDEX = 2**31 - 1
# Sizes and pointers are size_t / void* (64 bits): ctypes would keep only the low bits
# (2**64 + 4096 became a 4 KiB request).
SIZE_LIMIT = 2**64


def _device_index(device: Any) -> int:
    """A CUDA ordinal from None, an int, a ``torch.device`` or a string like ``"cuda:1"``.
    ValueError for a negative ordinal or one beyond a C int (whether the device exists is the
    library's to say)."""
    index = _device_ordinal(device)
    if not 0 <= index <= MAX_DEVICE_INDEX:
        raise ValueError(
            f"device index {index} is out of range: a CUDA device index is an int from 0 "
            f"to {MAX_DEVICE_INDEX} (got {device!r})"
        )
    return index


def _device_ordinal(device: Any) -> int:
    if device is None:
        return current_device()
    if isinstance(device, bool):
        raise TypeError(f"device must be None, an int, a torch.device or a str, not {device!r}")
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, sep, index = device.strip().partition(":")
        if kind == "cuda" and not sep:
            return current_device()
        if kind == "cuda" and index.isdigit():
            return int(index)
        if not sep and kind.isdigit():
            return int(kind)
        raise ValueError(f"expected a CUDA device such as 'cuda' or 'cuda:1', got {device!r}")
    kind, index = getattr(device, "type", None), getattr(device, "index", ())
    if isinstance(kind, str) and (index is None or isinstance(index, int)):
        if kind != "cuda":
            raise ValueError(f"expected a CUDA device, got {device!r}")
        return current_device() if index is None else index
    raise TypeError(
        f"device must be None, an int, a torch.device or a str, not {type(device).__name__}"
    )


# ---------------------------------------------------------------------------------------------
# Statistics.

# Set once torch-arena is PyTorch's allocator (global mode): until CUDA initialises, nothing
# was allocated through torch, and PyTorch's own functions return 0 / an empty dict then.
_pytorch_before_cuda = False


def answer_as_pytorch_before_cuda() -> None:
    """From now on, answer as PyTorch does while CUDA is not initialised (0, an empty dict)
    instead of opening the device: without a driver the library cannot, and would raise and
    log an error on every call. The simulated device still answers (tests allocate there
    without CUDA). Called by ``enable()``."""
    global _pytorch_before_cuda
    _pytorch_before_cuda = True


def _before_cuda() -> bool:
    if not _pytorch_before_cuda:
        return False
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return False
    except Exception:
        pass
    return _native.conf_items(_native.installed_conf()).get("device", "cuda") != "sim"


@_public
def memory_stats(device: Any = None) -> "OrderedDict[str, int]":
    """The memory statistics of ``device`` as ``torch.cuda.memory_stats()`` returns them: an
    OrderedDict of 122 keys such as ``"allocated_bytes.all.current"``, sorted. Empty while
    torch-arena is PyTorch's allocator and CUDA is not initialised yet, as PyTorch's."""
    if _before_cuda():
        return OrderedDict()
    values = _native.stats(_device_index(device))
    return OrderedDict(zip(_native.stats_keys(), values, strict=True))


@_public
def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """The statistics of ``device`` nested as ``torch.cuda.memory_stats_as_nested_dict()``
    returns them: ``stats["allocated_bytes"]["all"]["current"]``."""
    nested: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        *path, leaf = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


@_public
def memory_allocated(device: Any = None) -> int:
    """Bytes held by live tensors on ``device`` (block sizes, as torch counts them)."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


@_public
def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since the start or the last peak reset."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


@_public
def memory_reserved(device: Any = None) -> int:
    """Bytes of device memory the allocator holds on ``device`` (physical pages)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


@_public
def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved` since the start or the last peak reset."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


@_public
def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """``torch.cuda.memory_summary()``'s table for ``device`` (77-character lines; without the
    pool rows when ``abbreviated``), followed by torch-arena's own section."""
    return _native.summary(_device_index(device), abbreviated)


@_public
def reset_peak_memory_stats(device: Any = None) -> None:
    """Set every peak statistic of ``device`` to its current value."""
    _native.reset_peak_stats(_device_index(device))


@_public
def reset_max_memory_allocated(device: Any = None) -> None:
    """Reset the peak of allocated memory; like torch's, this resets every peak (with the same
    FutureWarning) because the peaks are kept together."""
    warnings.warn(
        "torch_arena.reset_max_memory_allocated now calls reset_peak_memory_stats, which resets "
        "/all/ peak memory stats.",
        FutureWarning,
        stacklevel=3,
    )
    reset_peak_memory_stats(device)


@_public
def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Set the allocated/freed totals and the counters (OOMs, retries...) of ``device`` to 0."""
    _native.reset_accumulated_stats(_device_index(device))


# ---------------------------------------------------------------------------------------------
# Maintenance.


@_public
def empty_cache() -> None:
    """Give every cached, unused page of every device back to the driver, as
    ``torch.cuda.empty_cache()`` does. Returns None; :func:`defragment` reports figures."""
    _native.empty_cache_report()


@_public
def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Cap the bytes ``device``'s arena may reserve at ``fraction`` (in (0, 1]) of the device's
    memory, like ``torch.cuda.set_per_process_memory_fraction`` (same signature). Cached pages
    above a lowered cap are released; a request beyond the cap fails as out of memory. Under
    torch-arena on a GPU, torch's own function reaches the same hook; on the simulated device
    (where torch's CUDA never starts) :func:`torch_arena.enable` points torch's at this one."""
    _native.set_memory_fraction(fraction, _device_index(device))


@_public
def defragment(device: Any = None) -> dict[str, int]:
    """Return ``device``'s empty slabs and idle mapped ranges to the page pool, where any new
    range can use them, without releasing memory to the driver. Returns what was recovered:
    ``slabs_released``, ``pages_unmapped``, ``pages_released``, ``bytes_recovered`` (bytes of
    idle pages now usable by any range: still reserved, so ``memory_reserved()`` does not drop by
    them), ``bytes_released`` (given back to the driver: 0 here)."""
    return _native.defragment(_device_index(device))


@_public
def growth(device: Any = None) -> dict[str, int]:
    """The physical memory ``device``'s arena created since it started (cuMemCreate handles, or
    cuMemAlloc segments without VMM), by what the request it served did to the bytes requested:
    ``at_peak_handles`` and ``at_peak_bytes`` for requests that took them to a new peak (the most
    ever requested at once, whatever ``reset_peak_memory_stats`` reset), growth any allocator
    needs; ``below_peak_handles`` and ``below_peak_bytes`` for those that left them at or under
    it: the memory existed, but not where the request landed. Read it once per training step:
    growth below the peak after warm-up is what a steady state avoids."""
    return _native.growth(_device_index(device))


@_public
def pages(device: Any = None) -> dict[str, int]:
    """Where ``device``'s physical memory is, in bytes: ``in_use_bytes`` (pages holding live
    tensors), ``idle_mapped_bytes`` (mapped pages holding nothing, reused where they are or moved
    where a new range needs them), ``held_bytes`` (mapped pages holding nothing that cannot move:
    a physical handle moves only whole, and other pages of theirs hold live tensors; only freeing
    those makes them usable elsewhere, but for what the out-of-memory ladder lends when memory
    runs out) and ``pooled_bytes`` (created, mapped nowhere), in pages of
    ``page_size`` bytes. With VMM the four add up to ``memory_reserved()``. Then ``limit_bytes``
    (what the arena may reserve: the device's capacity, or its memory fraction of it) and
    ``device_free_bytes`` (free as the driver reports it; one driver call). When memory runs out
    with much reserved but little allocated, ``held_bytes`` says how much of it is stuck. It walks
    the arena's page tables under its lock: read it to diagnose, not around every allocation."""
    return _native.pages(_device_index(device))


# ---------------------------------------------------------------------------------------------
# Raw allocations, as torch.cuda.caching_allocator_alloc / _delete.

# ptr -> (size, device, stream) of the pointers caching_allocator_alloc returned: free needs the
# request's size, device and stream. Plain dict operations are atomic under the GIL, so no lock.
_raw: dict[int, tuple[int, int, int]] = {}


def _stream_handle(stream: Any, device: int) -> int:
    """A cudaStream_t as an int from None (the current stream), an int, a ``torch.cuda.Stream``
    (``.cuda_stream``) or a ctypes-style object (``._as_parameter_``)."""
    if stream is None:
        cuda = _torch_cuda()
        return int(cuda.current_stream(device).cuda_stream) if cuda is not None else 0
    if isinstance(stream, bool):
        raise TypeError(f"stream must be None, an int or a CUDA stream, not {stream!r}")
    handle: Any = stream if isinstance(stream, int) else getattr(stream, "cuda_stream", None)
    if handle is None:
        handle = getattr(stream, "_as_parameter_", None)
        if isinstance(handle, ctypes.c_void_p):
            handle = handle.value or 0
    if isinstance(handle, int) and not isinstance(handle, bool):
        if not 0 <= handle < SIZE_LIMIT:
            raise ValueError(f"a stream handle is a cudaStream_t in [0, 2**64), not {handle}")
        return handle
    raise TypeError(
        "stream must be None, an int, a torch.cuda.Stream or an object with ._as_parameter_, "
        f"not {type(stream).__name__}"
    )


@_public
def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Allocate ``size`` bytes on ``device`` for ``stream`` (None: the current stream) and
    return the pointer as an int, like ``torch.cuda.caching_allocator_alloc``. Size 0 returns 0.
    Free it with :func:`caching_allocator_delete`. Raises :class:`OutOfMemoryError` when the
    request cannot be met."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, not {size!r}")
    if size >= SIZE_LIMIT:
        raise OverflowError(
            f"size {size} does not fit in a size_t: a request is at most 2**64 - 1 bytes"
        )
    index = _device_index(device)
    handle = _stream_handle(stream, index)
    ptr = _native.try_malloc(size, index, handle)
    if ptr:
        _raw[ptr] = (size, index, handle)
    return ptr


@_public
def caching_allocator_delete(mem_ptr: int) -> None:
    """Free a pointer :func:`caching_allocator_alloc` returned, like
    ``torch.cuda.caching_allocator_delete``. 0 does nothing; a pointer not from
    caching_allocator_alloc (or already freed) raises ValueError, anything but an int
    TypeError (an empty list once passed as "nothing to free")."""
    if isinstance(mem_ptr, bool) or not isinstance(mem_ptr, int):
        raise TypeError(
            f"caching_allocator_delete: mem_ptr must be an int (a pointer from "
            f"caching_allocator_alloc, or 0), not {type(mem_ptr).__name__} {mem_ptr!r}"
        )
    if mem_ptr == 0:
        return
    entry = _raw.pop(mem_ptr, None)
    if entry is None:
        raise ValueError(
            f"caching_allocator_delete: {mem_ptr:#x} was not returned by "
            "caching_allocator_alloc, or was already freed"
        )
    size, device, stream = entry
    _native.try_free(mem_ptr, size, device, stream)
