"""What track_modules() costs a forward: the same CPU model (100 Linear(64, 64) layers, batch 8,
so that the hooks weigh against little compute) timed with and without the global forward hooks,
and explain() on it with a live graph; then explain() with a million more tensors alive (the
explain issue's target: within 2 s). Under TORCH_ARENA=1 with cpu_tensors:True those tensors are
a million live allocations of the arena (counted in the output). Prints JSON; BENCHMARKS.md,
"explain()".

usage: TORCH_ARENA_CONF=device:sim python bench/explain_hooks.py
       TORCH_ARENA=1 TORCH_ARENA_CONF=device:sim,sim_backing:True,cpu_tensors:True \
           python bench/explain_hooks.py
"""

import json
import platform
import timeit

import torch
import torch_arena

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(100)])
x = torch.randn(8, 64)


def forward() -> None:
    model(x).sum()


def best(fn, number: int = 200, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


forward()
off = best(forward)
torch_arena.track_modules()
on = best(forward)
loss = model(x).sum()
report = best(lambda: torch_arena.explain(json=True, device="cpu"), number=3, repeat=3)
torch_arena.track_modules(False)
live = [torch.empty(4) for _ in range(1_000_000)]
enabled = torch_arena.is_enabled()
arena_live = torch_arena.memory_stats(0)["allocation.all.current"] if enabled else 0
million = best(lambda: torch_arena.explain(json=True, device="cpu"), number=1, repeat=3)
del live
calls = 101  # the Sequential and its 100 layers
print(
    json.dumps(
        {
            "benchmark": "explain_hooks",
            "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "forward_s": {"hooks_off": off, "hooks_on": on},
            "hook_cost_per_module_call_us": (on - off) / calls * 1e6,
            "explain_s": report,
            "explain_1m_tensors_s": million,
            "arena_allocations_live": arena_live,
        }
    )
)
