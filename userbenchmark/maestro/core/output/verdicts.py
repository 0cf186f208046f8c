"""The noise model behind every A/B verdict (``compare`` and the TorchBench detector): a change
counts only beyond noise (Welch's t over both runs' intervals, Bonferroni over the metrics judged
at once) and past the metric's floor or the runs' window spread (docs/torchbench.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Literal

from ..analysis.stats import t_quantile
from .metric_keys import BOUNDS, Direction, spec_of, split_bound

Verdict = Literal["regressed", "improved", "changed", "within noise", "unchanged", "not judged"]
FAMILY_ALPHA: Final = 0.05  # chance of a false alarm among all the metrics of a comparison
WINDOW_SPREADS: Final = 1.0
"""A change within this many window spreads (std of a run's window means, the larger) is noise:
identical 2-core gloo runs moved by up to 3x their floors, as their windows spread (BENCHMARKS.md)."""


@dataclass(frozen=True, kw_only=True)
class Reading:
    """One run's value of a metric, with its 95 % interval (NaN bounds: none)."""

    value: float
    low: float = math.nan
    high: float = math.nan
    df: float = math.inf  # the interval's degrees of freedom

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """The verdict on one metric key, with what it was judged by."""

    key: str
    control: Reading
    treatment: Reading
    change: float  # (treatment - control) / control; the difference for an absolute metric
    low: float  # the change's interval at the family's level; NaN: not judged
    high: float
    floor: float | None
    absolute: bool
    direction: Direction | None
    verdict: Verdict
    decides: bool = True  # False: a harness diagnostic, shown beside the verdicts that count


def readings(metrics: Mapping[str, float]) -> dict[str, Reading]:
    """Flat ``{key: float}`` (bound keys included) as ``{key: Reading}``; ValueError for a bound
    without its metric or an interval that does not hold its value."""
    out: dict[str, Reading] = {}
    for key, value in metrics.items():
        head, _, name = key.rpartition("/")
        base, index = split_bound(name)
        if index is None:
            low, high, df = (metrics.get(f"{head}/{base}{b}", math.nan) for b in BOUNDS)
            known = [not math.isnan(v) for v in (low, high, df)]
            if any(known) and not (all(known) and low <= value <= high and df >= 1):
                raise ValueError(
                    f"{key}: interval [{low!r}, {high!r}] (df {df!r}) does not hold {value!r}"
                )
            out[key] = Reading(value=value, low=low, high=high, df=df if all(known) else math.inf)
        elif f"{head}/{base}" not in metrics:
            raise ValueError(f"{key}: an interval bound without the metric {head}/{base}")
    return out


def judge_all(
    control: Mapping[str, Reading],
    treatment: Mapping[str, Reading],
    *,
    floors: Mapping[str, float] | None = None,
    judge_harness: bool = False,
) -> list[Judgement]:
    """Judge every key the two runs share (sorted); ``floors`` overrides metrics' floors. The
    harness's diagnostics decide nothing unless ``judge_harness`` (nor count in the family)."""
    floors = floors or {}
    keys = sorted(control.keys() & treatment.keys())
    metric = {key: key.rsplit("/", 1)[-1] for key in keys}  # a key's last part is its metric
    decides = {key: judge_harness or not spec_of(metric[key]).harness for key in keys}
    count = sum(
        decides[k] and _has_noise(control[k], treatment[k], metric[k], floors) for k in keys
    )
    p = 1 - FAMILY_ALPHA / (2 * max(count, 1))
    return [
        replace(_judge(key, control[key], treatment[key], metric[key], p, floors), decides=d)
        for key, d in decides.items()
    ]


def _has_noise(a: Reading, b: Reading, metric: str, floors: Mapping[str, float]) -> bool:
    spec = spec_of(metric)
    return (
        floors.get(metric, spec.floor) is not None
        and not spec.exact
        and a.has_interval
        and b.has_interval
        and (spec.absolute or min(a.low, b.low) > 0)
    )


def _judge(
    key: str, a: Reading, b: Reading, metric: str, p: float, floors: Mapping[str, float]
) -> Judgement:
    spec = spec_of(metric)
    floor = floors.get(metric, spec.floor)
    change = b.value - a.value if spec.absolute else _relative(a.value, b.value)
    low = high = math.nan
    verdict: Verdict = "not judged"
    if floor is not None and spec.exact:
        verdict = "unchanged" if abs(change) <= floor else _way(spec.better, change)
    elif _has_noise(a, b, metric, floors):
        to = (lambda v: v) if spec.absolute else math.log
        delta = to(b.value) - to(a.value)
        up = delta >= 0  # each run's interval on the side facing the other run
        half_a = to(a.high) - to(a.value) if up else to(a.value) - to(a.low)
        half_b = to(b.value) - to(b.low) if up else to(b.high) - to(b.value)
        se_a, se_b = half_a / t_quantile(0.975, a.df), half_b / t_quantile(0.975, b.df)
        margin = t_quantile(p, _welch(se_a, a.df, se_b, b.df)) * math.hypot(se_a, se_b)
        back = (lambda d: d) if spec.absolute else (lambda d: math.expm1(min(d, 700.0)))
        low, high = back(delta - margin), back(delta + margin)
        spread = WINDOW_SPREADS * max(_window_spread(a, to), _window_spread(b, to))
        floor = max(floor, back(spread))
        beyond = abs(delta) > margin and abs(change) > floor
        verdict = _way(spec.better, change) if beyond else "within noise"
    return Judgement(
        key=key,
        control=a,
        treatment=b,
        change=change,
        low=low,
        high=high,
        floor=floor,
        absolute=spec.absolute,
        direction=spec.better,
        verdict=verdict,
    )


def _window_spread(r: Reading, to: Callable[[float], float]) -> float:
    """The standard deviation of a run's window means, on the judged scale: its interval's
    standard error times the square root of its windows (degrees of freedom + 1)."""
    if not math.isfinite(r.df):
        return 0.0
    return (to(r.high) - to(r.low)) / 2 / t_quantile(0.975, r.df) * math.sqrt(r.df + 1)


def _welch(se_a: float, df_a: float, se_b: float, df_b: float) -> float:
    """Welch-Satterthwaite degrees of freedom of a difference of two estimates."""
    va, vb = se_a**2, se_b**2
    denominator = va**2 / df_a + vb**2 / df_b
    return (va + vb) ** 2 / denominator if denominator > 0 else min(df_a, df_b)


def _relative(a: float, b: float) -> float:
    if a == 0:
        return 0.0 if b == 0 else math.copysign(math.inf, b)
    return (b - a) / abs(a)


def _way(better: Direction | None, change: float) -> Verdict:
    if better is None:
        return "changed"
    worse = change > 0 if better == "lower" else change < 0
    return "regressed" if worse else "improved"
