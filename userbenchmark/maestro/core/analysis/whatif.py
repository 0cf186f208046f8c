"""A what-if variant against its pattern: both measured in the same rounds of one process, so the
change of the makespan is paired by round (the drift both share cancels), with its 95 % interval
and the one verdict rule (verdict.py); and the block whose own latency changed most."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

from ..config.spec import PatternSpec
from .verdict import Change, beyond_noise, paired_change, percent

WhatIfVerdict = Literal["slower", "faster", "within noise"]

WHATIF_FLOOR: Final = 0.01
"""The smallest change of the makespan a what-if calls slower or faster (1 %, as log(1.01) on the
verdict's scale), beyond an interval that must exclude 0. Paired rounds cancel the drift of one
process (a GEMM moved about 3 % between processes on an H200, 0.5-1.5 % inside one), so the
floor is below the 2 % a cuBLAS or NCCL update often brings, and above what a window's own
timing adds (docs/whatif.md)."""


@dataclass(frozen=True, kw_only=True)
class WhatIfResult:
    """One variant of one pattern, measured in the same rounds as the pattern."""

    suite: str = ""
    """Set by rank 0's reporter (the files and metric keys carry it)."""
    pattern: str
    """The pattern's name (a sweep point's, ``ar[size=4M]``)."""
    variant: str
    rounds: int
    """Rounds with both makespans measured: the pairs the change is made of."""
    makespan_avg_us: float
    """The variant's mean makespan over those rounds."""
    base_makespan_avg_us: float
    change_pct: float
    """The variant's makespan against the pattern's: the mean over rounds of log(variant /
    pattern), as a percentage (100 * expm1)."""
    change_ci_low_pct: float
    change_ci_high_pct: float
    """95 % interval of ``change_pct`` (Student t over the rounds' pairs)."""
    verdict: str
    """``slower``/``faster`` (WhatIfVerdict): the interval excludes 0 and the change is past
    WHATIF_FLOOR; else ``within noise``."""
    block: str = ""
    """The block (matched by name) whose latency changed most, either way; "" when none was
    timed in two rounds of both."""
    block_change_pct: float = math.nan
    block_change_ci_low_pct: float = math.nan
    block_change_ci_high_pct: float = math.nan
    """That block's average latency against the pattern's, paired by round as the makespan."""


def _pairs(base: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rounds where both are measured (finite and > 0)."""
    kept = np.isfinite(base) & np.isfinite(other) & (base > 0) & (other > 0)
    return base[kept], other[kept]


def _percent(change: Change) -> tuple[float, float, float]:
    return percent(change.value), percent(change.low), percent(change.high)


def _block_changes(
    base: PatternSpec, variant: PatternSpec, base_ns: np.ndarray, variant_ns: np.ndarray
) -> dict[str, Change]:
    """Each block of both (by name) timed in at least two rounds of both: its paired change."""
    rows = {block.name: i for i, block in enumerate(variant.blocks)}
    changes = {}
    for i, block in enumerate(base.blocks):
        if block.name in rows:
            a, b = _pairs(base_ns[i], variant_ns[rows[block.name]])
            if a.size >= 2:
                changes[block.name] = paired_change(a, b)
    return changes


def _shaped(name: str, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.shape != shape:
        raise ValueError(f"{name} has shape {array.shape}, expected {shape}")
    return array


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
    for arrays of other shapes or fewer than 2 rounds with both makespans measured."""
    rounds = (np.size(base_makespan_ns),)
    a = _shaped("base_makespan_ns", base_makespan_ns, rounds)
    b = _shaped("variant_makespan_ns", variant_makespan_ns, rounds)
    base_ns = _shaped("base_block_ns", base_block_ns, (len(base.blocks), *rounds))
    variant_ns = _shaped("variant_block_ns", variant_block_ns, (len(variant.blocks), *rounds))
    a, b = _pairs(a, b)
    if a.size < 2:
        raise ValueError(
            f"pattern {base.name!r}, variant {variant.variant!r}: {a.size} round(s) with both "
            "makespans measured; a what-if needs at least 2 for its interval"
        )
    change = paired_change(a, b)
    verdict: WhatIfVerdict = "within noise"
    if beyond_noise(change, WHATIF_FLOOR):
        verdict = "slower" if change.value > 0 else "faster"
    blocks = _block_changes(base, variant, base_ns, variant_ns)
    name = max(blocks, key=lambda n: abs(blocks[n].value), default="")
    block = _percent(blocks[name]) if name else (math.nan,) * 3
    pct = _percent(change)
    return WhatIfResult(
        pattern=base.name,
        variant=variant.variant or "",
        rounds=a.size,
        makespan_avg_us=float(b.mean()) / 1e3,
        base_makespan_avg_us=float(a.mean()) / 1e3,
        change_pct=pct[0],
        change_ci_low_pct=pct[1],
        change_ci_high_pct=pct[2],
        verdict=verdict,
        block=name,
        block_change_pct=block[0],
        block_change_ci_low_pct=block[1],
        block_change_ci_high_pct=block[2],
    )
