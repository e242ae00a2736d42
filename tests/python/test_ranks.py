"""Reports across ranks: explain(all_ranks=True) and leak_report(all_ranks=True) in a real
two-process gloo job on the CPU (two interpreters, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set
as torchrun sets them), where rank 1 holds a second model and leaks 1 MiB a step; then
`torch-arena merge` on the per-rank files the same run wrote, which must give the same table
(the same JSON bytes, the same text) as the live gather; bad input to merge; the one-process
cases; and docs/python.md's worked example, run as the doc shows it, printing what it shows.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import CONF, REPO, run_python

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

EXE = Path(sysconfig.get_path("scripts")) / "torch-arena"
MiB = 1 << 20
# torch.nn.Linear(256, 256) in float32: weight and bias.
LINEAR = 4 * (256 * 256 + 256)
LEAK_STEPS = 6

WORKER = f"""
import datetime, json, sys
import torch, torch.distributed as dist
import torch_arena
from torch_arena.testing import DeviceBuffer

out = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(256, 256)
if rank == 1:
    second = torch.nn.Linear(256, 256)  # rank 1 holds one more model's parameters
held = []
for _ in range({LEAK_STEPS}):
    if rank == 1:
        held.append(DeviceBuffer(1 << 20))  # and leaks 1 MiB a step on the device
    torch_arena.step()

mine = torch_arena.explain(json=True, device="cpu")
with open(f"{{out}}/explain-{{rank}}.json", "w") as f:
    json.dump(mine, f)
got = {{
    "mine": mine,
    "table": torch_arena.explain(all_ranks=True, json=True, device="cpu"),
    "text": torch_arena.explain(all_ranks=True, device="cpu"),
    "leaks": torch_arena.leak_report(format="json", all_ranks=True),
    "leak_text": torch_arena.leak_report(all_ranks=True),
}}
with open(f"{{out}}/all-{{rank}}.json", "w") as f:
    json.dump(got, f)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: Path, out: Path, **env_extra: str) -> list[str]:
    """Run ``script`` as ranks 0 and 1 of a job (the variables torchrun sets, a free port on
    localhost); each rank's stdout. A rank that fails fails the test with its stderr; a job
    still running after 240 s (a collective one rank never reached) is killed and fails it."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if k not in ("TORCH_ARENA", "PYTHONPATH")}
        env.update(
            TORCH_ARENA_CONF=CONF,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
        )
        env.update(env_extra)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(out)],
                cwd=out,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    results = []
    try:
        for p in procs:
            results.append(p.communicate(timeout=240))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        pytest.fail("a rank of the two-process job did not finish in 240 s (hung collective?)")
    for rank, (p, (_, err)) in enumerate(zip(procs, results, strict=True)):
        assert p.returncode == 0, f"rank {rank} failed:\n{err}"
    return [stdout for stdout, _ in results]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Run the two ranks of WORKER once; the folder of what they wrote."""
    out = tmp_path_factory.mktemp("ranks")
    script = out / "worker.py"
    script.write_text(WORKER)
    launch(
        script,
        out,
        TORCH_ARENA_CONF=CONF + ",leaks:True",
        TORCH_ARENA_LEAK_REPORT=str(out / "leaks-{rank}.json"),
    )
    return out


def doc_block(marker: str) -> str:
    """The fenced block after ``<!-- ranks: marker -->`` in docs/python.md."""
    text = (REPO / "docs" / "python.md").read_text()
    m = re.search(re.escape(f"<!-- ranks: {marker} -->") + r"\n```[a-z]*\n(.*?)```", text, re.S)
    assert m, f"docs/python.md has no block after <!-- ranks: {marker} -->"
    return m.group(1)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def merge(*args) -> subprocess.CompletedProcess:
    assert EXE.is_file(), "the wheel installs the torch-arena command"
    return subprocess.run(
        [str(EXE), "merge", *map(str, args)], capture_output=True, text=True, timeout=60
    )


def test_every_rank_gets_the_table_with_the_imbalance_it_holds(job):
    zero, one = load(job / "all-0.json"), load(job / "all-1.json")
    assert zero["table"] == one["table"]
    assert zero["text"] == one["text"]
    assert (zero["mine"]["rank"], one["mine"]["rank"]) == (0, 1)
    assert zero["mine"]["world_size"] == one["mine"]["world_size"] == 2

    t = zero["table"]
    assert t["kind"] == "explain"
    assert t["world_size"] == 2
    assert t["missing_ranks"] == []
    assert t["columns"][-1] == "total"
    assert [r["rank"] for r in t["ranks"]] == [0, 1]
    # Each row is that rank's own explain(): the categories it reported, and their total.
    for row, mine in zip(t["ranks"], (zero["mine"], one["mine"]), strict=True):
        assert {c: row[c] for c in mine["categories"]} == mine["categories"]
        assert row["total"] == sum(mine["categories"].values())
    # Rank 1 holds exactly one more Linear(256, 256): its parameters are twice rank 0's, and
    # nothing else differs.
    zero_row, one_row = t["ranks"]
    assert zero_row["parameters"] == LINEAR
    assert one_row["parameters"] == 2 * LINEAR
    assert one_row["total"] - zero_row["total"] == LINEAR
    p = t["stats"]["parameters"]
    assert p == {
        "max": 2 * LINEAR,
        "max_rank": 1,
        "min": LINEAR,
        "min_rank": 0,
        "mean": 3 * LINEAR // 2,
        "imbalance": 1.33,  # 2 / 1.5
    }
    total = t["stats"]["total"]
    assert (total["max_rank"], total["min_rank"]) == (1, 0)
    assert total["max"] - total["min"] == LINEAR
    # max / mean of the totals, to hundredths.
    want = round(200 * total["max"] / (total["max"] + total["min"])) / 100
    assert total["imbalance"] == want
    assert t["imbalance"] == {"column": "total", "rank": 1, "ratio": want}
    assert t["stats"]["gradients"]["imbalance"] is None  # no rank has gradients

    text = zero["text"]
    lines = text.splitlines()
    assert lines[0].startswith("torch-arena: bytes in live tensors per rank, ")
    assert "2 of 2 rank(s)" in lines[0]
    assert lines[1].split() == ["rank", *t["columns"]]
    ratios = lines[-2].split()  # the row above the headline
    assert ratios[:3] == ["max/mean", "1.33x", "-"]  # parameters, gradients
    assert ratios[-1] == f"{want:.2f}x"  # total
    assert lines[-1].startswith(
        f"imbalance: rank 1 has the most total, {fmt(total['max'])}: {want:.2f}x the mean"
    )


def fmt(n: int) -> str:
    from torch_arena.leaks import format_size

    return format_size(n)


def test_the_leak_table_shows_the_rank_that_leaks(job):
    zero, one = load(job / "all-0.json"), load(job / "all-1.json")
    assert zero["leaks"] == one["leaks"]
    t = zero["leaks"]
    assert t["kind"] == "leaks"
    assert t["columns"] == ["leaked_bytes", "growing_sites"]
    assert t["ranks"] == [
        {"rank": 0, "leaked_bytes": 0, "growing_sites": 0},
        {"rank": 1, "leaked_bytes": LEAK_STEPS * MiB, "growing_sites": 1},
    ]
    assert t["imbalance"] == {"column": "leaked_bytes", "rank": 1, "ratio": 2.0}
    assert zero["leak_text"].splitlines()[-1] == (
        "imbalance: rank 1 has the most leaked_bytes, 6.00 MiB: 2.00x the mean of 3.00 MiB "
        "(least: rank 0, 0 B)"
    )


def test_merge_of_the_files_the_run_wrote_gives_the_live_table(job):
    live = load(job / "all-0.json")
    files = [job / "explain-1.json", job / "explain-0.json"]  # any order
    got = merge("--json", *files)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == live["table"]
    assert got.stdout == json.dumps(live["table"]) + "\n"  # the same bytes, field order too
    got = merge(*files)
    assert got.returncode == 0, got.stderr
    assert got.stdout == live["text"] + "\n"

    # The leak reports written at exit carry their rank (the group was gone by then: from the
    # environment torchrun sets).
    leaks = [job / "leaks-0.json", job / "leaks-1.json"]
    assert [load(f)["rank"] for f in leaks] == [0, 1]
    got = merge("--json", *leaks)
    assert got.returncode == 0, got.stderr
    assert got.stdout == json.dumps(live["leaks"]) + "\n"
    got = merge(*leaks)
    assert got.returncode == 0, got.stderr
    assert got.stdout == live["leak_text"] + "\n"


def test_merge_of_one_rank_notes_the_missing_one(job):
    got = merge(job / "explain-1.json")
    assert got.returncode == 0, got.stderr
    assert "1 of 2 rank(s)" in got.stdout
    assert "note: no report from rank(s) 0" in got.stdout


@pytest.mark.parametrize(
    "files, says",
    [
        (["explain-0.json", "leaks-1.json"], "cannot merge explain reports with leak reports"),
        (["explain-0.json", "explain-0.json"], "rank 0 appears twice"),
        (["explain-0.json", "neither.json"], "neither.json: neither an explain report"),
        (["norank.json"], 'norank.json: an explain report without "rank"'),
        (["explain-0.json", "broken.json"], "broken.json: not a JSON report"),
        (["explain-0.json", "missing.json"], "cannot read"),
        (["merged.json"], "a merged table already"),
    ],
)
def test_merge_refuses_bad_input_naming_the_file(job, files, says):
    (job / "neither.json").write_text('{"hello": 1}')
    old = load(job / "explain-0.json")
    del old["rank"], old["world_size"]
    (job / "norank.json").write_text(json.dumps(old))
    (job / "broken.json").write_text((job / "explain-1.json").read_text()[:40])
    (job / "merged.json").write_text(json.dumps(load(job / "all-0.json")["table"]))
    got = merge(*(job / f for f in files))
    assert got.returncode == 1
    assert got.stdout == ""
    assert got.stderr.startswith("torch-arena: merge: "), got.stderr
    assert says in got.stderr, got.stderr


def test_one_process_without_a_group_is_the_whole_job(tmp_path):
    r = run_python(
        "import json, torch, torch_arena\n"
        "keep = torch.zeros(1024)\n"
        "print(json.dumps(torch_arena.explain(all_ranks=True, json=True, device='cpu')))\n",
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout.strip().splitlines()[-1])
    assert t["world_size"] == 1
    assert [row["rank"] for row in t["ranks"]] == [0]
    assert t["stats"]["total"]["imbalance"] == 1.0


def test_world_size_without_a_group_is_an_error(tmp_path):
    r = run_python(
        "import torch, torch_arena\ntorch_arena.explain(all_ranks=True, device='cpu')\n",
        tmp_path,
        RANK="1",
        WORLD_SIZE="2",
    )
    assert r.returncode != 0
    assert "all_ranks=True with WORLD_SIZE=2 but no torch.distributed process group" in r.stderr
    assert "init_process_group()" in r.stderr


def test_reports_carry_the_rank_from_the_environment(tmp_path):
    r = run_python(
        "import json, torch_arena\n"
        "print(json.dumps([torch_arena.explain(json=True, device='cpu')[k] "
        "for k in ('rank', 'world_size')]))\n",
        tmp_path,
        RANK="3",
        WORLD_SIZE="4",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [3, 4]


def test_the_merge_help_names_the_sources():
    got = subprocess.run([str(EXE), "merge", "--help"], capture_output=True, text=True)
    assert got.returncode == 0
    assert "explain(json=True)" in got.stdout
    assert "TORCH_ARENA_LEAK_REPORT" in got.stdout


def test_the_docs_worked_example_prints_what_the_doc_shows(tmp_path):
    script = tmp_path / "explain.py"
    script.write_text(doc_block("explain.py"))
    zero, one = launch(script, tmp_path)
    assert zero == doc_block("explain output")
    assert one == ""


def test_the_docs_merge_output_is_what_merge_prints_for_such_a_job(job):
    got = merge(job / "leaks-0.json", job / "leaks-1.json")
    assert got.returncode == 0, got.stderr
    assert got.stdout == doc_block("merge output")


def test_a_gather_whose_worker_holds_its_tensors_awhile_leaves_nothing_for_the_next_report():
    # gloo's worker threads may hold a collective's tensors a moment after it returns; CI saw
    # 272 B of a first explain(all_ranks=True)'s gather counted in the second one's row.
    code = """
import json, threading, time, torch, torch_arena
from torch_arena import _cpu_tensors, _ranks
torch_arena.enable()

class SlowGloo:
    def get_backend(self):
        return "gloo"
    def get_world_size(self):
        return 2
    def all_gather(self, outputs, tensor):
        for out in outputs:
            out.copy_(tensor)
        held = list(outputs) + [tensor]  # released by the worker 100 ms later
        threading.Thread(target=lambda: (time.sleep(0.1), held.clear())).start()

before = _cpu_tensors.live()
got = _ranks._all_gather_bytes(SlowGloo(), b"row of rank 0", _cpu_tensors.live)
print(json.dumps({"got": [g.decode() for g in got], "left": _cpu_tensors.live() - before}))
"""
    r = run_python(code, REPO, TORCH_ARENA_CONF=CONF + ",cpu_tensors:True")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"got": ["row of rank 0", "row of rank 0"], "left": 0}, out
