"""The programs the GPU suite runs, each in a fresh interpreter (torch allows one allocator swap
per process, so native and torch-arena runs never share one).

    python tests/gpu/workloads.py NAME [--device cuda]

runs workload NAME and prints one line ``RESULT {json}`` on stdout. Whether torch-arena is the
allocator is up to the environment (TORCH_ARENA=1 and the installed autostart .pth), exactly as
for a user's script; every result says which allocator served it (``backend``, ``arena``).
Not a test module: test_gpu.py starts these.
"""

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

# cuBLAS is deterministic only with a fixed workspace; it reads this when its handle is created.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30

WORKLOADS: dict[str, Callable[[str], dict[str, Any]]] = {}


def workload(fn: Callable[[str], dict[str, Any]]) -> Callable[[str], dict[str, Any]]:
    WORKLOADS[fn.__name__] = fn
    return fn


def allocator_state() -> dict[str, Any]:
    """Which allocator serves this process."""
    import torch_arena

    return {
        "backend": torch.cuda.get_allocator_backend(),
        "arena": torch_arena.is_enabled(),
    }


def outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """``{"ok": True, "value": ...}`` or ``{"ok": False, "error": "Type: message"}``."""
    try:
        value = fn()
        try:
            json.dumps(value)
        except TypeError:
            value = repr(value)[:500]
        return {"ok": True, "value": value}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1000]}


def memory_figures() -> dict[str, Any]:
    """torch.cuda's memory figures (served by torch-arena when it is the allocator) and the
    driver's view (mem_get_info)."""
    free, total = torch.cuda.mem_get_info()
    return {
        "allocated": torch.cuda.memory_allocated(),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "max_reserved": torch.cuda.max_memory_reserved(),
        "driver_free": free,
        "driver_total": total,
        "stats_keys": len(torch.cuda.memory_stats()),
    }


# ---------------------------------------------------------------------------------------------
# Training: a small transformer, built from scratch, deterministic.


class Block(torch.nn.Module):
    """Pre-norm causal self-attention and an MLP, from plain matmuls (no fused SDPA kernels,
    whose backward may not be deterministic)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.norm2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (d // h) ** 0.5
        mask = torch.ones(t, t, device=x.device, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        att = scores.softmax(dim=-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    def __init__(
        self, vocab: int = 256, d: int = 256, heads: int = 4, layers: int = 4, seq: int = 128
    ) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.zeros(seq, d))
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_step(model: TinyLM, opt: Any, chunk: torch.Tensor, vocab: int) -> torch.Tensor:
    """One training step of next-token prediction on ``chunk`` (batch, length + 1); the loss."""
    logits = model(chunk[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), chunk[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


@workload
def train(device: str) -> dict[str, Any]:
    """30 AdamW steps of TinyLM on fixed random tokens; the losses as exact hex floats."""
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    vocab, seq, batch, steps = 256, 128, 16, 30
    gen = torch.Generator().manual_seed(99)
    data = torch.randint(0, vocab, (steps, batch, seq + 1), generator=gen)
    model = TinyLM(vocab=vocab, seq=seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    losses, t0 = [], time.perf_counter()
    for step in range(steps):
        chunk = data[step].to(device)
        loss = lm_step(model, opt, chunk, vocab)
        losses.append(float(loss.item()).hex())
    result: dict[str, Any] = {"losses": losses, "seconds": time.perf_counter() - t0}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        result.update(memory_figures())
        result["summary"] = torch.cuda.memory_summary()
        result.update(allocator_state())
    return result


# ---------------------------------------------------------------------------------------------
# Steady state: driver calls and time per training step.

# The calls that create, map, unmap or free device memory (DriverCounters::memory_calls).
MEMORY_CALLS = (
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemAlloc",
    "cuMemFree",
)


def driver_calls() -> dict[str, int]:
    """The memory driver calls made so far in this process, by kind: torch-arena's own counts
    (the "Driver calls" section of memory_summary) under the arena; under the native allocator
    its num_device_alloc / num_device_free (cudaMalloc + cuMemMap, cudaFree + cuMemUnmap)."""
    import re

    import torch_arena

    if not torch_arena.is_enabled():
        s = torch.cuda.memory_stats()
        return {"device_alloc": s["num_device_alloc"], "device_free": s["num_device_free"]}
    text = torch.cuda.memory_summary()
    calls, seen = {}, False
    for line in text.splitlines():
        if "Driver calls" in line:
            seen = True
            continue
        m = re.match(r"\|\s*(cu\w+)\s*\|\s*(\d+)", line)
        if seen and m and m.group(1) in MEMORY_CALLS:
            calls[m.group(1)] = int(m.group(2))
    if not seen:
        raise RuntimeError("memory_summary has no Driver calls section:\n" + text[-3000:])
    return calls


@workload
def steps(device: str) -> dict[str, Any]:
    """A GPT-style model trained for 40 steps: 20 of one shape, then 20 cycling through four
    sequence lengths (a repeating pattern). Per step: its memory driver calls and its time."""
    torch.manual_seed(7)
    vocab, seq, batch = 1024, 512, 8
    model = TinyLM(vocab=vocab, d=1024, heads=8, layers=8, seq=seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = [seq] * 20 + [512, 384, 256, 448] * 5
    per_step = []
    snapshot = os.environ.get("STEPS_SNAPSHOT")
    if snapshot:  # PyTorch's own record of every alloc and free, for the lab (replay --native)
        torch.cuda.memory._record_memory_history(context=None, max_entries=1_000_000)
    import torch_arena

    # Under the arena: what each step created, for a new peak of the bytes requested or below it.
    growth = torch_arena.growth if torch_arena.is_enabled() else None
    before = driver_calls()
    grown = growth() if growth else None
    for length in lengths:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        chunk = torch.randint(0, vocab, (batch, length + 1), device=device)
        loss = lm_step(model, opt, chunk, vocab)
        loss.item()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1000
        now = driver_calls()
        made = {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}
        before = now
        step = {"length": length, "ms": round(ms, 3), "calls": sum(made.values()), "by_kind": made}
        if growth:
            g = growth()
            step["growth"] = {k: v - grown[k] for k, v in g.items()}
            grown = g
        per_step.append(step)
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    result: dict[str, Any] = {"steps": per_step, "lengths": lengths}
    result.update(memory_figures())
    result["summary"] = torch.cuda.memory_summary()
    result.update(allocator_state())
    return result


# ---------------------------------------------------------------------------------------------
# Statistics against the driver's view.


@workload
def stats(device: str) -> dict[str, Any]:
    """Allocate a known mix, read every figure, free, empty_cache, read again."""
    base = memory_figures()
    sizes = [512, 4096, 100_000, MiB, 3 * MiB + 7, 17 * MiB, 64 * MiB, 300 * MiB]
    tensors = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes for _ in range(4)]
    live = memory_figures()
    summary = torch.cuda.memory_summary()
    nested = torch.cuda.memory_stats_as_nested_dict()
    del tensors
    after_free = memory_figures()
    torch.cuda.empty_cache()
    after_empty = memory_figures()
    torch.cuda.reset_peak_memory_stats()
    after_reset = memory_figures()
    torch.cuda.reset_accumulated_memory_stats()
    accumulated = torch.cuda.memory_stats()["allocation.all.allocated"]
    return {
        "requested": 4 * sum(sizes),
        "base": base,
        "live": live,
        "after_free": after_free,
        "after_empty": after_empty,
        "after_reset": after_reset,
        "accumulated_after_reset": accumulated,
        "nested_current": nested["allocated_bytes"]["all"]["current"],
        "summary": summary,
        **allocator_state(),
    }


# ---------------------------------------------------------------------------------------------
# record_stream across two streams.


def _streams(record: bool, iters: int = 40, n: int = 4 * MiB) -> dict[str, Any]:
    """Produce on stream A, consume on B (which is held back by a sleep kernel), free the input
    on the host, then at once allocate and overwrite same-sized tensors on A. If the freed input
    were handed to A before B read it, B reads -1s. ``record`` says whether B is recorded on the
    input (tensor.record_stream), as correct code must."""
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    kept = []
    for i in range(iters):
        with torch.cuda.stream(a):
            x = torch.full((n,), float(i), device="cuda")
            ready = a.record_event()
        with torch.cuda.stream(b):
            b.wait_event(ready)
            torch.cuda._sleep(10_000_000)  # ~5 ms: B reads x well after the host frees it
            y = x * 2
            if record:
                x.record_stream(b)
        del x
        with torch.cuda.stream(a):
            junk = [torch.full((n,), -1.0, device="cuda") for _ in range(3)]
            load = torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
        kept.append((i, y, junk, load))
    torch.cuda.synchronize()
    wrong = [i for i, y, _, _ in kept if not bool((y == 2.0 * i).all())]
    return {"iterations": iters, "wrong": wrong}


@workload
def record_stream(device: str) -> dict[str, Any]:
    return {
        "with_record_stream": _streams(record=True),
        # Informative: without record_stream the reuse is legal and B may read overwritten
        # memory; shows that the test above can see a premature reuse at all.
        "without_record_stream": _streams(record=False),
        **allocator_state(),
    }


# ---------------------------------------------------------------------------------------------
# Out of memory.


@workload
def oom(device: str) -> dict[str, Any]:
    """Ask for more than the GPU has, then fill it in 1 GiB pieces until it is full; after each
    OOM the process must allocate again."""
    free, total = torch.cuda.mem_get_info()
    out: dict[str, Any] = {"total": total, "free_at_start": free}

    def too_big() -> None:
        torch.empty(total * 2, dtype=torch.uint8, device=device)

    out["too_big"] = _oom_outcome(too_big)
    x = torch.ones(MiB, device=device)
    out["after_too_big"] = float(x.sum().item())
    del x

    chunks = []

    def fill() -> None:
        while True:
            chunks.append(torch.empty(GiB, dtype=torch.uint8, device=device))

    out["fill"] = _oom_outcome(fill)
    out["chunks"] = len(chunks)
    out["reserved_when_full"] = torch.cuda.memory_reserved()
    chunks.clear()
    y = torch.ones(MiB, device=device)
    out["after_fill"] = float(y.sum().item())
    # The memory really came back: most of it can be taken again in one piece.
    again = torch.empty(max(out["chunks"] - 2, 1) * GiB, dtype=torch.uint8, device=device)
    out["again_bytes"] = again.numel()
    del again, y
    out["num_ooms"] = torch.cuda.memory_stats()["num_ooms"]
    out.update(allocator_state())
    return out


def _oom_outcome(fn: Callable[[], None]) -> dict[str, Any]:
    try:
        fn()
    except RuntimeError as exc:  # torch.OutOfMemoryError is a RuntimeError too
        return {"raised": True, "type": type(exc).__name__, "message": str(exc)[:2000]}
    return {"raised": False}


@workload
def memory_fraction(device: str) -> dict[str, Any]:
    """set_per_process_memory_fraction caps the allocator (our hook under torch-arena)."""
    free, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(0.25)
    small = outcome(lambda: torch.empty(total // 10, dtype=torch.uint8, device=device).numel())
    big = _oom_outcome(lambda: torch.empty(total // 2, dtype=torch.uint8, device=device))
    return {"total": total, "small": small, "big": big, **allocator_state()}


# ---------------------------------------------------------------------------------------------
# Pool mode: native allocator global, torch-arena behind a MemPool.


@workload
def pool(device: str) -> dict[str, Any]:
    import torch_arena
    from torch_arena import _native

    out: dict[str, Any] = {**allocator_state()}
    with torch_arena.pool() as first:
        inside = [torch.ones(n, device=device) for n in (1 << 10, MiB, 8 * MiB)]
    outside = torch.ones(MiB, device=device)
    with torch_arena.pool() as second:
        more = torch.ones(MiB, device=device)
    out["same_pool"] = first is second
    out["values"] = [float(t.sum().item()) for t in (*inside, outside, more)]

    def ours(t: torch.Tensor) -> bool:
        try:
            _native.base_alloc(t.data_ptr())
            return True
        except ValueError:
            return False

    out["inside_from_arena"] = [ours(t) for t in (*inside, more)]
    out["outside_from_arena"] = ours(outside)
    out["arena_reserved"] = torch_arena.memory_reserved()
    out["arena_allocated"] = torch_arena.memory_allocated()
    out["native_allocated"] = torch.cuda.memory_allocated()
    out["native_stats_keys"] = len(torch.cuda.memory_stats())
    out["native_summary_ok"] = "PyTorch CUDA memory summary" in torch.cuda.memory_summary()
    out["snapshot"] = outcome(lambda: len(torch.cuda.memory._snapshot()["segments"]))
    # explain() in pool mode: the tensors are PyTorch's to count (torch-arena is not the
    # device's allocator, so it has no cached or unusable bytes to give, and says so).
    report = torch_arena.explain(json=True, device="cuda")
    out["explain_other"] = report["categories"]["other"]
    out["explain_cached"] = report["cached_bytes"]
    out["explain_warns_not_served"] = any(
        "does not serve this device" in w for w in report["warnings"]
    )
    del inside, more, outside
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    out["arena_allocated_after_empty_cache"] = torch_arena.memory_allocated()
    return out


# ---------------------------------------------------------------------------------------------
# Probes: what works and what raises under the pluggable allocator (recorded for docs/python.md).


@workload
def probes(device: str) -> dict[str, Any]:
    x = torch.ones(MiB, device=device)
    out: dict[str, Any] = {**allocator_state()}
    acc = getattr(torch, "accelerator", None)
    for name in (
        "memory_stats",
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "empty_cache",
        "reset_peak_memory_stats",
    ):
        fn = getattr(acc, name, None)
        if fn is None:
            out[f"accelerator.{name}"] = {"ok": False, "error": "missing"}
        else:
            out[f"accelerator.{name}"] = outcome(lambda fn=fn: _size_of(fn()))
    # PyTorch's own torch.accelerator functions, which enable() replaced: what they do under a
    # pluggable allocator (expected: they read the unused native allocator).
    from torch_arena import _torch as integration

    for name in ("memory_stats", "memory_allocated"):
        fn = integration.original(name, "torch.accelerator")
        if fn is not None:
            out[f"accelerator.{name}.original"] = outcome(lambda fn=fn: _size_of(fn()))
    out["get_per_process_memory_fraction"] = outcome(torch.cuda.get_per_process_memory_fraction)
    out["_snapshot"] = outcome(lambda: len(torch.cuda.memory._snapshot()["segments"]))
    out["_record_memory_history"] = outcome(torch.cuda.memory._record_memory_history)
    out["memory_snapshot"] = outcome(lambda: len(torch.cuda.memory_snapshot()))
    out["MemPool"] = outcome(lambda: torch.cuda.MemPool().id)
    out["empty_cache"] = outcome(torch.cuda.empty_cache)

    def raw() -> int:
        p = torch.cuda.caching_allocator_alloc(4 * MiB)
        torch.cuda.caching_allocator_delete(p)
        return p

    out["caching_allocator_alloc"] = outcome(raw)
    out["mem_get_info"] = outcome(torch.cuda.mem_get_info)
    out["list_gpu_processes"] = outcome(lambda: torch.cuda.list_gpu_processes()[:200])
    out["x"] = float(x.sum().item())
    out["lightning"] = outcome(_lightning_stats)
    out["transformers"] = outcome(_transformers_tracker)
    return out


def _size_of(value: Any) -> Any:
    """A dict's length (its keys tell nothing here), anything else as is."""
    return len(value) if isinstance(value, dict) else value


def _lightning_stats() -> int:
    try:
        from lightning.pytorch.accelerators import CUDAAccelerator
    except ImportError:
        from pytorch_lightning.accelerators import CUDAAccelerator
    return len(CUDAAccelerator().get_device_stats(torch.device("cuda", 0)))


def _transformers_tracker() -> dict[str, Any]:
    from transformers.trainer_utils import TrainerMemoryTracker

    tracker = TrainerMemoryTracker(skip_memory_metrics=False)
    metrics: dict[str, Any] = {}

    def train() -> None:  # the tracker reads the stage from its caller's name
        tracker.start()
        y = torch.ones(16 * MiB, device="cuda")
        del y
        tracker.stop_and_update_metrics(metrics)

    train()
    return metrics


@workload
def cudnn(device: str) -> dict[str, Any]:
    """A convolution forward and backward, first with cudnn.benchmark False, then True. The
    benchmark run uses another input shape: PyTorch keeps the plans it found by shape whatever
    the flag, and a cached plan would skip the benchmark (and its workspace sizing) entirely."""

    def conv(benchmark: bool, side: int) -> float:
        torch.backends.cudnn.benchmark = benchmark
        torch.manual_seed(11)  # the same weights and input under both allocators
        layer = torch.nn.Conv2d(16, 32, 3, padding=1).to(device)
        inp = torch.randn(8, 16, side, side, device=device, requires_grad=True)
        out = layer(inp)
        out.sum().backward()
        torch.cuda.synchronize()
        return float(inp.grad.abs().sum().item())

    return {
        "benchmark_false": outcome(lambda: conv(False, 64)),
        "benchmark_true": outcome(lambda: conv(True, 72)),
        **allocator_state(),
    }


@workload
def graphs(device: str) -> dict[str, Any]:
    """torch.cuda.graph capture and replay (no error is expected from PyTorch; safety is the
    allocator's)."""
    static_in = torch.ones(MiB, device=device)

    def capture() -> list[float]:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                (static_in * 2).sum()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = (static_in * 2 + 1).sum()
        values = []
        for v in (1.0, 2.0, 3.0):
            static_in.fill_(v)
            g.replay()
            torch.cuda.synchronize()
            values.append(float(static_out.item()))
        return values

    return {"capture": outcome(capture), **allocator_state()}


@workload
def compile_default(device: str) -> dict[str, Any]:
    """torch.compile with the default mode (no CUDA graphs)."""
    fn = torch.compile(lambda a: (a.sin() * 2 + a.cos()).sum())
    a = torch.ones(MiB, device=device)
    return {"compile": outcome(lambda: float(fn(a).item())), **allocator_state()}


@workload
def compile_reduce_overhead(device: str) -> dict[str, Any]:
    """torch.compile(mode="reduce-overhead"): inductor's CUDA graph trees."""
    fn = torch.compile(lambda a: (a.sin() * 2 + a.cos()).sum(), mode="reduce-overhead")
    a = torch.ones(MiB, device=device)

    def run() -> float:
        for _ in range(3):
            r = fn(a)
        return float(r.item())

    return {"compile": outcome(run), **allocator_state()}


# ---------------------------------------------------------------------------------------------
# Leak hunting (run with TORCH_ARENA=1 TORCH_ARENA_CONF=leaks:True): real training loops with a
# planted leak, each allocating statement marked "# LEAK" (the test finds the line by reading
# this file), and a clean GPT-style loop that must report nothing. Steps advance on
# optimizer.step(), as for a user.


def _leak_line(tag: str) -> int:
    """The line of this file that ends with ``# LEAK <tag>``."""
    with open(__file__) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# LEAK {tag}"):
                return n
    raise LookupError(tag)


def _leak_result(expected_tag: str | None, planted: float | None) -> dict[str, Any]:
    """The leak report, reduced to what the test checks: per growing site its user frame,
    bytes per step and holders; the planted line and bytes per step."""
    import torch_arena
    from torch_arena.leaks import site_location

    torch.cuda.synchronize()
    report = torch_arena.leak_report(format="json")
    sites = []
    for s in report["growing"]:
        loc = site_location(s["frames"])
        sites.append(
            {
                "file": os.path.basename(loc[0]) if loc else None,
                "line": loc[1] if loc else None,
                "bytes_per_step": s["bytes_per_step"],
                "holders": [h["expr"] for h in s.get("holders", [])],
            }
        )
    return {
        "sites": sites,
        "expected_file": os.path.basename(__file__),
        "expected_line": _leak_line(expected_tag) if expected_tag else None,
        "planted_per_step": planted,
        "steps": report["step"],
        "text": torch_arena.leak_report(),
        **allocator_state(),
    }


def _mlp(device: str, width: int = 1024) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width)
    ).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


@workload
def leak_loss_graph(device: str) -> dict[str, Any]:
    """losses.append(loss): every step's loss keeps its autograd graph and saved activations."""
    model, opt = _mlp(device)
    losses = []
    before: list[int] = []
    for _ in range(12):
        x = torch.randn(64, 1024, device=device)
        loss = model(x).square().mean()  # LEAK graph
        opt.zero_grad(set_to_none=True)
        loss.backward(retain_graph=True)  # keeps the saved tensors alive with the graph
        opt.step()
        losses.append(loss)  # the bug: loss, not loss.item()
        before.append(torch.cuda.memory_allocated())
    grown = (before[-1] - before[3]) / (len(before) - 4)
    return _leak_result("graph", grown)


@workload
def leak_forward_hook(device: str) -> dict[str, Any]:
    """A forward hook that stashes every activation."""
    model, opt = _mlp(device)
    stash = []

    def keep(module: Any, inputs: Any, output: torch.Tensor) -> None:
        stash.append(output.detach().clone())  # LEAK hook

    model[1].register_forward_hook(keep)
    for _ in range(12):
        loss = model(torch.randn(64, 1024, device=device)).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return _leak_result("hook", 64 * 1024 * 4.0)


_EMBED_CACHE: dict = {}


@workload
def leak_growing_cache(device: str) -> dict[str, Any]:
    """A memo keyed by the step: one new 4 MiB tensor per step, never evicted."""
    model, opt = _mlp(device)
    for i in range(12):
        key = ("prompt", i)
        if key not in _EMBED_CACHE:
            _EMBED_CACHE[key] = torch.randn(1024, 1024, device=device)  # LEAK cache
        loss = (model(_EMBED_CACHE[key][:64]) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return _leak_result("cache", 1024 * 1024 * 4.0)


@workload
def clean_gpt(device: str) -> dict[str, Any]:
    """TinyLM trained with AdamW (optimizer state created on the first step, activations freed
    every step, the loss read with .item()): nothing may be reported."""
    torch.manual_seed(1234)
    vocab, seq, batch = 256, 128, 16
    model = TinyLM(vocab=vocab, seq=seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    history = []
    for _ in range(16):
        chunk = torch.randint(0, vocab, (batch, seq + 1), device=device)
        loss = lm_step(model, opt, chunk, vocab)
        history.append(loss.item())
    return _leak_result(None, None)


def _unique_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages of ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _explain_device(device: str) -> str:
    return "cpu" if device == "cpu" else "cuda"


def _try_step(model: Any, opt: Any, batch: int, seq: int, vocab: int, device: str) -> bool:
    """Whether one training step at ``batch`` runs without out-of-memory (the cache emptied
    first, so that each try starts from the same reserved memory)."""
    import gc

    import torch_arena

    torch_arena.empty_cache()
    try:
        chunk = torch.randint(0, vocab, (batch, seq + 1), device=device)
        lm_step(model, opt, chunk, vocab)
        return True
    except RuntimeError as exc:  # torch.OutOfMemoryError is one
        if "out of memory" not in str(exc):
            raise
        return False
    finally:
        opt.zero_grad(set_to_none=False)
        gc.collect()


@workload
def explain_truth(device: str) -> dict[str, Any]:
    """torch_arena.explain() on a real model against ground truths measured another way (issue
    41, item 3), under TORCH_ARENA_CONF with explain:True. On a GPU; on the CPU with the
    simulated device serving CPU tensors (cpu_tensors:True) the same program runs in CI.

    - parameters, gradients, optimizer state: exact, from the model and optimizer;
    - activations: what saved_tensors_hooks packs during the forward (less parameters) plus the
      live outputs;
    - an evaluation loop with grad enabled whose outputs are kept: held graphs, remedy no_grad;
    - a batch too large under a memory limit: the smaller_batch estimate written at the
      out-of-memory error against the largest batch that fits, found by trying (bisection)."""
    import gc
    import re

    import torch_arena

    on = _explain_device(device)
    torch.manual_seed(0)
    vocab, seq = 256, 128
    model = TinyLM(vocab=vocab, seq=seq).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch_arena.track_modules()
    chunk = torch.randint(0, vocab, (8, seq + 1), device=device)
    lm_step(model, opt, chunk, vocab)  # gradients and Adam's state exist from here

    # What autograd saves, by storage. The hook keeps a detached alias, not the tensor itself: a
    # saved output that packed itself would hold its own grad_fn, a cycle that is never freed.
    packed: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        packed[st.data_ptr()] = st.nbytes()
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(chunk[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, vocab), chunk[:, 1:].reshape(-1)
        )
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for out in (logits.untyped_storage(), loss.untyped_storage()):
        packed[out.data_ptr()] = out.nbytes()
    truth = {
        "parameters": _unique_bytes(list(model.parameters()) + list(model.buffers())),
        "gradients": _unique_bytes(p.grad for p in model.parameters() if p.grad is not None),
        "optimizer_state": _unique_bytes(
            v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)
        ),
        "activations": sum(n for ptr, n in packed.items() if ptr not in params),
    }
    report = torch_arena.explain(json=True, device=on)
    del logits, loss

    # An evaluation loop run with grad enabled, its outputs kept past a step boundary.
    model.eval()
    outputs = [model(chunk[:, :-1]) for _ in range(2)]
    torch_arena.step()
    held = torch_arena.explain(json=True, device=on)
    del outputs
    model.train()
    gc.collect()

    # Too large a batch under a limit: base (parameters, gradients, state) plus room for the
    # activations of about four times the batch of 8.
    torch_arena.empty_cache()
    opt.zero_grad(set_to_none=True)
    base = torch_arena.memory_allocated()
    torch_arena.reset_peak_memory_stats()
    _try_step(model, opt, 8, seq, vocab, device)
    peak8 = torch_arena.max_memory_allocated()
    limit = base + 4 * (peak8 - base)
    total = torch_arena.pages()["limit_bytes"]
    torch_arena.set_per_process_memory_fraction(limit / total)
    too_big = 64
    message = ""
    try:
        chunk = torch.randint(0, vocab, (too_big, seq + 1), device=device)
        lm_step(model, opt, chunk, vocab)
    except RuntimeError as exc:  # torch.OutOfMemoryError is one
        if "out of memory" not in str(exc):
            raise
        message = str(exc)
    del chunk
    opt.zero_grad(set_to_none=True)
    gc.collect()
    found = re.search(r"the whole report is in (\S+\.explain\.json)", message)
    oom_report = json.load(open(found[1])) if found else None
    lo, hi = 1, too_big  # lo fits (checked below), hi does not
    fits_1 = _try_step(model, opt, 1, seq, vocab, device)
    while fits_1 and hi - lo > 1:
        mid = (lo + hi) // 2
        if _try_step(model, opt, mid, seq, vocab, device):
            lo = mid
        else:
            hi = mid
    torch_arena.set_per_process_memory_fraction(1.0)
    torch_arena.track_modules(False)
    return {
        "device": device,
        "truth": truth,
        "report": report,
        "held": held,
        "limit_bytes": limit,
        "oom_message": message[-3000:],
        "oom_report": oom_report,
        "largest_batch_that_fits": lo if fits_1 else 0,
        "too_big": too_big,
    }


def explain_truth_failures(r: dict[str, Any]) -> list[str]:
    """What explain_truth's result gets wrong against its ground truths (empty: nothing), the
    explain issue's targets: parameters, gradients and optimizer state exact; activations within
    10 %; held graphs of an evaluation loop remedied by no_grad; the smaller_batch estimate
    within 25 % of the largest batch found by trying. Shared by the GPU and the CPU test."""
    bad = []
    got, truth = r["report"]["categories"], r["truth"]
    for cat in ("parameters", "gradients", "optimizer_state"):
        if got[cat] != truth[cat]:
            bad.append(f"{cat}: explain {got[cat]}, truth {truth[cat]}")
    if abs(got["activations"] - truth["activations"]) > 0.1 * truth["activations"]:
        bad.append(f"activations: explain {got['activations']}, truth {truth['activations']}")
    held = r["held"]
    if not held["categories"]["held_graphs"]:
        bad.append(f"no held graphs after an evaluation loop with grad: {held['categories']}")
    if "no_grad" not in [m["id"] for m in held["remedies"]]:
        bad.append(f"no no_grad remedy: {held['remedies']}")
    oom = r["oom_report"]
    if oom is None:
        bad.append(f"no report named at the out-of-memory error: {r['oom_message']!r}")
        return bad
    remedies = {m["id"]: m for m in oom["remedies"]}
    fits = r["largest_batch_that_fits"]
    estimate = oom["oom"].get("batch_that_fits")
    if "smaller_batch" not in remedies or estimate is None:
        bad.append(f"no smaller_batch remedy at batch {r['too_big']}: {oom['remedies']}")
    elif not fits or abs(estimate - fits) > 0.25 * fits:
        bad.append(f"smaller_batch: estimated {estimate}, the largest that fits is {fits}")
    return bad


def main(argv: list[str]) -> int:
    name = argv[1]
    device = argv[argv.index("--device") + 1] if "--device" in argv else "cuda"
    try:
        result = WORKLOADS[name](device)
    except Exception:
        traceback.print_exc()
        return 1
    result["pid"] = os.getpid()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
