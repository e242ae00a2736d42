"""Reports as text for people: growth (``leak_report``), allocations a block left live
(``no_leaks``, the pytest marker) and what is live now (``live_report``). Pure functions of
the report dicts; warnings come first, before any verdict."""

from typing import Any

from ._frames import frame_text, site_lines, user_frame_index
from ._sizes import format_size

__all__ = ["count_text", "render", "render_live"]

MAX_HOLDERS_SHOWN = 3  # holders printed per site


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
    # The true count: every live allocation of the site whose holder is not printed.
    shown = {h.get("ptr") for h in holders[:MAX_HOLDERS_SHOWN]}
    hidden = int(entry.get("live_count", len(shown))) - len(shown)
    if hidden > 0:
        lines.append(f"{indent}    ... and {hidden} more allocation(s) of this site")
    return lines


def count_text(n: float) -> str:
    """A count for people: whole numbers as they are, others to two decimals (``0.62``, not
    ``0.615385``)."""
    n = float(n)
    if n == int(n):
        return str(int(n))
    return f"{n:.2f}".rstrip("0").rstrip(".")


def _warning_lines(report: dict[str, Any]) -> list[str]:
    return [f"warning: {w}" for w in report.get("warnings") or ()]


def render(report: dict[str, Any]) -> str:
    """The text of a report (growth, or allocations left live by a block)."""
    lines = []
    device = report.get("device", 0)
    sites = report.get("growing", [])
    left_live = report.get("kind") == "left_live"
    if left_live:
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
    lines += _warning_lines(report)
    lines.append(head)
    freed = report.get("freed_since_last_step") or []
    if freed:
        lines.append(
            f"({len(freed)} site(s) grew until the last step, but their memory has been freed "
            "since: not reported)"
        )
    for p in report.get("plateaued") or ():
        where = (
            frame_text(p["frames"][user_frame_index(p["frames"])])
            if p.get("frames")
            else "an unknown site"
        )
        lines.append(
            f"(not a leak: {where} grew {format_size(p.get('bytes_per_step', 0))} per step "
            f"from step {p.get('first_step', '?')} to {p.get('until_step', '?')}, then stayed "
            f"flat at {format_size(p.get('live_bytes', 0))}: a bounded cache?)"
        )
    for p in report.get("replaced") or ():
        where = (
            frame_text(p["frames"][user_frame_index(p["frames"])])
            if p.get("frames")
            else "an unknown site"
        )
        lines.append(
            f"(not a leak: {where} left {format_size(p.get('live_bytes', 0))} live in "
            f"{p.get('live_count', 0)} allocation(s), but its live memory did not grow: they "
            "replaced older ones, a bounded cache?)"
        )
    if not sites:
        if report.get("warnings") and not left_live:
            lines.append("no verdict: see the warning(s) above.")
        else:
            lines.append("nothing left live." if left_live else "no growing allocation site.")
    for n, s in enumerate(sites, 1):
        lines.append("")
        if left_live:
            grew = s.get("growth_bytes", s["live_bytes"])
            lines.append(
                f"#{n}  {format_size(s['live_bytes'])} left live in {s['live_count']} allocation(s)"
                + (f"; the site grew by {format_size(grew)}" if grew != s["live_bytes"] else "")
            )
        else:
            lines.append(
                f"#{n}  {format_size(s.get('bytes_per_step', 0))} per step "
                f"({count_text(s.get('count_per_step', 0))} allocation(s) per step), since step "
                f"{s.get('first_step', '?')}; live now {format_size(s.get('live_bytes', 0))} "
                f"in {s.get('live_count', 0)} allocation(s)"
            )
        lines += _site_block(s)
    old = report.get("old") or []
    if old:
        lines.append("")
        lines.append(f"{len(old)} live allocation(s) older than the age limit:")
        for o in old[:20]:
            where = (
                frame_text(o["frames"][user_frame_index(o["frames"])])
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


def _site_block(s: dict[str, Any]) -> list[str]:
    lines = site_lines(s.get("frames") or [], "    ")
    sizes = s.get("example_sizes") or []
    if sizes:
        lines.append("    example sizes: " + ", ".join(format_size(x) for x in sizes[:5]))
    if s.get("tags"):
        lines.append("    tags: " + ", ".join(str(t) for t in s["tags"]))
    if "holders" in s:
        lines += _holder_lines(s, "    ")
    return lines


def render_live(report: dict[str, Any]) -> str:
    """The text of :func:`torch_arena.live_report`: what is live now, by site."""
    lines = _warning_lines(report)
    lines.append(
        f"torch-arena live memory, device {report.get('device', 0)}, step "
        f"{report.get('step', 0)}: {format_size(report.get('live_bytes', 0))} in "
        f"{report.get('live_count', 0)} allocation(s) at {len(report.get('sites', ()))} "
        f"site(s) shown"
        + (
            f" (and {report['sites_not_shown']} more site(s))"
            if report.get("sites_not_shown")
            else ""
        )
    )
    for n, s in enumerate(report.get("sites", ()), 1):
        lines.append("")
        share = s["live_bytes"] / report["live_bytes"] if report.get("live_bytes") else 0.0
        lines.append(
            f"#{n}  {format_size(s['live_bytes'])} ({share:.0%}) in {s['live_count']} allocation(s)"
        )
        lines += _site_block(s)
    return "\n".join(lines) + "\n"
