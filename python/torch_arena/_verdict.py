"""The leak verdict, in one place: growth over steps (``leak_report``, ``no_leaks``), growth
over one block (``no_leaks(steps=False)``, the pytest marker), what is live now by site
(``live_report``), and the warnings that say when a verdict cannot be trusted.

Growth itself is judged by the library (src/track/leaks.rs): a site's live bytes sampled at
step boundaries must rise overall, never fall as far as they rose, rise in at least two
intervals, and still be rising (flat for fewer steps than it took to grow, or fewer than 3);
a site that grew and then stayed flat is *plateaued* (a bounded cache), noted but not a leak.
Over one block the same rule applies to the one interval: a site leaks when its live bytes at
the end exceed those at the start; new allocations that only replaced older ones of the same
site (a bounded cache, warm) are noted, not a leak.
"""

import gc
from typing import Any

from . import _capture, _native
from ._render import render
from ._sizes import format_size
from .referrers import find_holders

__all__ = [
    "LeakError",
    "MIN_BOUNDARIES",
    "attach_holders",
    "check_growth",
    "check_left_live",
    "growth_report",
    "left_live",
    "live_by_site",
    "site_bytes",
]

# Boundaries at or after the warm-up a growth verdict needs: the warm-up boundary, then two
# more (a site counts as growing only once it rose in two intervals).
MIN_BOUNDARIES = 3

# Pointers whose holders are looked for, per site.
HOLDER_PTRS = 5

MARK_STEPS = (
    "mark steps: once torch-arena is enabled every optimizer.step() ends one; otherwise call "
    "torch_arena.step() at the end of each iteration"
)


class LeakError(AssertionError):
    """Device memory grew where it should not have. The message is the leak report; the
    parsed report is in ``.report`` (the JSON form of :func:`torch_arena.leak_report`).

    An AssertionError so that test runners count it as a failed check, not as a crash of the
    test, and ``pytest.raises(AssertionError)`` and ``unittest`` treat it like any assertion."""

    def __init__(self, message: str, report: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.report = report or {}


def capture_warnings() -> list[str]:
    """What makes any verdict by site unreliable in the site capture in force."""
    mode, every, min_bytes = _capture.sites()
    out = []
    if mode == "none":
        out.append(
            "site capture is off, so no site can be judged: set TORCH_ARENA_CONF=leaks:True "
            "(or sites:python) before the run, or check a block with no_leaks()"
        )
        return out
    if every > 1:
        out.append(
            f"sites_every:{every}: only one allocation in {every} has a site, so bytes per step "
            "and live bytes by site are samples and small leaks may be missed"
        )
    if min_bytes > 0:
        out.append(
            f"sites_min_kb:{min_bytes >> 10}: allocations under {min_bytes >> 10} KiB have no "
            "site and are not judged"
        )
    return out


def growth_warnings(report: dict[str, Any]) -> list[str]:
    out = []
    boundaries = int(report.get("boundaries", 0))
    warmup = report.get("warmup", 0)
    if boundaries < MIN_BOUNDARIES:
        seen = "no step boundary" if boundaries == 0 else f"only {boundaries} step boundary(ies)"
        out.append(
            f"{seen} at or after the warm-up (step {warmup}, now step {report.get('step', 0)}): "
            f"growth needs {MIN_BOUNDARIES} (the warm-up boundary and two more), so nothing "
            f"could be judged; {MARK_STEPS}"
        )
    return out + capture_warnings()


def attach_holders(entries: list[dict[str, Any]]) -> None:
    """Add "holders" (by the entries' "example_ptrs", one gc walk for all) and
    "holders_not_shown" (the site's live allocations whose holders were not looked for)."""
    ptrs = {p for e in entries for p in e.get("example_ptrs", ())[:HOLDER_PTRS]}
    found = find_holders(ptrs) if ptrs else {}
    for e in entries:
        looked = e.get("example_ptrs", ())[:HOLDER_PTRS]
        e["holders"] = [dict(h, ptr=p) for p in looked for h in found.get(p, ())]
        e["holders_not_shown"] = max(0, int(e.get("live_count", 0)) - len(looked))


def growth_report(device: int, warmup: int, age: int) -> dict[str, Any]:
    """The library's growth verdict for ``device`` after step ``warmup``, with holders and
    warnings."""
    gc.collect()  # cycles that only the collector frees are not leaks
    report = _native.leaks_json(device, warmup, age)
    report["kind"] = "growth"
    # Growth is judged at step boundaries; a site whose memory was all freed since the last
    # boundary (the loop returned, the list was dropped) no longer leaks anything.
    growing = report.get("growing", [])
    report["growing"] = [s for s in growing if s.get("live_count", 1) > 0]
    report["freed_since_last_step"] = [s["site"] for s in growing if s.get("live_count", 1) == 0]
    report["plateaued"] = [s for s in report.get("plateaued", []) if s.get("live_count", 1) > 0]
    report["sites_mode"] = _capture.sites()[0]
    report["warnings"] = growth_warnings(report)
    attach_holders(report["growing"])
    return report


def check_growth(report: dict[str, Any], limit: int) -> None:
    """Raise LeakError when a growing site grew by more than ``limit`` over the steps observed."""
    observed = max(1, int(report.get("steps_observed", 1)))
    bad = [
        s for s in report.get("growing", []) if float(s.get("bytes_per_step", 0)) * observed > limit
    ]
    if bad:
        report["growing"] = bad
        text = render(report)
        text += f"(limit {format_size(limit)} of growth per site over the block)\n"
        raise LeakError(text, report)


def live_by_site(device: int, after_seq: int = -1) -> dict[str, Any]:
    """``device``'s live allocations with a sequence number above ``after_seq``, grouped by
    site, largest first (ties: the site seen first)."""
    live = _native.live_json(device)
    frames = live.get("sites", {})
    groups: dict[int, dict[str, Any]] = {}
    total = count = 0
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
        size = int(a.get("size", 0))
        g["live_bytes"] += size
        g["live_count"] += 1
        total += size
        count += 1
        if len(g["example_ptrs"]) < 8:
            g["example_ptrs"].append(int(a["ptr"]))
            g["example_sizes"].append(size)
        if a.get("tag") and a["tag"] not in g["tags"]:
            g["tags"].append(a["tag"])
    entries = sorted(groups.values(), key=lambda g: -g["live_bytes"])
    return {
        "device": device,
        "step": live.get("step", 0),
        "live_bytes": total,
        "live_count": count,
        "sites": entries,
    }


def site_bytes(device: int) -> dict[int, int]:
    """``device``'s live bytes by site now: what :func:`left_live` compares against."""
    return {g["site"]: g["live_bytes"] for g in live_by_site(device)["sites"]}


def left_live(
    device: int, after_seq: int, limit: int, before: dict[int, int] | None = None
) -> dict[str, Any]:
    """The allocations of ``device`` with a sequence number above ``after_seq`` that are still
    live, grouped by site, largest first, with their holders.

    The verdict is the growth verdict's, over the one interval of the block: a site leaks when
    its live bytes grew. ``before`` is :func:`site_bytes` at the start of the block (None:
    nothing was live); each site's "growth_bytes" is its live bytes now less ``before``'s, and
    "over" lists the sites that grew by more than ``limit``. A site whose new allocations only
    replaced older ones of its own (a warm ``deque(maxlen=N)``, an LRU cache at its bound)
    did not grow: it is listed under "replaced", a note, never a leak."""
    gc.collect()
    live = live_by_site(device, after_seq)
    now = site_bytes(device)
    before = before or {}
    entries = live["sites"]
    for g in entries:
        g["growth_bytes"] = max(0, now.get(g["site"], 0) - before.get(g["site"], 0))
    report = {
        "device": device,
        "step": live["step"],
        "kind": "left_live",
        "limit": limit,
        "growing": [g for g in entries if g["growth_bytes"] > 0],
        "replaced": [g for g in entries if g["growth_bytes"] == 0],
        "warnings": capture_warnings(),
    }
    report["over"] = [g["site"] for g in report["growing"] if g["growth_bytes"] > limit]
    attach_holders(report["growing"])
    return report


def check_left_live(report: dict[str, Any]) -> None:
    """Raise LeakError when a site of a :func:`left_live` report is over its limit."""
    if report["over"]:
        over = set(report["over"])
        report["growing"] = [g for g in report["growing"] if g["site"] in over]
        raise LeakError(render(report), report)
