"""The leak report at exit (``leaks:True``): printed to stderr, and written as JSON to
``TORCH_ARENA_LEAK_REPORT`` (``{rank}``/``{pid}`` expanded) when set, as ``{"rank",
"world_size", "devices": [one leak_report(format="json") per device]}`` (``torch-arena merge``
reads these files). The torch integration tells it which devices to report
(:func:`set_devices`); it imports nothing that imports it."""

import atexit
import json
import os
import sys
from collections.abc import Callable

from . import _capture, _native, _paths, _ranks
from .leaks import leak_report, render

__all__ = ["install", "set_devices"]

_installed = False
# The devices to report at exit; the torch integration replaces it once it is enabled.
_devices: Callable[[], list[int]] = lambda: [0]  # noqa: E731


def set_devices(devices: Callable[[], list[int]]) -> None:
    """Report the devices ``devices()`` returns at exit (called then, not now)."""
    global _devices
    _devices = devices


def install(conf: str | None = None) -> bool:
    """Print the leak report at exit if ``conf`` (default: the configuration in force) has
    ``leaks:True``. Once per process; whether it is installed."""
    global _installed
    if _installed:
        return True
    if not _capture.leaks_configured(conf):
        return False
    _installed = True
    atexit.register(_report_at_exit)
    return True


def _report_at_exit() -> None:
    try:
        if not _native.has_track():
            return
        reports = [leak_report(d, format="json") for d in _devices()]
        for report in reports:
            sys.stderr.write(render(report))
        sys.stderr.flush()
        path = os.environ.get("TORCH_ARENA_LEAK_REPORT", "")
        if path:
            _paths.write_whole(
                _paths.expand(path),
                lambda f: json.dump(
                    {**_ranks.identity(), "devices": reports}, f, indent=1, default=str
                ),
            )
    except Exception as exc:  # at exit: say it, never raise
        print(f"torch-arena: the leak report at exit failed: {exc}", file=sys.stderr)
