"""Leak hunting on the simulated device: planted leaks in tests/python/leaky/ must be found at
the allocating statement, with the planted bytes per step, and held by the named container;
clean loops with large but steady memory must report nothing. Also no_leaks, tag, sizes, and
the report at exit (leaks:True) in a fresh interpreter.
"""

import collections
import contextlib
import gc
import importlib
import inspect
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch_arena
from conftest import run_python
from torch_arena import _native
from torch_arena.leaks import format_size, parse_size, site_location
from torch_arena.testing import DeviceBuffer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the leaky package

MiB = 1 << 20
STEPS = 8
WARMUP = 2

pytestmark = pytest.mark.skipif(
    not _native.has_track(), reason="this torch-arena library has no tracking exports"
)


@pytest.fixture(autouse=True)
def _reset_leaky_modules():
    """Free the planted leaks after each test: the rest of the suite expects nothing live."""
    yield
    for name in ("list_append", "dict_cache", "closure", "clean"):
        module = sys.modules.get(f"leaky.{name}")
        if module is not None:
            module.reset()
    gc.collect()


def leak_line(module) -> tuple[str, int]:
    """(file, line) of the statement marked ``# LEAK`` in ``module``'s source."""
    path = inspect.getsourcefile(module)
    lines = Path(path).read_text().splitlines()
    marked = [n for n, text in enumerate(lines, 1) if text.rstrip().endswith("# LEAK")]
    assert len(marked) == 1, f"{module.__name__} must mark exactly one line with # LEAK"
    return os.path.realpath(path), marked[0]


def same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def at_line(report, path: str, line: int) -> list:
    """The growing sites whose user frame is ``path``:``line``."""
    return [
        s
        for s in report["growing"]
        if (loc := site_location(s["frames"])) and loc[1] == line and same_file(loc[0], path)
    ]


def run_loop(fn, **kwargs):
    """Run ``fn(steps, step, at_end)``; the JSON leak report taken at its end."""
    start = torch_arena.current_step()

    def at_end():
        report = torch_arena.leak_report(format="json", warmup=start + WARMUP)
        text = torch_arena.leak_report(warmup=start + WARMUP)
        return report, text

    return fn(STEPS, torch_arena.step, at_end, **kwargs)


LEAKY = ["leaky.list_append", "leaky.dict_cache", "leaky.closure"]


@pytest.mark.parametrize("name", LEAKY)
def test_a_planted_leak_is_found_at_its_line_with_its_bytes_per_step(name, sites):
    module = importlib.import_module(name)
    report, text = run_loop(module.train)
    path, line = leak_line(module)
    # A site is a whole stack: one statement reached by two call paths makes two sites.
    found = at_line(report, path, line)
    assert found, f"no growing site at {path}:{line}:\n{text}"
    total = sum(s["bytes_per_step"] for s in found)
    assert total == pytest.approx(module.LEAK_PER_STEP, rel=0.05), text
    # Nothing else of the loop grows (its steady buffers are not leaks).
    others = [s for s in report["growing"] if s not in found]
    assert not others, text
    # The text names the file:line and the bytes per step, for people.
    rel = os.path.relpath(path)
    assert f"{rel}:{line}" in text or f"{path}:{line}" in text, text
    for site in found:
        assert f"{format_size(site['bytes_per_step'])} per step" in text, text


@pytest.mark.parametrize("name", LEAKY)
def test_the_holder_of_a_planted_leak_is_named(name, sites):
    module = importlib.import_module(name)
    report, text = run_loop(module.train)
    path, line = leak_line(module)
    sites = at_line(report, path, line)
    exprs = [h["expr"] or "" for s in sites for h in s["holders"]]
    assert any(module.HOLDER in e for e in exprs), (exprs, text)
    assert module.HOLDER in text


def test_a_leak_freed_after_the_last_step_is_not_reported(sites):
    from leaky import list_append

    start = torch_arena.current_step()
    list_append.train(STEPS, torch_arena.step, lambda: None)  # the list dies on return
    report = torch_arena.leak_report(format="json", warmup=start + WARMUP)
    assert report["growing"] == []
    assert len(report["freed_since_last_step"]) == 1
    assert "freed since" in torch_arena.leak_report(warmup=start + WARMUP)


def test_list_append_holder_reads_like_code_and_says_where_the_list_lives(sites):
    from leaky import list_append

    report, text = run_loop(list_append.train)
    holders = [h for s in report["growing"] for h in s["holders"]]
    indexed = [h for h in holders if (h["expr"] or "").startswith("losses[")]
    assert indexed, text
    assert "local variable 'losses' of train()" in indexed[0]["root"]
    assert "list_append.py:" in indexed[0]["root"]


def test_dict_cache_holder_is_the_module_global(sites):
    from leaky import dict_cache

    report, text = run_loop(dict_cache.train)
    holders = [h for s in report["growing"] for h in s["holders"]]
    assert any(
        (h["expr"] or "").startswith("_CACHE['") and "module leaky.dict_cache" in h["root"]
        for h in holders
    ), text


def test_closure_holder_names_the_function_and_the_free_variable(sites):
    from leaky import closure

    report, text = run_loop(closure.train)
    holders = [h for s in report["growing"] for h in s["holders"]]
    assert any((h["expr"] or "").startswith("HOOK.<closure stashed>[") for h in holders), text


@pytest.mark.parametrize("loop", ["train", "sawtooth"])
def test_clean_loops_with_large_steady_memory_report_nothing(loop, sites):
    from leaky import clean

    report, text = run_loop(getattr(clean, loop))
    assert report["growing"] == [], text
    assert "no growing allocation site" in text


def leaky_steps(losses: list, steps: int) -> None:
    """The list_append leak, with the list owned by the caller (it outlives the block)."""
    from leaky import list_append

    for batch in range(steps):
        activations, loss = list_append.forward(batch)
        losses.append(loss)
        del activations
        torch_arena.step()


def test_no_leaks_raises_on_a_leak_with_the_report_and_passes_clean_code(sites):
    from leaky import clean, list_append

    losses: list = []
    with pytest.raises(torch_arena.LeakError) as info:
        with torch_arena.no_leaks(warmup=2, limit="1 MB"):
            leaky_steps(losses, STEPS)
    assert isinstance(info.value, AssertionError)
    path, line = leak_line(list_append)
    assert f"list_append.py:{line} in forward" in str(info.value)
    assert "losses[" in str(info.value)
    assert info.value.report["growing"]
    losses.clear()

    with torch_arena.no_leaks(warmup=2, limit="1 MB") as check:
        clean.train(STEPS, torch_arena.step, lambda: None)
    assert check.report is not None and check.report["growing"] == []


def test_no_leaks_limit_is_growth_over_the_block(sites):
    # 1 MiB per step over STEPS - 2 measured steps: 6 MiB of growth.
    losses: list = []
    with torch_arena.no_leaks(warmup=2, limit="7 MiB"):
        leaky_steps(losses, STEPS)
    losses.clear()
    with pytest.raises(torch_arena.LeakError):
        with torch_arena.no_leaks(warmup=2, limit="5 MiB"):
            leaky_steps(losses, STEPS)
    losses.clear()


def test_no_leaks_ignores_growth_freed_before_the_block_ends(sites):
    from leaky import list_append

    with torch_arena.no_leaks(warmup=2, limit=0) as check:
        list_append.train(STEPS, torch_arena.step, lambda: None)  # the list dies on return
    assert check.report["growing"] == [] and check.report["freed_since_last_step"]


def test_no_leaks_steps_false_judges_what_the_block_left_live():
    kept = []
    with pytest.raises(torch_arena.LeakError) as info:
        with torch_arena.no_leaks(limit="1 MB", steps=False):
            kept.append(DeviceBuffer(2 * MiB))  # left live
            scratch = DeviceBuffer(8 * MiB)  # freed in the block
            del scratch
    text = str(info.value)
    assert "2.00 MiB left live in 1 allocation(s)" in text, text
    assert "kept[0]" in text, text
    assert "test_leaks.py" in text
    kept.clear()

    with torch_arena.no_leaks(limit="1 MB", steps=False):
        scratch = DeviceBuffer(64 * MiB)
        small = DeviceBuffer(512 << 10)  # under the limit
        del scratch
    del small


def test_no_leaks_steps_false_calls_a_warm_bounded_cache_no_leak(sites):
    # The block's new buffer only replaced the deque's older one, of the same site: the site's
    # live memory did not grow, as no_leaks() with steps and leak_report() would judge it.
    # (The cache was warmed with sites captured, as under leaks:True.)
    recent = collections.deque(maxlen=1)

    def put():
        recent.append(DeviceBuffer(2 * MiB))

    check = torch_arena.no_leaks(limit="1 MB", steps=False)
    for block in (contextlib.nullcontext(), check):  # one call line: one site
        with block:
            put()
    assert check.report["growing"] == [] and len(check.report["replaced"]) == 1
    assert "not a leak" in torch_arena.leaks.render(check.report)
    recent.clear()


def test_no_leaks_needs_more_steps_than_warmup():
    with pytest.raises(ValueError, match=r"needs at least 4"):
        with torch_arena.no_leaks(warmup=2):
            for _ in range(3):
                torch_arena.step()


def test_no_leaks_lets_the_blocks_exception_through_unchecked():
    kept = []
    with pytest.raises(KeyError):
        with torch_arena.no_leaks(limit=0, steps=False):
            kept.append(DeviceBuffer(MiB))
            raise KeyError("boom")
    kept.clear()


def test_tags_label_the_allocations_of_a_block_and_a_function(sites):
    @torch_arena.tag("eval")
    def evaluate():
        return DeviceBuffer(MiB)

    with torch_arena.tag("train"):
        a = DeviceBuffer(MiB)
        b = evaluate()
    c = DeviceBuffer(MiB)
    live = {x["ptr"]: x["tag"] for x in _native.live_json(0)["allocations"]}
    assert (live[a.ptr], live[b.ptr], live[c.ptr]) == ("train", "eval", None)
    del a, b, c


def test_steps_advance():
    s = torch_arena.current_step()
    assert torch_arena.step() == s + 1
    assert torch_arena.current_step() == s + 1


@pytest.mark.parametrize(
    "text, expected",
    [
        (0, 0),
        (4096, 4096),
        ("1 MB", 1_000_000),
        ("1MB", 1_000_000),
        ("512KiB", 512 << 10),
        ("1.5 GiB", 3 << 29),
        ("100", 100),
        ("2 mib", 2 << 20),
        ("10 B", 10),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["1 MX", "MB", "", "-1 MB", -5, True, None, "1 M B"])
def test_a_bad_size_says_what_is_accepted(bad):
    with pytest.raises(ValueError, match=r"KiB|negative|int"):
        parse_size(bad)


def test_a_bad_limit_is_refused_by_no_leaks():
    with pytest.raises(ValueError, match="'1 MX'.*KB, MB"):
        torch_arena.no_leaks(limit="1 MX")


def test_format_size_writes_what_the_rust_library_writes():
    # The same file holds Rust's human_bytes to the same texts (src/stats/summary.rs).
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "byte_formats.txt"
    rows = [
        line.split("\t")
        for line in fixture.read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert len(rows) >= 20
    for n, text in rows:
        assert format_size(int(n)) == text, (n, text)
    assert format_size(-1536) == "-1.50 KiB"


def test_importing_torch_arena_does_not_import_torch(tmp_path):
    proc = run_python(
        "import sys, torch_arena; torch_arena.leak_report(); print('torch' in sys.modules)",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_leaks_true_prints_the_report_at_exit_and_writes_json(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch_arena
            from torch_arena.testing import DeviceBuffer

            history = []
            for i in range(6):
                history.append(DeviceBuffer(1 << 20))  # LEAK
                torch_arena.step()
            """
        )
    )
    line = next(i for i, t in enumerate(script.read_text().splitlines(), 1) if t.endswith("# LEAK"))
    out = tmp_path / "leaks-{pid}.json"
    proc = run_python(
        f"path = {str(script)!r}\nexec(compile(open(path).read(), path, 'exec'))",
        tmp_path,
        TORCH_ARENA_CONF="device:sim,sim_capacity_mb:1024,leaks:True",
        TORCH_ARENA_LEAK_REPORT=str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert f"train.py:{line} in <module>" in proc.stderr, proc.stderr
    assert "1.00 MiB per step" in proc.stderr, proc.stderr
    assert "history[" in proc.stderr, proc.stderr
    (written,) = list(tmp_path.glob("leaks-*.json"))
    data = json.loads(written.read_text())
    (site,) = data["devices"][0]["growing"]
    assert site["bytes_per_step"] == pytest.approx(1 << 20, rel=0.05)


def test_without_leaks_true_nothing_is_printed_at_exit(tmp_path):
    proc = run_python(
        "import torch_arena\n"
        "from torch_arena.testing import DeviceBuffer\n"
        "keep = [DeviceBuffer(1 << 20) for _ in range(3)]\n"
        "[torch_arena.step() for _ in range(3)]\n",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "leak report" not in proc.stderr
