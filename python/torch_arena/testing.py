"""Helpers for testing code that uses torch-arena without a GPU or torch.

:class:`DeviceBuffer` is a small Python object that owns one allocation of the allocator (on the
simulated device, ``TORCH_ARENA_CONF=device:sim``, or a real one) and frees it when it dies, the
way a tensor owns its storage. The leak tools find it as a holder exactly as they find tensors,
so leak-hunting code and tests can be exercised on a CPU-only machine.
"""

from typing import Any

from . import _native
from .referrers import register_holder_type
from .stats import _device_index

__all__ = ["DeviceBuffer"]


class DeviceBuffer:
    """``size`` bytes on ``device`` (None: the current device), freed when the object is
    collected (or by :meth:`free`). ``ptr`` is the device pointer (0 for size 0)."""

    __slots__ = ("ptr", "size", "device", "__weakref__")

    def __init__(self, size: int, device: Any = None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"size must be a non-negative int, not {size!r}")
        self.ptr = 0
        self.size = size
        self.device = _device_index(device)
        self.ptr = _native.try_malloc(size, self.device, 0)

    def free(self) -> None:
        """Free the allocation now (idempotent)."""
        ptr, self.ptr = self.ptr, 0
        if ptr:
            _native.try_free(ptr, self.size, self.device, 0)

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"DeviceBuffer(size={self.size}, device={self.device}, ptr={self.ptr:#x})"


# The leak tools find DeviceBuffers as holders, exactly as they find tensors.
register_holder_type(DeviceBuffer, lambda obj: (obj.ptr,) if obj.ptr else ())
