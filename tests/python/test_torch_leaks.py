"""Leak hunting wired into torch by enable(), against the real (CUDA build of) torch on a
machine without a GPU: every optimizer.step() advances torch-arena's step, and torch.cuda's
snapshot and history functions answer from torch-arena. Each test runs in a fresh interpreter
(one allocator swap per process)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from torch_arena import _native

pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not _native.has_track(), reason="this torch-arena library has no tracking exports"
)

SIM = "device:sim,sim_capacity_mb:1024"
_SCRUB = ("TORCH_ARENA", "TORCH_ARENA_CONF", "PYTHONPATH", "PYTORCH_CUDA_ALLOC_CONF")


def run(code: str, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def test_every_optimizer_step_advances_the_step():
    r = run(
        """
        import json, torch, torch_arena
        torch_arena.enable()
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = torch_arena.current_step()
        for _ in range(3):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        adam = torch.optim.Adam(model.parameters())
        model(torch.randn(8, 4)).sum().backward()
        adam.step()
        print("RESULT", json.dumps({"steps": torch_arena.current_step() - before}))
        """,
        TORCH_ARENA_CONF=SIM,
    )
    assert r["steps"] == 4


def test_without_enable_optimizer_steps_do_not_count():
    r = run(
        """
        import json, torch, torch_arena
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        torch_arena.step()
        print("RESULT", json.dumps({"step": torch_arena.current_step()}))
        """,
        TORCH_ARENA_CONF=SIM,
    )
    assert r["step"] == 1


def test_torch_cuda_snapshot_functions_answer_from_torch_arena(tmp_path):
    path = tmp_path / "snap.pickle"
    r = run(
        f"""
        import json, pickle, torch, torch_arena
        torch_arena.enable()
        torch.cuda.memory._record_memory_history(max_entries=1000)
        ptr = torch_arena.caching_allocator_alloc(3 << 20, 0, 0)
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._dump_snapshot({str(path)!r})
        with open({str(path)!r}, "rb") as f:
            dumped = pickle.load(f)
        segs = torch.cuda.memory_snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        blocks = [b for s in snap["segments"] for b in s["blocks"]
                  if b["state"] == "active_allocated"]
        print("RESULT", json.dumps({{
            "ours": torch.cuda.memory._snapshot.__module__.startswith("torch_arena"),
            "ptr_in_snapshot": any(b["address"] == ptr for b in blocks),
            "dumped_same": dumped["segments"] == snap["segments"],
            "memory_snapshot_same": segs == snap["segments"],
            "traced": [e["action"] for e in snap["device_traces"][0] if e["addr"] == ptr],
            "frames": [f["filename"] for b in blocks if b["address"] == ptr
                       for f in b["frames"]],
        }}))
        """,
        TORCH_ARENA_CONF=SIM,
    )
    assert r["ours"] and r["ptr_in_snapshot"] and r["dumped_same"] and r["memory_snapshot_same"]
    assert r["traced"][-1] == "alloc"  # after the segment_map that made room, if any
    assert set(r["traced"]) <= {"segment_map", "alloc"}
    assert "<string>" in r["frames"]  # context="all": the site was captured


def test_torch_arena_1_prints_the_leak_report_at_exit_on_the_simulated_device(tmp_path):
    # README's first leak-hunting command, as written, on the simulated device: the report at
    # exit must name the leaking line (it once saw no device: torch's CUDA never initialises
    # on the simulated device, and the exit report listed only initialised CUDA devices).
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            import torch_arena

            history = []
            for i in range(6):
                history.append(torch_arena.caching_allocator_alloc(1 << 20))  # LEAK
                torch_arena.step()
            """
        )
    )
    line = next(i for i, t in enumerate(script.read_text().splitlines(), 1) if t.endswith("# LEAK"))
    out = tmp_path / "leaks.json"
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update(
        TORCH_ARENA="1",
        TORCH_ARENA_CONF=SIM + ",leaks:True",
        TORCH_ARENA_LEAK_REPORT=str(out),
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "torch-arena leak report, device 0" in proc.stderr, proc.stderr
    assert f"train.py:{line} in <module>" in proc.stderr, proc.stderr
    (device,) = json.loads(out.read_text())["devices"]
    (site,) = device["growing"]
    assert site["bytes_per_step"] == pytest.approx(1 << 20, rel=0.05)
