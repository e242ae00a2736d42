"""What the memory is: live tensors sorted into categories from PyTorch's own structures.

:func:`categorize` looks at every tensor the process holds (found through the garbage collector,
at report time, not by hooks on the hot path) and gives each storage one category, the first
that applies:

- ``parameters``: the parameters and buffers of every ``torch.nn.Module`` alive (and of its
  submodules);
- ``gradients``: their ``.grad``;
- ``optimizer_state``: the tensors in every ``torch.optim.Optimizer``'s ``state``;
- ``activations``: tensors that autograd saved for a backward still to come, in graphs built in
  the current step;
- ``held_graphs``: tensors saved by graphs built *before* the last step boundary and still
  alive: something outside the training step holds a graph's output (losses appended to a list,
  evaluation outputs computed with grad enabled), and with it everything the graph saved;
- ``other``: every other tensor.

A storage shared by several tensors (views, a parameter saved by autograd) counts once, in the
first category above that reaches it. Step boundaries are :func:`torch_arena.step` calls and,
once torch-arena is enabled, every ``optimizer.step()``; each notes autograd's sequence number
(``Node._sequence_nr()``, a counter of the thread that builds the graph), and a graph whose
newest node is older than the last boundary was built before it. Without a step boundary every
live graph counts as ``activations``.

:func:`explain` turns the categories into a report (text, or ``json=True`` for a dict) with the
remedies the evidence supports: ``set_to_none`` for gradients that hold only zeros (zeroed in
place rather than freed), ``mixed_precision`` for float32 activations (half of them, an
estimate), ``no_grad`` for held graphs built through the parameters of a
module that is in evaluation mode when the report runs (an evaluation loop run with grad enabled;
the mode at the time the graph was built is not recorded), ``detach`` for other held graphs, each
with the bytes it would free.

``by_module`` attributes parameters and gradients to the module that owns them, and, with
:func:`track_modules` on, activations and held graphs to the module whose forward built them.

Not yet: the ``checkpointing``, ``smaller_batch`` and ``fragmentation`` remedies, reports at
out-of-memory and diffs (the explain issue's other items). Across ranks: :mod:`torch_arena._ranks`.

This module imports torch when its functions are called, never at import time.
"""

import gc
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _ranks, stats
from ._sizes import format_size

CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "held_graphs",
    "other",
)

# The by_module row of graphs built outside every module's forward.
OUTSIDE_MODULES = "(outside modules)"
# Rows of explain()'s by_module (the largest).
_TOP_MODULES = 20

# Autograd's sequence number at the last step boundary (None: no boundary yet).
_boundary_seq: int | None = None
# The CUDA devices torch-arena serves (set by enable(); None: it serves none, and explain has no
# allocator figures to give).
_devices: Callable[[], list[int]] | None = None


def set_devices(devices: Callable[[], list[int]] | None) -> None:
    """The devices torch-arena serves, as ``devices()`` lists them when a report runs (enable()
    sets it); explain() adds the allocator's cached and unusable bytes for those."""
    global _devices
    _devices = devices


def _allocator_figures(device: str | None) -> dict[str, int] | None:
    """``cached_bytes`` (idle mapped and pooled pages: any request can have them) and
    ``unusable_bytes`` (reserved, yet not for any request: pages holding nothing in handles that
    also hold live data or belong to a private pool, and the free space inside pages that hold
    live data), as the out-of-memory message counts them, of the torch-arena device that
    ``device`` names (None: the first it serves), or None where torch-arena serves none."""
    if _devices is None or (device is not None and not device.startswith("cuda")):
        return None
    serving = _devices()
    if not serving:
        return None
    index = serving[0] if device in (None, "cuda") else stats._device_index(device)
    if index not in serving:
        return None
    pages = stats.pages(index)
    allocated = stats.memory_stats(index).get("allocated_bytes.all.current", 0)
    return {
        "cached_bytes": pages["idle_mapped_bytes"] + pages["pooled_bytes"],
        "unusable_bytes": pages["held_bytes"] + max(0, pages["in_use_bytes"] - allocated),
    }


def _sequence_now(torch: Any) -> int:
    """Autograd's next sequence number on this thread (``_get_sequence_nr``, 61 ns; where a torch
    lacks it, a one-element graph is built and its node's number read)."""
    get = getattr(getattr(torch._C, "_autograd", None), "_get_sequence_nr", None)
    if get is not None:
        return int(get())
    with torch.enable_grad():
        probe = torch.zeros((), requires_grad=True) * 1.0
    return int(probe.grad_fn._sequence_nr())


# ---------------------------------------------------------------------------------------------
# Modules: which module's forward built a node. Global forward hooks note, per module call, the
# autograd sequence numbers its forward took; a node belongs to the innermost call whose range
# holds its number (the thread that builds the graph numbers its nodes).

# Module calls, oldest first: (first sequence number, one past the last, module), at most
# _MODULE_CALLS_KEPT of them (the oldest dropped first).
_MODULE_CALLS_KEPT = 1 << 17
_calls: "deque[tuple[int, int, Any]]" = deque(maxlen=_MODULE_CALLS_KEPT)
_open = threading.local()
_hooks: list[Any] = []


def _pre_hook(module: Any, args: Any) -> None:
    import torch

    stack = getattr(_open, "stack", None)
    if stack is None:
        stack = _open.stack = []
    stack.append((id(module), _sequence_now(torch)))


def _post_hook(module: Any, args: Any, output: Any) -> None:
    import torch

    stack = getattr(_open, "stack", None)
    # A forward that raised left its entry: drop entries down to this module's.
    while stack:
        key, start = stack.pop()
        if key == id(module):
            _calls.append((start, _sequence_now(torch), weakref.ref(module)))
            return


def track_modules(enabled: bool = True) -> None:
    """Attribute activations to the module whose forward built them (``explain()``'s
    ``by_module``): installs (or with ``enabled=False`` removes) global forward hooks on every
    ``torch.nn.Module``. Each module call then costs two hook calls (BENCHMARKS.md, "explain()");
    the last 131,072 calls are kept."""
    import torch.nn.modules.module as module_hooks

    if enabled and not _hooks:
        _hooks.append(module_hooks.register_module_forward_pre_hook(_pre_hook))
        _hooks.append(module_hooks.register_module_forward_hook(_post_hook))
    elif not enabled:
        while _hooks:
            _hooks.pop().remove()
        _calls.clear()


def _innermost_calls(seqs: list[int]) -> dict[int, Any]:
    """For each sequence number, the module of the innermost kept call whose range holds it
    (absent: none does). Calls nest, so one sweep over both sorted lists, with a stack of the
    calls open at each number, finds them all."""
    calls = sorted(_calls, key=lambda c: (c[0], -c[1]))  # at one start, the outer call first
    found: dict[int, Any] = {}
    stack: list[tuple[int, int, Any]] = []
    i = 0
    for seq in sorted(set(seqs)):
        while i < len(calls) and calls[i][0] <= seq:
            while stack and stack[-1][1] <= calls[i][0]:
                stack.pop()
            stack.append(calls[i])
            i += 1
        while stack and stack[-1][1] <= seq:
            stack.pop()
        if stack:
            module = stack[-1][2]()
            if module is not None:
                found[seq] = module
    return found


def note_step() -> None:
    """Mark a step boundary for :func:`categorize` (called by :func:`torch_arena.step` and after
    every ``optimizer.step()`` once torch-arena is enabled). Does nothing until torch is
    imported."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "zeros"):
        return
    global _boundary_seq
    _boundary_seq = _sequence_now(torch)


@dataclass
class HeldGraph:
    """A graph built before the last step boundary, kept alive through its output ``root``."""

    description: str
    bytes: int
    eval_mode: bool


@dataclass
class Categories:
    """Bytes and storages per category (:data:`CATEGORIES`), and the held graphs found."""

    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    storages: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    held: list[HeldGraph] = field(default_factory=list)
    # Bytes of float32 storages among the activations (what autocast would halve).
    float32_activations: int = 0
    # Gradient bytes whose every element is zero (zeroed in place, not freed).
    zeroed_gradients: int = 0
    # Module path -> category -> bytes (parameters and gradients by the module that owns them;
    # activations and held graphs by the module whose forward built the node that saved them,
    # with track_modules() on).
    by_module: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


def _storage_key(t: Any) -> tuple[str, int, int] | None:
    """(device, data pointer, bytes) of a tensor's storage; None for one without storage (meta,
    sparse and other layouts without a single data pointer)."""
    try:
        s = t.untyped_storage()
        return (str(t.device), s.data_ptr(), s.nbytes())
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _saved_tensors(node: Any) -> list[Any]:
    """The tensors an autograd node saved for its backward (``_saved_*`` attributes), those
    still there (a backward that ran frees them)."""
    out = []
    for name in dir(node):
        if not name.startswith("_saved_"):
            continue
        try:
            value = getattr(node, name)
        except RuntimeError:  # freed by a backward that already ran
            continue
        values = value if isinstance(value, (tuple, list)) else (value,)
        out.extend(v for v in values if _is_tensor(v))
    return out


def _is_tensor(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.Tensor)


def _walk(root: Any, seen: set[int]) -> tuple[list[Any], int, set[int]]:
    """The nodes of the graph under ``root`` not in ``seen`` (which it extends), the newest
    sequence number among all of them, and the ids of parameters it reads (AccumulateGrad)."""
    nodes, newest, leaves = [], -1, set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        # AccumulateGrad nodes (a leaf's: they have `variable`) carry the largest sequence
        # number, so that a backward runs them first: they say nothing of when a graph was built.
        if not hasattr(node, "variable"):
            newest = max(newest, _seq(node))
        for fn, _ in getattr(node, "next_functions", ()):
            if fn is None:
                continue
            # AccumulateGrad: a leaf that wants a gradient. Graphs share these nodes, so the leaf
            # is noted even when another graph visited its node first.
            variable = getattr(fn, "variable", None)
            if variable is not None:
                leaves.add(id(variable))
            stack.append(fn)
    return nodes, newest, leaves


def categorize(
    modules: list[Any] | None = None,
    optimizers: list[Any] | None = None,
    device: str | None = None,
) -> Categories:
    """Every live tensor's storage, by category (see the module's text). ``modules`` and
    ``optimizers`` default to every ``torch.nn.Module`` and ``torch.optim.Optimizer`` alive;
    ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``) keeps only storages there (default: all)."""
    import torch

    # By type(o), not isinstance: isinstance reads __class__, which some module-level proxies
    # (torch.distributed.reduce_op) answer with a deprecation warning.
    found_modules, found_optimizers, tensors = [], [], []
    for o in gc.get_objects():
        tp = type(o)
        if issubclass(tp, torch.Tensor):
            tensors.append(o)
        elif issubclass(tp, torch.nn.Module):
            found_modules.append(o)
        elif issubclass(tp, torch.optim.Optimizer):
            found_optimizers.append(o)
    if modules is None:
        modules = found_modules
    if optimizers is None:
        optimizers = found_optimizers

    out = Categories()
    placed: dict[tuple[str, int, int], str] = {}

    def place(t: Any, category: str) -> int:
        key = _storage_key(t)
        if key is None or key in placed or key[2] == 0:
            return 0
        if device is not None and not _on_device(key[0], device):
            return 0
        placed[key] = category
        out.bytes[category] += key[2]
        out.storages[category] += 1
        if category == "activations" and t.dtype == torch.float32:
            out.float32_activations += key[2]
        return key[2]

    # Every module and its submodules once, each named by its path from a module that is no
    # other's child ("Sequential.0"), each parameter under the module that owns it.
    paths: dict[int, str] = {}
    children = {id(c) for m in modules for c in m.children()}
    for m in modules:
        if id(m) in children:
            continue
        for name, sub in m.named_modules(remove_duplicate=True):
            paths.setdefault(id(sub), f"{type(m).__name__}.{name}" if name else type(m).__name__)
    owners: dict[int, Any] = {}
    for m in modules:
        for sub in m.modules():
            owners.setdefault(id(sub), sub)

    def credit(module: Any, category: str, n: int) -> None:
        if not n:
            return
        if module is not None and id(module) in paths:
            path = paths[id(module)]
        elif module is None and _calls and category in ("activations", "held_graphs"):
            path = OUTSIDE_MODULES  # built by code between module calls (a loss, say)
        else:
            return
        row = out.by_module.setdefault(path, {})
        row[category] = row.get(category, 0) + n

    eval_params: set[int] = set()
    params = []
    for m in owners.values():
        for p in m.parameters(recurse=False):
            credit(m, "parameters", place(p, "parameters"))
            params.append((m, p))
            if not m.training:
                eval_params.add(id(p))
        for b in m.buffers(recurse=False):
            credit(m, "parameters", place(b, "parameters"))
    for m, p in params:
        if p.grad is None:
            continue
        n = place(p.grad, "gradients")
        credit(m, "gradients", n)
        if n and not p.grad.any():
            out.zeroed_gradients += n
    for opt in optimizers:
        for state in opt.state.values():
            for v in state.values() if isinstance(state, dict) else ():
                if _is_tensor(v):
                    place(v, "optimizer_state")

    # Graphs: from every live tensor that has one, newest first, so that a graph held from an
    # old step and extended in this one counts as this step's.
    roots = [t for t in tensors if t.grad_fn is not None]
    roots.sort(key=lambda t: -_seq(t.grad_fn))
    # Nodes by id: every node visited stays referenced here until the end, so that no id is
    # reused by another node's Python wrapper while it means "visited".
    seen: set[int] = set()
    visited: list[Any] = []
    node_category: dict[int, str] = {}
    # First every graph is walked (a root inside a graph already walked has no nodes of its own:
    # the `out` of `loss = f(out)` is that graph's), then the module calls of all their nodes are
    # found in one sweep, then the storages are placed, newest graph first.
    graphs = []
    for t in roots:
        nodes, newest, leaves = _walk(t.grad_fn, seen)
        visited.extend(nodes)
        if not nodes:
            graphs.append((t, node_category.get(id(t.grad_fn), "activations"), [], None))
            continue
        held = _boundary_seq is not None and newest < _boundary_seq
        category = "held_graphs" if held else "activations"
        saved_by = [(node, _saved_tensors(node)) for node in nodes]
        for node in nodes:
            node_category[id(node)] = category
        graphs.append((t, category, saved_by, bool(leaves & eval_params) if held else None))
    seqs = [_seq(t.grad_fn) for t, *_ in graphs]
    seqs += [_seq(n) for _, _, saved_by, _ in graphs for n, saved in saved_by if saved]
    by_call = _innermost_calls(seqs) if _calls else {}
    for t, category, saved_by, eval_mode in graphs:
        freed = place(t, category)
        credit(by_call.get(_seq(t.grad_fn)), category, freed)
        for node, saved in saved_by:
            n = sum(place(v, category) for v in saved)
            credit(by_call.get(_seq(node)), category, n)
            freed += n
        if eval_mode is not None:  # a held graph
            out.held.append(
                HeldGraph(
                    description=f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} "
                    f"from {type(t.grad_fn).__name__}",
                    bytes=freed,
                    eval_mode=eval_mode,
                )
            )
    for t in tensors:
        place(t, "other")
    return out


def _seq(node: Any) -> int:
    try:
        return int(node._sequence_nr())
    except (AttributeError, RuntimeError):
        return -1


def _on_device(where: str, device: str) -> bool:
    return where == device or (":" not in device and where.split(":")[0] == device)


def explain(
    json: bool = False,
    modules: list[Any] | None = None,
    optimizers: list[Any] | None = None,
    device: str | None = None,
    all_ranks: bool = False,
) -> Any:
    """Where the memory is, and what would free some: the categories of :func:`categorize` and
    the remedies their evidence supports. Text, or with ``json=True`` a dict::

        {"categories": {"parameters": N, ...}, "by_module": [{"module", "parameters", ...}],
         "cached_bytes": N, "unusable_bytes": N,
         "held_graphs": [{"root", "bytes", "eval_mode"}],
         "remedies": [{"id", "saves_bytes", "why"}], "warnings": [...]}

    ``cached_bytes`` and ``unusable_bytes`` are the allocator's, for a device torch-arena serves
    (None otherwise, and for ``device="cpu"``). ``rank`` and ``world_size`` say which process of
    a job wrote it (:func:`torch_arena._ranks.identity`).

    ``all_ranks=True`` returns instead the table of every rank's categories and their imbalance
    (:mod:`torch_arena._ranks`), gathered through ``torch.distributed``: a collective, which every
    rank must call.
    """
    c = categorize(modules, optimizers, device)
    remedies = []
    for remedy, eval_mode, why in (
        (
            "no_grad",
            True,
            "{n} output(s) computed through a module in evaluation mode with grad enabled keep "
            "their graphs ({size}) past a step: run evaluation under torch.no_grad() or "
            "torch.inference_mode()",
        ),
        (
            "detach",
            False,
            "{n} tensor(s) kept past a step hold their graphs ({size}): keep .detach() or "
            ".item() of them (a loss appended to a list keeps its whole graph)",
        ),
    ):
        graphs = [h for h in c.held if h.eval_mode == eval_mode]
        if graphs:
            saves = sum(h.bytes for h in graphs)
            why = why.format(n=len(graphs), size=format_size(saves))
            remedies.append({"id": remedy, "saves_bytes": saves, "why": why})
    if c.zeroed_gradients:
        remedies.append(
            {
                "id": "set_to_none",
                "saves_bytes": c.zeroed_gradients,
                "why": f"{format_size(c.zeroed_gradients)} of gradients hold only zeros: "
                "zero_grad(set_to_none=True) (the default since torch 2.0) frees them until "
                "the next backward",
            }
        )
    if c.float32_activations:
        saves = c.float32_activations // 2
        remedies.append(
            {
                "id": "mixed_precision",
                "saves_bytes": saves,
                "why": f"{format_size(c.float32_activations)} of activations are float32: "
                "under torch.autocast (bfloat16 or float16) most would take half "
                f"(about {format_size(saves)} saved, an estimate: some ops stay in float32, and "
                "autocast saves low-precision copies of the weights it casts)",
            }
        )
    remedies.sort(key=lambda r: -r["saves_bytes"])
    warnings = []
    if _boundary_seq is None:
        warnings.append(
            "no step boundary yet (torch_arena.step() or optimizer.step() with torch-arena "
            "enabled): every live graph counts as activations"
        )
    figures = _allocator_figures(device)
    by_module = sorted(
        ({"module": path, **row} for path, row in c.by_module.items()),
        key=lambda r: -sum(v for k, v in r.items() if k != "module"),
    )
    report = {
        "categories": dict(c.bytes),
        "by_module": by_module[:_TOP_MODULES],
        "cached_bytes": figures["cached_bytes"] if figures else None,
        "unusable_bytes": figures["unusable_bytes"] if figures else None,
        "held_graphs": [
            {"root": h.description, "bytes": h.bytes, "eval_mode": h.eval_mode} for h in c.held
        ],
        "remedies": remedies,
        "warnings": warnings,
        **_ranks.identity(),
    }
    if all_ranks:
        return _ranks.across_ranks("explain", _ranks.explain_row(report), json)
    if json:
        return report
    return _render(report)


def _render(report: dict[str, Any]) -> str:
    cats = report["categories"]
    total = sum(cats.values())
    lines = [f"torch-arena: {format_size(total)} in live tensors"]
    for name in CATEGORIES:
        share = cats[name] / total * 100 if total else 0.0
        lines.append(f"  {name:<16} {format_size(cats[name]):>12}  {share:5.1f} %")
    if report["by_module"]:
        lines.append("  largest modules:")
        for row in report["by_module"][:10]:
            parts = ", ".join(
                f"{k} {format_size(v)}" for k, v in row.items() if k != "module" and v
            )
            lines.append(f"    {row['module']}: {parts}")
    if report["cached_bytes"] is not None:
        lines.append(
            f"  allocator: {format_size(report['cached_bytes'])} cached (any request can have "
            f"it), {format_size(report['unusable_bytes'])} reserved but unusable (pages whose "
            "handles also hold live data, free space inside pages that hold live data)"
        )
    for r in report["remedies"]:
        lines.append(f"remedy {r['id']}: saves {format_size(r['saves_bytes'])}: {r['why']}")
    for w in report["warnings"]:
        lines.append(f"note: {w}")
    return "\n".join(lines)
