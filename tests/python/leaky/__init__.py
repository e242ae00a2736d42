"""Planted leaks for the leak-hunting tests: small training-loop shapes written as plain Python
over ``torch_arena.testing.DeviceBuffer`` (a Python object owning device memory on the simulated
device, as a tensor owns its storage), so they run without a GPU.

Each leaky module marks its allocating statement with a ``# LEAK`` comment (the tests find its
line by reading the source) and says how many bytes per step it leaks (``LEAK_PER_STEP``).
``train(steps, step, at_end)`` runs the loop, calling ``step()`` after each iteration and
``at_end()`` before returning (while the loop's frame and its locals are alive), and returns
what ``at_end`` returned. ``reset()`` frees what a module keeps between runs.
"""
