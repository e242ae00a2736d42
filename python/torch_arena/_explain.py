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

With those hooks, ``checkpointing`` is given for a group of sibling modules of one type that
saved most of the activations. At an out-of-memory error (``explain:True``), :func:`report_at_oom`
adds ``smaller_batch`` and ``fragmentation``, which need the failed request (docs/python.md, "At
out-of-memory"). Across ranks: :mod:`torch_arena._ranks`.

This module imports torch when its functions are called, never at import time.
"""

import gc
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _cpu_tensors, _ranks, stats
from ._sizes import format_size
from .referrers import _saved_of

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


def _serving_index(device: str | None) -> int | None:
    """The torch-arena device that ``device`` names (None: the first it serves), or None where
    torch-arena serves none (or ``device`` is not a CUDA device). ``"cpu"`` names simulated
    device 0 where it serves CPU tensors (``cpu_tensors:True``)."""
    if device == "cpu" and _cpu_tensors.active():
        return 0
    if _devices is None or (device is not None and not device.startswith("cuda")):
        return None
    serving = _devices()
    if not serving:
        return None
    index = serving[0] if device in (None, "cuda") else stats._device_index(device)
    return index if index in serving else None


def _allocator_figures(index: int | None) -> dict[str, int] | None:
    """The allocator's figures for torch-arena device ``index`` (None: None): ``cached_bytes``
    (idle mapped and pooled pages: any request can have them) and ``unusable_bytes`` (reserved,
    yet not for any request: pages holding nothing in handles that also hold live data or belong
    to a private pool, and the free space inside pages that hold live data), as the
    out-of-memory message counts them; and ``reserved_bytes``, ``limit_bytes`` (what the arena
    may reserve) and ``device_free_bytes`` (what the driver says is free)."""
    if index is None:
        return None
    pages = stats.pages(index)
    allocated = stats.memory_stats(index).get("allocated_bytes.all.current", 0)
    return {
        "cached_bytes": pages["idle_mapped_bytes"] + pages["pooled_bytes"],
        "unusable_bytes": pages["held_bytes"] + max(0, pages["in_use_bytes"] - allocated),
        "reserved_bytes": pages["in_use_bytes"]
        + pages["idle_mapped_bytes"]
        + pages["held_bytes"]
        + pages["pooled_bytes"],
        "held_bytes": pages["held_bytes"],
        "allocated_bytes": allocated,
        "limit_bytes": pages["limit_bytes"],
        "device_free_bytes": pages["device_free_bytes"],
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

# Module calls, oldest first: (first sequence number, one past the last, module, bytes of the
# storages of its tensor arguments), at most _MODULE_CALLS_KEPT of them (the oldest dropped
# first). The argument bytes are what activation checkpointing would keep of the call.
_MODULE_CALLS_KEPT = 1 << 17
_calls: "deque[tuple[int, int, Any, int]]" = deque(maxlen=_MODULE_CALLS_KEPT)
_open = threading.local()
_hooks: list[Any] = []
# The batch of the last outermost module call: the first dimension of its first tensor argument
# (None: no call yet, or its first argument was not a tensor with a dimension); and its module.
_batch: int | None = None
_outer: "weakref.ref[Any] | None" = None


def _pre_hook(module: Any, args: Any) -> None:
    import torch

    global _batch, _outer
    stack = getattr(_open, "stack", None)
    if stack is None:
        stack = _open.stack = []
    inputs = 0
    first = None
    for a in args:
        if isinstance(a, torch.Tensor):
            inputs += a.untyped_storage().nbytes()
            if first is None:
                first = a
    if not stack:
        _batch = int(first.shape[0]) if first is not None and first.dim() else None
        _outer = weakref.ref(module)
    stack.append((id(module), _sequence_now(torch), inputs))


def _post_hook(module: Any, args: Any, output: Any) -> None:
    import torch

    stack = getattr(_open, "stack", None)
    # A forward that raised left its entry: drop entries down to this module's.
    while stack:
        key, start, inputs = stack.pop()
        if key == id(module):
            _calls.append((start, _sequence_now(torch), weakref.ref(module), inputs))
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
        global _batch, _outer
        while _hooks:
            _hooks.pop().remove()
        _calls.clear()
        _batch = _outer = None


def _innermost_calls(seqs: list[int]) -> dict[int, Any]:
    """For each sequence number, the module of the innermost kept call whose range holds it
    (absent: none does). Calls nest, so one sweep over both sorted lists, with a stack of the
    calls open at each number, finds them all."""
    calls = sorted(_calls, key=lambda c: (c[0], -c[1]))  # at one start, the outer call first
    found: dict[int, Any] = {}
    stack: list[tuple[int, int, Any, int]] = []
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
class Checkpoint:
    """Sibling modules of one type (the blocks of a model) whose forwards saved most of the
    activations: what ``torch.utils.checkpoint`` on each would keep and save."""

    parent: str
    kind: str
    count: int
    activations: int
    # What checkpointing keeps: the storages of the blocks' tensor arguments.
    inputs: int
    # The most one block saved: recomputed one block at a time, backward holds this again.
    largest: int

    @property
    def saves(self) -> int:
        return self.activations - self.inputs - self.largest


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
    # The repeated blocks whose checkpointing would save the most (None: no such blocks, or
    # track_modules() off).
    checkpoint: Checkpoint | None = None
    # What the step has still to allocate, as far as the structures tell: gradients of parameters
    # that want one and have none yet, the state of optimizers that have not stepped yet (by
    # their kind), and the activations of leaf modules this step's forward has not called yet
    # (each as much as the called ones of its type saved; with track_modules() on).
    gradients_to_come: int = 0
    optimizer_state_to_come: int = 0
    activations_to_come: int = 0
    # Optimizers with no state yet whose state size this module cannot tell.
    unknown_optimizers: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


def _storage_key(t: Any) -> tuple[int, int, int] | None:
    """(device index, data pointer, bytes) of a tensor's storage, the index -1 for the CPU (and
    other devices without one); None for one without storage (sparse and other layouts without a
    single data pointer). ``get_device()`` rather than ``str(t.device)``: a fifth of the cost on
    a million tensors (BENCHMARKS.md, "explain()")."""
    try:
        s = t.untyped_storage()
        return (t.get_device(), s.data_ptr(), s.nbytes())
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _saved_tensors(node: Any) -> list[Any]:
    """The tensors an autograd node saved for its backward (``_saved_*`` attributes, and a
    custom autograd.Function's ``saved_tensors``, what torch.compile's CompiledFunction saves),
    those still there (a backward that ran frees them)."""
    import torch

    return [t for _, t in _saved_of(node, torch.Tensor)]


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
    ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``) keeps only storages there (default: all).
    A garbage collection runs first: tensors that only unreachable reference cycles hold are
    freed, not reported (the figures would otherwise change with when the collector last ran)."""
    import torch

    gc.collect()

    # By type(o), not isinstance: isinstance reads __class__, which some module-level proxies
    # (torch.distributed.reduce_op) answer with a deprecation warning.
    # One issubclass per type, not per object: a million tensors share a handful of types.
    found: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    tensors, found_modules, found_optimizers = found
    kinds: dict[type, list[Any] | None] = {}
    # torch.compile leaves FakeTensors (shapes without memory) in its caches: not tensors here.
    fake = getattr(sys.modules.get("torch._subclasses.fake_tensor"), "FakeTensor", None)
    for o in gc.get_objects():
        tp = type(o)
        try:
            into = kinds[tp]
        except KeyError:
            into = kinds[tp] = (
                None
                if fake is not None and issubclass(tp, fake)
                else next(
                    (
                        lst
                        for base, lst in zip(
                            (torch.Tensor, torch.nn.Module, torch.optim.Optimizer),
                            found,
                            strict=True,
                        )
                        if issubclass(tp, base)
                    ),
                    None,
                )
            )
        if into is not None:
            into.append(o)
    if modules is None:
        modules = found_modules
    if optimizers is None:
        optimizers = found_optimizers

    out = Categories()
    placed: dict[tuple[int, int, int], str] = {}
    want = _device_filter(device)

    def place(t: Any, category: str) -> int:
        key = _storage_key(t)
        # A null data pointer: a meta tensor (no memory) or an empty storage.
        if key is None or key in placed or key[2] == 0 or key[1] == 0:
            return 0
        if want is not None and not want(key[0], t):
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
            if p.requires_grad and (want is None or want(p.get_device(), p)):
                out.gradients_to_come += p.untyped_storage().nbytes()
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
        if not opt.state:
            copies = _state_copies(opt)
            if copies is None:
                out.unknown_optimizers.append(type(opt).__name__)
            else:
                out.optimizer_state_to_come += copies * sum(
                    p.untyped_storage().nbytes()
                    for g in opt.param_groups
                    for p in g["params"]
                    if p.requires_grad and (want is None or want(p.get_device(), p))
                )

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
    step_calls = _step_calls() if _calls else {}
    subtree = _subtree_activations(out.by_module)
    out.checkpoint = _checkpoint_candidate(owners, paths, subtree, step_calls)
    out.activations_to_come = _activations_to_come(paths, out.by_module, step_calls)
    # The rest, usually most tensors: place() inlined (a million tensors, BENCHMARKS.md).
    other = 0
    for t in tensors:
        key = _storage_key(t)
        if key is None or key in placed or key[2] == 0 or key[1] == 0:
            continue
        if want is not None and not want(key[0], t):
            continue
        placed[key] = "other"
        other += key[2]
        out.storages["other"] += 1
    out.bytes["other"] += other
    return out


# Tensors of state per parameter that an optimizer of each kind makes at its first step (each
# the size of the parameter), from torch.optim's _init_group methods: exp_avg and exp_avg_sq for
# the Adam family (exp_inf for Adamax), square_avg for RMSprop (+ momentum_buffer, + grad_avg
# when centered), momentum_buffer for SGD with momentum. Adagrad makes its state at construction.
_STATE_COPIES = {"Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2}


def _state_copies(opt: Any) -> int | None:
    """Parameter-sized state tensors ``opt`` will make at its first step (None: unknown kind)."""
    kind = type(opt).__name__
    group = opt.param_groups[0] if opt.param_groups else {}
    if kind in _STATE_COPIES:
        # amsgrad keeps max_exp_avg_sq too.
        return _STATE_COPIES[kind] + (1 if group.get("amsgrad") else 0)
    if kind == "SGD":
        return 1 if group.get("momentum", 0) else 0
    if kind == "RMSprop":
        return 1 + (1 if group.get("momentum", 0) else 0) + (1 if group.get("centered") else 0)
    return None


def _step_calls() -> dict[int, int]:
    """Module id -> bytes of the tensor arguments of its latest call in this step (since the
    last step boundary; every kept call without one)."""
    since = -1 if _boundary_seq is None else _boundary_seq
    out: dict[int, int] = {}
    for start, _end, ref, inputs in _calls:
        if start >= since:
            m = ref()
            if m is not None:
                out[id(m)] = inputs
    return out


def _subtree_activations(by_module: dict[str, dict[str, int]]) -> dict[str, int]:
    """Module path -> activations saved by its forward and its submodules' (by_module credits
    each to the innermost call)."""
    out: dict[str, int] = {}
    for path, row in by_module.items():
        n = row.get("activations", 0)
        if not n:
            continue
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            out[prefix] = out.get(prefix, 0) + n
    return out


def _checkpoint_candidate(
    owners: dict[int, Any],
    paths: dict[int, str],
    subtree: dict[str, int],
    step_calls: dict[int, int],
) -> Checkpoint | None:
    """The group of sibling modules of one type (two or more) that checkpointing would save the
    most with: their activations, less what it keeps (their inputs) and what backward recomputes
    at once (the largest one's)."""
    best: Checkpoint | None = None
    for m in owners.values():
        groups: dict[type, list[Any]] = {}
        for child in m.children():
            groups.setdefault(type(child), []).append(child)
        for kind, members in groups.items():
            acts = [subtree.get(paths.get(id(c), ""), 0) for c in members]
            if len(members) < 2 or not any(acts):
                continue
            cand = Checkpoint(
                parent=paths.get(id(m), type(m).__name__),
                kind=kind.__name__,
                count=sum(1 for a in acts if a),
                activations=sum(acts),
                inputs=sum(
                    step_calls.get(id(c), 0) for c, a in zip(members, acts, strict=True) if a
                ),
                largest=max(acts),
            )
            if best is None or cand.saves > best.saves:
                best = cand
    return best


def _activations_to_come(
    paths: dict[int, str],
    by_module: dict[str, dict[str, int]],
    step_calls: dict[int, int],
) -> int:
    """Activations the leaf modules of the last outermost module called (the model whose forward
    runs) that this step has not called yet will save, each as much as the called leaves of its
    type saved on average (of all called leaves, for a type none of which ran). 0 when no leaf
    ran this step (nothing to go by) or every leaf did (the forward is done)."""
    root = _outer() if _outer is not None else None
    if root is None:
        return 0
    leaves = [m for m in root.modules() if next(m.children(), None) is None]
    called = [m for m in leaves if id(m) in step_calls]
    if not called or len(called) == len(leaves):
        return 0
    by_kind: dict[type, list[int]] = {}
    for m in called:
        by_kind.setdefault(type(m), []).append(
            by_module.get(paths.get(id(m), ""), {}).get("activations", 0)
        )
    overall = sum(sum(v) for v in by_kind.values()) / len(called)
    total = 0.0
    for m in leaves:
        if id(m) not in step_calls:
            seen = by_kind.get(type(m))
            total += sum(seen) / len(seen) if seen else overall
    return int(total)


def _seq(node: Any) -> int:
    try:
        return int(node._sequence_nr())
    except (AttributeError, RuntimeError):
        return -1


def _device_filter(device: str | None) -> Callable[[int, Any], bool] | None:
    """What keeps a storage for ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``), given its
    device index and a tensor on it; None keeps everything."""
    if device is None:
        return None
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return lambda i, t: i < 0 and t.is_cpu
    if kind == "cuda" and index:
        n = int(index)
        return lambda i, t: i == n and t.is_cuda
    if kind == "cuda":
        return lambda i, t: t.is_cuda
    return lambda i, t: t.device.type == kind and (not index or i == int(index))


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
    (None otherwise, and for ``device="cpu"`` unless torch-arena serves CPU tensors,
    ``cpu_tensors:True``). ``rank`` and ``world_size`` say which process of
    a job wrote it (:func:`torch_arena._ranks.identity`). The ``smaller_batch`` and
    ``fragmentation`` remedies need the request that failed: they come in the report written at
    out-of-memory (``explain:True``), which adds an ``"oom"`` object.

    ``all_ranks=True`` returns instead the table of every rank's categories and their imbalance
    (:mod:`torch_arena._ranks`), gathered through ``torch.distributed``: a collective, which every
    rank must call.
    """
    c = categorize(modules, optimizers, device)
    report = _report(c, _allocator_figures(_serving_index(device)), None)
    if all_ranks:
        row = _ranks.explain_row(report)
        return _ranks.across_ranks("explain", row, json, _cpu_tensors.live_counter())
    return report if json else _render(report)


def report_at_oom(device: int, size: int, tensors_on: str) -> dict[str, Any]:
    """explain()'s report at an out-of-memory error of torch-arena device ``device`` for a
    request of ``size`` bytes, over the tensors on ``tensors_on`` (``"cuda:N"``, or ``"cpu"``
    where the arena serves CPU tensors)."""
    c = categorize(None, None, tensors_on)
    return _report(c, _allocator_figures(device), (device, size))


def _report(
    c: Categories, figures: dict[str, int] | None, oom: tuple[int, int] | None
) -> dict[str, Any]:
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
    cp = c.checkpoint
    # Only where the blocks hold most of the activations: otherwise checkpointing them is not
    # what would free memory.
    if cp is not None and cp.saves > 0 and 2 * cp.activations >= c.bytes["activations"]:
        remedies.append(
            {
                "id": "checkpointing",
                "saves_bytes": cp.saves,
                "why": f"{cp.count} {cp.kind} modules under {cp.parent} saved "
                f"{format_size(cp.activations)} of the {format_size(c.bytes['activations'])} "
                "of activations: torch.utils.checkpoint around each keeps only their inputs "
                f"({format_size(cp.inputs)}) and recomputes one at a time in backward (up to "
                f"{format_size(cp.largest)} again): about {format_size(cp.saves)} saved, an "
                "estimate, for about a third more compute",
            }
        )
    warnings = []
    oom_info = None
    if oom is not None:
        oom_info, oom_remedies, oom_warnings = _at_oom(c, figures, oom)
        remedies += oom_remedies
        warnings += oom_warnings
    remedies.sort(key=lambda r: -r["saves_bytes"])
    if _boundary_seq is None:
        warnings.append(
            "no step boundary yet (torch_arena.step() or optimizer.step() with torch-arena "
            "enabled): every live graph counts as activations"
        )
    if not _hooks:
        warnings.append(
            "track_modules() is off (explain:True turns it on at enable()): activations are not "
            "attributed to modules, and the checkpointing remedy cannot be judged"
        )
    if figures is None:
        warnings.append(
            "torch-arena does not serve this device: its cached and unusable bytes are unknown, "
            "and fragmentation cannot be judged"
        )
    by_module = sorted(
        ({"module": path, **row} for path, row in c.by_module.items()),
        key=lambda r: -sum(v for k, v in r.items() if k != "module"),
    )
    report: dict[str, Any] = {
        "categories": dict(c.bytes),
        # Allocated by torch-arena but held by no tensor found: raw allocations
        # (caching_allocator_alloc), library workspaces, tensors without a Python object.
        "outside_tensors_bytes": max(0, figures["allocated_bytes"] - c.total) if figures else None,
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
    if oom_info is not None:
        report["oom"] = oom_info
    return report


def _at_oom(
    c: Categories, figures: dict[str, int] | None, oom: tuple[int, int]
) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """What an out-of-memory error adds to the report: the request and the device's figures,
    and the remedies that need them (``smaller_batch``, ``fragmentation``)."""
    device, size = oom
    info: dict[str, Any] = {"device": device, "request_bytes": size, "batch": _batch}
    remedies: list[dict[str, Any]] = []
    warnings: list[str] = []
    if figures is None:
        return info, remedies, warnings
    info.update(
        limit_bytes=figures["limit_bytes"],
        reserved_bytes=figures["reserved_bytes"],
        device_free_bytes=figures["device_free_bytes"],
    )
    limit = figures["limit_bytes"]
    # Fragmentation: the request would have fit in what is cached, unreserved and unusable
    # together, but not without the unusable part.
    headroom = max(0, min(limit - figures["reserved_bytes"], figures["device_free_bytes"]))
    usable = figures["cached_bytes"] + headroom
    unusable = figures["unusable_bytes"]
    if unusable and usable < size <= usable + unusable:
        held = figures["held_bytes"]
        remedies.append(
            {
                "id": "fragmentation",
                "saves_bytes": unusable,
                "why": f"the request of {format_size(size)} would fit if the "
                f"{format_size(unusable)} reserved but unusable could serve it: "
                f"{format_size(held)} free in pages that live neighbours pin (handle_mb:2 "
                "makes every physical handle one page, so that each free page can move) and "
                f"{format_size(unusable - held)} free inside partly used pages (only freeing "
                "or moving the tensors beside it frees that); `torch-arena fit` on the snapshot "
                "written at this error gives the smallest device each allocator and setting "
                "needs for what ran",
            }
        )
    # A smaller batch: activations (and the request that failed, and what the forward has still
    # to save) scale with the batch; parameters, gradients, optimizer state, held graphs and
    # other tensors do not.
    fixed = (
        c.bytes["parameters"]
        + c.bytes["gradients"]
        + c.gradients_to_come
        + c.bytes["optimizer_state"]
        + c.optimizer_state_to_come
        + c.bytes["held_graphs"]
        + c.bytes["other"]
    )
    scaling = c.bytes["activations"] + size + c.activations_to_come
    info.update(fixed_bytes=fixed, scaling_bytes=scaling)
    if c.unknown_optimizers:
        warnings.append(
            f"optimizer(s) {', '.join(sorted(set(c.unknown_optimizers)))} have no state yet and "
            "its size is unknown: the batch estimate leaves it out"
        )
    if fixed >= limit:
        warnings.append(
            f"parameters, gradients, optimizer state and other tensors alone take "
            f"{format_size(fixed)} of the {format_size(limit)} limit: no batch fits"
        )
    elif _batch and scaling:
        fits = _batch * (limit - fixed) // scaling
        if 1 <= fits < _batch:
            info["batch_that_fits"] = fits
            remedies.append(
                {
                    "id": "smaller_batch",
                    "saves_bytes": scaling - scaling * fits // _batch,
                    "why": f"a batch of about {fits} (now {_batch}) would fit: the step needs "
                    f"about {format_size(scaling)} that scale with the batch (activations, "
                    f"the request that failed and what the forward has still to save) beside "
                    f"{format_size(fixed)} that do not, within {format_size(limit)}; an "
                    "estimate (the peak also holds the gradients of activations during backward)",
                }
            )
    elif not _batch:
        warnings.append(
            "the batch size is unknown (track_modules() records the first argument of the "
            "outermost module call): no smaller_batch estimate"
        )
    return info, remedies, warnings


def oom_line(report: dict[str, Any], path: str | None) -> str:
    """One line for the out-of-memory message: the largest categories and the top remedy."""
    cats = sorted(report["categories"].items(), key=lambda kv: -kv[1])
    total = sum(v for _, v in cats) or 1
    parts = ", ".join(f"{k} {format_size(v)} ({v * 100 // total} %)" for k, v in cats[:3] if v)
    line = f"torch-arena explain: {parts or 'no live tensors found'}"
    outside = report.get("outside_tensors_bytes")
    if outside:
        line += f", {format_size(outside)} allocated outside tensors"
    if report["remedies"]:
        top = report["remedies"][0]
        line += f"; top remedy {top['id']}: {top['why']}"
    if path:
        line += f"; the whole report is in {path}"
    return line


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
