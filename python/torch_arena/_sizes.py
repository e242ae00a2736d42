"""Sizes for people and for limits: ``parse_size("1 MB")`` and ``format_size(1 << 20)``. A
leaf module: it imports nothing of the package."""

import re
from typing import Any

__all__ = ["format_size", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(limit: Any) -> int:
    """Bytes from an int (bytes) or a string: a number and a unit, ``"1 MB"``, ``"512KiB"``,
    ``"1.5 GiB"``, ``"100"``. KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB powers of
    1024; units are case-insensitive. ValueError names the accepted forms."""
    if isinstance(limit, bool):
        raise ValueError(f"a size must be an int or a string like '1 MB', not {limit!r}")
    if isinstance(limit, int):
        if limit < 0:
            raise ValueError(f"a size must not be negative, not {limit}")
        return limit
    if isinstance(limit, float) and limit >= 0 and limit == limit:
        return int(limit)
    if isinstance(limit, str):
        m = _SIZE.match(limit)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ValueError(
        f"cannot read the size {limit!r}: give bytes as an int, or a string of a number and a "
        "unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), "
        "e.g. '1 MB', '512KiB', '1.5 GiB'"
    )


def format_size(n: float) -> str:
    """``n`` bytes for people, as the Rust library and the ``torch-arena`` command write them
    (``human_bytes``): two decimals in the largest binary unit that keeps the number at least 1,
    ``"1.00 MiB"``, ``"79.65 GiB"``; whole bytes under 1 KiB, ``"512 B"``. Negative sizes (a site
    that shrank) get a minus sign. ``tests/fixtures/byte_formats.txt`` holds both to the same
    text."""
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value < 1024:
        return f"{sign}{value:.0f} B"
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    unit = 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024.0
        unit += 1
    return f"{sign}{value:.2f} {units[unit]}"
