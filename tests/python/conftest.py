"""Shared setup for the Python tests: they exercise the INSTALLED torch_arena package (built by
`pip install .`), on a simulated device backed by host memory, so they need no GPU and no torch.

The allocator reads TORCH_ARENA_CONF once per process, on first use, so it is set here before
torch_arena is imported. Tests that need another configuration run in a subprocess
(`run_python`).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONF = "device:sim,sim_capacity_mb:4096,sim_backing:True"
CAPACITY = 4096 << 20

os.environ["TORCH_ARENA_CONF"] = CONF
os.environ.pop("TORCH_ARENA", None)

REPO = Path(__file__).resolve().parents[2]

try:
    import torch_arena
except ImportError as e:  # pragma: no cover - the message is the point
    pytest.exit(
        f"torch_arena is not importable ({e}); install it first: pip install . "
        "(scripts/test does this in .venv-test)",
        returncode=2,
    )

if Path(torch_arena.__file__).resolve().is_relative_to(REPO / "python"):
    pytest.exit(
        f"torch_arena was imported from the source tree ({torch_arena.__file__}), not from the "
        "installed package; do not put python/ on sys.path",
        returncode=2,
    )


def run_python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """Run ``python -c code`` in a fresh interpreter of this environment, with TORCH_ARENA unset
    and TORCH_ARENA_CONF the tests' configuration, unless ``env`` says otherwise."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("TORCH_ARENA", "PYTHONPATH")}
    full_env["TORCH_ARENA_CONF"] = CONF
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def no_leaked_allocations():
    """The test frees what it allocates: live allocations on device 0 are the same after it.
    (Not autouse: it starts the allocator in the pytest process, which tests of the torch
    integration may need to do themselves.)"""
    before = torch_arena.memory_stats(0)["allocation.all.current"]
    yield
    after = torch_arena.memory_stats(0)["allocation.all.current"]
    assert after == before, f"the test left {after - before} allocation(s) live"


@pytest.fixture
def sites():
    """Python site capture for the test (the suite's configuration has none)."""
    from torch_arena import _capture

    _capture.set_capture("python", 1, 0)
    try:
        yield
    finally:
        _capture.restore()
