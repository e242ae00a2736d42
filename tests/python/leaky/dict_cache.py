"""Leak by a growing dict cache: a memo keyed by something that never repeats."""

from torch_arena.testing import DeviceBuffer

KiB = 1 << 10
LEAK_PER_STEP = 2 * 256 * KiB  # two entries per step
HOLDER = "_CACHE"

_CACHE: dict = {}


def embed(key: str) -> DeviceBuffer:
    if key not in _CACHE:
        _CACHE[key] = DeviceBuffer(256 * KiB)  # LEAK
    return _CACHE[key]


def train(steps, step, at_end):
    for i in range(steps):
        embed(f"query-{i}")
        embed(f"doc-{i}")  # keys never repeat: the cache only grows
        workspace = DeviceBuffer(4 << 20)  # steady
        del workspace
        step()
    return at_end()
