"""Leak by a closure: a hook-like function stashes every activation in a list it closes over."""

from torch_arena.testing import DeviceBuffer

MiB = 1 << 20
LEAK_PER_STEP = 2 * MiB
HOLDER = "stashed"


def make_hook():
    stashed = []

    def hook(size):
        stashed.append(DeviceBuffer(size))  # LEAK

    return hook


HOOK = make_hook()


def train(steps, step, at_end):
    for _ in range(steps):
        HOOK(LEAK_PER_STEP)
        grads = DeviceBuffer(3 * MiB)  # steady
        del grads
        step()
    return at_end()


def reset():
    """Free what the module keeps between runs."""
    global HOOK
    HOOK = make_hook()
