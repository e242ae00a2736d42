"""``cpu_tensors:True``: real torch tensors from the arena without a GPU, for tests.

With ``TORCH_ARENA_CONF=device:sim,sim_backing:True,cpu_tensors:True``, :func:`enable` makes a
small C++ allocator (``_cpu_tensors.cpp``) c10's CPU allocator: the storage of every CPU tensor
made from then on comes from simulated device 0 (real host pages, thanks to ``sim_backing``),
through the library's ``torch_arena_try_malloc`` / ``torch_arena_try_free``, so it is tracked,
counted and reported exactly as a CUDA tensor's storage would be. Real models, autograd and
optimizers then run through the arena on a machine with no GPU.

The allocator is compiled on first use against the running torch's headers (torch ships them)
with the system's C++ compiler (``CXX``, else ``c++``, ``g++`` or ``clang++``): about 1.5 s,
once; the shared library is cached under ``$TORCH_ARENA_CACHE`` (default
``$XDG_CACHE_HOME/torch-arena``, else ``~/.cache/torch-arena``; a folder under the temporary
one if that is not writable), named by a hash of the source, the torch version and headers, the
compiler and its flags, so a new torch or compiler builds a new one. Not built at ``pip
install``: the wheel would then depend on one torch's C++ ABI, and torch is not a build
dependency.

Storages allocated before enable() keep the previous allocator's deleter and are freed by it;
``raw_deallocate`` of such a pointer through the new allocator is handed back to the previous
one. Only ``c10::GetCPUAllocator()`` users are served: that is every ``torch.empty`` /
``zeros`` / ``randn``, every op output, autograd's buffers and optimizer state; code that asks
for ``c10::GetDefaultCPUAllocator()`` by name, and memory torch does not allocate (``from_numpy``,
``from_blob``), is not. In a fork child (DataLoader workers) the arena is left to the parent,
whose simulated pages the child shares: new storages come from the previous allocator, and
freeing an inherited one only forgets it.
"""

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from . import _native

__all__ = ["DEVICE", "active", "enabled_in", "install", "live", "prepare", "uninstall"]

# The simulated device CPU tensors live on.
DEVICE = 0

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cpu_tensors.cpp")
_FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden")

_lock = threading.Lock()
_lib: Any = None  # the loaded allocator library (prepare)
_active = False  # installed as c10's CPU allocator (install)


def enabled_in(items: dict[str, str]) -> bool:
    """Whether configuration items (``_native.conf_items``) ask for ``cpu_tensors``."""
    return items.get("cpu_tensors") == "True"


def active() -> bool:
    """Whether CPU tensors come from the arena in this process."""
    return _active


def live_counter() -> Callable[[], int] | None:
    """:func:`live` where CPU tensors come from the arena, else None (what a report's gather
    waits on: ``_ranks.across_ranks``)."""
    return live if _active else None


def live() -> int:
    """CPU storages the arena's CPU allocator made that are still alive (-1: not installed)."""
    if _lib is None:
        return -1
    return int(_lib.torch_arena_cpu_live())


def _cache_dir() -> str:
    base = os.environ.get("TORCH_ARENA_CACHE")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "torch-arena")
    return base


def _compiler() -> list[str]:
    cxx = os.environ.get("CXX")
    if cxx:
        return shlex.split(cxx)
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return [name]
    raise RuntimeError(
        "cpu_tensors:True needs a C++ compiler to build torch-arena's CPU allocator (once, "
        "cached): none found (set CXX, or install g++)"
    )


def _compiler_version(cxx: list[str]) -> str:
    try:
        out = subprocess.run(
            [*cxx, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
        return out.stdout.splitlines()[0] if out.stdout else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def _build(torch: Any) -> str:
    """The path of the compiled allocator for this torch, compiled now if not cached."""
    include = os.path.join(os.path.dirname(torch.__file__), "include")
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    if not os.path.isfile(os.path.join(include, "c10", "core", "CPUAllocator.h")):
        raise RuntimeError(
            f"cpu_tensors:True needs torch's C++ headers, which this torch lacks ({include}); "
            "install a torch wheel from PyPI or download.pytorch.org (they ship them)"
        )
    cxx = _compiler()
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    flags = [*_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    with open(_SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256()
    for part in (torch.__version__, include, " ".join(cxx), _compiler_version(cxx), *flags):
        key.update(part.encode() + b"\0")
    key.update(source)
    name = f"cpu_tensors-{key.hexdigest()[:16]}.so"
    # The cache, else (read-only home, say) a folder of this user's under the temporary one.
    folders = [_cache_dir(), os.path.join(tempfile.gettempdir(), f"torch-arena-{os.getuid()}")]
    for folder in folders:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    for folder in folders:
        try:
            os.makedirs(folder, exist_ok=True)
            # Compiled beside its final name and renamed into place: processes that build at
            # once (pytest-xdist, torchrun ranks) each write their own file; the last rename wins.
            fd, tmp = tempfile.mkstemp(prefix=".cpu_tensors-", suffix=".so", dir=folder)
            os.close(fd)
            break
        except OSError:
            continue
    else:
        raise RuntimeError(
            "cpu_tensors:True: no folder to build torch-arena's CPU allocator in "
            f"({' and '.join(folders)} are not writable); set TORCH_ARENA_CACHE to one that is"
        )
    path = os.path.join(folder, name)
    cmd = [
        *cxx,
        *flags,
        f"-I{include}",
        "-o",
        tmp,
        _SOURCE,
        f"-L{libdir}",
        "-lc10",
        f"-Wl,-rpath,{libdir}",
    ]
    try:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            raise RuntimeError(
                f"cpu_tensors:True: compiling torch-arena's CPU allocator failed ({exc})"
            ) from exc
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
            raise RuntimeError(
                "cpu_tensors:True: compiling torch-arena's CPU allocator failed "
                f"({shlex.join(cmd)}):\n{tail}"
            )
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def prepare(torch: Any) -> None:
    """Compile (or find in the cache) and load the allocator; nothing is installed yet.
    RuntimeError when it cannot be built (no compiler, no headers, a compile error)."""
    global _lib
    with _lock:
        if _lib is not None:
            return
        path = _build(torch)
        lib = ctypes.CDLL(path)
        lib.torch_arena_cpu_install.restype = ctypes.c_int
        lib.torch_arena_cpu_install.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        lib.torch_arena_cpu_uninstall.restype = ctypes.c_int
        lib.torch_arena_cpu_uninstall.argtypes = []
        lib.torch_arena_cpu_live.restype = ctypes.c_longlong
        lib.torch_arena_cpu_live.argtypes = []
        _lib = lib


def install() -> None:
    """Make the arena c10's CPU allocator (after :func:`prepare`). RuntimeError if c10 refuses."""
    global _active
    with _lock:
        if _active:
            return
        if _lib is None:
            raise RuntimeError("torch_arena._cpu_tensors.install() before prepare()")
        addresses = [
            _native.symbol_address(name)
            for name in ("torch_arena_try_malloc", "torch_arena_try_free", "torch_arena_last_error")
        ]
        err = ctypes.create_string_buffer(512)
        if _lib.torch_arena_cpu_install(*addresses, DEVICE, err, len(err)) != 0:
            raise RuntimeError(
                f"cpu_tensors:True: torch-arena's CPU allocator could not be installed: "
                f"{err.value.decode(errors='replace')}"
            )
        _active = True


def uninstall() -> None:
    """Give c10 its previous CPU allocator back (enable() does when its CUDA allocator swap fails
    after :func:`install`). Storages already made stay the arena's until they are freed."""
    global _active
    with _lock:
        if _active:
            _lib.torch_arena_cpu_uninstall()
            _active = False
