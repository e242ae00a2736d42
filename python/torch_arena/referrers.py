"""Who holds a leaked allocation: the Python objects that own it and the chain of references
from a root (a module global, a local variable of a running frame) down to them.

Owners are found by a walk over the objects the garbage collector tracks:

* ``torch.Tensor`` -- its storage's ``data_ptr()``, only if torch is already imported (this
  module never imports it) and the tensor is on a CUDA device;
* :class:`torch_arena.testing.DeviceBuffer`;
* any type given to :func:`register_holder_type` with a function returning its device pointers.

Then ``gc.get_referrers`` climbs from the owners, breadth first, one pass over the heap per
level, until each owner reaches a root. Everything is bounded (owners per call, objects per
level, depth) and every look at a foreign object is guarded, so an exotic object costs a missing
holder, never an exception.
"""

import gc
import os
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["find_holders", "register_holder_type"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# type -> function(obj) -> iterable of device pointers (ints).
_HOLDER_TYPES: dict[type, Callable[[Any], Iterable[int]]] = {}
# type -> the function that applies to it (looked up through the MRO once per type), or None.
_resolved: dict[type, Callable[[Any], Iterable[int]] | None] = {}

MAX_OWNERS = 64  # owners whose chain is traced, per call
MAX_FRONTIER = 256  # objects climbed from, per level
MAX_DEPTH = 8  # levels of references climbed


def register_holder_type(cls: type, pointers: Callable[[Any], Iterable[int]]) -> None:
    """Teach the leak report that objects of ``cls`` (and subclasses) own device memory:
    ``pointers(obj)`` returns the device pointers (allocation base addresses) the object owns.
    Exceptions it raises are ignored."""
    if not isinstance(cls, type) or not callable(pointers):
        raise TypeError("register_holder_type(cls, pointers): a type and a callable")
    _HOLDER_TYPES[cls] = pointers
    _resolved.clear()


def _device_buffer_pointers(obj: Any) -> Iterable[int]:
    return (obj.ptr,) if obj.ptr else ()


def _tensor_pointers(obj: Any) -> Iterable[int]:
    if not obj.is_cuda:
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


def _register_defaults() -> None:
    from .testing import DeviceBuffer

    _HOLDER_TYPES.setdefault(DeviceBuffer, _device_buffer_pointers)


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


def _describe(obj: Any) -> str:
    try:
        if isinstance(obj, (list, tuple, dict, set, frozenset)):
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
        if isinstance(parent, (list, tuple)):
            for i, item in enumerate(parent):
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
            return "{...}"
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
        # parent[id(obj)] = (parent object, accessor); a root: parent is None.
        seen: dict[int, Any] = {id(o): o for o in owners}
        parent: dict[int, tuple[Any, str]] = {}
        roots: dict[int, str] = {}  # id(obj) -> root description
        frontier = list(owners)
        self.ignore.update({id(seen), id(parent), id(roots), id(owners)})
        for _ in range(MAX_DEPTH):
            if not frontier:
                break
            self.ignore.add(id(frontier))
            ids = {id(o) for o in frontier}
            self.ignore.add(id(ids))
            next_frontier: list[Any] = []
            self.ignore.add(id(next_frontier))
            # Locals of running frames (not visible to gc.get_referrers since Python 3.11).
            for frame in self.frames:
                try:
                    local_items = list(frame.f_locals.items())
                except Exception:
                    continue
                for name, value in local_items:
                    if id(value) in ids and id(value) not in roots:
                        roots[id(value)] = f"local variable {name!r} of {_frame_where(frame)}"
            try:
                referrers = gc.get_referrers(*frontier)
            except Exception:
                referrers = []
            for ref in referrers:
                rid = id(ref)
                if rid in self.ignore or isinstance(ref, types.FrameType) and _is_ours(ref):
                    continue
                if type(ref) is tuple and len(ref) == len(frontier):
                    if all(id(x) in ids for x in ref):  # get_referrers' own argument tuple
                        continue
                if rid in self.modules:
                    for child in frontier:
                        if id(child) in roots:
                            continue
                        for key, value in list(ref.items()):
                            if value is child:
                                roots[id(child)] = f"global {key!r} of module {self.modules[rid]}"
                                break
                    continue
                if isinstance(ref, types.FrameType):
                    for name, value in list(ref.f_locals.items()):
                        if id(value) in ids and id(value) not in roots:
                            roots[id(value)] = f"local variable {name!r} of {_frame_where(ref)}"
                    continue
                if rid in seen:
                    continue
                for child in frontier:
                    if id(child) in roots:
                        continue
                    accessor = _edge(ref, child)
                    if accessor is None:
                        continue
                    parent[rid] = (child, accessor)
                    seen[rid] = ref
                    if len(next_frontier) < MAX_FRONTIER:
                        next_frontier.append(ref)
                    break
            # Climb only from objects that have no root yet.
            frontier = [o for o in next_frontier if id(o) not in roots]
        result: dict[int, dict[str, Any]] = {}
        # For each owner, find the shortest path up: invert parent links.
        children_of: dict[int, list[int]] = {}
        for pid, (child, _) in parent.items():
            children_of.setdefault(id(child), []).append(pid)
        for owner in owners:
            path = self._path_to_root(id(owner), children_of, roots, seen)
            if path is None:
                continue
            root_id, ids_up = path
            nodes = [seen[i] for i in ids_up]  # owner first, the rooted object last
            root_name = roots[root_id]
            name = root_name.split("'")[1] if "'" in root_name else "?"
            result[id(owner)] = {
                "expr": name + _accessors(list(reversed(nodes))),
                "root": root_name,
                "chain": [_describe(node) for node in nodes],
            }
        return result

    @staticmethod
    def _path_to_root(
        start: int,
        children_of: dict[int, list[int]],
        roots: dict[int, str],
        seen: dict[int, Any],
    ) -> tuple[int, list[int]] | None:
        """Breadth-first from ``start`` upwards to the nearest object with a root."""
        queue = [(start, [start])]
        visited = {start}
        while queue:
            node, path = queue.pop(0)
            if node in roots:
                return node, path
            for up in children_of.get(node, ()):
                if up not in visited:
                    visited.add(up)
                    queue.append((up, path + [up]))
        return None


def find_holders(ptrs: Iterable[int], max_owners: int = MAX_OWNERS) -> dict[int, list[dict]]:
    """For each device pointer of ``ptrs``, the Python objects that own it and where they are
    held: ``{ptr: [{"type", "expr", "root", "chain"}, ...]}``. ``expr`` reads like the code
    that reaches the owner (``losses[12]``, ``model.stash[3]``), ``root`` says where its first
    name lives (``global 'losses' of module train``, ``local variable 'cache' of step() at
    train.py:40``), ``chain`` lists the objects from the owner up. An owner reachable from no
    root within the limits gets ``expr`` None. Never raises."""
    try:
        _register_defaults()
        wanted = {int(p) for p in ptrs}
        if not wanted:
            return {}
        owners = _owners(wanted, max_owners)
        flat = [obj for objs in owners.values() for obj in objs]
        walk = _Walk()
        chains = walk.chains(flat) if flat else {}
        result: dict[int, list[dict]] = {}
        for ptr, objs in owners.items():
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
            result[ptr] = entries
        return result
    except Exception:  # never break a report for want of holders
        return {}
