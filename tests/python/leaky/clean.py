"""Clean loops: large but steady memory. Nothing here may be reported."""

from torch_arena.testing import DeviceBuffer

MiB = 1 << 20

WEIGHTS: list = []  # "parameters": allocated once, before the loop, and kept


def train(steps, step, at_end):
    """A training loop: big weights, per-step activations, a loss kept only until the next
    step, and a bounded cache filled during the first steps."""
    if not WEIGHTS:
        WEIGHTS.extend(DeviceBuffer(32 * MiB) for _ in range(4))
    last_loss = None
    cache: dict = {}
    for i in range(steps):
        activations = [DeviceBuffer(6 * MiB) for _ in range(3)]
        last_loss = DeviceBuffer(1 * MiB)  # replaced each step: one alive at a time
        key = i % 2  # bounded cache: two entries, refreshed
        cache[key] = DeviceBuffer(2 * MiB)
        del activations
        step()
    del last_loss
    return at_end()


def sawtooth(steps, step, at_end):
    """Memory that rises for a few steps then is released (a buffer flushed every 3 steps)."""
    buffer = []
    for i in range(steps):
        buffer.append(DeviceBuffer(1 * MiB))
        if i % 3 == 2:
            buffer.clear()
        step()
    return at_end()


def reset():
    """Free what the module keeps between runs."""
    WEIGHTS.clear()
