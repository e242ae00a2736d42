"""File names for what torch-arena writes, one per process under torchrun.

Every rank of a torchrun job inherits TORCH_ARENA and TORCH_ARENA_CONF, so a path the user gives
may hold placeholders that make it unique per process: ``{rank}`` (the global rank: RANK, else
LOCAL_RANK, else 0) and ``{pid}``. Names the package picks itself carry the rank.
"""

import os
import stat
from collections.abc import Callable
from typing import IO, Any

__all__ = ["default_name", "expand", "rank", "write_whole"]

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


def write_whole(path: str, fill: Callable[[IO[Any]], None], binary: bool = False) -> None:
    """Write ``path`` whole or not at all: ``fill`` writes into a temporary file beside it, which
    is flushed, synced and renamed over ``path``; if anything fails (an exception in ``fill``, a
    full disk) the temporary file is removed and what was at ``path`` is left as it was. A path
    that is not a regular file (``/dev/stdout``, a FIFO) is written in place. The rename keeps
    the old file's permissions; a symlink is followed, so the file it names is replaced."""
    target = os.path.realpath(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    mode = "wb" if binary else "w"
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(target, mode) as f:
            fill(f)
        return
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name[:200]}.tmp-{os.getpid()}")
    try:
        with open(tmp, mode) as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, target)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
