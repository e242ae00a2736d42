"""ctypes binding of the torch-arena library shipped in this package.

The library is the Rust cdylib (``_native_lib*.so`` next to this file) that PyTorch also loads
through ``CUDAPluggableAllocator``; both loads share one process-wide allocator. This module
declares the argument and result types of every export of ``cpp_shim/torch_arena.h`` and wraps
each one in a typed function that raises a Python exception, built from
``torch_arena_last_error``, when the call fails:

==========================  =====================
status                      exception
==========================  =====================
out of memory               OutOfMemoryError
bad configuration           ValueError
bad pointer, bad device     ValueError
invalid argument            ValueError
anything else, a panic      RuntimeError
==========================  =====================

ctypes releases the GIL around every call, and the library never takes it, so these calls cannot
deadlock with PyTorch's allocator hooks running on other threads. This module holds no lock of
its own.
"""

import ctypes
import glob
import logging
import operator
import os
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "Growth",
    "OutOfMemoryError",
    "ReclaimReport",
    "attach_logs",
    "bad_free_count",
    "base_alloc",
    "check_config",
    "clear_last_error",
    "configure",
    "defragment",
    "drain_logs",
    "empty_cache",
    "empty_cache_report",
    "growth",
    "has_log",
    "has_track",
    "history_enable",
    "history_json",
    "installed_conf",
    "layout_json",
    "leaks_json",
    "live_json",
    "init",
    "last_error",
    "library_path",
    "log_level",
    "logs_dropped",
    "record_stream",
    "reset_accumulated_stats",
    "reset_peak_stats",
    "set_log_level",
    "set_memory_fraction",
    "set_sites",
    "stats",
    "stats_keys",
    "step",
    "current_step",
    "tag_pop",
    "tag_push",
    "summary",
    "symbol_address",
    "try_free",
    "try_malloc",
    "version",
]

# Status codes (TORCH_ARENA_* in torch_arena.h).
OK = 0
ERR_OOM = 1
ERR_OTHER = 2
ERR_CONFIG = 3
ERR_BAD_POINTER = 4
ERR_BAD_DEVICE = 5
ERR_INVALID_ARGUMENT = 6
ERR_PANIC = 7

_VALUE_ERRORS = (ERR_CONFIG, ERR_BAD_POINTER, ERR_BAD_DEVICE, ERR_INVALID_ARGUMENT)


class OutOfMemoryError(RuntimeError):
    """A request torch-arena could not meet. The message starts with ``"CUDA out of memory.
    Tried to allocate"``, the text PyTorch and the libraries above it match, and goes on with the
    device's capacity, reserved, allocated, cached and fragmented bytes."""


class _Counts(ctypes.Structure):
    """A C struct of counters, read back as a dict."""

    _fields_: list[tuple[str, Any]] = []

    def as_dict(self) -> dict[str, int]:
        """The fields as a plain dict, in declaration order."""
        return {name: int(getattr(self, name)) for name, _ in self._fields_}


class ReclaimReport(_Counts):
    """``torch_arena_reclaim_report``: what defragment / empty_cache recovered."""

    _fields_ = [
        ("slabs_released", ctypes.c_uint64),
        ("pages_unmapped", ctypes.c_uint64),
        ("pages_released", ctypes.c_uint64),
        ("bytes_recovered", ctypes.c_uint64),
        ("bytes_released", ctypes.c_uint64),
    ]


class Growth(_Counts):
    """``torch_arena_growth_t``: the memory a device's arena created, by what each request did to
    the bytes requested."""

    _fields_ = [
        ("at_peak_handles", ctypes.c_uint64),
        ("at_peak_bytes", ctypes.c_uint64),
        ("below_peak_handles", ctypes.c_uint64),
        ("below_peak_bytes", ctypes.c_uint64),
    ]


class Pages(_Counts):
    """``torch_arena_pages_t``: where a device's physical memory is, in bytes."""

    _fields_ = [
        ("page_size", ctypes.c_uint64),
        ("in_use_bytes", ctypes.c_uint64),
        ("idle_mapped_bytes", ctypes.c_uint64),
        ("held_bytes", ctypes.c_uint64),
        ("pooled_bytes", ctypes.c_uint64),
        ("limit_bytes", ctypes.c_uint64),
        ("device_free_bytes", ctypes.c_uint64),
    ]


def _find_library() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_native_lib*.so")))
    if not found:
        raise ImportError(
            f"torch_arena: the native library (_native_lib*.so) is missing from {here}. "
            "Install the package with `pip install .` from the repository root (it builds the "
            "Rust library); a source checkout on PYTHONPATH has no library."
        )
    return found[0]


_PATH = _find_library()
_lib = ctypes.CDLL(_PATH)

_c_int = ctypes.c_int
_c_size = ctypes.c_size_t
_c_ptr = ctypes.c_void_p
_c_str = ctypes.c_char_p
_c_i64 = ctypes.c_int64
_c_u64 = ctypes.c_uint64

# name: (restype, argtypes), for every export of torch_arena.h.
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "torch_arena_malloc": (_c_ptr, [_c_size, _c_int, _c_ptr]),
    "torch_arena_free": (None, [_c_ptr, _c_size, _c_int, _c_ptr]),
    "torch_arena_try_malloc": (_c_int, [_c_size, _c_int, _c_ptr, ctypes.POINTER(_c_ptr)]),
    "torch_arena_try_free": (_c_int, [_c_ptr, _c_size, _c_int, _c_ptr]),
    "torch_arena_bad_free_count": (_c_u64, []),
    "torch_arena_init": (None, [_c_int]),
    "torch_arena_empty_cache": (None, []),
    "torch_arena_set_memory_fraction": (None, [ctypes.c_double, _c_int]),
    "torch_arena_record_stream": (None, [_c_ptr, _c_ptr]),
    "torch_arena_base_alloc": (_c_ptr, [_c_ptr, ctypes.POINTER(_c_size)]),
    "torch_arena_configure": (_c_int, [_c_str]),
    "torch_arena_check_config": (_c_int, [_c_str]),
    "torch_arena_config": (_c_size, [ctypes.c_char_p, _c_size]),
    "torch_arena_last_error": (_c_size, [ctypes.c_char_p, _c_size]),
    "torch_arena_clear_last_error": (None, []),
    "torch_arena_version": (_c_str, []),
    "torch_arena_stats_count": (_c_i64, []),
    "torch_arena_stats_key": (_c_str, [_c_i64]),
    "torch_arena_stats": (_c_int, [_c_int, ctypes.POINTER(_c_i64), _c_size]),
    "torch_arena_summary": (_c_size, [_c_int, _c_int, ctypes.c_char_p, _c_size]),
    "torch_arena_reset_peak_stats": (_c_int, [_c_int]),
    "torch_arena_reset_accumulated_stats": (_c_int, [_c_int]),
    "torch_arena_defragment": (_c_int, [_c_int, ctypes.POINTER(ReclaimReport)]),
    "torch_arena_growth": (_c_int, [_c_int, ctypes.POINTER(Growth)]),
    "torch_arena_pages": (_c_int, [_c_int, ctypes.POINTER(Pages)]),
    "torch_arena_empty_cache_report": (_c_int, [ctypes.POINTER(ReclaimReport)]),
    "torch_arena_set_oom_observer": (_c_int, [_c_ptr]),
}

# The log exports (src/log.rs), bound only when the library has them.
_LOG_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "torch_arena_set_log_level": (_c_int, [_c_str]),
    "torch_arena_log_level": (_c_int, []),
    "torch_arena_log_attach": (None, [_c_int]),
    "torch_arena_log_drain": (_c_size, [ctypes.c_char_p, _c_size]),
    "torch_arena_log_dropped": (_c_u64, []),
}

# The tracking exports (issue 4: steps, tags, sites, live table, leaks, layout, history), bound
# only when the library has them; the functions below raise RuntimeError otherwise.
_TRACK_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "torch_arena_step": (_c_u64, []),
    "torch_arena_current_step": (_c_u64, []),
    "torch_arena_tag_push": (_c_int, [_c_str]),
    "torch_arena_tag_pop": (_c_int, []),
    "torch_arena_set_sites": (_c_int, [_c_str, _c_u64, _c_u64]),
    "torch_arena_live_json": (_c_size, [_c_int, ctypes.c_char_p, _c_size]),
    "torch_arena_leaks_json": (_c_size, [_c_int, _c_u64, _c_u64, ctypes.c_char_p, _c_size]),
    "torch_arena_layout_json": (_c_size, [_c_int, ctypes.c_char_p, _c_size]),
    "torch_arena_history_enable": (_c_int, [_c_int, _c_u64]),
    "torch_arena_history_json": (_c_size, [_c_int, ctypes.c_char_p, _c_size]),
}

for _name, (_restype, _argtypes) in _SIGNATURES.items():
    _fn = getattr(_lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes
for _name, (_restype, _argtypes) in _LOG_SIGNATURES.items():
    if hasattr(_lib, _name):
        _fn = getattr(_lib, _name)
        _fn.restype = _restype
        _fn.argtypes = _argtypes
for _name, (_restype, _argtypes) in _TRACK_SIGNATURES.items():
    if hasattr(_lib, _name):
        _fn = getattr(_lib, _name)
        _fn.restype = _restype
        _fn.argtypes = _argtypes
del _name, _restype, _argtypes, _fn

_HAS_LOG = all(hasattr(_lib, name) for name in _LOG_SIGNATURES)
_HAS_TRACK = all(hasattr(_lib, name) for name in _TRACK_SIGNATURES)


def library_path() -> str:
    """Absolute path of the shared library, as ``CUDAPluggableAllocator`` needs it."""
    return _PATH


def symbol_address(name: str) -> int:
    """Address of the export ``name`` (for PyTorch's ``set_*_fn`` hooks)."""
    return ctypes.cast(getattr(_lib, name), ctypes.c_void_p).value or 0


def version() -> str:
    """The library's version (Cargo.toml's)."""
    return _lib.torch_arena_version().decode()


# ---------------------------------------------------------------------------------------------
# Errors.


def _copy_out(fn: Callable[..., int], *args: Any, initial: int = 256) -> str:
    """Call an snprintf-style export ``fn(*args, buf, cap)`` until the text fits."""
    cap = initial
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = fn(*args, buf, cap)
        if n < cap:
            return buf.raw[:n].decode("utf-8", errors="replace")
        cap = n + 1


def last_error() -> str:
    """The calling thread's most recent error message, else the process's ("" if none)."""
    return _copy_out(_lib.torch_arena_last_error)


def clear_last_error() -> None:
    """Forget the last error (this thread's and the process's)."""
    _lib.torch_arena_clear_last_error()


# `size_t observer(int device, size_t size, char* buf, size_t cap)` (torch_arena.h).
_OomObserver = ctypes.CFUNCTYPE(_c_size, _c_int, _c_size, ctypes.c_void_p, _c_size)
# The observer set, kept alive here: the library holds only its address.
_oom_observer: Any = None


def set_oom_hook(hook: Callable[[int, int], str] | None) -> None:
    """Call ``hook(device, size)`` at every out-of-memory error of the library (a PyTorch op's
    or ours), before the error is raised, on the allocating thread, with no lock of the library
    held; the line it returns is appended to the error's message. ``None`` removes it. A hook
    that raises adds nothing: the OOM is never hidden behind it."""
    global _oom_observer
    if hook is None:
        _lib.torch_arena_set_oom_observer(None)
        _oom_observer = None
        return

    def observer(device: int, size: int, buf: int, cap: int) -> int:
        try:
            note = hook(device, size)
        except Exception:
            return 0
        data = note.encode()[:cap]
        while data and not _utf8_prefix(data):
            data = data[:-1]
        ctypes.memmove(buf, data, len(data))
        return len(data)

    _oom_observer = _OomObserver(observer)
    _lib.torch_arena_set_oom_observer(ctypes.cast(_oom_observer, ctypes.c_void_p))


def _utf8_prefix(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _error(code: int, call: str) -> Exception:
    """The exception for status ``code`` of ``call``, with the library's message."""
    msg = last_error() or f"{call} failed with status {code}"
    if code == ERR_OOM:
        return OutOfMemoryError(msg)
    if code in _VALUE_ERRORS:
        return ValueError(msg)
    return RuntimeError(msg)


def _check(code: int, call: str) -> None:
    if code != OK:
        raise _error(code, call)


# The ranges of the C types the exports take. ctypes keeps only the low bits of a Python int
# that does not fit (2**64 became device 0, every=-1 became 2**64 - 1), so every int is checked
# here first, naming the argument, the value and the range.
C_INT_MAX = 2**31 - 1
U64_MAX = 2**64 - 1


def _int(call: str, name: str, value: Any, lo: int, hi: int) -> int:
    """``value`` as an int in [lo, hi]; TypeError for a non-int (bool included), ValueError
    out of range."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{call}: {name} must be an int from {lo} to {hi}, not {value!r}")
    value = operator.index(value)
    if not lo <= value <= hi:
        raise ValueError(f"{call}: {name} {value} is out of range: expected {lo} to {hi}")
    return value


def _device(call: str, device: Any) -> int:
    return _int(call, "device", device, 0, C_INT_MAX)


def _text(call: str, name: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{call}: {name} must be a str, not {type(value).__name__} {value!r}")
    return value.encode()


# ---------------------------------------------------------------------------------------------
# Configuration.


def configure(conf: str | None = None) -> None:
    """Install the allocator configuration (``TORCH_ARENA_CONF`` grammar) before first use.

    ``conf=None`` installs the text of ``TORCH_ARENA_CONF`` ("" when unset: the defaults), which
    is what the library would read on its own. Raises ValueError for a bad text (naming the key,
    the value and the accepted forms; nothing is installed) or when the allocator already runs
    with a different configuration.
    """
    global _installed_conf
    text = os.environ.get("TORCH_ARENA_CONF", "") if conf is None else conf
    data = _text("configure", "conf (a TORCH_ARENA_CONF text, or None)", text)
    _check(_lib.torch_arena_configure(data), "torch_arena_configure")
    _installed_conf = text


# The text the last successful configure() installed; None: the library reads TORCH_ARENA_CONF
# itself on first use.
_installed_conf: str | None = None


def installed_conf() -> str:
    """The configuration in force: the library's own reading once it is initialised (every key
    spelled out), else what :func:`configure` last installed, else ``TORCH_ARENA_CONF``
    ("" = the defaults), which is what the library will read on first use."""
    in_force = _copy_out(_lib.torch_arena_config)
    if in_force:
        return in_force
    if _installed_conf is not None:
        return _installed_conf
    return os.environ.get("TORCH_ARENA_CONF", "")


def conf_items(text: str) -> dict[str, str]:
    """key -> value of a configuration text in PyTorch's allocator-conf grammar (TORCH_ARENA_CONF
    or PYTORCH_CUDA_ALLOC_CONF): top level only, commas inside [...] do not split."""
    items: dict[str, str] = {}
    depth, start = 0, 0
    for i, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            key, _, value = text[start:i].partition(":")
            if key.strip():
                items[key.strip()] = value.strip()
            start = i + 1
    return items


def check_config(conf: str) -> None:
    """Validate a configuration text without installing it; ValueError says what is wrong."""
    data = _text("check_config", "conf", conf)
    _check(_lib.torch_arena_check_config(data), "torch_arena_check_config")


# ---------------------------------------------------------------------------------------------
# malloc / free and PyTorch's hooks.


def try_malloc(size: int, device: int, stream: int = 0) -> int:
    """Allocate ``size`` bytes on ``device`` for ``stream`` (a cudaStream_t as an int, 0 = the
    default stream); the pointer as an int (0 for size 0). OutOfMemoryError when the request
    cannot be met; ValueError for a bad configuration or device."""
    # ctypes keeps only the low bits of a too-large int: refuse rather than truncate.
    if isinstance(size, int) and not 0 <= size < 2**64:
        raise OverflowError(f"size {size} does not fit in a size_t: a request is 0 to 2**64 - 1")
    size = _int("try_malloc", "size", size, 0, U64_MAX)
    device = _device("try_malloc", device)
    stream = _int("try_malloc", "stream", stream or 0, 0, U64_MAX)
    out = _c_ptr()
    code = _lib.torch_arena_try_malloc(size, device, stream or None, ctypes.byref(out))
    if code == OK:
        return out.value or 0
    if code == ERR_OOM:
        raise _error(code, "torch_arena_try_malloc")
    # try_malloc narrows every other failure to ERR_OTHER; a query on the same device tells a bad
    # configuration or device (ValueError) from a device error. Keep the allocation's message.
    msg = last_error()
    exc = ValueError if _probe(device) in _VALUE_ERRORS else RuntimeError
    raise exc(msg or f"torch_arena_try_malloc failed with status {code}")


def try_free(ptr: int, size: int, device: int, stream: int = 0) -> None:
    """Free ``ptr`` (0: no-op), passing the size, device and stream it was allocated with.
    ValueError for a pointer never returned, a double free or a size mismatch (the library also
    counts and logs it)."""
    ptr = _int("try_free", "ptr", ptr or 0, 0, U64_MAX)
    size = _int("try_free", "size", size, 0, U64_MAX)
    device = _device("try_free", device)
    stream = _int("try_free", "stream", stream or 0, 0, U64_MAX)
    _check(_lib.torch_arena_try_free(ptr or None, size, device, stream or None), "torch_arena_free")


def bad_free_count() -> int:
    """Frees that failed so far in this process (any reason)."""
    return int(_lib.torch_arena_bad_free_count())


def init(device_count: int) -> None:
    """PyTorch's init hook: record the device count and read the configuration."""
    _lib.torch_arena_init(_int("init", "device_count", device_count, 0, C_INT_MAX))


def empty_cache() -> None:
    """PyTorch's reset hook: return every cached page to the driver (no report, no error)."""
    _lib.torch_arena_empty_cache()


def set_memory_fraction(fraction: float, device: int) -> None:
    """Cap the bytes ``device``'s arena may hold at ``fraction`` of the device's memory."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(
            f"set_memory_fraction: fraction must be a float in (0, 1], not {fraction!r}"
        )
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"set_memory_fraction: fraction {fraction} is not in (0, 1]")
    device = _device("set_memory_fraction", device)
    _check(_probe(device), "torch_arena_stats")  # the hook itself reports nothing
    _lib.torch_arena_set_memory_fraction(fraction, device)


def _probe(device: int) -> int:
    """The status of a statistics query on ``device``: a cheap call that reports a bad
    configuration or ordinal as such (ERR_CONFIG, ERR_BAD_DEVICE), with the last error set."""
    n = _stats_count()
    return _lib.torch_arena_stats(_device("stats", device), (_c_i64 * n)(), n)


def record_stream(ptr: int, stream: int) -> None:
    """Keep ``ptr``'s memory from reuse until work queued on ``stream`` has completed."""
    base, _ = base_alloc(ptr)  # raises ValueError for an unknown pointer
    stream = _int("record_stream", "stream", stream or 0, 0, U64_MAX)
    _lib.torch_arena_record_stream(base, stream or None)


def base_alloc(ptr: int) -> tuple[int, int]:
    """``(base, size)`` of the live allocation containing ``ptr``; ValueError if none does."""
    ptr = _int("base_alloc", "ptr", ptr or 0, 0, U64_MAX)
    size = _c_size(0)
    base = _lib.torch_arena_base_alloc(ptr or None, ctypes.byref(size))
    if size.value == 0:
        raise ValueError(last_error() or f"torch_arena_base_alloc: {ptr:#x} is not allocated")
    return int(base or 0), int(size.value)


# ---------------------------------------------------------------------------------------------
# Statistics and maintenance.

_keys: tuple[str, ...] | None = None


def _stats_count() -> int:
    return len(stats_keys())


def stats_keys() -> tuple[str, ...]:
    """The ``memory_stats()`` keys (122), sorted as torch sorts them."""
    global _keys
    if _keys is None:
        n = _lib.torch_arena_stats_count()
        if n < 0:
            raise _error(ERR_OTHER, "torch_arena_stats_count")
        keys = []
        for i in range(n):
            key = _lib.torch_arena_stats_key(i)
            if key is None:
                raise _error(ERR_OTHER, "torch_arena_stats_key")
            keys.append(key.decode())
        _keys = tuple(keys)
    return _keys


def stats(device: int) -> list[int]:
    """``device``'s statistics, one value per key of :func:`stats_keys`, in that order."""
    n = _stats_count()
    values = (_c_i64 * n)()
    _check(_lib.torch_arena_stats(_device("stats", device), values, n), "torch_arena_stats")
    return list(values)


def summary(device: int, abbreviated: bool = False) -> str:
    """``memory_summary()`` text of ``device``: PyTorch's table, then torch-arena's section."""
    device = _device("summary", device)
    text = _copy_out(_lib.torch_arena_summary, device, int(abbreviated), initial=16384)
    if not text:
        raise _error(ERR_OTHER, "torch_arena_summary")
    return text


def reset_peak_stats(device: int) -> None:
    """Every peak of ``device`` becomes the current value."""
    device = _device("reset_peak_stats", device)
    _check(_lib.torch_arena_reset_peak_stats(device), "torch_arena_reset_peak_stats")


def reset_accumulated_stats(device: int) -> None:
    """Allocated/freed totals and counters of ``device`` go to 0."""
    code = _lib.torch_arena_reset_accumulated_stats(_device("reset_accumulated_stats", device))
    _check(code, "torch_arena_reset_accumulated_stats")


def defragment(device: int) -> dict[str, int]:
    """Return ``device``'s empty slabs and idle ranges to the page pool; what was recovered."""
    report = ReclaimReport()
    device = _device("defragment", device)
    _check(_lib.torch_arena_defragment(device, ctypes.byref(report)), "torch_arena_defragment")
    return report.as_dict()


def growth(device: int) -> dict[str, int]:
    """The memory ``device``'s arena created, by what each request did to the bytes requested."""
    out = Growth()
    device = _device("growth", device)
    _check(_lib.torch_arena_growth(device, ctypes.byref(out)), "torch_arena_growth")
    return out.as_dict()


def pages(device: int) -> dict[str, int]:
    """Where ``device``'s physical memory is, in bytes."""
    out = Pages()
    device = _device("pages", device)
    _check(_lib.torch_arena_pages(device, ctypes.byref(out)), "torch_arena_pages")
    return out.as_dict()


def empty_cache_report() -> dict[str, int]:
    """empty_cache on every open device; what was recovered and released."""
    report = ReclaimReport()
    code = _lib.torch_arena_empty_cache_report(ctypes.byref(report))
    _check(code, "torch_arena_empty_cache_report")
    return report.as_dict()


# ---------------------------------------------------------------------------------------------
# Log records from the library, forwarded to logging.getLogger("torch_arena").
#
# The library writes its warnings to stderr until a consumer attaches (attach_logs(True)); then
# it queues them (1024 records at most, the oldest dropped first) and drain_logs() moves them to
# Python's logging. Records are queued, never delivered by a call into Python, because they are
# emitted on PyTorch's threads, possibly under an arena lock.

_logger = logging.getLogger("torch_arena")
_TRACE = 5  # below logging.DEBUG, like tracing's TRACE below DEBUG
_LEVELS = {
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": _TRACE,
}
_DRAIN_CAP = 4096  # always holds at least one record (log.rs: DRAIN_CAP)
_UNESCAPE = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
_ESCAPED = re.compile(r"\\([\\tnr])")


def has_log() -> bool:
    """Whether the library has the log exports (torch_arena_*log*)."""
    return _HAS_LOG


def _require_log(call: str) -> None:
    if not _HAS_LOG:
        raise RuntimeError(f"{call}: this build of the torch-arena library has no log exports")


def set_log_level(level: str) -> None:
    """Set the library's log level: "error", "warn", "info", "debug", "trace" or "off"
    (case-insensitive; the default comes from TORCH_ARENA_LOG, else "warn"). ValueError names
    the accepted levels."""
    _require_log("set_log_level")
    data = _text("set_log_level", "level", level)
    _check(_lib.torch_arena_set_log_level(data), "torch_arena_set_log_level")


def log_level() -> int:
    """The library's log level: 0 off, 1 error, 2 warn, 3 info, 4 debug, 5 trace."""
    _require_log("log_level")
    return int(_lib.torch_arena_log_level())


def attach_logs(attached: bool = True) -> None:
    """True: the library queues its log records for :func:`drain_logs` instead of writing them
    to stderr. False: back to stderr, after forwarding what is queued."""
    _require_log("attach_logs")
    if not attached:
        _lib.torch_arena_log_attach(0)
        drain_logs()
    else:
        _lib.torch_arena_log_attach(1)


def logs_dropped() -> int:
    """Log records lost so far because the queue was full."""
    _require_log("logs_dropped")
    return int(_lib.torch_arena_log_dropped())


def _unescape(field: str) -> str:
    """Undo log.rs's escapes of backslash, tab, newline and carriage return."""
    return _ESCAPED.sub(lambda m: _UNESCAPE[m.group(1)], field)


def drain_logs() -> list[tuple[int, str, str]]:
    """Move the library's queued log records to ``logging.getLogger("torch_arena")`` (the Rust
    target in ``record.target``) and return them as ``(level, target, message)``. ``[]`` when
    none are queued (one cheap call) or the library has no log exports."""
    if not _HAS_LOG or _lib.torch_arena_log_drain(None, 0) == 0:
        return []
    records = []
    cap = _DRAIN_CAP
    buf = ctypes.create_string_buffer(cap)
    while True:
        n = _lib.torch_arena_log_drain(buf, cap)
        if n == 0:
            break
        if n >= cap:  # one record longer than the buffer: grow it, nothing was popped
            cap = n + 1
            buf = ctypes.create_string_buffer(cap)
            continue
        # Split on "\n" only: a record is one line, its own line breaks are escaped.
        for line in buf.raw[:n].decode("utf-8", errors="replace").split("\n")[:-1]:
            level_name, _, rest = line.partition("\t")
            target, _, message = rest.partition("\t")
            level = _LEVELS.get(level_name, logging.WARNING)
            records.append((level, _unescape(target), _unescape(message)))
    for level, target, message in records:
        _logger.log(level, "%s", message, extra={"target": target})
    return records


# ---------------------------------------------------------------------------------------------
# Tracking: steps, tags, allocation sites, the live table, leaks, layout and history (issue 4).
# The JSON schemas are those of docs/tracking-abi.md; each function returns the parsed JSON.


def has_track() -> bool:
    """Whether the library has the tracking exports (steps, sites, live table, leaks...)."""
    return _HAS_TRACK


def _require_track(call: str) -> None:
    if not _HAS_TRACK:
        raise RuntimeError(
            f"{call}: this build of the torch-arena library has no tracking exports "
            "(torch_arena_step, torch_arena_leaks_json, ...); rebuild it with `pip install .`"
        )


def step() -> int:
    """Advance the process-wide step; the new step number (steps start at 0)."""
    _require_track("step")
    n = int(_lib.torch_arena_step())
    if n == 0:  # steps start at 0, so a new step is >= 1: 0 is the failure value
        raise _error(ERR_OTHER, "torch_arena_step")
    return n


def current_step() -> int:
    """The process-wide step number."""
    _require_track("current_step")
    return int(_lib.torch_arena_current_step())


def tag_push(tag: str) -> None:
    """Push ``tag`` on the process-wide tag stack: new allocations carry the innermost tag."""
    _require_track("tag_push")
    _check(_lib.torch_arena_tag_push(_text("tag_push", "tag", tag)), "torch_arena_tag_push")


def tag_pop() -> None:
    """Pop the innermost tag; ValueError when the stack is empty."""
    _require_track("tag_pop")
    _check(_lib.torch_arena_tag_pop(), "torch_arena_tag_pop")


def set_sites(mode: str, every: int = 1, min_bytes: int = 0) -> None:
    """Capture allocation sites from now on: ``mode`` is "none", "python", "native" or "all";
    one allocation in ``every`` (>= 1); only requests of at least ``min_bytes``."""
    _require_track("set_sites")
    data = _text("set_sites", "mode", mode)
    every = _int("set_sites", "every", every, 1, U64_MAX)
    min_bytes = _int("set_sites", "min_bytes", min_bytes, 0, U64_MAX)
    _check(_lib.torch_arena_set_sites(data, every, min_bytes), "torch_arena_set_sites")


def history_enable(enabled: bool, max_entries: int = 0) -> None:
    """Start (clearing it) or stop a bounded ring of ``max_entries`` trace entries."""
    _require_track("history_enable")
    max_entries = _int("history_enable", "max_entries", max_entries, 0, U64_MAX)
    code = _lib.torch_arena_history_enable(int(bool(enabled)), max_entries)
    _check(code, "torch_arena_history_enable")


def _json(fn: Callable[..., int], call: str, device: int, *args: Any) -> dict[str, Any]:
    """Call a JSON export of ``device`` (snprintf convention; 0 = failure) and parse it."""
    import json

    _require_track(call)
    device = _device(call, device)
    clear_last_error()
    text = _copy_out(fn, device, *args, initial=65536)
    if not text:
        msg = last_error()
        code = _probe(device)  # a bad device or configuration says so
        exc = ValueError if code in _VALUE_ERRORS else RuntimeError
        raise exc(msg or f"{call}({device}) failed")
    return json.loads(text)


def live_json(device: int) -> dict[str, Any]:
    """``device``'s live allocations with their step, tag and site, and the sites' frames."""
    return _json(_lib.torch_arena_live_json, "torch_arena_live_json", device)


def leaks_json(device: int, warmup: int, age_steps: int) -> dict[str, Any]:
    """``device``'s growing sites after step ``warmup``, and allocations older than
    ``age_steps`` steps (0: none)."""
    warmup = _int("leaks_json", "warmup", warmup, 0, U64_MAX)
    age_steps = _int("leaks_json", "age_steps", age_steps, 0, U64_MAX)
    return _json(_lib.torch_arena_leaks_json, "torch_arena_leaks_json", device, warmup, age_steps)


def layout_json(device: int) -> dict[str, Any]:
    """``device``'s segments and the blocks that cover them (for snapshots)."""
    return _json(_lib.torch_arena_layout_json, "torch_arena_layout_json", device)


def history_json(device: int) -> dict[str, Any]:
    """``device``'s recorded trace entries (empty unless :func:`history_enable` is on)."""
    return _json(_lib.torch_arena_history_json, "torch_arena_history_json", device)
