"""docs/python.md's leak-hunting walkthrough reproduces its printed output verbatim: the test
takes the train.py and the output the doc shows, runs the one as the doc says
(``TORCH_ARENA_CONF=device:sim,leaks:True python train.py``), and compares with the other."""

import os
import re
import subprocess
import sys

from conftest import REPO

DOC = REPO / "docs" / "python.md"


def _block_after(text: str, marker: str) -> str:
    """The fenced code block right after the HTML comment ``marker``."""
    m = re.search(re.escape(marker) + r"[^\n]*\n```[a-z]*\n(.*?)```", text, re.S)
    assert m, f"docs/python.md has no code block after {marker!r}"
    return m.group(1)


def test_the_leak_walkthrough_prints_what_the_doc_shows(tmp_path):
    doc = DOC.read_text()
    assert "run with `TORCH_ARENA_CONF=device:sim,leaks:True python train.py`" in doc
    (tmp_path / "train.py").write_text(_block_after(doc, "<!-- walkthrough: train.py"))
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_ARENA", "PYTHONPATH")}
    env["TORCH_ARENA_CONF"] = "device:sim,leaks:True"
    proc = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == _block_after(doc, "<!-- walkthrough: output -->") + "\n", proc.stdout
    # The report at exit, on stderr, says the list died with train() (the doc says so too).
    assert "freed since" in proc.stderr, proc.stderr
