"""Frames of an allocation site as people read them: the *user frame* (the first frame outside
torch-arena, torch and the import machinery), its callers, library runs collapsed. A leaf
module: it imports nothing of the package."""

import os
import sys
from typing import Any

__all__ = ["frame_text", "site_lines", "site_location", "user_frame_index"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
MAX_CALLERS_SHOWN = 12  # caller frames printed under a site's user frame


def _torch_dir() -> str | None:
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None) if torch is not None else None
    return os.path.dirname(os.path.abspath(path)) if path else None


def _is_internal(filename: str, torch_dir: str | None) -> bool:
    """A frame of torch-arena, torch or the import machinery, not the user's code."""
    if filename.startswith("<frozen") or "importlib" in filename:
        return True
    path = os.path.abspath(filename) if filename and not filename.startswith("<") else filename
    if path.startswith(_PACKAGE_DIR + os.sep):
        return True
    if torch_dir is not None:
        return path.startswith(torch_dir + os.sep)
    return f"{os.sep}site-packages{os.sep}torch{os.sep}" in path


def user_frame_index(frames: list[dict[str, Any]]) -> int:
    """Index of the first (innermost) Python frame outside torch-arena, torch and importlib;
    else of the first Python frame; else 0."""
    torch_dir = _torch_dir()
    python = [i for i, f in enumerate(frames) if f.get("kind", "python") == "python"]
    for i in python:
        if not _is_internal(str(frames[i].get("filename", "")), torch_dir):
            return i
    return python[0] if python else 0


def _short(path: str) -> str:
    if not path or path.startswith("<"):
        return path
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def frame_text(frame: dict[str, Any]) -> str:
    if frame.get("kind") == "native":
        lib = os.path.basename(str(frame.get("filename", "")))
        return f"{frame.get('name', '?')} ({lib or '?'} {frame.get('ip', '')})".rstrip()
    where = _short(str(frame.get("filename", "?")))
    return f"{where}:{frame.get('line', 0)} in {frame.get('name', '?')}"


def site_lines(frames: list[dict[str, Any]], indent: str) -> list[str]:
    if not frames:
        return [
            f"{indent}at an unknown site (site capture was off: sites:python in TORCH_ARENA_CONF)"
        ]
    i = user_frame_index(frames)
    lines = [f"{indent}at {frame_text(frames[i])}"]
    callers = [f for f in frames[i + 1 :] if f.get("kind", "python") == "python"] or frames[i + 1 :]
    shown = 0
    run: list[str] = []  # packages of a run of library frames, collapsed into one line

    def flush() -> None:
        if run:
            names = ", ".join(dict.fromkeys(run))
            lines.append(f"{indent}    ... {len(run)} frame(s) in {names}")
            run.clear()

    for n, f in enumerate(callers):
        package = _library_package(str(f.get("filename", "")))
        if package is not None:
            run.append(package)
            continue
        flush()
        if shown == MAX_CALLERS_SHOWN:
            lines.append(f"{indent}    ... {len(callers) - n} more frame(s)")
            return lines
        lines.append(f"{indent}    called from {frame_text(f)}")
        shown += 1
    flush()
    return lines


_LIBRARY_DIRS = tuple(
    {os.path.dirname(os.__file__) + os.sep}
    | {p + os.sep for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
)


def _library_package(filename: str) -> str | None:
    """The top-level package of a frame in the standard library or site-packages (callers
    there are collapsed in the report), None for the user's code."""
    if filename.startswith("<"):
        return filename.strip("<>").split(" ")[-1] or "?"
    for prefix in _LIBRARY_DIRS:
        if filename.startswith(prefix):
            rest = filename[len(prefix) :]
            if rest.startswith(("site-packages" + os.sep, "dist-packages" + os.sep)):
                rest = rest.split(os.sep, 1)[1]
            top = rest.split(os.sep, 1)[0]
            return top[:-3] if top.endswith(".py") else top
    return None


def site_location(frames: list[dict[str, Any]]) -> tuple[str, int] | None:
    """(filename, line) of a site's user frame, None when the site has no frames."""
    if not frames:
        return None
    f = frames[user_frame_index(frames)]
    return str(f.get("filename", "")), int(f.get("line", 0))
