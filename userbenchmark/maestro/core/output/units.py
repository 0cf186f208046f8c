"""Latency units and number formatting for tables: one unit per column, never a misleading 0."""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numpy.typing import ArrayLike

# Microseconds per unit. Units are spelled in ASCII so tables and CSV stay plain text.
LATENCY_UNIT_SCALE_US: Final[dict[str, float]] = {"us": 1.0, "ms": 1e3, "s": 1e6}


def choose_latency_unit(values_us: ArrayLike) -> str:
    """One display unit for a column of latencies in microseconds: the largest unit that the
    smallest positive finite value fills at least once ("us" when there is none)."""
    arr = np.asarray(values_us, dtype=np.float64).ravel()
    positive = arr[np.isfinite(arr) & (arr > 0)]
    smallest = float(positive.min()) if positive.size else 0.0
    return next((u for u in ("s", "ms") if smallest >= LATENCY_UNIT_SCALE_US[u]), "us")


def format_in_unit(value_us: float, unit: str, precision: int = 2) -> str:
    """A latency in microseconds, in ``unit``, fixed-point with ``precision`` decimals, except
    that a non-zero value never prints as zero: it gets the fewest decimals that show it
    (0.0004 ms at precision 2: "0.0004"). NaN prints "n/a", infinities "inf"/"-inf"; never
    scientific notation."""
    value_us = float(value_us)
    if math.isnan(value_us):
        return "n/a"
    if math.isinf(value_us):
        return "inf" if value_us > 0 else "-inf"
    value = value_us / LATENCY_UNIT_SCALE_US[unit]
    text = f"{value:.{precision}f}"
    if value == 0.0 or float(text) != 0.0:
        return text
    # Fewest decimals that print non-zero: start one short of the first significant digit's
    # place (0.00096 rounds to 0.001) and step up (log10 may also be off by one near powers
    # of ten); this takes at most a few steps.
    decimals = max(precision + 1, -math.floor(math.log10(abs(value))) - 1)
    text = f"{value:.{decimals}f}"
    while float(text) == 0.0:
        decimals += 1
        text = f"{value:.{decimals}f}"
    return text
