"""`torch-arena demo` from the installed wheel, run in a folder outside the source tree: the demo
trace is built into the command, so nothing is read from the checkout."""

import os
import subprocess
import sysconfig
from pathlib import Path


def test_demo_runs_from_the_wheel_outside_the_source_tree(tmp_path):
    exe = Path(sysconfig.get_path("scripts")) / "torch-arena"
    assert exe.is_file(), "the wheel installs the torch-arena command"
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_ARENA_DEMO_TRACE",)}
    out = subprocess.run(
        [exe, "demo", "--no-progress"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "the demo trace built into torch-arena" in out.stdout
    assert "native (emulated)" in out.stdout
    assert "Memory driver calls in the last replay step" in out.stdout
