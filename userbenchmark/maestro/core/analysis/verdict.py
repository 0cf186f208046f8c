"""The one verdict rule of every A/B judgement (``compare``, the TorchBench detector, ``abtest``,
the what-if report), docs/torchbench.md's: pure math on plain numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from .stats import t_quantile


@dataclass(frozen=True, kw_only=True)
class Change:
    """A change on the judged scale: log(b / a) for a relative metric, b - a for an absolute one,
    with its interval (same scale) and the interval's degrees of freedom."""

    value: float
    low: float
    high: float
    df: float


def _judged(values: ArrayLike, absolute: bool, what: str) -> np.ndarray:
    x = np.array(values, dtype=np.float64, copy=True)
    if x.ndim != 1:
        raise ValueError(f"{what} must be one value per round (1-D), got shape {x.shape}")
    if not np.all(np.isfinite(x)) or (not absolute and np.any(x <= 0)):
        valid = "finite" if absolute else "finite and > 0 (a relative metric)"
        raise ValueError(f"{what}: every value must be {valid}")
    return x if absolute else np.log(x)


def mean_change(values: ArrayLike, *, level: float = 0.95) -> Change:
    """The mean of ``values`` (already on the judged scale, at least 2) with its Student t
    interval, df = len - 1."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"an interval needs at least 2 values, got {x.size}")
    mean, df = float(x.mean()), x.size - 1
    margin = t_quantile(0.5 + level / 2, df) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Change(value=mean, low=mean - margin, high=mean + margin, df=df)


def paired_change(
    base: ArrayLike, other: ArrayLike, *, absolute: bool = False, level: float = 0.95
) -> Change:
    """`other` against `base` paired by round (arrays of one value per round, same length >= 2):
    the mean of the per-round log ratios (differences when absolute) with its Student t interval
    over rounds (df = rounds - 1). ValueError: fewer than 2 rounds, lengths differ, or a value
    <= 0 / non-finite for a relative metric."""
    a, b = _judged(base, absolute, "base"), _judged(other, absolute, "other")
    if a.size != b.size:
        raise ValueError(f"base has {a.size} rounds and other {b.size}: pairs need the same count")
    return mean_change(b - a, level=level)


def independent_change(
    delta: float, se_a: float, df_a: float, se_b: float, df_b: float, *, level: float = 0.95
) -> Change:
    """The change ``delta`` between two independent estimates (judged scale) with standard errors
    ``se_a``, ``se_b``: its Welch interval (Welch-Satterthwaite degrees of freedom)."""
    va, vb = se_a**2, se_b**2
    denominator = va**2 / df_a + vb**2 / df_b
    df = (va + vb) ** 2 / denominator if denominator > 0 else min(df_a, df_b)
    margin = t_quantile(0.5 + level / 2, df) * math.hypot(se_a, se_b)
    return Change(value=delta, low=delta - margin, high=delta + margin, df=df)


def beyond_noise(change: Change, floor: float, *, absolute: bool = False) -> bool:
    """True when the change's interval excludes 0 AND it is past ``floor`` (a fraction, compared as
    log1p(floor) for a relative metric: a rise by r and a fall by 1/r are judged alike)."""
    excludes_zero = change.low > 0 or change.high < 0
    return excludes_zero and abs(change.value) > (floor if absolute else math.log1p(floor))


def percent(value: float) -> float:
    """A relative change on the log scale as a percentage: 100 * expm1 (log 2 is +100 %)."""
    return 100 * math.expm1(min(value, 700.0))


def process_mean(
    values: ArrayLike, *, absolute: bool = False
) -> tuple[float, tuple[float, float, int] | None]:
    """Figures of one metric measured in several processes (NaN left out): their mean, and its
    Student t interval between processes as (low, high, df), made on the judged scale (the log
    for a relative metric) around the mean; None from fewer than 2 values."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    mean = float(x.mean()) if x.size else math.nan
    if x.size < 2 or (not absolute and np.any(x <= 0)):
        return mean, None
    spread = mean_change(_judged(x, absolute, "values"))
    margin = spread.high - spread.value
    if absolute:
        return mean, (mean - margin, mean + margin, int(spread.df))
    return mean, (mean * math.exp(-margin), mean * math.exp(margin), int(spread.df))
