#!/usr/bin/env python3
"""What one ``torch.empty`` + ``del`` costs on the host through PyTorch, under its native
allocator and under torch-arena: the Rust pairs benchmark (bench/run) measured without PyTorch;
this is what a user's program pays, PyTorch's own bookkeeping and the pluggable allocator's
``std::function`` hop included.

    python3 bench/torch_pairs.py [--out DIR] [--iters N]

Runs itself twice in fresh interpreters, once per allocator (torch allows one allocator per
process; ``TORCH_ARENA=1`` switches torch-arena on through the installed package's autostart),
and writes ``torch-pairs.json`` into ``--out`` (default: the current folder). Needs a CUDA GPU.

Per size, the median over 5 rounds of ``iters`` pairs, in ns per pair:

- ``pair``: allocate and free at once (the caching fast path of both allocators);
- ``live1000``: the same with 1,000 other tensors of the size live, freed in allocation order.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = (512, 4096, 65536, 1 << 20, 8 << 20, 64 << 20)


def child(iters: int) -> dict:
    import torch

    arena = os.environ.get("TORCH_ARENA") == "1"
    if arena:
        import torch_arena

        assert torch_arena.is_enabled(), "TORCH_ARENA=1 but torch-arena is not the allocator"
    dev = torch.device("cuda")
    torch.empty(1, device=dev)  # CUDA context and allocator up
    out = {
        "allocator": "arena" if arena else "native",
        "backend": torch.cuda.get_allocator_backend(),
    }
    for n in SIZES:
        pair, live = [], []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(iters):
                x = torch.empty(n, dtype=torch.uint8, device=dev)
                del x
            pair.append((time.perf_counter_ns() - t0) / iters)
            held = [torch.empty(n, dtype=torch.uint8, device=dev) for _ in range(1000)]
            t0 = time.perf_counter_ns()
            for i in range(iters):
                held[i % 1000] = torch.empty(n, dtype=torch.uint8, device=dev)
            live.append((time.perf_counter_ns() - t0) / iters)
            del held
        out[str(n)] = {
            "pair_ns": round(statistics.median(pair)),
            "live1000_ns": round(statistics.median(live)),
        }
    torch.cuda.synchronize()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.iters)), flush=True)
        return 0
    results = {}
    for arena in (False, True):
        env = {k: v for k, v in os.environ.items() if k not in ("TORCH_ARENA", "TORCH_ARENA_CONF")}
        if arena:
            env["TORCH_ARENA"] = "1"
        proc = subprocess.run(
            [sys.executable, __file__, "--child", "--iters", str(args.iters)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(
                f"torch_pairs: the {'arena' if arena else 'native'} run failed:\n"
                f"{proc.stderr[-3000:]}"
            )
            return 1
        r = json.loads(lines[-1][len("RESULT ") :])
        results[r["allocator"]] = r
    print(
        f"{'size':>10} {'native pair':>12} {'arena pair':>11} {'native live':>12}"
        f" {'arena live':>11}  (ns)"
    )
    for n in SIZES:
        a, b = results["native"][str(n)], results["arena"][str(n)]
        print(
            f"{n:>10} {a['pair_ns']:>12} {b['pair_ns']:>11} {a['live1000_ns']:>12}"
            f" {b['live1000_ns']:>11}"
        )
    report = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "iters": args.iters, "results": results}
    try:
        import torch

        report["gpu"] = torch.cuda.get_device_name(0)
        report["torch"] = torch.__version__
    except Exception as exc:
        report["gpu"] = f"unknown: {exc}"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "torch-pairs.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
