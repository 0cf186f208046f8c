"""Byte sizes as pattern files write them: 4096, 64K, 1.5MiB (K/M/G/T are powers of 1024).
``parse_size`` is strict (positive, whole bytes, within an address space); ``format_size`` gives
the shortest string that parses back to the same number of bytes."""

from __future__ import annotations

import math
import re
from decimal import Decimal, localcontext
from typing import Final

MAX_SIZE_BYTES: Final = 2**48
"""Largest accepted size: 256 TiB, past the virtual address space of any current machine."""

UNIT_BYTES: Final = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
"""Bytes per unit prefix; KiB/MiB/GiB/TiB and a trailing B spell the same units."""

# Number, optional spaces, optional unit: K/M/G/T (k also), then nothing, B, or iB.
_SIZE_RE = re.compile(
    r"(?P<sign>[-+]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*"
    r"(?:(?P<unit>[KkMGT])(?P<suffix>B|iB)?|(?P<bytes>B))?"
)
_MAX_TEXT_CHARS: Final = 64
_EXAMPLES: Final = "such as 4096, 64K, 1.5MiB or 2G (K/M/G/T are powers of 1024)"


def parse_size(value: object) -> int:
    """Bytes of ``value``: an int (bytes), a whole float, or a string such as "4M" or "1.5KiB";
    ValueError saying which rule failed."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size {_EXAMPLES}, got a boolean ({str(value).lower()})")
    if isinstance(value, int):
        return _checked(value, repr(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"expected a finite size, got {value}")
        if not value.is_integer() and value > 0:
            raise ValueError(f"size {value} is not a whole number of bytes")
        return _checked(int(value), repr(value))  # not positive: says so
    if not isinstance(value, str):
        raise ValueError(f"expected a size {_EXAMPLES}, got {type(value).__name__}")
    text = value.strip()
    match = _SIZE_RE.fullmatch(text) if len(text) <= _MAX_TEXT_CHARS else None
    if match is None:
        shown = value if len(value) <= _MAX_TEXT_CHARS else value[:_MAX_TEXT_CHARS] + "..."
        raise ValueError(f"expected a size {_EXAMPLES}, got {shown!r}")
    if match["sign"] == "-":
        raise ValueError(f"size must be positive, got {value!r}")
    with localcontext() as ctx:
        ctx.prec = 100  # exact for every string of at most 64 characters
        total = Decimal(match["number"]) * UNIT_BYTES[(match["unit"] or "").upper()]
    if total != total.to_integral_value():
        raise ValueError(f"size {value!r} is {total.normalize():f} bytes, not a whole number")
    return _checked(int(total), repr(value))


def _checked(size_bytes: int, shown: str) -> int:
    if size_bytes <= 0:
        raise ValueError(f"size must be positive, got {shown}")
    if size_bytes > MAX_SIZE_BYTES:
        raise ValueError(
            f"size {shown} ({size_bytes} bytes) is larger than any machine's address "
            f"space (at most 2**48 bytes = 256T)"
        )
    return size_bytes


def format_size(size_bytes: int) -> str:
    """Shortest exact spelling of ``size_bytes`` ("4M", "1.5K", "3"), ties to the larger unit:
    ``parse_size(format_size(x)) == x`` for every x in [1, 2**48]."""
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes <= 0:
        raise ValueError(f"format_size needs a positive int, got {size_bytes!r}")
    best = str(size_bytes)
    with localcontext() as ctx:
        ctx.prec = 200  # x / 1024**p has at most 10p decimals: always exact here
        for unit in ("K", "M", "G", "T"):
            text = f"{(Decimal(size_bytes) / UNIT_BYTES[unit]).normalize():f}" + unit
            if len(text) <= len(best):
                best = text
    return best


def counted(count: int, noun: str) -> str:
    """``1 iteration``, ``2 iterations``: a count and its noun, plural but for one."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
