"""pytest plugin (entry point ``pytest11``, loaded once torch-arena is installed): the marker
``gpu_leaks`` fails a test that leaks device memory, in the spirit of pytest-memray's
``limit_leaks``::

    @pytest.mark.gpu_leaks(limit="1 MB", warmups=2)
    def test_inference(model):
        model(torch.randn(8, 512, device="cuda"))

The test function runs ``warmups`` times first (lazy initialisation, caches filling: not
judged), then once more, measured. The test fails with the leak report (sites, stacks, holders)
when the live memory of an allocation site grew by more than ``limit`` over the measured run
(the verdict of ``no_leaks`` and ``leak_report``, over one run): memory the run made and left
live fails; memory it made only to replace older memory of the same site (a warm
``deque(maxlen=N)``, an ``lru_cache`` at its bound) is noted, not a leak. Fixtures are set up
once and shared by every run. Python site capture is switched on for all the runs.

The check needs torch-arena to see the test's device memory: torch-arena enabled as PyTorch's
allocator (``TORCH_ARENA=1``, ``torch_arena.enable()``), or the simulated device configured
(``TORCH_ARENA_CONF=device:sim...``, for tests that allocate through torch_arena itself).
Otherwise the test runs once, unchecked, and a warning says why: a check that cannot see the
memory would pass whatever the code does, and failing every marked test on machines that run
the suite without torch-arena would be worse. ``--gpu-leaks-strict`` makes that case a failure.
"""

import functools
import gc
import sys
from typing import Any

import pytest

MARKER = "gpu_leaks"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("torch-arena")
    group.addoption(
        "--gpu-leaks-strict",
        action="store_true",
        default=False,
        help="fail gpu_leaks tests when torch-arena is not the allocator (default: run them "
        "unchecked, with a warning)",
    )


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(limit='1 MB', warmups=2): run the test `warmups` times, then once measured; "
        "fail if the device memory the measured run left live exceeds `limit` at any "
        "allocation site (torch-arena)",
    )


def _marker_args(marker: Any) -> tuple[int, int]:
    from ._sizes import parse_size

    if marker.args:
        raise pytest.UsageError(
            f"@pytest.mark.{MARKER} takes keyword arguments only: limit='1 MB', warmups=2"
        )
    unknown = set(marker.kwargs) - {"limit", "warmups"}
    if unknown:
        raise pytest.UsageError(
            f"@pytest.mark.{MARKER}: unknown argument(s) {sorted(unknown)}; accepted: limit, "
            "warmups"
        )
    warmups = marker.kwargs.get("warmups", 2)
    if isinstance(warmups, bool) or not isinstance(warmups, int) or warmups < 0:
        raise pytest.UsageError(f"@pytest.mark.{MARKER}: warmups must be an int >= 0")
    try:
        limit = parse_size(marker.kwargs.get("limit", "1 MB"))
    except ValueError as exc:
        raise pytest.UsageError(f"@pytest.mark.{MARKER}: {exc}") from exc
    return limit, warmups


def inactive_reason() -> str | None:
    """Why the marker cannot check anything in this process, or None when it can."""
    from . import _capture, _native, _torch

    if not _native.has_track():
        return "this torch-arena library has no tracking exports"
    if "torch" in sys.modules and _torch.is_enabled():
        return None
    if _capture.conf().get("device") == "sim":
        return None
    return (
        "torch-arena is not the CUDA allocator in this process (set TORCH_ARENA=1, or call "
        "torch_arena.enable() before CUDA starts), so it cannot see the test's device memory"
    )


def _measured(fn: Any, limit: int, warmups: int, device: int) -> Any:
    from . import _capture, _verdict
    from .leaks import _max_live_seq

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # the failure is the report, not this wrapper
        # Every run from the same line, with sites captured: an allocation of the measured run
        # and one of a warm-up then share a site, so memory the measured run only replaced (a
        # bounded cache) shows as no growth, as no_leaks() and leak_report() judge it.
        with _capture.capture_on():
            for index in range(warmups + 1):
                if index == warmups:
                    gc.collect()
                    seq0 = _max_live_seq(device)
                    before = _verdict.site_bytes(device)
                result = fn(*args, **kwargs)
            report = _verdict.left_live(device, seq0, limit, before)
        _verdict.check_left_live(report)
        return result

    return run


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:  # bad marker arguments stop the run before any test
        marker = item.get_closest_marker(MARKER)
        if marker is not None:
            _marker_args(marker)


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem: Any) -> Any:
    marker = pyfuncitem.get_closest_marker(MARKER)
    if marker is None:
        yield
        return
    limit, warmups = _marker_args(marker)
    reason = inactive_reason()
    if reason is not None:
        if pyfuncitem.config.getoption("gpu_leaks_strict"):
            pytest.fail(f"gpu_leaks: cannot check for leaks: {reason}", pytrace=False)
        pyfuncitem.warn(pytest.PytestWarning(f"gpu_leaks: not checked for leaks: {reason}"))
        yield
        return
    from .stats import current_device

    original = pyfuncitem.obj
    pyfuncitem.obj = _measured(original, limit, warmups, current_device())
    try:
        yield
    finally:
        pyfuncitem.obj = original


__all__ = ["MARKER", "inactive_reason"]
