"""Leak by a growing dict cache: a memo keyed by something that never repeats."""

import itertools

from torch_arena.testing import DeviceBuffer

KiB = 1 << 10
LEAK_PER_STEP = 2 * 256 * KiB  # two entries per step
HOLDER = "_CACHE"

_CACHE: dict = {}
_IDS = itertools.count()


def embed(key: str) -> DeviceBuffer:
    if key not in _CACHE:
        _CACHE[key] = DeviceBuffer(256 * KiB)  # LEAK
    return _CACHE[key]


def train(steps, step, at_end):
    for _ in range(steps):
        i = next(_IDS)
        embed(f"query-{i}")
        embed(f"doc-{i}")  # keys never repeat: the cache only grows
        workspace = DeviceBuffer(4 << 20)  # steady
        del workspace
        step()
    return at_end()


def reset():
    """Free what the module keeps between runs."""
    _CACHE.clear()
