"""A what-if variant against its pattern (docs/whatif.md): measured in the same rounds of one
process, so the makespan's change is paired by round (the drift both share cancels)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from ..config.spec import PatternSpec
from .verdict import beyond_noise, paired_change, percent

WHATIF_FLOOR: Final = 0.01
"""The smallest makespan change called slower or faster (docs/whatif.md says why so low)."""


@dataclass(frozen=True, kw_only=True)
class WhatIfResult:
    """One variant of one pattern, measured in the same rounds as the pattern."""

    suite: str = ""  # set by rank 0's reporter
    pattern: str  # a sweep point's name: ``ar[size=4M]``
    variant: str
    rounds: int  # with both makespans measured: the pairs the change is made of
    makespan_avg_us: float  # the variant's, over those rounds
    base_makespan_avg_us: float
    change_pct: float  # the mean over rounds of log(variant / pattern), as 100 * expm1
    change_ci_low_pct: float
    change_ci_high_pct: float  # its 95 % interval, Student t over the rounds
    verdict: str  # slower or faster (past WHATIF_FLOOR, the interval excludes 0), within noise
    block: str = ""
    """The block (by name) whose average latency changed most either way, paired by round as
    the makespan; "" when none was timed in two rounds of both."""
    block_change_pct: float = math.nan


def _pairs(base: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rounds where both are measured (finite and > 0)."""
    kept = np.isfinite(base) & np.isfinite(other) & (base > 0) & (other > 0)
    return base[kept], other[kept]


def build_whatif(
    base: PatternSpec,
    variant: PatternSpec,
    *,
    base_makespan_ns: np.ndarray,
    variant_makespan_ns: np.ndarray,
    base_block_ns: np.ndarray,
    variant_block_ns: np.ndarray,
) -> WhatIfResult:
    """``variant`` against ``base`` from each round's average makespan (shape (rounds,)) and each
    block's average latency per round (shape (blocks, rounds), NaN where untimed); ValueError
    for other shapes, or fewer than 2 rounds with both makespans measured."""
    arrays = [base_makespan_ns, variant_makespan_ns, base_block_ns, variant_block_ns]
    a, b, base_ns, variant_ns = (np.asarray(x, dtype=np.float64) for x in arrays)
    shapes = [(a.size,), (a.size,), (len(base.blocks), a.size), (len(variant.blocks), a.size)]
    given = [a.shape, b.shape, base_ns.shape, variant_ns.shape]
    if given != shapes:
        raise ValueError(f"arrays of shapes {given}, expected {shapes} (rounds, blocks x rounds)")
    a, b = _pairs(a, b)
    if a.size < 2:
        raise ValueError(
            f"pattern {base.name!r}, variant {variant.variant!r}: {a.size} round(s) with both "
            "makespans measured; a what-if needs at least 2 for its interval"
        )
    change = paired_change(a, b)
    slower = "slower" if change.value > 0 else "faster"
    rows = {block.name: i for i, block in enumerate(variant.blocks)}
    blocks = {}  # name: its paired change, for the blocks of both timed in two rounds of both
    for i, block in enumerate(base.blocks):
        x, y = _pairs(base_ns[i], variant_ns[rows[block.name]]) if block.name in rows else ((), ())
        if len(x) >= 2:
            blocks[block.name] = paired_change(x, y).value
    most = max(blocks, key=lambda name: abs(blocks[name]), default="")
    return WhatIfResult(
        pattern=base.name,
        variant=variant.variant or "",
        rounds=a.size,
        makespan_avg_us=float(b.mean()) / 1e3,
        base_makespan_avg_us=float(a.mean()) / 1e3,
        change_pct=percent(change.value),
        change_ci_low_pct=percent(change.low),
        change_ci_high_pct=percent(change.high),
        verdict=slower if beyond_noise(change, WHATIF_FLOOR) else "within noise",
        block=most,
        block_change_pct=percent(blocks[most]) if most else math.nan,
    )
