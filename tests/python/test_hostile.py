"""Hostile and careless requests from Python, on the simulated device (the hostile-input issue's
repros that are written in Python). The Rust suite (tests/hostile_sizes.rs) pins the arena's
side; these pin what a Python caller sees."""

import itertools

import pytest
import torch_arena
from torch_arena import _native

MIB = 1 << 20


def test_a_size_near_two_to_the_64_is_out_of_memory_and_never_shares_an_address():
    # Item 1: rounding 2**64 - 1 up to 512 bytes wrapped to 0, a 0-byte block was handed out at
    # the start of the free hole, and the next allocation got the same address.
    a, b, c = (torch_arena.caching_allocator_alloc(4 * MIB) for _ in range(3))
    torch_arena.caching_allocator_delete(b)
    live = [a, c]
    try:
        for size in (2**64 - 1, 2**64 - 511, 2**64 - 512, 2**63):
            with pytest.raises(_native.OutOfMemoryError, match="^CUDA out of memory"):
                torch_arena.caching_allocator_alloc(size)
        live += [torch_arena.caching_allocator_alloc(4 * MIB) for _ in range(2)]
        spans = sorted((p, p + 4 * MIB) for p in live)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, "two live allocations overlap"
    finally:
        for p in live:
            torch_arena.caching_allocator_delete(p)


def test_a_request_beyond_the_device_holds_nothing():
    # Item 5: a request that cannot fit created every page of the device before failing and
    # kept them reserved until empty_cache().
    torch_arena.empty_cache()
    before = torch_arena.memory_reserved()
    with pytest.raises(_native.OutOfMemoryError, match="Tried to allocate"):
        torch_arena.caching_allocator_alloc(5 << 30)  # the tests' device has 4 GiB
    assert torch_arena.memory_reserved() == before
