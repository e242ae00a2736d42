"""File names for what torch-arena writes, one per process under torchrun.

Every rank of a torchrun job inherits TORCH_ARENA and TORCH_ARENA_CONF, so a path the user gives
may hold placeholders that make it unique per process: ``{rank}`` (the global rank: RANK, else
LOCAL_RANK, else 0) and ``{pid}``. Names the package picks itself carry the rank.
"""

import os

__all__ = ["default_name", "expand", "rank"]

_RANK_VARIABLES = ("RANK", "LOCAL_RANK")


def rank() -> int:
    """The process's rank: RANK, else LOCAL_RANK, else 0 (a variable that is unset, empty or not
    a whole number is skipped)."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        try:
            return int(value)
        except ValueError:
            continue
    return 0


def expand(pattern: str) -> str:
    """``pattern`` with ``{rank}`` and ``{pid}`` replaced; other braces are left alone.

    >>> os.environ["RANK"] = "3"; expand("leaks-{rank}-{pid}.txt")  # doctest: +SKIP
    'leaks-3-12345.txt'
    """
    return pattern.replace("{rank}", str(rank())).replace("{pid}", str(os.getpid()))


def default_name(stem: str, ext: str) -> str:
    """The default file name for ``stem``: ``f"{stem}-rank{rank}.{ext}"``."""
    return f"{stem}-rank{rank()}.{ext.lstrip('.')}"
