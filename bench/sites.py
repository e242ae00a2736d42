"""What Python allocation-site capture costs, measured from Python on the simulated device.

    .venv-test/bin/python bench/sites.py [--pairs N]

Each setting runs in a fresh interpreter (the configuration is fixed per process). A run times N
``caching_allocator_alloc`` + ``caching_allocator_delete`` pairs of 4 KiB through the installed
package (ctypes; the GIL is released for each call, so a capture has to take it back), at two
Python stack depths. The capture cost is the difference between a setting and ``sites:none`` in
the same table; ctypes' own overhead is in every row. Writes
``bench/results/sites-<UTC date>-<commit>.json`` and prints a table.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import torch_arena

def deep(n, f):
    return f() if n == 0 else deep(n - 1, f)

def run(pairs):
    alloc, free = torch_arena.caching_allocator_alloc, torch_arena.caching_allocator_delete
    for _ in range(1000):  # warm: slabs, interned stacks
        free(alloc(4096))
    t = time.perf_counter_ns()
    for _ in range(pairs):
        free(alloc(4096))
    return (time.perf_counter_ns() - t) / pairs

pairs, depth = int(sys.argv[1]), int(sys.argv[2])
best = min(deep(depth, lambda: run(pairs)) for _ in range(5))
print(json.dumps({"ns_per_pair": best}))
"""

SETTINGS = [
    ("sites:none", "no capture (tracking table only)"),
    ("sites:python", "every allocation"),
    ("sites:python,sites_every:100", "1 in 100 allocations"),
    ("sites:native", "every allocation, native frames"),
]


def measure(conf: str, pairs: int, depth: int) -> float:
    env = dict(os.environ, TORCH_ARENA_CONF=f"device:sim,sim_capacity_mb:1024,{conf}")
    env.pop("TORCH_ARENA", None)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(pairs), str(depth)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)["ns_per_pair"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20000)
    args = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    rows = []
    for depth in (0, 30):
        base = None
        for conf, what in SETTINGS:
            ns = measure(conf, args.pairs, depth)
            base = ns if base is None else base
            rows.append(
                {
                    "conf": conf,
                    "what": what,
                    "extra_python_frames": depth,
                    "ns_per_pair": round(ns, 1),
                    "ns_over_none": round(ns - base, 1),
                }
            )
            print(
                f"depth +{depth:<3} {conf:<32} {ns:9.0f} ns/pair  (+{ns - base:7.0f})",
                file=sys.stderr,
            )
    result = {
        "benchmark": "python site capture, alloc+delete pairs of 4 KiB via ctypes, sim device",
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), Python {platform.python_version()}",
        "command": f"python bench/sites.py --pairs {args.pairs}",
        "rows": rows,
    }
    day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    path = REPO / "bench" / "results" / f"sites-{day}-{commit}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
