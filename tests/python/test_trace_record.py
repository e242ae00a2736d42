"""`trace:PATH` through the installed package: a run on the simulated device records every
alloc and free, with Python allocation sites, and `torch-arena replay` reads the file back."""

import json
import subprocess
import sysconfig
import textwrap
from pathlib import Path

from conftest import run_python

WORKLOAD = textwrap.dedent(
    """
    import torch_arena

    def forward(n):
        return torch_arena.caching_allocator_alloc(n << 20)  # SITE

    kept = [forward(1 + i % 3) for i in range(6)]
    for p in kept[:4]:
        torch_arena.caching_allocator_delete(p)
    """
)


def test_recording_names_python_sites_and_replays(tmp_path):
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    site_line = (
        WORKLOAD.splitlines().index(
            next(line for line in WORKLOAD.splitlines() if line.endswith("# SITE"))
        )
        + 1
    )
    trace = tmp_path / "run-{pid}.trace"
    r = run_python(
        f"import runpy; runpy.run_path({str(script)!r})",
        tmp_path,
        TORCH_ARENA_CONF=f"device:sim,sim_capacity_mb:1024,sites:python,trace:{trace}",
    )
    assert r.returncode == 0, r.stderr
    [written] = list(tmp_path.glob("run-*.trace"))
    lines = written.read_text().splitlines()
    assert lines[0] == "torch-arena-trace 1"
    sites = {int(ln.split()[1]): ln.split(" ", 2)[2] for ln in lines if ln.startswith("site ")}
    allocs = [ln.split() for ln in lines if ln.startswith("a ")]
    frees = [ln.split() for ln in lines if ln.startswith("f ")]
    assert len(allocs) == 6 and len(frees) == 4
    assert [int(a[2]) for a in allocs] == [(1 + i % 3) << 20 for i in range(6)]
    # Every allocation names the user's line, not torch_arena's own code.
    assert {sites[int(a[6])] for a in allocs} == {f"{script}:{site_line} in forward"}

    exe = Path(sysconfig.get_path("scripts")) / "torch-arena"
    assert exe.is_file(), "the wheel installs the torch-arena command"
    out = subprocess.run(
        [exe, "replay", str(written), "--json", "--capacity", "1GiB"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.splitlines()[0])
    assert row["events"] == 10
    assert row["peak_requested_bytes"] == sum((1 + i % 3) << 20 for i in range(6))
    assert row["oom_event"] is None
