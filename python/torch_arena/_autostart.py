"""Switch torch-arena on from the environment: ``TORCH_ARENA=1 python train.py``.

The ``torch-arena-autostart.pth`` file that the package installs into site-packages imports this
module at interpreter start, only when ``TORCH_ARENA`` is set to something other than ``""`` and
``"0"``. Then:

* if torch is already imported, :func:`torch_arena.enable` runs at once;
* otherwise an import hook (a ``sys.meta_path`` finder) waits for the program's own
  ``import torch`` (``import torch.cuda``, ``from torch import nn`` ... import ``torch`` first)
  and runs :func:`torch_arena.enable` right after torch's ``__init__`` has run, before the
  program gets the module back, so before any CUDA call. The hook then removes itself.

So a process that never imports torch never imports it (nor pays its ~2 s import time up
front), and one that does gets torch-arena installed before CUDA starts. Under torchrun every
rank inherits ``TORCH_ARENA`` and ``TORCH_ARENA_CONF`` and switches itself on the same way.

A bad ``TORCH_ARENA_CONF`` stops the program: the program's ``import torch`` raises the
ValueError (naming the key), before torch is loaded, and one line on stderr says what to fix.
Any other failure to switch on is raised from ``import torch`` the same way.
"""

import logging
import os
import sys
from typing import Any

_log = logging.getLogger("torch_arena")


def active() -> bool:
    """Whether ``TORCH_ARENA`` asks for torch-arena (set, and neither ``""`` nor ``"0"``)."""
    return os.environ.get("TORCH_ARENA", "0") not in ("", "0")


_reported: set[str] = set()


def _report(exc: BaseException) -> None:
    """One line on stderr saying why TORCH_ARENA could not take effect (once per reason)."""
    what = " ".join(str(exc).split()) or type(exc).__name__
    if what in _reported:
        return
    _reported.add(what)
    print(
        f"torch-arena: TORCH_ARENA is set but torch-arena cannot start: {what} "
        "(fix it, or unset TORCH_ARENA to run without torch-arena)",
        file=sys.stderr,
        flush=True,
    )


def _check_conf() -> None:
    """Validate TORCH_ARENA_CONF without importing torch; ValueError naming the key."""
    from . import _native

    _native.check_config(os.environ.get("TORCH_ARENA_CONF", ""))


def _enable() -> None:
    from ._torch import enable

    enable()


def _start() -> None:
    """Validate the configuration, then enable(); report and re-raise any failure."""
    try:
        _check_conf()
        _enable()
    except Exception as exc:
        _report(exc)
        raise


# The finder and the loader follow importlib's protocols (find_spec; create_module and
# exec_module) without subclassing importlib.abc, whose import costs ~10 ms at every interpreter
# start under TORCH_ARENA=1.


class _EnableAfterTorch:
    """Wraps torch's own loader: runs it, then switches torch-arena on."""

    def __init__(self, loader: Any, hook: "TorchImportHook") -> None:
        self.loader = loader
        self.hook = hook

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # Give torch its own loader back before it runs (importlib.resources, inspect and
        # friends look at __loader__ / __spec__.loader).
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.hook.remove()
        _start()

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not yet set (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


class TorchImportHook:
    """A ``sys.meta_path`` finder that sees the first ``import torch`` and wraps torch's loader
    so that :func:`torch_arena.enable` runs as soon as torch's ``__init__`` has run.

    Every spec it returns carries the wrapper, until torch has been executed once: a caller that
    only looks (``importlib.util.find_spec("torch")``, as availability checks do) and never
    loads must not use the hook up.
    """

    def __init__(self) -> None:
        self._done = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch" or self._done:
            return None
        # Fail before torch is even loaded: import torch raises, torch stays unimported.
        try:
            _check_conf()
        except Exception as exc:
            _report(exc)
            raise
        spec = self._real_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # torch is missing (ModuleNotFoundError follows) or exotic: leave it
        spec.loader = _EnableAfterTorch(spec.loader, self)
        return spec

    def _real_spec(self, fullname: str, path: Any, target: Any) -> Any:
        """The spec the rest of sys.meta_path would give, as the import system would find it."""
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def remove(self) -> None:
        """Take this finder out of sys.meta_path (after torch's import, when no import system
        loop is iterating over it)."""
        self._done = True
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def installed(self) -> bool:
        """Whether this finder is still waiting in sys.meta_path."""
        return self in sys.meta_path


_hook: TorchImportHook | None = None


def install() -> None:
    """Switch torch-arena on now if torch is imported, else when it is (see the module doc)."""
    global _hook
    if "torch" in sys.modules:
        _start()
        return
    if _hook is not None and _hook.installed():
        return
    _hook = TorchImportHook()
    sys.meta_path.insert(0, _hook)
    _log.debug("torch-arena: waiting for `import torch` to install the allocator")


if active():
    install()
