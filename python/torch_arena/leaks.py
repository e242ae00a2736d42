"""Leak hunting, the public API: steps, tags, ``leak_report``, ``live_report``, ``no_leaks``.

The library records, for every live allocation, the step it was made in, the innermost tag of
its thread and (with site capture on: ``sites:python`` in ``TORCH_ARENA_CONF``, implied by
``leaks:True``) the Python frames that made it. At each step boundary it notes each site's live
bytes; a site whose live bytes keep rising from step to step is *growing*: a leak, unlike a
site that is large but steady, or one that grew to a bound and stayed there (a cache). The
verdict is in :mod:`torch_arena._verdict`, the text in :mod:`torch_arena._render`, who holds
the memory in :mod:`torch_arena.referrers`.

Steps advance on every ``optimizer.step()`` once torch-arena is enabled, and on each
:func:`step` call.
"""

import functools
import gc
import math
from collections.abc import Callable
from typing import Any, TypeVar

from . import _capture, _cpu_tensors, _explain, _native, _ranks, _verdict
from ._frames import site_location, user_frame_index
from ._render import render, render_live
from ._sizes import format_size, parse_size
from ._verdict import LeakError
from .stats import _device_index

__all__ = [
    "LeakError",
    "current_step",
    "format_size",
    "leak_report",
    "live_report",
    "no_leaks",
    "parse_size",
    "render",
    "site_location",
    "step",
    "tag",
    "user_frame_index",
]

_F = TypeVar("_F", bound=Callable[..., Any])


# ---------------------------------------------------------------------------------------------
# Steps and tags.


def step() -> int:
    """End the current step: the library notes each site's live bytes (the points growth is
    judged from) and returns the new step number. Called for you on every ``optimizer.step()``
    once torch-arena is enabled; call it yourself in loops without an optimizer. It is also the
    boundary :func:`torch_arena.explain` tells a held graph by."""
    n = _native.step()
    _explain.note_step()
    return n


def current_step() -> int:
    """The process-wide step number (0 before the first :func:`step`)."""
    return _native.current_step()


class tag:  # noqa: N801 - used like a function: with tag("eval"): / @tag("eval")
    """Label the allocations made inside a block (``with torch_arena.tag("eval"):``) or a
    function (``@torch_arena.tag("eval")``); the leak report lists each growing site's tags.
    Tags nest (the innermost wins) and are per thread: an allocation carries the innermost tag
    of the thread that made it, so two threads' blocks never swap labels (and an allocation an
    autograd worker thread makes carries none)."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a tag is a non-empty string, not {name!r}")
        self.name = name

    def __enter__(self) -> "tag":
        _native.tag_push(self.name)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            _native.tag_pop()
        except ValueError:
            # More exits than entries on this thread. Never replace the block's own exception
            # with ours; without one, say what went wrong.
            if exc_type is None:
                raise

    def __call__(self, fn: _F) -> _F:
        @functools.wraps(fn)
        def tagged(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return tagged  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Reports.


def _warmup_age(warmup: Any, age: Any) -> tuple[int, int]:
    items = _capture.conf()
    warmup = _capture.conf_int(items, "leak_warmup", 2) if warmup is None else int(warmup)
    age = _capture.conf_int(items, "leak_age", 0) if age is None else int(age)
    if warmup < 0 or age < 0:
        raise ValueError(f"warmup and age must be >= 0 (got warmup={warmup}, age={age})")
    return warmup, age


def leak_report(
    device: Any = None,
    format: str = "text",
    warmup: int | None = None,
    age: int | None = None,
    all_ranks: bool = False,
) -> Any:
    """The allocation sites of ``device`` (None: the current one) whose live memory keeps
    growing from step to step, after ``warmup`` steps (default: the ``leak_warmup`` setting,
    2), and, with ``age`` > 0 (default: ``leak_age``, 0), the live allocations older than
    ``age`` steps.

    ``format="text"`` returns the report for people (nothing is printed): warnings first (too
    few steps to judge, site capture off), then per growing site its file:line and stack, bytes
    and allocations per step, since which step, example sizes, tags, and who holds the memory
    (``losses[12]`` of ``local variable 'losses' of train() at train.py:40``).
    ``format="json"`` returns the library's JSON as a dict, each growing site with "holders"
    added, "warnings" (a list of strings, empty when the verdict can be trusted), and "rank"
    and "world_size" (which process of a job wrote it).

    ``all_ranks=True`` returns instead the table of every rank's leaked bytes (the live bytes of
    its growing sites) and their imbalance, as text or (``format="json"``) a dict, gathered
    through ``torch.distributed`` (:mod:`torch_arena._ranks`): a collective, which every rank
    must call."""
    if format not in ("text", "json"):
        raise ValueError(f"format must be 'text' or 'json', not {format!r}")
    warmup, age = _warmup_age(warmup, age)
    report = _verdict.growth_report(_device_index(device), warmup, age)
    report.update(_ranks.identity())
    if all_ranks:
        row = _ranks.leak_row(report["rank"], [report])
        return _ranks.across_ranks("leaks", row, format == "json", _cpu_tensors.live_counter())
    return report if format == "json" else render(report)


def live_report(device: Any = None, format: str = "text", top: int = 10) -> Any:
    """What is live now on ``device`` (None: the current one), by allocation site: the ``top``
    sites by live bytes, largest first, each with its bytes, share, count, stack, example
    sizes, tags and who holds the memory. ``format="json"`` returns a dict: ``live_bytes``,
    ``live_count``, ``sites`` (each ``site``, ``frames``, ``live_bytes``, ``live_count``,
    ``example_sizes``, ``example_ptrs``, ``tags``, ``holders``, ``holders_not_shown``),
    ``sites_not_shown`` and ``warnings``. Allocations without a captured site are grouped
    under site 0."""
    if format not in ("text", "json"):
        raise ValueError(f"format must be 'text' or 'json', not {format!r}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be an int >= 1, not {top!r}")
    gc.collect()
    report = _verdict.live_by_site(_device_index(device))
    report["sites_not_shown"] = max(0, len(report["sites"]) - top)
    report["sites"] = report["sites"][:top]
    report["warnings"] = _verdict.capture_warnings()
    _verdict.attach_holders(report["sites"])
    return report if format == "json" else render_live(report)


# ---------------------------------------------------------------------------------------------
# no_leaks.


def _max_live_seq(device: int) -> int:
    live = _native.live_json(device)
    return max((a.get("seq", 0) for a in live.get("allocations", ())), default=0)


def _limit(limit: Any) -> float:
    if isinstance(limit, float) and math.isinf(limit) and limit > 0:
        return math.inf  # no limit: report, never fail
    return parse_size(limit)


class no_leaks:  # noqa: N801 - a context manager used like a function
    """Fail a block that leaks device memory::

        with torch_arena.no_leaks(warmup=2, limit="1 MB"):
            for batch in loader:
                train_step(batch)            # optimizer.step() advances the step

    The first ``warmup`` steps inside the block are ignored and a site fails when its live
    memory grew by more than ``limit`` over the remaining steps (``bytes_per_step`` times the
    steps measured; steady memory, however large, passes, and so does a site that grew to a
    bound and stayed flat). It needs at least ``warmup + 2`` steps: a site counts as growing
    only when it rose in at least two steps. A block with fewer steps raises ValueError saying
    how to mark steps, rather than passing a block it could not judge.

    ``steps=False`` judges the block by what it leaves live instead (for code with no steps):
    a site fails when its live memory grew by more than ``limit`` over the block; allocations
    the block left live that only replaced older ones of the same site (a bounded cache,
    warmed before the block with sites captured: ``leaks:True``) are noted in the report, not
    a leak.

    On failure raises :class:`LeakError` (an AssertionError) carrying the report. The block
    turns on Python site capture for its duration if it is off. ``limit``: bytes, a string
    such as ``"1 MB"`` or ``"512KiB"``, or ``math.inf`` (never fail; ``.report`` still has the
    verdict). An exception from the block propagates unchecked. ``.report`` holds the last
    report (a dict) after the block."""

    def __init__(
        self, warmup: int = 2, limit: Any = "1 MB", device: Any = None, steps: bool = True
    ) -> None:
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, not {warmup!r}")
        if not isinstance(steps, bool):
            raise ValueError(f"steps must be True or False, not {steps!r}")
        self.warmup = warmup
        self.limit = _limit(limit)
        self.device = device
        self.steps = steps
        self.report: dict[str, Any] | None = None
        self._sites: Any = None

    def __enter__(self) -> "no_leaks":
        self._index = _device_index(self.device)
        self._sites = _capture.capture_on()
        self._sites.__enter__()
        try:
            gc.collect()
            self._step0 = _native.current_step()
            self._seq0 = _max_live_seq(self._index)
            self._before = _verdict.site_bytes(self._index) if not self.steps else None
        except BaseException:
            self._sites.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        try:
            if exc_type is not None:
                return False
            self.check()
        finally:
            self._sites.__exit__(None, None, None)
        return False

    def check(self) -> None:
        """Judge the block now (``__exit__`` does); raise LeakError on a leak."""
        if not self.steps:
            report = _verdict.left_live(self._index, self._seq0, self.limit, self._before)
            self.report = report
            _verdict.check_left_live(report)
            return
        steps = _native.current_step() - self._step0
        if steps < self.warmup + 2:
            seen = "no step" if steps == 0 else f"{steps} step(s)"
            raise ValueError(
                f"no_leaks(warmup={self.warmup}) saw {seen} in its block, so it could judge "
                f"nothing: it needs at least {self.warmup + 2} (the warmup steps, then two to "
                f"see growth). {_verdict.MARK_STEPS[0].upper()}{_verdict.MARK_STEPS[1:]}; or "
                "lower warmup; or use no_leaks(steps=False) to check what the block leaves live."
            )
        report = _verdict.growth_report(self._index, self._step0 + self.warmup, 0)
        self.report = report
        _verdict.check_growth(report, self.limit)
