"""CUDA graph capture hooks against the real torch from PyPI, without a GPU.

torch's own pool entry points (the ones ``torch.cuda.use_mem_pool`` and inductor's cudagraph
trees call) reach the allocator object's hooks without CUDA: so torch's compiled code, built by
the wheel's GCC and libstdc++, hands our C++ shim a real ``std::function`` filter, and the shim
calls it. That is the layout check the static_asserts in cpp_shim/shim.cpp cannot make alone
(docs/cuda-graphs.md). Each test runs in a fresh interpreter: one allocator swap per process.
"""

import pytest
from test_torch import SIM, result, run

torch = pytest.importorskip("torch")

# torch's filter for _cuda_beginAllocateCurrentThreadToPool accepts the thread that began; the
# shim evaluates it in torch_arena_malloc. torch_arena_pool_of says where the block landed.
ROUTING = """
import ctypes, json, threading
import torch, torch_arena
from torch_arena import _native
torch_arena.enable()
lib = ctypes.CDLL(_native.library_path())
lib.torch_arena_malloc.restype = ctypes.c_void_p
lib.torch_arena_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.torch_arena_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
u64p = ctypes.POINTER(ctypes.c_uint64)
lib.torch_arena_pool_of.argtypes = [ctypes.c_void_p, ctypes.c_int, u64p, u64p]

def where(ptr):
    a, b = ctypes.c_uint64(), ctypes.c_uint64()
    rc = lib.torch_arena_pool_of(ptr, 0, ctypes.byref(a), ctypes.byref(b))
    return [a.value, b.value] if rc == 1 else None

pool = (7, 0)
torch._C._cuda_beginAllocateCurrentThreadToPool(0, pool)
try:
    torch._C._cuda_beginAllocateCurrentThreadToPool(0, pool)
    twice = "no error"
except RuntimeError as e:
    twice = str(e)
mine = lib.torch_arena_malloc(3 << 20, 0, 0x5100)
small = lib.torch_arena_malloc(4000, 0, 0x5100)
other = {}
t = threading.Thread(target=lambda: other.update(p=lib.torch_arena_malloc(3 << 20, 0, 0x5100)))
t.start(); t.join()
torch._C._cuda_endAllocateToPool(0, pool)
after = lib.torch_arena_malloc(3 << 20, 0, 0x5100)
places = dict(mine=where(mine), small=where(small), other=where(other["p"]), after=where(after))
lib.torch_arena_free(mine, 3 << 20, 0, 0x5100)
lib.torch_arena_free(small, 4000, 0, 0x5100)
torch._C._cuda_releasePool(0, pool)
for p in (other["p"], after):
    lib.torch_arena_free(p, 3 << 20, 0, 0x5100)
torch_arena.empty_cache()
out = dict(places=places, twice=twice, reserved=torch.cuda.memory_reserved(0),
           bad_frees=lib.torch_arena_bad_free_count())
print("RESULT " + json.dumps(out), flush=True)
"""


def test_torch_compiled_filter_routes_allocations_to_the_pool():
    r = result(run(ROUTING, TORCH_ARENA_CONF=SIM))
    places = r["places"]
    # The thread that began the pool allocates from it; another thread, and the same thread
    # after the end, from general memory: torch's filter object was called correctly.
    assert places["mine"] == [7, 0]
    assert places["small"] == [7, 0]
    assert places["other"] is None
    assert places["after"] is None
    # Beginning a recording pool again raises, as under PyTorch's own allocator, and the first
    # capture's routing is intact.
    assert "already recording" in r["twice"]
    # Released and freed: nothing left after empty_cache.
    assert r["reserved"] == 0
    assert r["bad_frees"] == 0


def test_enable_warns_about_cudagraph_trees():
    proc = run(
        """
        import warnings, json
        import torch, torch_arena
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch_arena.enable()
        texts = [str(w.message) for w in caught if w.category is torch_arena.TorchArenaWarning]
        print("RESULT " + json.dumps(dict(texts=texts)), flush=True)
        """,
        TORCH_ARENA_CONF=SIM,
        TORCHINDUCTOR_CUDAGRAPHS="1",
    )
    texts = result(proc)["texts"]
    assert any("cudagraph_trees = False" in t and "163257" in t for t in texts), texts


def test_no_cudagraph_warning_by_default():
    proc = run(
        """
        import warnings, json
        import torch, torch_arena
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch_arena.enable()
        texts = [str(w.message) for w in caught]
        print("RESULT " + json.dumps(dict(texts=texts)), flush=True)
        """,
        TORCH_ARENA_CONF=SIM,
    )
    assert not any("cudagraph" in t for t in result(proc)["texts"])
