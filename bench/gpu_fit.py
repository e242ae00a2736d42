#!/usr/bin/env python3
"""The smallest free GPU memory on which N training steps run, per allocator, on a real GPU.

    python3 bench/gpu_fit.py --out DIR [--steps N] [--workloads fixed,varlen] [--budget S]

The GPU round of the GPU issue (item 1 and 2): for each workload and each allocator (PyTorch's
native allocator with its defaults, with ``expandable_segments:True``, and torch-arena through
``TORCH_ARENA=1``), one child process of this script finds the smallest free memory at which
the workload's N steps run with no out-of-memory. The free memory is made exact with a *ballast*:
bytes taken with the driver's own ``cuMemAlloc`` (outside every allocator) so that what is left
free is the figure tried. The bisection runs inside the one process: per trial, the ballast is
resized, the model and optimizer are built, the steps run (an out-of-memory ends the trial), and
everything is freed and the allocator's cache emptied. Then, at the minimum x 1.02 and with all
the memory, the steady steps' time and memory driver calls; and a record of the allocations at
ample memory (PyTorch's snapshot schema, from either allocator) for `torch-arena fit`, which
gives the lab's minimum to put beside the GPU's.

Writes DIR/gpu-fit.json (one object: the device, every allocator and workload's minimum free
bytes, trials, steady steps) and the recordings DIR/fit-<workload>-<allocator>.pickle.
Each child stops after --budget seconds (default 100); the whole run is sized for one device
call of under 10 minutes. ``--dry-run`` runs the bisection against a model of memory on the CPU
(no torch needed): what the tests check.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

MiB = 1 << 20
ALLOCATORS = {
    "native": {"PYTORCH_CUDA_ALLOC_CONF": ""},
    "native-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "arena": {"TORCH_ARENA": "1"},
}


def precision(bytes_: int) -> int:
    """The bisection stops within max(32 MiB, 0.5 %): half the target's max(64 MiB, 1 %)."""
    return max(32 * MiB, bytes_ // 200)


def bisect_min_free(fits: Callable[[int], bool], lo: int, hi: int) -> tuple[int | None, int]:
    """The least free bytes in (lo, hi] at which ``fits`` holds, to ``precision``, assuming it
    holds at ``hi`` (checked first) and grows with the bytes; ``None`` when it does not fit at
    ``hi``. Returns it and the trials run."""
    trials = 1
    if not fits(hi):
        return None, trials
    best = hi
    while best - lo > precision(best):
        mid = (lo + best) // 2 // MiB * MiB
        if mid <= lo or mid >= best:
            break
        trials += 1
        if fits(mid):
            best = mid
        else:
            lo = mid
    return best, trials


class Ballast:
    """Device memory taken with the driver's cuMemAlloc, outside every allocator."""

    def __init__(self) -> None:
        name = os.environ.get("TORCH_ARENA_LIBCUDA", "libcuda.so.1")
        self.lib = ctypes.CDLL(name)
        self.lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.ptr: int | None = None

    def set(self, size: int) -> None:
        self.clear()
        if size <= 0:
            return
        p = ctypes.c_uint64()
        rc = self.lib.cuMemAlloc_v2(ctypes.byref(p), size)
        if rc != 0:
            raise RuntimeError(f"cuMemAlloc of a {size >> 20} MiB ballast failed: CUresult {rc}")
        self.ptr = p.value

    def clear(self) -> None:
        if self.ptr is not None:
            self.lib.cuMemFree_v2(self.ptr)
            self.ptr = None


def workload_lengths(name: str, steps: int, seq: int) -> list[int]:
    """Sequence length per step: fixed, or cycling through four (the GPU suite's pattern)."""
    if name == "fixed":
        return [seq] * steps
    if name == "varlen":
        cycle = [seq, seq * 3 // 4, seq // 2, seq * 7 // 8]
        return [cycle[i % 4] for i in range(steps)]
    raise SystemExit(f"gpu_fit: unknown workload '{name}' (fixed or varlen)")


def child(workload: str, steps: int, out: str, budget: float, allocator: str) -> dict[str, Any]:
    """Runs in the child process of one allocator: the bisection, then the steady steps."""
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "gpu"))
    import workloads as w  # the GPU suite's model, step and driver-call counts

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context, before the free memory is read
    ballast = Ballast()
    started = time.perf_counter()
    vocab, seq, batch = 1024, 512, 8
    lengths = workload_lengths(workload, steps, seq)

    def empty() -> None:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def run(timed: bool = False) -> list[dict[str, Any]]:
        torch.manual_seed(7)
        model = w.TinyLM(vocab=vocab, d=1024, heads=8, layers=8, seq=seq).to("cuda")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        per_step = []
        before = w.driver_calls()
        try:
            for length in lengths:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                chunk = torch.randint(0, vocab, (batch, length + 1), device="cuda")
                w.lm_step(model, opt, chunk, vocab).item()
                torch.cuda.synchronize()
                if timed:
                    now = w.driver_calls()
                    calls = sum(v - before.get(k, 0) for k, v in now.items())
                    before = now
                    per_step.append(
                        {"length": length, "ms": (time.perf_counter() - t0) * 1e3, "calls": calls}
                    )
        finally:
            del model, opt
            empty()
        return per_step

    empty()
    free0, total = torch.cuda.mem_get_info()

    def fits(free: int) -> bool:
        if time.perf_counter() - started > budget:
            raise TimeoutError("budget spent")
        empty()
        now_free = torch.cuda.mem_get_info()[0]
        ballast.set(now_free - free)
        try:
            run()
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            ballast.clear()
            empty()

    result: dict[str, Any] = {"allocator": allocator, "workload": workload, "steps": steps}
    result["device"] = torch.cuda.get_device_name(0)
    result["total_bytes"], result["free_at_start_bytes"] = total, free0
    # Record the allocations of one run at ample memory, in PyTorch's snapshot schema (under the
    # arena, torch_arena's functions of the same names write it).
    if allocator == "arena":
        import torch_arena as rec

        record, dump = rec.record_memory_history, rec.dump_snapshot
    else:
        record, dump = torch.cuda.memory._record_memory_history, torch.cuda.memory._dump_snapshot
    record(context=None, max_entries=1_000_000)
    run()
    dump(os.path.join(out, f"fit-{workload}-{allocator}.pickle"))
    record(enabled=None)
    try:
        best, trials = bisect_min_free(fits, 0, free0 - 64 * MiB)
        result["min_free_bytes"], result["trials"] = best, trials
    except TimeoutError:
        result["min_free_bytes"], result["error"] = None, f"bisection stopped after {budget} s"
    steady: dict[str, Any] = {}
    for label, free in (("ample", None), ("min_x1.02", result.get("min_free_bytes"))):
        if label != "ample" and not free:
            continue
        if free:
            empty()
            ballast.set(torch.cuda.mem_get_info()[0] - int(free * 1.02))
        try:
            per_step = run(timed=True)
            tail = per_step[len(per_step) // 2 :]
            steady[label] = {
                "ms_per_step": sum(s["ms"] for s in tail) / max(1, len(tail)),
                "memory_calls_per_step": sum(s["calls"] for s in tail) / max(1, len(tail)),
                "steps": per_step,
            }
        except torch.cuda.OutOfMemoryError:
            steady[label] = {"error": "out of memory"}
        finally:
            ballast.clear()
    result["steady"] = steady
    return result


def parent(args: argparse.Namespace) -> int:
    os.makedirs(args.out, exist_ok=True)
    results = []
    for workload in args.workloads.split(","):
        workload_lengths(workload, 1, 8)  # a bad name stops here, before any run
        for allocator, env in ALLOCATORS.items():
            child_env = {**os.environ, **env}
            child_env.pop("TORCH_ARENA_CONF", None)
            if allocator != "arena":
                child_env.pop("TORCH_ARENA", None)
            cmd = [sys.executable, __file__, "--child", allocator, "--workload-one", workload]
            cmd += ["--steps", str(args.steps), "--out", args.out, "--budget", str(args.budget)]
            print(f"gpu_fit: {workload} under {allocator}", flush=True)
            try:
                p = subprocess.run(
                    cmd, env=child_env, capture_output=True, text=True, timeout=args.budget + 60
                )
                lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
                r = json.loads(lines[-1]) if lines else {"error": p.stderr[-2000:]}
            except subprocess.TimeoutExpired:
                r = {"error": f"stopped after {args.budget + 60} s"}
            r.update({"allocator": allocator, "workload": workload})
            print(json.dumps({k: v for k, v in r.items() if k != "steady"}), flush=True)
            results.append(r)
    with open(os.path.join(args.out, "gpu-fit.json"), "w") as f:
        json.dump(
            {
                "benchmark": "gpu-fit",
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "results": results,
            },
            f,
            indent=1,
        )
    return 0 if all(r.get("min_free_bytes") for r in results) else 1


def dry_run() -> int:
    """The bisection against a model: an allocator that needs `need` bytes fits when free >=
    need; the minimum found must be within the precision above it."""
    for need in (300 * MiB, 7 * 1024 * MiB + 123, 40 * 1024 * MiB):
        best, trials = bisect_min_free(lambda free, n=need: free >= n, 0, 80 * 1024 * MiB)
        assert best is not None and need <= best <= need + precision(best) + MiB, (need, best)
        print(json.dumps({"need": need, "found": best, "trials": trials}))
    assert bisect_min_free(lambda free: False, 0, 1 << 30) == (None, 1)
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--workloads", default="fixed,varlen")
    ap.add_argument("--budget", type=float, default=100.0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--child", choices=sorted(ALLOCATORS), help=argparse.SUPPRESS)
    ap.add_argument("--workload-one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run()
    if args.child:
        r = child(args.workload_one, args.steps, args.out, args.budget, args.child)
        print(json.dumps(r))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
