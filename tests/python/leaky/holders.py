"""Device memory held through every standard container kind, each filled from its own line."""

import collections

from torch_arena.testing import DeviceBuffer

KiB = 1 << 10


class Model:
    """Holds buffers in an attribute (through its ``__dict__``)."""

    def __init__(self):
        self.stash = []


class Slotted:
    """Holds one buffer in a ``__slots__`` attribute."""

    __slots__ = ("buf",)

    def __init__(self, buf):
        self.buf = buf


DEQUE: collections.deque = collections.deque()
ODICT: collections.OrderedDict = collections.OrderedDict()
DDICT: collections.defaultdict = collections.defaultdict(list)
SET: set = set()
MODEL = Model()
SLOTTED: list = []

# container name -> the start of the holder expression the report must show
EXPECTED = {
    "deque": "DEQUE[",
    "odict": "ODICT['k",
    "ddict": "DDICT['batch'][",
    "set": "SET{...}",
    "attr": "MODEL.stash[",
    "slots": "SLOTTED[",
}


def fill(n):
    """``n`` buffers into each container; the line of each kind."""
    for i in range(n):
        DEQUE.append(DeviceBuffer(1 * KiB))  # deque
        ODICT[f"k{i}"] = DeviceBuffer(2 * KiB)  # odict
        DDICT["batch"].append(DeviceBuffer(3 * KiB))  # ddict
        SET.add(DeviceBuffer(4 * KiB))  # set
        MODEL.stash.append(DeviceBuffer(5 * KiB))  # attr
        SLOTTED.append(Slotted(DeviceBuffer(6 * KiB)))  # slots


def reset():
    DEQUE.clear()
    ODICT.clear()
    DDICT.clear()
    SET.clear()
    MODEL.stash.clear()
    SLOTTED.clear()
