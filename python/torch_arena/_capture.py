"""Site capture in force, and the leak settings of the configuration.

This module owns the one piece of state about site capture the library cannot tell us: what
it was changed to at run time (``no_leaks``, the pytest marker and ``record_memory_history``
turn it on for a while). Everything that changes capture goes through :func:`set_capture`,
:func:`restore` or :func:`capture_on`; nothing else writes the state.
"""

import contextlib
from collections.abc import Iterator

from . import _native

__all__ = [
    "capture_on",
    "conf",
    "conf_int",
    "configured_sites",
    "leaks_configured",
    "restore",
    "set_capture",
    "sites",
]


def conf_int(items: dict[str, str], key: str, default: int) -> int:
    try:
        return int(items[key])
    except (KeyError, ValueError):
        return default


def conf(text: str | None = None) -> dict[str, str]:
    """key -> value of ``text`` (default: the configuration in force)."""
    return _native.conf_items(_native.installed_conf() if text is None else text)


def leaks_configured(text: str | None = None) -> bool:
    """Whether ``text`` (default: the configuration in force) has ``leaks:True``."""
    return conf(text).get("leaks", "False") == "True"


def configured_sites() -> tuple[str, int, int]:
    """(mode, every, min_bytes) of site capture as configured: the ``sites`` key, else
    ``python`` when ``leaks:True``, else ``none``."""
    items = conf()
    mode = items.get("sites", "auto")
    if mode == "auto":  # the default: python with leaks:True, else none
        mode = "python" if items.get("leaks") == "True" else "none"
    return (
        mode,
        max(1, conf_int(items, "sites_every", 1)),
        conf_int(items, "sites_min_kb", 0) << 10,
    )


# Site capture in force as changed at run time (None: as configured).
_now: tuple[str, int, int] | None = None


def sites() -> tuple[str, int, int]:
    """(mode, every, min_bytes) of site capture in force."""
    return _now if _now is not None else configured_sites()


def set_capture(mode: str, every: int = 1, min_bytes: int = 0) -> None:
    """Capture sites with these settings from now on."""
    global _now
    _native.set_sites(mode, every, min_bytes)
    _now = (mode, every, min_bytes)


def restore() -> None:
    """Back to site capture as configured."""
    global _now
    if _now is not None:
        _native.set_sites(*configured_sites())
        _now = None


@contextlib.contextmanager
def capture_on() -> Iterator[None]:
    """Capture the Python site of every allocation in the block (if it is not captured yet)."""
    global _now
    before_now = _now
    before = sites()
    if before[0] != "none" and before[1] == 1 and before[2] == 0:
        yield
        return
    mode = before[0] if before[0] != "none" else "python"
    set_capture(mode, 1, 0)
    try:
        yield
    finally:
        if _now == (mode, 1, 0):  # nobody changed it meanwhile
            _native.set_sites(*before)
            _now = before_now
