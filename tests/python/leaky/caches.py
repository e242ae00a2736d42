"""Bounded caches: they fill up, then stay flat. None of them is a leak."""

import collections

from torch_arena.testing import DeviceBuffer

KiB = 1 << 10
ITEM = 64 * KiB
PER_STEP = 8  # lookups of new keys per step (8 micro-batches)

DEQUE: collections.deque = collections.deque()
LRU: collections.OrderedDict = collections.OrderedDict()


def deque_cache(steps, step, at_end, size):
    """A deque(maxlen=size) of recent buffers."""
    global DEQUE
    DEQUE = collections.deque(maxlen=size)
    for _ in range(steps):
        for _ in range(PER_STEP):
            DEQUE.append(DeviceBuffer(ITEM))  # cache:deque_cache
        step()
    return at_end()


def lru_cache(steps, step, at_end, size):
    """An LRU dict capped at ``size`` entries, keyed by inputs that never repeat."""
    LRU.clear()
    key = 0
    for _ in range(steps):
        for _ in range(PER_STEP):
            key += 1
            LRU[key] = DeviceBuffer(ITEM)  # cache:lru_cache
            LRU.move_to_end(key)
            if len(LRU) > size:
                LRU.popitem(last=False)
        step()
    return at_end()


def fills_then_flat(steps, step, at_end, grow_steps=10):
    """One buffer a step into a deque(maxlen=grow_steps): grows for grow_steps, then flat."""
    global DEQUE
    DEQUE = collections.deque(maxlen=grow_steps)
    for _ in range(steps):
        DEQUE.append(DeviceBuffer(ITEM))  # cache:fills_then_flat
        step()
    return at_end()


def reset():
    """Free what the module keeps between runs."""
    DEQUE.clear()
    LRU.clear()
