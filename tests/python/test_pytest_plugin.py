"""The pytest plugin (entry point pytest11, torch_arena.pytest_plugin) through pytester, in
fresh pytest processes that load it from the installed package, on the simulated device."""

import pytest
from torch_arena import _native

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.skipif(
    not _native.has_track(), reason="this torch-arena library has no tracking exports"
)

SIM = "device:sim,sim_capacity_mb:1024"

TESTS = """
import pytest
from torch_arena.testing import DeviceBuffer

MiB = 1 << 20
KEPT = []
CALLS = []


@pytest.mark.gpu_leaks(limit="1 MB", warmups=2)
def test_leaky():
    KEPT.append(DeviceBuffer(2 * MiB))  # LEAK


@pytest.mark.gpu_leaks(limit="1 MB", warmups=2)
def test_clean():
    scratch = DeviceBuffer(64 * MiB)
    small = DeviceBuffer(256 << 10)
    KEPT.append(small)  # 256 KiB per run: under the limit
    del scratch


@pytest.mark.gpu_leaks(limit="1 MB", warmups=3)
def test_counts_runs():
    CALLS.append(1)


def test_runs_after():
    assert len(CALLS) == 4  # 3 warmups + 1 measured


CACHE = {}


@pytest.mark.gpu_leaks(limit="1 MB", warmups=1)
def test_cache_filled_during_warmup_is_not_a_leak(tmp_path):
    if "w" not in CACHE:
        CACHE["w"] = DeviceBuffer(8 * MiB)
    assert tmp_path.exists()
"""


@pytest.fixture(autouse=True)
def _environment(monkeypatch):
    monkeypatch.setenv("TORCH_ARENA_CONF", SIM)
    monkeypatch.delenv("TORCH_ARENA", raising=False)


def run(pytester, *args):
    pytester.makepyfile(test_marked=TESTS)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_the_marker_is_registered(pytester):
    result = run(pytester, "--markers")
    result.stdout.fnmatch_lines(["*@pytest.mark.gpu_leaks(limit='1 MB', warmups=2)*"])
    result = run(pytester, "-W", "error::pytest.PytestUnknownMarkWarning", "-k", "clean")
    result.assert_outcomes(passed=1, deselected=4)


def test_a_leaking_test_fails_with_the_report_and_clean_ones_pass(pytester):
    result = run(pytester, "-v")
    source = (pytester.path / "test_marked.py").read_text().splitlines()
    line = next(i for i, t in enumerate(source, 1) if t.endswith("# LEAK"))
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_leaky FAILED*",
            "*LeakError*",
            "*2.00 MiB left live in 1 allocation(s)*",
            f"*test_marked.py:{line} in test_leaky*",
            "*KEPT[[]*",
        ]
    )


def test_without_torch_arena_the_check_is_skipped_with_a_warning(pytester, monkeypatch):
    pytester.makepyfile(
        test_plain="""
        import pytest

        RUNS = []

        @pytest.mark.gpu_leaks(warmups=2)
        def test_x():
            RUNS.append(1)

        def test_ran_once():
            assert RUNS == [1]
        """
    )
    # The allocator's own defaults (a CUDA device), torch-arena not enabled: nothing to see.
    monkeypatch.setenv("TORCH_ARENA_CONF", "")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["*gpu_leaks: not checked for leaks*TORCH_ARENA=1*"])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--gpu-leaks-strict")
    result.assert_outcomes(passed=0, failed=2)


def test_bad_marker_arguments_are_usage_errors(pytester):
    pytester.makepyfile(
        test_bad="""
        import pytest

        @pytest.mark.gpu_leaks(limit="1 MX")
        def test_x():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*gpu_leaks*'1 MX'*KiB*"])


BOUNDED = """
import collections
import functools
import itertools

import pytest
from torch_arena.testing import DeviceBuffer

MiB = 1 << 20
RECENT = collections.deque(maxlen=1)
KEYS = itertools.count()


@functools.lru_cache(maxsize=2)
def weights(key):
    return DeviceBuffer(2 * MiB)


@pytest.mark.gpu_leaks(limit="1 MB", warmups=2)
def test_warm_deque():
    RECENT.append(DeviceBuffer(2 * MiB))


@pytest.mark.gpu_leaks(limit="1 MB", warmups=2)
def test_lru_cache_at_its_bound():
    weights(next(KEYS))


KEPT = []


@pytest.mark.gpu_leaks(limit="1 MB", warmups=2)
def test_unbounded():
    KEPT.append(DeviceBuffer(2 * MiB))  # LEAK
"""


def test_a_bounded_cache_is_not_a_leak_as_no_leaks_judges_it(pytester):
    # The marker once failed the warm deque and the LRU cache at its bound (each measured run
    # leaves one new buffer live, having freed an older one of the same site), where no_leaks()
    # and leak_report() call such a site "not a leak". One verdict: a site leaks when its live
    # memory grew.
    pytester.makepyfile(test_bounded=BOUNDED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*test_warm_deque PASSED*", "*test_lru_cache_at_its_bound PASSED*"]
    )
    result.stdout.fnmatch_lines(["*test_unbounded FAILED*", "*2.00 MiB left live in 1 allocation*"])
