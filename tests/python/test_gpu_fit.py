"""bench/gpu_fit.py's bisection, on a model of memory (its --dry-run needs no GPU, no torch)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_fit.py"
MiB = 1 << 20


def load():
    spec = importlib.util.spec_from_file_location("gpu_fit", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bisection_finds_the_least_free_memory_within_its_precision():
    m = load()
    for need in (100 * MiB, 3_000 * MiB + 17, 70_000 * MiB):
        tried = []

        def fits(free, need=need, tried=tried):
            tried.append(free)
            return free >= need

        best, trials = m.bisect_min_free(fits, 0, 80_000 * MiB)
        assert need <= best <= need + m.precision(best) + MiB
        assert trials == len(tried)
        assert tried[0] == 80_000 * MiB  # the ceiling is checked first
    assert m.bisect_min_free(lambda free: False, 0, 1 << 30) == (None, 1)


def test_dry_run_and_bad_workload_names():
    p = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(rows) == 3 and all(r["found"] >= r["need"] for r in rows)
    m = load()
    assert m.workload_lengths("varlen", 5, 512) == [512, 384, 256, 448, 512]
    try:
        m.workload_lengths("nope", 1, 8)
    except SystemExit as e:
        assert "unknown workload 'nope'" in str(e)
    else:
        raise AssertionError("a bad workload name must stop the run")
