"""Every file the Python package writes is replaced whole or not at all (issue 37, item 5's
standing suite): the snapshot dump, the snapshot at out-of-memory and the leak report at exit.
A write that fails part-way (here: each file limited to 1 KiB with RLIMIT_FSIZE, as a disk that
fills up) leaves the previous file as it was and no temporary file beside it."""

import os
import stat

import pytest
from torch_arena._paths import write_whole

OLD = b"the previous file, whole\n"

# Run first in each child: files it writes may hold at most 1 KiB; a write past that fails with
# EFBIG instead of killing the process (SIGXFSZ ignored), as a full disk fails with ENOSPC.
LIMIT = """
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
"""


def _only(folder, name):
    """The folder holds `name` and nothing else (no temporary file left behind)."""
    assert sorted(p.name for p in folder.iterdir()) == [name]


def test_write_whole_replaces_the_file_or_leaves_it(tmp_path):
    target = tmp_path / "out.json"
    target.write_bytes(OLD)
    os.chmod(target, 0o640)

    def half_then_fail(f):
        f.write("half of the new file")
        raise RuntimeError("the writer failed")

    with pytest.raises(RuntimeError, match="the writer failed"):
        write_whole(str(target), half_then_fail)
    assert target.read_bytes() == OLD
    _only(tmp_path, "out.json")

    write_whole(str(target), lambda f: f.write("new"))
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    _only(tmp_path, "out.json")

    # A new file, a binary one, through a symlink (the file it names is replaced).
    link = tmp_path / "link.pickle"
    link.symlink_to(tmp_path / "real.pickle")
    write_whole(str(link), lambda f: f.write(b"\x80\x04"), binary=True)
    assert (tmp_path / "real.pickle").read_bytes() == b"\x80\x04" and link.is_symlink()
    # A device is written in place.
    write_whole("/dev/null", lambda f: f.write("nothing"))


def test_a_snapshot_dump_that_fails_leaves_the_previous_one(tmp_path):
    from conftest import run_python

    (tmp_path / "snap.pickle").write_bytes(OLD)
    proc = run_python(
        LIMIT
        + "import torch_arena\nfrom torch_arena.testing import DeviceBuffer\n"
        + "keep = [DeviceBuffer(1 << 20) for _ in range(64)]\n"
        + "try:\n    torch_arena.snapshots.dump_snapshot('snap.pickle')\n"
        + "except OSError as e:\n    print('FAILED', e.errno)\n",
        tmp_path,
        TORCH_ARENA_CONF="device:sim,sim_capacity_mb:256,sites:python",
    )
    assert proc.returncode == 0, proc.stderr
    assert "FAILED" in proc.stdout, proc.stdout
    assert (tmp_path / "snap.pickle").read_bytes() == OLD
    _only(tmp_path, "snap.pickle")


def test_an_oom_snapshot_that_fails_leaves_the_previous_one(tmp_path):
    from conftest import run_python

    (tmp_path / "oom.pickle").write_bytes(OLD)
    proc = run_python(
        LIMIT
        + "import torch_arena\nfrom torch_arena.testing import DeviceBuffer\n"
        + "keep = [DeviceBuffer(1 << 20) for _ in range(32)]\n"
        + "try:\n    DeviceBuffer(1 << 30)\n"
        + "except torch_arena.OutOfMemoryError as e:\n"
        + "    print('MESSAGE', str(e).replace(chr(10), ' | '))\n",
        tmp_path,
        TORCH_ARENA_CONF="device:sim,sim_capacity_mb:64",
        TORCH_ARENA_OOM_SNAPSHOT="oom.pickle",
    )
    assert proc.returncode == 0, proc.stderr
    assert "could not be written to oom.pickle" in proc.stdout, proc.stdout
    assert (tmp_path / "oom.pickle").read_bytes() == OLD
    _only(tmp_path, "oom.pickle")


def test_a_leak_report_that_fails_at_exit_leaves_the_previous_one(tmp_path):
    from conftest import run_python

    (tmp_path / "leaks.json").write_bytes(OLD)
    proc = run_python(
        LIMIT
        + "import torch_arena\nfrom torch_arena.testing import DeviceBuffer\n"
        + "held = []\n"
        + "for step in range(8):\n"
        + "    held.extend(DeviceBuffer(1 << 16) for _ in range(40))\n"
        + "    torch_arena.step()\n",
        tmp_path,
        TORCH_ARENA_CONF="device:sim,sim_capacity_mb:256,leaks:True",
        TORCH_ARENA_LEAK_REPORT="leaks.json",
    )
    assert proc.returncode == 0, proc.stderr
    assert "the leak report at exit failed" in proc.stderr, proc.stderr
    assert (tmp_path / "leaks.json").read_bytes() == OLD
    _only(tmp_path, "leaks.json")
