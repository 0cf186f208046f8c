"""Latency statistics over measured iterations: pure numpy, inputs copied and never modified."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike


@dataclass(frozen=True, kw_only=True)
class LatencyStats:
    """One block's latency over the measured iterations, in µs (NaN: not measured)."""

    count: int  # measured iterations
    avg_us: float = math.nan  # arithmetic mean
    min_us: float = math.nan
    max_us: float = math.nan
    p50_us: float = math.nan  # nearest rank: an observed value, never interpolated
    p99_us: float = math.nan  # nearest rank
    stdev_us: float = math.nan  # population (ddof=0)


def _as_1d_finite(values: ArrayLike, what: str) -> np.ndarray:
    arr = np.array(values, dtype=np.float64, copy=True)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{what} is empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} contains NaN or infinite values")
    return arr


def _nearest_rank_index(q: float, n: int) -> int:
    q = float(q)
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    # Decimal keeps q*n/100 exact for the q a user writes (7 * 100 / 100 is 7, whereas binary
    # 0.07 * 100 is 7.000000000000001 and would push ceil() one rank too high).
    rank = math.ceil(Decimal(repr(q)) * n / 100)
    return min(max(rank, 1), n) - 1


def percentile_nearest_rank(values: ArrayLike, q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]: the ceil(q/100 * N)-th smallest value (at least
    the first); the input is not sorted in place."""
    arr = _as_1d_finite(values, "values")
    k = _nearest_rank_index(q, arr.size)
    return float(np.partition(arr, k)[k])


def latency_stats(durations_ns: ArrayLike) -> LatencyStats:
    """Statistics (µs) of per-iteration durations (ns); ValueError for empty, negative or NaN."""
    arr_us = _as_1d_finite(durations_ns, "durations_ns")
    if np.any(arr_us < 0):
        raise ValueError(f"durations_ns contains negative values (min {arr_us.min()} ns)")
    arr_us /= 1e3  # our own copy
    n = arr_us.size
    k50, k99 = (_nearest_rank_index(q, n) for q in (50.0, 99.0))
    part = np.partition(arr_us, [k50, k99])
    return LatencyStats(
        count=n,
        avg_us=float(np.mean(arr_us)),
        min_us=float(np.min(arr_us)),
        max_us=float(np.max(arr_us)),
        p50_us=float(part[k50]),
        p99_us=float(part[k99]),
        stdev_us=float(np.std(arr_us, ddof=0)),
    )


RESAMPLES = 1000
"""Bootstrap resamples per measured window: enough for the 2.5 % and 97.5 % points."""
Z95 = NormalDist().inv_cdf(0.975)


def _t_inside(t: float, nu: int) -> float:
    """P(|T| < t) for Student's t with ``nu`` (integer) degrees of freedom (Abramowitz &
    Stegun 26.7.3 and 26.7.4: a finite sum in theta = atan(t / sqrt(nu)))."""
    theta = math.atan(t / math.sqrt(nu))
    c2 = math.cos(theta) ** 2
    term = total = 1.0 if nu % 2 == 0 else math.cos(theta)
    for k in range(2 if nu % 2 == 0 else 3, nu - 1, 2):
        term *= c2 * (k - 1) / k
        total += term
    if nu % 2 == 0:
        return math.sin(theta) * total
    return 2 / math.pi * (theta + (math.sin(theta) * total if nu > 1 else 0.0))


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile for 0.5 < p < 1: exact (bisection on the closed-form
    distribution, ``df`` rounded down) below 30 degrees of freedom, the Cornish-Fisher
    expansion (Abramowitz & Stegun 26.7.5, within 0.1 %) from 30, the normal one at inf."""
    z = NormalDist().inv_cdf(p)
    if df >= 30:
        g1 = (z**3 + z) / 4
        g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
        g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
        return z + g1 / df + g2 / df**2 + g3 / df**3
    nu, inside = max(1, int(df)), 2 * p - 1
    low, high = 0.0, z
    while _t_inside(high, nu) < inside:
        low, high = high, high * 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_inside(mid, nu) < inside else (low, mid)
    return (low + high) / 2


def block_length(values: np.ndarray) -> int:
    """Iterations resampled together (README.md's "intervals"): n^(1/3), or twice the correlation
    time (1 + r) / (1 - r) of the lag-1 autocorrelation r when longer; at most n / 2."""
    n = values.size
    length = max(1, round(n ** (1 / 3)))
    centred = values - values.mean()
    power = float(centred @ centred)
    if n >= 4 and power > 0:
        r = min(float(centred[1:] @ centred[:-1]) / power, 0.95)
        if r > 0:
            length = max(length, math.ceil(2 * (1 + r) / (1 - r)))
    return max(1, min(length, n // 2))


class Phase:
    """The bootstrap of one measured window (README.md's "intervals"): every series resampled with
    the same moving blocks of iterations, so figures of one window keep their correlation."""

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self._indices: dict[tuple[int, int], np.ndarray] = {}
        self._shift = np.random.default_rng([seed, 0]).standard_normal(RESAMPLES)

    def indices(self, num_iters: int, length: int) -> np.ndarray:
        """(resamples, num_iters) indices: moving blocks of ``length``, seeded by (n, length)."""
        key = (num_iters, length)
        if key not in self._indices:
            rng = np.random.default_rng([self._seed, num_iters, length])
            count = -(-num_iters // length)
            starts = rng.integers(0, num_iters - length + 1, size=(RESAMPLES, count))
            blocks = starts[:, :, None] + np.arange(length)
            self._indices[key] = blocks.reshape(RESAMPLES, -1)[:, :num_iters]
        return self._indices[key]

    def resample(
        self, values: ArrayLike, statistic: str = "mean", *, drift: bool = True
    ) -> np.ndarray:
        """(resamples,) replicates of the ``mean``, ``p50`` or ``p99`` of the finite values
        (empty: fewer than 2); ``drift`` False for two series of a window divided by each other."""
        x = np.asarray(values, dtype=np.float64)
        x = x[np.isfinite(x)]
        if x.size < 2:
            return np.empty(0)
        draws = x[self.indices(x.size, block_length(x))]
        if statistic == "mean":
            out = draws.mean(axis=1)
        else:
            k = _nearest_rank_index(float(statistic[1:]), x.size)
            out = np.partition(draws, k, axis=1)[:, k]
        # The drift scales the level, log-normally: a positive figure stays positive.
        return out * np.exp(relative_drift(x) * self._shift) if drift else out


def relative_drift(values: np.ndarray) -> float:
    """How far a series' level moves between windows, relative to its mean (README.md's
    "intervals"): twice its halves' mean difference beyond noise."""
    n = values.size
    if n < 4:
        return 0.0
    # d^2 - 4 var / n: 4 var / n is d^2's mean without drift; clipped to the 5th and 95th
    # percentiles, a preemption or two is noise, not a move of the level.
    x = np.clip(values, *np.percentile(values, [5, 95]))
    mean, half = float(x.mean()), n // 2
    d = float(x[half:].mean() - x[:half].mean())
    excess = d * d - 4 * float(x.var()) / n
    return 2 * math.sqrt(excess) / abs(mean) if excess > 0 and mean else 0.0


def degrees_of_freedom(values: ArrayLike) -> int:
    """Independent blocks of iterations in a series, less one: what a bootstrap of it knows."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    return max(1, x.size // block_length(x) - 1) if x.size >= 2 else 1


def interval(estimate: float, replicates: np.ndarray, df: int) -> tuple[float, float]:
    """The 95 % interval of ``estimate``: the replicates' percentile interval widened by t/z for
    ``df`` (few independent blocks make it too narrow), on the log scale for positive figures."""
    finite = replicates[np.isfinite(replicates)]
    if not math.isfinite(estimate) or finite.size < 0.9 * max(replicates.size, 1):
        return math.nan, math.nan
    low, high = (float(v) for v in np.percentile(finite, [2.5, 97.5]))
    widen = t_quantile(0.975, df) / Z95
    if estimate > 0 and low > 0:
        return (
            estimate * min(low / estimate, 1.0) ** widen,
            estimate * max(high / estimate, 1.0) ** widen,
        )
    return (
        estimate - max(estimate - low, 0.0) * widen,
        estimate + max(high - estimate, 0.0) * widen,
    )


NOT_MEASURABLE = "not measurable here"
FEW_WINDOWS = 10
"""Independent windows of iterations under which a too wide interval is put down to too few
iterations, rather than to iterations that vary too much."""
_RANGES = {"overlap_efficiency": "its range, 0 to 1", "slowdown": "the slowdown itself"}


def measurable(name: str, value: float, low: float, high: float) -> bool:
    """False when the 95 % interval [low, high] of ``name`` is wider than the range it is read in
    (README.md's "not measurable here"); True for other figures and where there is no interval."""
    span = 1.0 if name == "overlap_efficiency" else abs(value) if name == "slowdown" else math.inf
    return not high - low > span


def unmeasurable_note(name: str, value: float, interval: tuple[float, ...], iters: int) -> str:
    """Why the figure ``name`` is not measurable here (:func:`measurable`), with its value and
    interval; ``""`` when it is."""
    low, high, df = interval
    if measurable(name, value, low, high):
        return ""
    why = (
        f"too few iterations ({iters}, {df + 1:.0f} independent windows of them): run more iters"
        if df + 1 < FEW_WINDOWS
        else "the iterations vary too much (a noisy host): run on a quieter machine"
    )
    return (
        f"{name.replace('_', ' ')} {NOT_MEASURABLE}: {value:.3f}, its 95 % interval "
        f"[{low:.3f}, {high:.3f}] wider than {_RANGES[name]}: {why}"
    )
