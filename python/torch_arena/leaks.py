"""Leak hunting: steps, tags, the leak report, ``no_leaks`` and the report at exit.

The library records, for every live allocation, the step it was made in, the innermost tag and
(with site capture on: ``sites:python`` in ``TORCH_ARENA_CONF``, implied by ``leaks:True``) the
Python frames that made it. At each step boundary it notes each site's live bytes; a site whose
live bytes keep rising from step to step is *growing*: a leak, unlike a site that is large but
steady. This module turns that into a report people read (the user's file:line, bytes per step,
since which step, and who holds the memory, found with ``gc``) or a dict for tools.

Steps advance on every ``optimizer.step()`` once torch-arena is enabled, and on each
:func:`step` call.
"""

import atexit
import contextlib
import functools
import gc
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from . import _native, _paths
from .stats import _device_index

__all__ = [
    "LeakError",
    "current_step",
    "format_size",
    "leak_report",
    "no_leaks",
    "parse_size",
    "step",
    "tag",
]

_F = TypeVar("_F", bound=Callable[..., Any])

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
MAX_HOLDERS_SHOWN = 3  # holders printed per site
MAX_CALLERS_SHOWN = 12  # caller frames printed under a site's user frame


class LeakError(AssertionError):
    """Device memory grew where it should not have. The message is the leak report; the
    parsed report is in ``.report`` (the JSON form of :func:`leak_report`).

    An AssertionError so that test runners count it as a failed check, not as a crash of the
    test, and ``pytest.raises(AssertionError)`` and ``unittest`` treat it like any assertion."""

    def __init__(self, message: str, report: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.report = report or {}


# ---------------------------------------------------------------------------------------------
# Sizes.

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(limit: Any) -> int:
    """Bytes from an int (bytes) or a string: a number and a unit, ``"1 MB"``, ``"512KiB"``,
    ``"1.5 GiB"``, ``"100"``. KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB powers of
    1024; units are case-insensitive. ValueError names the accepted forms."""
    if isinstance(limit, bool):
        raise ValueError(f"a size must be an int or a string like '1 MB', not {limit!r}")
    if isinstance(limit, int):
        if limit < 0:
            raise ValueError(f"a size must not be negative, not {limit}")
        return limit
    if isinstance(limit, float) and limit >= 0 and limit == limit:
        return int(limit)
    if isinstance(limit, str):
        m = _SIZE.match(limit)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ValueError(
        f"cannot read the size {limit!r}: give bytes as an int, or a string of a number and a "
        "unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), "
        "e.g. '1 MB', '512KiB', '1.5 GiB'"
    )


def format_size(n: float) -> str:
    """``n`` bytes in binary units, like PyTorch's memory_viz: ``"1.0 MiB"``, ``"512 B"``."""
    value = float(n)
    if abs(value) < 1024:
        return f"{value:.0f} B" if value == int(value) else f"{value:.1f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024.0
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    return f"{value:.1f} PiB"  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# Configuration in force, as key -> value (from `_native.installed_conf()`).


def _conf_int(items: dict[str, str], key: str, default: int) -> int:
    try:
        return int(items[key])
    except (KeyError, ValueError):
        return default


def _conf() -> dict[str, str]:
    return _native.conf_items(_native.installed_conf())


def _leaks_configured(text: str | None = None) -> bool:
    items = _native.conf_items(_native.installed_conf() if text is None else text)
    return items.get("leaks", "False") == "True"


def configured_sites() -> tuple[str, int, int]:
    """(mode, every, min_bytes) of site capture as configured: the ``sites`` key, else
    ``python`` when ``leaks:True``, else ``none``."""
    items = _conf()
    mode = items.get("sites", "auto")
    if mode == "auto":  # the default: python with leaks:True, else none
        mode = "python" if items.get("leaks") == "True" else "none"
    return (
        mode,
        max(1, _conf_int(items, "sites_every", 1)),
        _conf_int(items, "sites_min_kb", 0) << 10,
    )


# Site capture in force, as changed at run time by _sites_on (None: as configured).
_sites_now: tuple[str, int, int] | None = None


def _sites() -> tuple[str, int, int]:
    return _sites_now if _sites_now is not None else configured_sites()


@contextlib.contextmanager
def _sites_on() -> Iterator[None]:
    """Capture the Python site of every allocation in the block (if it is not captured yet)."""
    global _sites_now
    before = _sites()
    if before[0] != "none" and before[1] == 1 and before[2] == 0:
        yield
        return
    mode = before[0] if before[0] != "none" else "python"
    _native.set_sites(mode, 1, 0)
    _sites_now = (mode, 1, 0)
    try:
        yield
    finally:
        _native.set_sites(*before)
        _sites_now = before if _sites_now == (mode, 1, 0) else _sites_now


# ---------------------------------------------------------------------------------------------
# Steps and tags.


def step() -> int:
    """End the current step: the library notes each site's live bytes (the points growth is
    judged from) and returns the new step number. Called for you on every ``optimizer.step()``
    once torch-arena is enabled; call it yourself in loops without an optimizer."""
    return _native.step()


def current_step() -> int:
    """The process-wide step number (0 before the first :func:`step`)."""
    return _native.current_step()


class tag:  # noqa: N801 - used like a function: with tag("eval"): / @tag("eval")
    """Label the allocations made inside a block (``with torch_arena.tag("eval"):``) or a
    function (``@torch_arena.tag("eval")``); the leak report lists each growing site's tags.
    Tags nest (the innermost wins) and, like steps, are process-wide: an allocation made on
    another thread meanwhile gets the tag too."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a tag is a non-empty string, not {name!r}")
        self.name = name

    def __enter__(self) -> "tag":
        _native.tag_push(self.name)
        return self

    def __exit__(self, *exc: Any) -> None:
        _native.tag_pop()

    def __call__(self, fn: _F) -> _F:
        @functools.wraps(fn)
        def tagged(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return tagged  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Frames.


def _torch_dir() -> str | None:
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None) if torch is not None else None
    return os.path.dirname(os.path.abspath(path)) if path else None


def _is_internal(filename: str, torch_dir: str | None) -> bool:
    """A frame of torch-arena, torch or the import machinery, not the user's code."""
    if filename.startswith("<frozen") or "importlib" in filename:
        return True
    path = os.path.abspath(filename) if filename and not filename.startswith("<") else filename
    if path.startswith(_PACKAGE_DIR + os.sep):
        return True
    if torch_dir is not None:
        return path.startswith(torch_dir + os.sep)
    return f"{os.sep}site-packages{os.sep}torch{os.sep}" in path


def user_frame_index(frames: list[dict[str, Any]]) -> int:
    """Index of the first (innermost) Python frame outside torch-arena, torch and importlib;
    else of the first Python frame; else 0."""
    torch_dir = _torch_dir()
    python = [i for i, f in enumerate(frames) if f.get("kind", "python") == "python"]
    for i in python:
        if not _is_internal(str(frames[i].get("filename", "")), torch_dir):
            return i
    return python[0] if python else 0


def _short(path: str) -> str:
    if not path or path.startswith("<"):
        return path
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _frame_text(frame: dict[str, Any]) -> str:
    if frame.get("kind") == "native":
        lib = os.path.basename(str(frame.get("filename", "")))
        return f"{frame.get('name', '?')} ({lib or '?'} {frame.get('ip', '')})".rstrip()
    where = _short(str(frame.get("filename", "?")))
    return f"{where}:{frame.get('line', 0)} in {frame.get('name', '?')}"


def _site_lines(frames: list[dict[str, Any]], indent: str) -> list[str]:
    if not frames:
        return [
            f"{indent}at an unknown site (site capture was off: sites:python in TORCH_ARENA_CONF)"
        ]
    i = user_frame_index(frames)
    lines = [f"{indent}at {_frame_text(frames[i])}"]
    callers = [f for f in frames[i + 1 :] if f.get("kind", "python") == "python"] or frames[i + 1 :]
    shown = 0
    run: list[str] = []  # packages of a run of library frames, collapsed into one line

    def flush() -> None:
        if run:
            names = ", ".join(dict.fromkeys(run))
            lines.append(f"{indent}    ... {len(run)} frame(s) in {names}")
            run.clear()

    for n, f in enumerate(callers):
        package = _library_package(str(f.get("filename", "")))
        if package is not None:
            run.append(package)
            continue
        flush()
        if shown == MAX_CALLERS_SHOWN:
            lines.append(f"{indent}    ... {len(callers) - n} more frame(s)")
            return lines
        lines.append(f"{indent}    called from {_frame_text(f)}")
        shown += 1
    flush()
    return lines


_LIBRARY_DIRS = tuple(
    {os.path.dirname(os.__file__) + os.sep}
    | {p + os.sep for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
)


def _library_package(filename: str) -> str | None:
    """The top-level package of a frame in the standard library or site-packages (callers
    there are collapsed in the report), None for the user's code."""
    if filename.startswith("<"):
        return filename.strip("<>").split(" ")[-1] or "?"
    for prefix in _LIBRARY_DIRS:
        if filename.startswith(prefix):
            rest = filename[len(prefix) :]
            if rest.startswith(("site-packages" + os.sep, "dist-packages" + os.sep)):
                rest = rest.split(os.sep, 1)[1]
            top = rest.split(os.sep, 1)[0]
            return top[:-3] if top.endswith(".py") else top
    return None


def site_location(frames: list[dict[str, Any]]) -> tuple[str, int] | None:
    """(filename, line) of a site's user frame, None when the site has no frames."""
    if not frames:
        return None
    f = frames[user_frame_index(frames)]
    return str(f.get("filename", "")), int(f.get("line", 0))


# ---------------------------------------------------------------------------------------------
# Reports.


def _attach_holders(report: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    """Add "holders" to each entry (by its "example_ptrs"), with one gc walk for all."""
    from .referrers import find_holders

    ptrs = {p for e in entries for p in e.get("example_ptrs", ())}
    found = find_holders(ptrs) if ptrs else {}
    for e in entries:
        holders = []
        for p in e.get("example_ptrs", ()):
            for h in found.get(p, ()):
                holders.append(dict(h, ptr=p))
        e["holders"] = holders


def _leaks(device: int, warmup: int, age: int) -> dict[str, Any]:
    gc.collect()  # cycles that only the collector frees are not leaks
    report = _native.leaks_json(device, warmup, age)
    report["kind"] = "growth"
    # Growth is judged at step boundaries; a site whose memory was all freed since the last
    # boundary (the loop returned, the list was dropped) no longer leaks anything.
    growing = report.get("growing", [])
    report["growing"] = [s for s in growing if s.get("live_count", 1) > 0]
    report["freed_since_last_step"] = [s["site"] for s in growing if s.get("live_count", 1) == 0]
    report["sites_mode"] = _sites()[0]
    _attach_holders(report, report.get("growing", []))
    return report


def leak_report(
    device: Any = None, format: str = "text", warmup: int | None = None, age: int | None = None
) -> Any:
    """The allocation sites of ``device`` (None: the current one) whose live memory keeps
    growing from step to step, after ``warmup`` steps (default: the ``leak_warmup`` setting,
    2), and, with ``age`` > 0 (default: ``leak_age``, 0), the live allocations older than
    ``age`` steps.

    ``format="text"`` returns the report for people (nothing is printed): per growing site its
    file:line and stack, bytes and allocations per step, since which step, example sizes, tags,
    and who holds the memory (``losses[12]`` of ``local variable 'losses' of train() at
    train.py:40``). ``format="json"`` returns the library's JSON as a dict, each growing site
    with "holders" added."""
    if format not in ("text", "json"):
        raise ValueError(f"format must be 'text' or 'json', not {format!r}")
    items = _conf()
    warmup = _conf_int(items, "leak_warmup", 2) if warmup is None else int(warmup)
    age = _conf_int(items, "leak_age", 0) if age is None else int(age)
    if warmup < 0 or age < 0:
        raise ValueError(f"warmup and age must be >= 0 (got warmup={warmup}, age={age})")
    report = _leaks(_device_index(device), warmup, age)
    return report if format == "json" else render(report)


def _holder_lines(entry: dict[str, Any], indent: str) -> list[str]:
    holders = entry.get("holders") or []
    if not holders:
        return [f"{indent}held by: no Python object found (not a tensor, or not reachable)"]
    lines = [f"{indent}held by:"]
    # Named holders first, those reached through a container (the likely culprit) before a
    # plain variable that happens to hold the newest one.
    holders = sorted(holders, key=lambda h: (h.get("expr") is None, -len(h.get("chain") or ())))
    for h in holders[:MAX_HOLDERS_SHOWN]:
        kind = h.get("type", "?").rsplit(".", 1)[-1]
        if h.get("expr"):
            lines.append(f"{indent}    {h['expr']}  ({kind}; {h['root']})")
            chain = h.get("chain") or []
            if len(chain) > 1:
                lines.append(f"{indent}        {' <- '.join(chain)}")
        else:
            lines.append(f"{indent}    a {kind} reachable from no global or running frame")
    if len(holders) > MAX_HOLDERS_SHOWN:
        lines.append(f"{indent}    ... and {len(holders) - MAX_HOLDERS_SHOWN} more")
    return lines


def render(report: dict[str, Any]) -> str:
    """The text of a report (growth, or allocations left live by a block)."""
    lines = []
    device = report.get("device", 0)
    sites = report.get("growing", [])
    if report.get("kind") == "left_live":
        head = (
            f"torch-arena leak report, device {device}: allocations made in the checked block "
            f"and still live after it, by site (limit {format_size(report.get('limit', 0))})"
        )
    else:
        head = (
            f"torch-arena leak report, device {device}, step {report.get('step', 0)}: "
            f"growth judged over {report.get('steps_observed', 0)} step(s) after the "
            f"{report.get('warmup', 0)} warmup step(s)"
        )
    lines.append(head)
    if report.get("sites_mode") == "none":
        lines.append(
            "site capture is off, so no site can be judged: set TORCH_ARENA_CONF=leaks:True "
            "(or sites:python) before the run, or check a block with no_leaks()"
        )
    freed = report.get("freed_since_last_step") or []
    if freed:
        lines.append(
            f"({len(freed)} site(s) grew until the last step, but their memory has been freed "
            "since: not reported)"
        )
    if not sites:
        lines.append(
            "no growing allocation site."
            if report.get("kind") != "left_live"
            else "nothing left live."
        )
    for n, s in enumerate(sites, 1):
        lines.append("")
        if report.get("kind") == "left_live":
            lines.append(
                f"#{n}  {format_size(s['live_bytes'])} left live in {s['live_count']} allocation(s)"
            )
        else:
            lines.append(
                f"#{n}  {format_size(s.get('bytes_per_step', 0))} per step "
                f"({s.get('count_per_step', 0):g} allocation(s) per step), since step "
                f"{s.get('first_step', '?')}; live now {format_size(s.get('live_bytes', 0))} "
                f"in {s.get('live_count', 0)} allocation(s)"
            )
        lines += _site_lines(s.get("frames") or [], "    ")
        sizes = s.get("example_sizes") or []
        if sizes:
            lines.append("    example sizes: " + ", ".join(format_size(x) for x in sizes[:5]))
        if s.get("tags"):
            lines.append("    tags: " + ", ".join(str(t) for t in s["tags"]))
        lines += _holder_lines(s, "    ")
    old = report.get("old") or []
    if old:
        lines.append("")
        lines.append(f"{len(old)} live allocation(s) older than the age limit:")
        for o in old[:20]:
            where = (
                _frame_text(o["frames"][user_frame_index(o["frames"])])
                if o.get("frames")
                else "unknown site"
            )
            lines.append(
                f"    {format_size(o.get('size', 0))} at {o.get('ptr', 0):#x}, made at step "
                f"{o.get('step', '?')} (age {o.get('age', '?')}), {where}"
            )
        if len(old) > 20:
            lines.append(f"    ... and {len(old) - 20} more")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Allocations left live by a block (no steps), for no_leaks and the pytest marker.


def _max_live_seq(device: int) -> int:
    live = _native.live_json(device)
    return max((a.get("seq", 0) for a in live.get("allocations", ())), default=0)


def left_live(device: int, after_seq: int, limit: int) -> dict[str, Any]:
    """The allocations of ``device`` with a sequence number above ``after_seq`` that are still
    live, grouped by site, largest first, with their holders; "over" lists the sites whose
    live bytes exceed ``limit``."""
    gc.collect()
    live = _native.live_json(device)
    frames = live.get("sites", {})
    groups: dict[int, dict[str, Any]] = {}
    for a in live.get("allocations", ()):
        if a.get("seq", 0) <= after_seq:
            continue
        site = int(a.get("site", 0))
        g = groups.setdefault(
            site,
            {
                "site": site,
                "frames": frames.get(str(site), []),
                "live_bytes": 0,
                "live_count": 0,
                "example_sizes": [],
                "example_ptrs": [],
                "tags": [],
            },
        )
        g["live_bytes"] += int(a.get("size", 0))
        g["live_count"] += 1
        if len(g["example_ptrs"]) < 8:
            g["example_ptrs"].append(int(a["ptr"]))
            g["example_sizes"].append(int(a.get("size", 0)))
        if a.get("tag") and a["tag"] not in g["tags"]:
            g["tags"].append(a["tag"])
    entries = sorted(groups.values(), key=lambda g: -g["live_bytes"])
    report = {
        "device": device,
        "step": live.get("step", 0),
        "kind": "left_live",
        "limit": limit,
        "growing": entries,
    }
    report["over"] = [g["site"] for g in entries if g["live_bytes"] > limit]
    _attach_holders(report, entries)
    return report


class no_leaks:  # noqa: N801 - a context manager used like a function
    """Fail a block that leaks device memory::

        with torch_arena.no_leaks(warmup=2, limit="1 MB"):
            for batch in loader:
                train_step(batch)            # optimizer.step() advances the step

    With steps inside the block (``optimizer.step()`` once torch-arena is enabled, or
    :func:`step`), the first ``warmup`` are ignored and a site fails when its live memory grew
    by more than ``limit`` over the remaining steps (``bytes_per_step`` times the steps
    measured; steady memory, however large, passes). It needs at least ``warmup + 2`` steps: a
    site counts as growing only when it rose in at least two steps. With no step inside the
    block, a site fails when the allocations the block made and left live exceed ``limit``.

    On failure raises :class:`LeakError` (an AssertionError) carrying the report. The block turns
    on Python site capture for its duration if it is off. ``limit``: bytes, or a string such as
    ``"1 MB"`` or ``"512KiB"``. An exception from the block propagates unchecked. ``.report``
    holds the last report (a dict) after the block."""

    def __init__(self, warmup: int = 2, limit: Any = "1 MB", device: Any = None) -> None:
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, not {warmup!r}")
        self.warmup = warmup
        self.limit = parse_size(limit)
        self.device = device
        self.report: dict[str, Any] | None = None
        self._sites: Any = None

    def __enter__(self) -> "no_leaks":
        self._index = _device_index(self.device)
        self._sites = _sites_on()
        self._sites.__enter__()
        try:
            gc.collect()
            self._step0 = _native.current_step()
            self._seq0 = _max_live_seq(self._index)
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
        steps = _native.current_step() - self._step0
        if steps == 0:
            report = left_live(self._index, self._seq0, self.limit)
            self.report = report
            if report["over"]:
                over = set(report["over"])
                report["growing"] = [g for g in report["growing"] if g["site"] in over]
                raise LeakError(render(report), report)
            return
        if steps < self.warmup + 2:
            raise ValueError(
                f"no_leaks(warmup={self.warmup}) saw {steps} step(s) in its block: it needs at "
                f"least {self.warmup + 2} (the warmup steps, then two to see growth), or none "
                "at all to check what the block leaves live. Lower warmup or run more steps."
            )
        report = _leaks(self._index, self._step0 + self.warmup, 0)
        self.report = report
        observed = max(1, int(report.get("steps_observed", steps - self.warmup)))
        bad = [
            s
            for s in report.get("growing", [])
            if float(s.get("bytes_per_step", 0)) * observed > self.limit
        ]
        if bad:
            report["growing"] = bad
            text = render(report)
            text += f"(limit {format_size(self.limit)} of growth per site over the block)\n"
            raise LeakError(text, report)


# ---------------------------------------------------------------------------------------------
# The report at exit (leaks:True).

_exit_installed = False


def install_exit_report(conf: str | None = None) -> bool:
    """Print the leak report to stderr at exit (and write its JSON to
    ``TORCH_ARENA_LEAK_REPORT``, with ``{rank}``/``{pid}`` expanded, when set) if ``conf``
    (default: the configuration in force) has ``leaks:True``. Once per process; whether it is
    installed."""
    global _exit_installed
    if _exit_installed:
        return True
    if not _leaks_configured(conf):
        return False
    _exit_installed = True
    atexit.register(_report_at_exit)
    return True


def _exit_devices() -> list[int]:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    from ._torch import is_enabled

    if cuda is not None and is_enabled():
        if not cuda.is_initialized():
            return []  # no CUDA memory was ever allocated
        return list(range(cuda.device_count()))
    return [0]


def _report_at_exit() -> None:
    try:
        if not _native.has_track():
            return
        reports = [leak_report(d, format="json") for d in _exit_devices()]
        for report in reports:
            sys.stderr.write(render(report))
        sys.stderr.flush()
        path = os.environ.get("TORCH_ARENA_LEAK_REPORT", "")
        if path:
            with open(_paths.expand(path), "w") as f:
                json.dump({"devices": reports}, f, indent=1, default=str)
    except Exception as exc:  # at exit: say it, never raise
        print(f"torch-arena: the leak report at exit failed: {exc}", file=sys.stderr)
