"""The GPU suite: real torch, a real GPU, the installed torch_arena wheel (scripts/gpu-check).

Each check runs a program of workloads.py in a fresh interpreter, once with PyTorch's native
allocator and, where it compares, once with ``TORCH_ARENA=1`` (the autostart .pth switches
torch-arena on at ``import torch``, exactly as for a user). Every result is gathered into
``$OUT/gpu-results.json`` (when OUT is set) with the machine, the versions and the outcome of
each test, so the figures come back from the device machine even when a test fails.

Not part of the CPU suite (pyproject's testpaths is tests/python); without a GPU every test here
is skipped.
"""

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads.py"

# Everything the children reported, keyed "workload/native" or "workload/arena".
RESULTS: dict[str, Any] = {}
OUTCOMES: dict[str, str] = {}

_SCRUB = (
    "TORCH_ARENA",
    "TORCH_ARENA_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "RANK",
    "LOCAL_RANK",
)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="the GPU suite needs a CUDA GPU (scripts/gpu-check)")
        for item in items:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and not report.passed):
        OUTCOMES[item.nodeid] = report.outcome


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers",
        "exclusive: reads the driver's free memory, fills the GPU or times steps; gpu-check runs "
        "these alone, after the others",
    )


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Write what this session gathered into $OUT/gpu-results.json, merged with what is there
    already (gpu-check runs pytest twice) and, under pytest-xdist, with what each worker left in
    $GPU_CHECK_PARTS (a worker writes only its part; the controller merges)."""
    out = os.environ.get("OUT")
    if not out:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    parts = os.environ.get("GPU_CHECK_PARTS")
    if worker:
        if parts:
            Path(parts).mkdir(parents=True, exist_ok=True)
            part = Path(parts) / f"{worker}.json"
            part.write_text(json.dumps({"tests": OUTCOMES, "results": RESULTS}, default=str))
        return
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "exitstatus": int(exitstatus),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory"] = torch.cuda.get_device_properties(0).total_memory
    try:
        import torch_arena

        info["torch_arena"] = torch_arena.__version__
        info["library"] = torch_arena.library_path()
    except Exception as exc:  # reported, not fatal: the tests say what broke
        info["torch_arena"] = f"not importable: {exc}"
    Path(out).mkdir(parents=True, exist_ok=True)
    path = Path(out) / "gpu-results.json"
    merged: dict[str, Any] = {"info": {}, "tests": {}, "results": {}}
    if path.exists():
        merged = json.loads(path.read_text())
    sources = [{"tests": OUTCOMES, "results": RESULTS}]
    if parts and Path(parts).is_dir():
        for part in sorted(Path(parts).glob("*.json")):
            sources.append(json.loads(part.read_text()))
            part.unlink()
    for source in sources:
        merged["tests"].update(source["tests"])
        merged["results"].update(source["results"])
    merged["info"] = {**merged["info"], **info}
    path.write_text(json.dumps(merged, indent=1, default=str))


def run_workload(
    name: str, arena: bool, timeout: float = 540, must_succeed: bool = True, **env: str
) -> dict[str, Any]:
    """Run workload ``name`` in a fresh interpreter, with torch-arena switched on by the
    environment when ``arena``; return its RESULT (also kept for gpu-results.json). Fails the
    test when the program fails (unless not ``must_succeed``: then the result is
    ``{"failed": True, ...}``), or when the allocator it ran under is not the one asked for.
    ``GPU_CHECK_TIMEOUT`` (seconds), when set, caps ``timeout``."""
    cap = os.environ.get("GPU_CHECK_TIMEOUT")
    if cap:
        timeout = min(timeout, float(cap))
    full = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    full["PYTHONUNBUFFERED"] = "1"
    if arena:
        full["TORCH_ARENA"] = "1"
    full.update(env)
    key = f"{name}/{'arena' if arena else 'native'}"
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(WORKLOADS), name],
            env=full,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        RESULTS[key] = {"failed": True, "timeout": timeout, "stderr": str(exc.stderr)[-4000:]}
        if not must_succeed:
            return RESULTS[key]
        pytest.fail(f"{key} ran past {timeout} s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        RESULTS[key] = {
            "failed": True,
            "returncode": proc.returncode,
            "stderr": proc.stderr[-4000:],
        }
        if not must_succeed:
            return RESULTS[key]
        pytest.fail(
            f"{key} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
        )
    result = json.loads(lines[-1][len("RESULT ") :])
    result["wall_s"] = round(time.perf_counter() - start, 2)
    RESULTS[key] = result
    if "backend" in result:
        expected = ("pluggable", True) if arena else ("native", False)
        assert (result["backend"], result["arena"]) == expected, f"{key} ran under {result}"
    return result


@pytest.fixture
def workload() -> Any:
    return run_workload
