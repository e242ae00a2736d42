"""Leak by list append: every step keeps its "loss" (and what hangs off it) in a list."""

from torch_arena.testing import DeviceBuffer

MiB = 1 << 20
LEAK_PER_STEP = 1 * MiB
HOLDER = "losses"


def forward(batch: int) -> tuple[DeviceBuffer, DeviceBuffer]:
    activations = DeviceBuffer(8 * MiB)  # steady: freed when the step ends
    loss = DeviceBuffer(LEAK_PER_STEP)  # LEAK
    return activations, loss


def train(steps, step, at_end):
    losses = []
    for batch in range(steps):
        activations, loss = forward(batch)
        losses.append(loss)  # the bug: keeps every step's loss alive
        del activations
        step()
    return at_end()


def reset():
    """Free what the module keeps between runs."""
    pass
