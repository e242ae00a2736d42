"""Who holds a leaked allocation: the Python objects that own it and the chain of references
from a root (a module global, a local variable of a running frame) down to them.

Owners are found by a walk over the objects the garbage collector tracks:

* ``torch.Tensor`` -- its storage's ``data_ptr()``, only if torch is already imported (this
  module never imports it) and the tensor is on a CUDA device (or on the CPU, when CPU tensors
  come from the arena: ``cpu_tensors:True``);
* any type given to :func:`register_holder_type` with a function returning its device pointers.

(:class:`torch_arena.testing.DeviceBuffer` registers itself that way.) An allocation no named
object owns may be what an autograd graph saved for its backward (the activations of a loss
kept in a list): the graphs under the tensors that have one are walked (``next_functions``,
bounded), and the tensor at the top of the graph that saved it is its holder, named with the
path to the saving node (``losses[3].grad_fn.next_functions[0][0]._saved_mat1``). Then
``gc.get_referrers`` climbs from the owners, breadth first, one pass over the heap per
level, until each owner reaches a root. Containers are named the way code reaches into them:
lists, tuples and deques by index, dicts (OrderedDict, defaultdict, any dict subclass) by key,
sets by membership (``{...}``), objects by attribute through ``__dict__`` or ``__slots__``,
closures by free variable. Everything is bounded (owners per call, objects per
level, depth) and every look at a foreign object is guarded, so an exotic object costs a missing
holder, never an exception.
"""

import collections
import gc
import os
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["count_cpu_tensors", "find_holders", "register_holder_type"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# type -> function(obj) -> iterable of device pointers (ints).
_HOLDER_TYPES: dict[type, Callable[[Any], Iterable[int]]] = {}
# type -> the function that applies to it (looked up through the MRO once per type), or None.
_resolved: dict[type, Callable[[Any], Iterable[int]] | None] = {}

# Whether CPU tensors own arena memory too (cpu_tensors:True; set by enable()).
_cpu_tensors = False

MAX_OWNERS = 64  # owners whose chain is traced, per call
MAX_FRONTIER = 256  # objects climbed from, per level
MAX_DEPTH = 8  # levels of references climbed
MAX_GRAPH_NODES = 20_000  # autograd nodes looked into, per call
GRAPH_PATH_SHOWN = 3  # next_functions hops spelled out in a holder's expr


def register_holder_type(cls: type, pointers: Callable[[Any], Iterable[int]]) -> None:
    """Teach the leak report that objects of ``cls`` (and subclasses) own device memory:
    ``pointers(obj)`` returns the device pointers (allocation base addresses) the object owns.
    Exceptions it raises are ignored."""
    if not isinstance(cls, type) or not callable(pointers):
        raise TypeError("register_holder_type(cls, pointers): a type and a callable")
    _HOLDER_TYPES[cls] = pointers
    _resolved.clear()


def count_cpu_tensors() -> None:
    """From now on CPU tensors own arena memory too (``cpu_tensors:True``: enable() calls this
    once their storages come from the arena)."""
    global _cpu_tensors
    _cpu_tensors = True


def _tensor_pointers(obj: Any) -> Iterable[int]:
    if not (obj.is_cuda or (_cpu_tensors and obj.is_cpu)):
        return ()
    return (int(obj.untyped_storage().data_ptr()),)


def _pointer_function(tp: type) -> Callable[[Any], Iterable[int]] | None:
    try:
        return _resolved[tp]
    except KeyError:
        pass
    fn = None
    torch = sys.modules.get("torch")
    tensor = getattr(torch, "Tensor", None) if torch is not None else None
    try:
        for base in tp.__mro__:
            if base in _HOLDER_TYPES:
                fn = _HOLDER_TYPES[base]
                break
            if tensor is not None and base is tensor:
                fn = _tensor_pointers
                break
    except Exception:
        fn = None
    _resolved[tp] = fn
    return fn


def _owners(ptrs: set[int], limit: int) -> dict[int, list[Any]]:
    """ptr -> the objects owning it (at most ``limit`` objects in all)."""
    found: dict[int, list[Any]] = {}
    count = 0
    for obj in gc.get_objects():
        fn = _pointer_function(type(obj))
        if fn is None:
            continue
        try:
            owned = [int(p) for p in fn(obj)]
        except Exception:
            continue
        for p in owned:
            if p in ptrs:
                found.setdefault(p, []).append(obj)
                count += 1
        if count >= limit:
            break
    return found


def _saved_by_graphs(ptrs: set[int]) -> dict[int, list[tuple[Any, str, str]]]:
    """ptr -> [(tensor, path, node type)] for allocations an autograd graph keeps: a tensor
    some node saved for its backward (``_saved_*``, ``saved_tensors``) in the graph under a
    tensor Python holds (its ``grad_fn``). ``path`` leads from that tensor to the saved one
    (``.grad_fn.next_functions[0][0]._saved_result``). The holder is the graph's top: a tensor
    whose node no other tensor's graph reaches (an intermediate tensor's Python object can
    outlive its name, kept alive by the graph). Graphs are walked breadth first, at most
    MAX_GRAPH_NODES nodes in each of the two walks."""
    torch = sys.modules.get("torch")
    tensor_type = getattr(torch, "Tensor", None) if torch is not None else None
    if tensor_type is None or not ptrs:
        return {}
    # Tensors with a graph, by their node. Node objects are kept alive for the whole walk:
    # their Python wrappers may be made afresh on each access, and ids of freed ones reused.
    tops: dict[int, tuple[Any, Any]] = {}
    for obj in gc.get_objects():
        try:
            if tensor_type in type(obj).__mro__ and obj.grad_fn is not None:
                node = obj.grad_fn
                tops.setdefault(id(node), (node, obj))
        except Exception:
            continue
    # A tensor whose node another graph reaches is inside that graph: not a top.
    seen: dict[int, Any] = {}
    budget = MAX_GRAPH_NODES
    for node_id, (root, _) in list(tops.items()):
        queue = collections.deque([root])
        while queue and budget > 0:
            node = queue.popleft()
            for child in _next_nodes(node):
                if child is None:
                    continue
                if id(child) in tops and id(child) != node_id:
                    tops.pop(id(child), None)
                if id(child) not in seen:
                    seen[id(child)] = child
                    budget -= 1
                    queue.append(child)
    found: dict[int, list[tuple[Any, str, str]]] = {}
    seen = {}
    budget = MAX_GRAPH_NODES
    for root, t in tops.values():
        queue = collections.deque([(root, ".grad_fn", 0)])
        while queue and budget > 0:
            node, path, depth = queue.popleft()
            if id(node) in seen:
                continue
            seen[id(node)] = node
            budget -= 1
            for name, saved in _saved_of(node, tensor_type):
                try:
                    owned = [int(p) for p in _tensor_pointers(saved)]
                except Exception:
                    continue
                for p in owned:
                    if p in ptrs and not any(h[0] is t for h in found.get(p, ())):
                        where = _graph_path(path, depth, node, name)
                        found.setdefault(p, []).append((t, where, type(node).__name__))
            for i, child in enumerate(_next_nodes(node)):
                if child is not None and id(child) not in seen:
                    queue.append((child, f"{path}.next_functions[{i}][0]", depth + 1))
    return found


def _next_nodes(node: Any) -> list[Any]:
    """The nodes ``node`` passes gradients to (None where an input needs none)."""
    try:
        return [child for child, _ in node.next_functions]
    except Exception:
        return []


def _saved_of(node: Any, tensor_type: type) -> list[tuple[str, Any]]:
    """(name, tensor) for what ``node`` saved for its backward and still holds."""
    out = []
    try:
        names = dir(node)
    except Exception:
        return out
    for name in names:
        # `_saved_*` on built-in nodes; `saved_tensors` on a custom autograd.Function's.
        if not name.startswith("_saved_") and name != "saved_tensors":
            continue
        try:
            value = getattr(node, name)
        except Exception:  # freed by a backward that already ran
            continue
        if isinstance(value, (tuple, list)):
            items = enumerate(value)
            out.extend((f"{name}[{i}]", v) for i, v in items if isinstance(v, tensor_type))
        elif isinstance(value, tensor_type):
            out.append((name, value))
    return out


def _graph_path(path: str, depth: int, node: Any, name: str) -> str:
    """The accessor from a tensor to what its graph saved: spelled out for a node a few hops
    down, else shortened to the node's type and depth."""
    if depth <= GRAPH_PATH_SHOWN:
        return f"{path}.{name}"
    return f".grad_fn<{depth} hops down: {type(node).__name__}>.{name}"


def _short(path: str) -> str:
    """A file name relative to the working directory when under it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _is_ours(frame: types.FrameType) -> bool:
    return os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR


def _frame_where(frame: types.FrameType) -> str:
    code = frame.f_code
    return f"{code.co_name}() at {_short(code.co_filename)}:{frame.f_lineno}"


_SEQUENCES = (list, tuple, collections.deque)
_CONTAINERS = (list, tuple, collections.deque, dict, set, frozenset)


def _describe(obj: Any) -> str:
    try:
        if isinstance(obj, _CONTAINERS):
            return f"{type(obj).__name__} of {len(obj)}"
        if isinstance(obj, types.FunctionType):
            return f"function {obj.__qualname__}"
        return f"{type(obj).__module__}.{type(obj).__qualname__} object"
    except Exception:
        return "object"


def _edge(parent: Any, child: Any) -> str | None:
    """How ``parent`` refers to ``child``, as an accessor (``[3]``, ``['k']``, ``.attr``), or
    None when it cannot be named."""
    try:
        if isinstance(parent, _SEQUENCES):
            for i, item in enumerate(list(parent)):
                if item is child:
                    return f"[{i}]"
            return None
        if isinstance(parent, dict):
            for key, value in parent.items():
                if value is child:
                    return f"[{key!r}]" if not isinstance(key, str) else f"[{key!r}]"
                if key is child:
                    return f"(key {key!r})"
            return None
        if isinstance(parent, (set, frozenset)):
            return "{...}" if any(item is child for item in list(parent)) else None
        if isinstance(parent, types.CellType):
            return "" if parent.cell_contents is child else None
        if isinstance(parent, types.FunctionType):
            closure = parent.__closure__ or ()
            if child is closure:
                return ""
            for name, cell in zip(parent.__code__.co_freevars, closure, strict=False):
                if cell is child:
                    return f".<closure {name}>"
            return None
        d = getattr(parent, "__dict__", None)
        if isinstance(d, dict):
            if d is child:
                return ""
            for key, value in d.items():
                if value is child:
                    return f".{key}"
        for klass in type(parent).__mro__:
            for name in getattr(klass, "__slots__", ()):
                if isinstance(name, str) and getattr(parent, name, None) is child:
                    return f".{name}"
    except Exception:
        return None
    return None


def _accessors(nodes: list[Any]) -> str:
    """The accessor text from ``nodes[0]`` (a rooted object) down to ``nodes[-1]`` (the owner):
    ``[3]``, ``['key']``, ``.attr``, ``.<closure name>``."""
    out = []
    i = 0
    while i < len(nodes) - 1:
        upper, lower = nodes[i], nodes[i + 1]
        try:
            # function -> __closure__ tuple -> cell -> value: the free variable's name.
            if isinstance(upper, types.FunctionType) and lower is upper.__closure__:
                if i + 2 < len(nodes) and isinstance(nodes[i + 2], types.CellType):
                    index = next(k for k, c in enumerate(lower) if c is nodes[i + 2])
                    out.append(f".<closure {upper.__code__.co_freevars[index]}>")
                    i += 3
                    continue
            # object -> its __dict__ -> value: an attribute.
            if isinstance(lower, dict) and getattr(upper, "__dict__", None) is lower:
                if i + 2 < len(nodes):
                    key = next(k for k, v in lower.items() if v is nodes[i + 2])
                    out.append(f".{key}")
                    i += 2
                    continue
        except Exception:
            pass
        accessor = _edge(upper, lower)
        out.append(accessor if accessor is not None else "...")
        i += 1
    return "".join(out)


class _Walk:
    """One breadth-first climb from the owners towards roots."""

    def __init__(self) -> None:
        self.modules: dict[int, str] = {}
        for name, module in list(sys.modules.items()):
            d = getattr(module, "__dict__", None)
            if isinstance(d, dict):
                self.modules.setdefault(id(d), name)
        self.frames = self._running_frames()
        # Objects this walk itself created: never reported as holders.
        self.ignore: set[int] = {id(self.modules), id(self.frames), id(self.__dict__)}

    def _running_frames(self) -> list[types.FrameType]:
        frames = []
        try:
            current = sys._current_frames()
        except Exception:
            current = {}
        for top in current.values():
            frame = top
            while frame is not None:
                if not _is_ours(frame):
                    frames.append(frame)
                frame = frame.f_back
        return frames

    def chains(self, owners: list[Any]) -> dict[int, dict[str, Any]]:
        """id(owner) -> {"expr", "root", "chain"} for the owners a root was found for."""
        seen: dict[int, Any] = {id(o): o for o in owners}  # keeps every object visited alive
        up: dict[int, list[Any]] = {}  # id(obj) -> the objects found referring to it
        roots: dict[int, str] = {}  # id(obj) -> where its name lives
        frontier = list(owners)
        self.ignore.update({id(seen), id(up), id(roots), id(owners)})
        for _ in range(MAX_DEPTH):
            if not frontier:
                break
            ids = {id(o) for o in frontier}
            self.ignore.update({id(frontier), id(ids)})
            self._frame_roots(ids, roots)
            pending = {i for i in ids if i not in roots}
            if not pending:
                break
            # Passed as one tuple (CPython hands it to the call as is), so the argument tuple
            # is known by identity: a user's tuple of exactly the pending objects is not it.
            args = tuple(o for o in frontier if id(o) in pending)
            self.ignore.add(id(args))
            try:
                referrers = gc.get_referrers(*args)
            except Exception:
                referrers = []
            next_frontier: list[Any] = []
            self.ignore.add(id(next_frontier))
            for ref in referrers:
                rid = id(ref)
                if rid in self.ignore or (isinstance(ref, types.FrameType) and _is_ours(ref)):
                    continue
                if rid in self.modules:
                    self._module_roots(ref, self.modules[rid], pending, roots)
                    continue
                if isinstance(ref, types.FrameType):
                    self._frame_locals_roots(ref, pending, roots)
                    continue
                linked = False
                for cid in _children(ref, pending, seen):
                    up.setdefault(cid, []).append(ref)
                    linked = True
                if linked and rid not in seen:
                    seen[rid] = ref
                    if len(next_frontier) < MAX_FRONTIER:
                        next_frontier.append(ref)
            frontier = next_frontier
        result: dict[int, dict[str, Any]] = {}
        for owner in owners:
            nodes = _path_to_root(owner, up, roots)
            if nodes is None:
                continue
            root_name = roots[id(nodes[-1])]
            name = root_name.split("'")[1] if "'" in root_name else "?"
            result[id(owner)] = {
                "expr": name + _accessors(list(reversed(nodes))),
                "root": root_name,
                "chain": [_describe(node) for node in nodes],
            }
        return result

    def _frame_roots(self, ids: set[int], roots: dict[int, str]) -> None:
        """Locals of running frames (not visible to gc.get_referrers since Python 3.11)."""
        for frame in self.frames:
            self._frame_locals_roots(frame, ids, roots)

    @staticmethod
    def _frame_locals_roots(frame: types.FrameType, ids: set[int], roots: dict[int, str]) -> None:
        try:
            local_items = list(frame.f_locals.items())
        except Exception:
            return
        for name, value in local_items:
            if id(value) in ids and id(value) not in roots:
                roots[id(value)] = f"local variable {name!r} of {_frame_where(frame)}"

    @staticmethod
    def _module_roots(d: dict, module: str, ids: set[int], roots: dict[int, str]) -> None:
        try:
            items = list(d.items())
        except Exception:
            return
        for key, value in items:
            if id(value) in ids and id(value) not in roots:
                roots[id(value)] = f"global {key!r} of module {module}"


def _path_to_root(owner: Any, up: dict[int, list[Any]], roots: dict[int, str]) -> list | None:
    """The shortest chain [owner, ..., rooted object] along the referrer links, or None."""
    queue = [[owner]]
    visited = {id(owner)}
    while queue:
        path = queue.pop(0)
        if id(path[-1]) in roots:
            return path
        for parent in up.get(id(path[-1]), ()):
            if id(parent) not in visited:
                visited.add(id(parent))
                queue.append(path + [parent])
    return None


def _children(parent: Any, ids: set[int], seen: dict[int, Any]) -> list[int]:
    """The ids of ``ids`` (objects in ``seen``) that ``parent`` refers to by a nameable edge."""
    try:
        if isinstance(parent, (*_SEQUENCES, set, frozenset)):
            return [id(x) for x in list(parent) if id(x) in ids]
        if isinstance(parent, dict):
            return [id(v) for v in list(parent.values()) if id(v) in ids]
    except Exception:
        return []
    return [i for i in ids if _edge(parent, seen[i]) is not None]


def find_holders(ptrs: Iterable[int], max_owners: int = MAX_OWNERS) -> dict[int, list[dict]]:
    """For each device pointer of ``ptrs``, the Python objects that own it and where they are
    held: ``{ptr: [{"type", "expr", "root", "chain"}, ...]}``. ``expr`` reads like the code
    that reaches the owner (``losses[12]``, ``model.stash[3]``), ``root`` says where its first
    name lives (``global 'losses' of module train``, ``local variable 'cache' of step() at
    train.py:40``), ``chain`` lists the objects from the owner up. An owner reachable from no
    root within the limits gets ``expr`` None. Never raises."""
    try:
        wanted = {int(p) for p in ptrs}
        if not wanted:
            return {}
        owners = _owners(wanted, max_owners)
        # Saved for a backward by a graph some tensor still holds: that tensor is the holder
        # (an allocation's own tensor object may outlive every name for it, kept by the graph).
        by_graph = _saved_by_graphs(wanted)
        graph_roots = {id(h[0]): h[0] for holders in by_graph.values() for h in holders}
        flat = [obj for objs in owners.values() for obj in objs]
        flat += [t for t in graph_roots.values() if all(t is not o for o in flat)]
        walk = _Walk()
        # This function's own containers refer to the owners too: never holders.
        walk.ignore.update(id(objs) for objs in owners.values())
        walk.ignore.update({id(owners), id(flat), id(by_graph), id(graph_roots)})
        walk.ignore.update(id(holders) for holders in by_graph.values())
        walk.ignore.update(id(pair) for holders in by_graph.values() for pair in holders)
        chains = walk.chains(flat) if flat else {}
        result: dict[int, list[dict]] = {}
        for ptr in wanted:
            entries = _owner_entries(owners.get(ptr, []), chains)
            named = any(e["expr"] is not None for e in entries)
            graph = _graph_entries(by_graph.get(ptr, []), chains)
            if not named and graph:
                entries = graph + entries
            if entries:
                result[ptr] = entries
        return result
    except Exception:  # never break a report for want of holders
        return {}


def _owner_entries(objs: list[Any], chains: dict[int, dict[str, Any]]) -> list[dict]:
    entries = []
    for obj in objs:
        info = chains.get(id(obj), {})
        entries.append(
            {
                "type": f"{type(obj).__module__}.{type(obj).__qualname__}",
                "expr": info.get("expr"),
                "root": info.get("root"),
                "chain": info.get("chain", [_describe(obj)]),
            }
        )
    return entries


def _graph_entries(holders: list[tuple[Any, str, str]], chains: dict[int, dict[str, Any]]) -> list:
    """The holders whose graph's top tensor a root names (an unnamed top says nothing more than
    the allocation's own unnamed tensor)."""
    entries = []
    for t, path, node in holders:
        info = chains.get(id(t), {})
        expr = info.get("expr")
        if expr is None:
            continue
        entries.append(
            {
                "type": "autograd graph",
                "expr": expr + path,
                "root": info.get("root"),
                "chain": [f"saved for backward by {node}"] + info.get("chain", [_describe(t)]),
            }
        )
    return entries
