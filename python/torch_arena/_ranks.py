"""Reports across ranks: one row per rank, and how unevenly the ranks hold memory.

``explain(all_ranks=True)`` and ``leak_report(..., all_ranks=True)`` reduce each rank's report to
a row (:func:`explain_row`, :func:`leak_row`), gather the rows through ``torch.distributed``
(``all_gather`` on the default process group the program already has: gloo, NCCL, MPI) and
build the table (:func:`table`): per column the largest, least and mean value over the ranks,
the rank that holds the most, and the imbalance, the largest over the mean. The gather is a
collective: every rank must make the same call, or those that did wait for the others. Every rank
gets the same table. Without an initialised process group the process is the whole job (a
one-row table), unless ``WORLD_SIZE`` says there are more ranks: that is an error, since the
others could not be reached.

``torch-arena merge FILE...`` builds the same table offline from the per-rank JSON files
(``explain(json=True)`` dumped, the leak report ``TORCH_ARENA_LEAK_REPORT`` writes); it is
written in Rust (crates/cli/src/merge.rs) so that the files can be merged where neither torch
nor this package is installed. The table's rules are these, in both: the mean is rounded to
whole bytes (half up), the imbalance to hundredths (half up) from the exact sums, the rank
named for a largest or least value is the lowest that has it. tests/python/test_ranks.py holds
both to the same JSON and the same text on the files of a real two-rank run.

This module imports torch only to gather, when the program has a process group.
"""

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from . import _paths
from ._sizes import format_size

__all__ = ["across_ranks", "explain_row", "identity", "leak_row", "render", "table"]

# The columns of a leak table (an explain table's are the reports' categories, then "total"), and
# the column whose imbalance each kind of table leads with.
_LEAK_COLUMNS = ("leaked_bytes", "growing_sites")
_HEADLINE = {"explain": "total", "leaks": "leaked_bytes"}
# Columns that count things rather than bytes.
_COUNTS = frozenset({"growing_sites"})
_TITLE = {
    "explain": "bytes in live tensors per rank",
    "leaks": "leaks per rank (the live bytes of the growing allocation sites)",
}


def _distributed() -> Any:
    """``torch.distributed`` when the program imported it and its default process group is
    initialised, else None (never imports it: a program that did not cannot have a group)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # a torch without distributed, a group torn down: no group
        pass
    return None


def _world_size_env() -> int:
    try:
        n = int(os.environ.get("WORLD_SIZE", "").strip())
    except ValueError:
        return 1
    return n if n >= 1 else 1


def identity() -> dict[str, int]:
    """``{"rank", "world_size"}`` of this process: the default process group's, else RANK (or
    LOCAL_RANK) and WORLD_SIZE from the environment torchrun sets, else 0 and 1. The reports'
    JSON carries them, so that ``torch-arena merge`` can tell the files apart."""
    dist = _distributed()
    if dist is not None:
        try:
            return {"rank": int(dist.get_rank()), "world_size": int(dist.get_world_size())}
        except Exception:  # torn down meanwhile
            pass
    return {"rank": _paths.rank(), "world_size": _world_size_env()}


def explain_row(report: dict[str, Any]) -> dict[str, int]:
    """An ``explain(json=True)`` report as a row: its rank, each category's bytes, and total."""
    row = {"rank": int(report["rank"])}
    row.update((name, int(n)) for name, n in report["categories"].items())
    row["total"] = sum(int(n) for n in report["categories"].values())
    return row


def leak_row(rank: int, reports: list[dict[str, Any]]) -> dict[str, int]:
    """Leak reports (one per device, ``leak_report(format="json")``) as a row: the live bytes of
    the growing sites (what has leaked so far, as far as the verdict can tell) and how many sites
    grow, over all the devices."""
    growing = [s for r in reports for s in r.get("growing", ())]
    return {
        "rank": rank,
        "leaked_bytes": sum(int(s.get("live_bytes", 0)) for s in growing),
        "growing_sites": len(growing),
    }


def _gather(
    row: dict[str, int], storages: Callable[[], int] | None = None
) -> tuple[list[dict[str, int]], int]:
    """Every rank's row (a collective on the default group) and the world size. ``storages``:
    see :func:`across_ranks`."""
    dist = _distributed()
    if dist is None:
        world = _world_size_env()
        if world > 1:
            raise RuntimeError(
                f"all_ranks=True with WORLD_SIZE={world} but no torch.distributed process group: "
                "call torch.distributed.init_process_group() first (on every rank), or pass "
                "all_ranks=False for this rank's own report"
            )
        return [row], 1
    data = json.dumps(row).encode()
    rows = [json.loads(b) for b in _all_gather_bytes(dist, data, storages)]
    return rows, dist.get_world_size()


def _all_gather_bytes(
    dist: Any, data: bytes, storages: Callable[[], int] | None = None
) -> list[bytes]:
    """``data`` of every rank, by rank: the lengths, then the bytes padded to the longest, in
    two ``all_gather`` calls of the default group. (Not ``all_gather_object``: it needs numpy,
    which torch does not.) The tensors are on the CPU where the group has a CPU backend (gloo,
    MPI), else on the current CUDA device (NCCL: set it with ``torch.cuda.set_device`` first, as
    every NCCL collective needs)."""
    import torch

    backend = str(dist.get_backend()).lower()
    cpu = any(b in backend for b in ("gloo", "mpi", "cpu:"))
    # The gather's tensors are arena storages only on the CPU, with cpu_tensors.
    counter = storages if cpu else None
    before = counter() if counter is not None else 0
    device = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
    world = dist.get_world_size()
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    dist.all_gather(lengths, length)
    sizes = [int(n.item()) for n in lengths]
    mine = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    mine[: len(data)] = torch.tensor(list(data), dtype=torch.uint8, device=device)
    parts = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    out = [bytes(p[:n].tolist()) for p, n in zip(parts, sizes, strict=True)]
    del length, lengths, mine, parts
    if counter is not None:
        _settle(counter, before)
    return out


def _settle(storages: Callable[[], int], before: int, timeout_s: float = 0.5) -> None:
    """Wait, at most ``timeout_s``, until the CPU storages alive are no more than ``before``: a
    collective's worker thread (gloo's) may hold its tensors a moment after the call returns,
    and they must not count in the report that comes next (CI saw 272 B of them in a second
    ``explain(all_ranks=True)`` on one rank). Another thread allocating meanwhile only makes it
    wait the whole timeout."""
    deadline = time.monotonic() + timeout_s
    while storages() > before and time.monotonic() < deadline:
        time.sleep(0.001)


def across_ranks(
    kind: str, row: dict[str, int], as_json: bool, storages: Callable[[], int] | None = None
) -> Any:
    """Gather ``row`` from every rank (a collective: see the module's text) and return the table
    of ``kind`` (``"explain"`` or ``"leaks"``) as a dict, or as text. ``storages`` counts the CPU
    storages alive, where CPU tensors come from the arena (``_cpu_tensors.live``): the gather
    then waits for its own to be freed."""
    rows, world = _gather(row, storages)
    t = table(kind, rows, world)
    return t if as_json else render(t)


def _columns(kind: str, rows: list[dict[str, int]]) -> list[str]:
    if kind == "leaks":
        return list(_LEAK_COLUMNS)
    return [k for k in rows[0] if k != "rank"]


def table(kind: str, rows: list[dict[str, int]], world_size: int) -> dict[str, Any]:
    """The table of ``rows`` (one per rank, any order): ``{"kind", "world_size", "columns",
    "ranks" (the rows by rank), "missing_ranks", "stats": {column: {"max", "max_rank", "min",
    "min_rank", "mean", "imbalance"}}, "imbalance": {"column", "rank", "ratio"}}``. ``mean`` is
    whole bytes (rounded half up), ``imbalance`` the largest over the mean to hundredths (None
    where every rank has 0)."""
    rows = sorted(rows, key=lambda r: r["rank"])
    columns = _columns(kind, rows)
    n = len(rows)
    stats = {}
    for col in columns:
        values = [(r[col], r["rank"]) for r in rows]
        most = max(v for v, _ in values)
        least = min(v for v, _ in values)
        total = sum(v for v, _ in values)
        stats[col] = {
            "max": most,
            "max_rank": min(rank for v, rank in values if v == most),
            "min": least,
            "min_rank": min(rank for v, rank in values if v == least),
            "mean": (2 * total + n) // (2 * n),
            "imbalance": _hundredths(most, n, total) / 100 if total else None,
        }
    head = _HEADLINE[kind]
    seen = {r["rank"] for r in rows}
    return {
        "kind": kind,
        "world_size": world_size,
        "columns": columns,
        "ranks": [{"rank": r["rank"], **{c: r[c] for c in columns}} for r in rows],
        "missing_ranks": [r for r in range(world_size) if r not in seen],
        "stats": stats,
        "imbalance": {
            "column": head,
            "rank": stats[head]["max_rank"],
            "ratio": stats[head]["imbalance"],
        },
    }


def _hundredths(most: int, n: int, total: int) -> int:
    """``most / (total / n)`` in hundredths, rounded half up, exactly."""
    return (200 * most * n + total) // (2 * total)


def _cell(col: str, v: int) -> str:
    return str(v) if col in _COUNTS else format_size(v)


def render(t: dict[str, Any]) -> str:
    """The table as text: a row per rank, then max, min, mean and max/mean per column, and the
    headline imbalance."""
    columns, stats = t["columns"], t["stats"]
    n = len(t["ranks"])
    body = [[str(r["rank"])] + [_cell(c, r[c]) for c in columns] for r in t["ranks"]]
    for label in ("max", "min", "mean"):
        body.append([label] + [_cell(c, stats[c][label]) for c in columns])
    body.append(["max/mean"] + [_ratio(stats[c]["imbalance"]) for c in columns])
    head = ["rank"] + columns
    widths = [max(len(row[i]) for row in [head] + body) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = "  ".join(cell.rjust(w) for cell, w in zip(cells[1:], widths[1:], strict=True))
        return f"  {first}  {rest}"

    world = t["world_size"]
    lines = [f"torch-arena: {_TITLE[t['kind']]}, {n} of {world} rank(s)"]
    lines += [line(head)] + [line(row) for row in body]
    lines.append(_headline(t))
    if t["missing_ranks"]:
        missing = ", ".join(str(r) for r in t["missing_ranks"])
        lines.append(f"note: no report from rank(s) {missing}")
    return "\n".join(lines)


def _ratio(r: float | None) -> str:
    # r is hundredths over 100: two decimals give the hundredths back exactly.
    return "-" if r is None else f"{r:.2f}x"


def _headline(t: dict[str, Any]) -> str:
    col = t["imbalance"]["column"]
    s = t["stats"][col]
    if s["imbalance"] is None:
        return f"imbalance: none, every rank has {_cell(col, 0)} {col}"
    return (
        f"imbalance: rank {s['max_rank']} has the most {col}, {_cell(col, s['max'])}: "
        f"{_ratio(s['imbalance'])} the mean of {_cell(col, s['mean'])} (least: rank "
        f"{s['min_rank']}, {_cell(col, s['min'])})"
    )
