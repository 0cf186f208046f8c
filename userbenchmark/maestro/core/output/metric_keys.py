"""Metric keys (``suite/pattern[/block or a+b]/metric``), what each metric is (its record field),
and the noise model behind every A/B verdict: Welch's t over both runs' intervals, Bonferroni over
the metrics judged at once, past the metric's floor or window spread (docs/torchbench.md)."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, fields, replace
from types import MappingProxyType
from typing import Final, Literal

from ..analysis.records import RECORDS, Direction, Domain, Level, Metric, metrics_of
from ..analysis.stats import t_quantile

NamePart = Literal["suite", "pattern", "block", "metric"]

PAIR_SEPARATOR: Final = "+"  # joins a pair key's block names (ag+rs); no block name has it

_NAME = r"[A-Za-z0-9_.-]+"
_NAME_HINT = "letters, digits and _ . -"
# A sweep point's suffix, as the loader writes it: "ar_sweep[size=4M]" or "[size=4M,dtype=bf16]".
_SWEEP_SUFFIX = r"\[[A-Za-z0-9_.,=+-]+\]"
_PARTS: Final[dict[str, tuple[re.Pattern[str], str]]] = {
    part: (re.compile(_NAME), _NAME_HINT) for part in ("suite", "block", "metric")
}
_PARTS["pattern"] = (
    re.compile(rf"{_NAME}(?:{_SWEEP_SUFFIX})?"),
    f"{_NAME_HINT}, optionally followed by a sweep suffix like [size=4M]",
)


@dataclass(frozen=True, kw_only=True)
class MetricSpec(Metric):
    """One metric: its record field's :class:`~..analysis.records.Metric`, its name and level."""

    name: str
    level: Level | None  # None for a name no record has


METRICS: Final[Mapping[str, MetricSpec]] = MappingProxyType(
    {
        name: MetricSpec(name=name, level=level, **asdict(info))
        for level, record_type in RECORDS.items()
        for name, info in metrics_of(record_type).items()
    }
)
"""Every metric of the records, by name (no two levels share a name)."""
REQUIRED_METRICS: Final[Mapping[Level, frozenset[str]]] = MappingProxyType(
    {
        level: frozenset(
            f.name
            for f in fields(record_type)
            if f.name in METRICS and f.default is MISSING and f.default_factory is MISSING
        )
        for level, record_type in RECORDS.items()
    }
)
"""The metrics every timed block or pattern has (its record requires them): NaN only for a
block no rank timed."""

# Suffixes of the keys of a metric's 95 % interval and its degrees of freedom (x_ci_low, ...).
BOUNDS: Final = ("_ci_low", "_ci_high", "_ci_df")
# Name tokens of tail, extreme and spread statistics: a metric of a newer version named so
# counts from 10 %, any other from 5 %.
_NOISY_TOKENS: Final[frozenset[str]] = frozenset({"p99", "max", "min", "skew", "stdev"})


def split_bound(metric: str) -> tuple[str, int | None]:
    """(metric, index into BOUNDS) for an interval's key name (``x_ci_low``: ``("x", 0)``),
    else (metric, None)."""
    for index, suffix in enumerate(BOUNDS):
        if metric.endswith(suffix) and len(metric) > len(suffix):
            return metric[: -len(suffix)], index
    return metric, None


def spec_of(metric: str) -> MetricSpec:
    """The spec of a known metric; for another name (a newer version's), one inferred from its
    unit: ``_us`` lower is better, ``_gbps`` and ``tflops`` higher, otherwise descriptive."""
    if metric in METRICS:
        return METRICS[metric]
    higher = metric.endswith(("_gbps", "tflops"))
    direction: Direction | None = (
        "lower" if metric.endswith("_us") else "higher" if higher else None
    )
    floor = 0.10 if _NOISY_TOKENS.intersection(metric.split("_")) else 0.05
    return MetricSpec(
        name=metric, level=None, better=direction, domain="finite", meaning="", floor=floor
    )


@dataclass(frozen=True, kw_only=True)
class MetricKey:
    """A parsed metric key; ``block`` and ``pair`` are None for a pattern-level metric, and
    ``pair`` is (block_a, block_b) for a metric of two blocks (then ``block`` is None)."""

    suite: str
    pattern: str
    block: str | None
    metric: str
    pair: tuple[str, str] | None = None

    @property
    def level(self) -> Level:
        return "pair" if self.pair is not None else "pattern" if self.block is None else "block"


def check_name(part: NamePart, value: object) -> str:
    """``value`` when it is a valid ``part`` of a metric key; else ValueError."""
    if part not in _PARTS:
        raise ValueError(f"unknown key part {part!r}; expected one of {sorted(_PARTS)}")
    regex, hint = _PARTS[part]
    if not isinstance(value, str) or not regex.fullmatch(value):
        raise ValueError(f"invalid {part} name {value!r} in a metric key: expected {hint}")
    return value


def metric_key(
    suite: str, pattern: str, block: str | None, metric: str, *, pair: tuple[str, str] | None = None
) -> str:
    """Build ``suite/pattern/block/metric``, ``suite/pattern/a+b/metric`` for ``pair=(a, b)``,
    or ``suite/pattern/metric`` when both are None."""
    parts = [check_name("suite", suite), check_name("pattern", pattern)]
    if pair is not None:
        if block is not None:
            raise ValueError(f"a metric key has a block or a pair, not both: {block!r}, {pair!r}")
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ValueError(f"invalid pair {pair!r} in a metric key: expected (block_a, block_b)")
        parts.append(PAIR_SEPARATOR.join(check_name("block", name) for name in pair))
    elif block is not None:
        parts.append(check_name("block", block))
    parts.append(check_name("metric", metric))
    return "/".join(parts)


def parse_metric_key(key: str) -> MetricKey:
    """Split a key built by metric_key back into its parts; ValueError when malformed."""
    if not isinstance(key, str):
        raise ValueError(f"metric key must be a string, got {type(key).__name__}")
    parts = key.split("/")
    block: str | None = None
    pair: tuple[str, str] | None = None
    if len(parts) == 4:
        suite, pattern, middle, metric = parts
        if PAIR_SEPARATOR in middle:
            a, _, b = middle.partition(PAIR_SEPARATOR)
            pair = (a, b)  # a second "+" leaves b invalid: refused below
        else:
            block = middle
    elif len(parts) == 3:
        suite, pattern, metric = parts
    else:
        raise ValueError(
            f"malformed metric key {key!r}: expected suite/pattern/block/metric, "
            "suite/pattern/block_a+block_b/metric or suite/pattern/metric"
        )
    try:
        metric_key(suite, pattern, block, metric, pair=pair)
    except ValueError as exc:
        raise ValueError(f"malformed metric key {key!r}: {exc}") from None
    return MetricKey(suite=suite, pattern=pattern, block=block, metric=metric, pair=pair)


_DOMAINS: Final[dict[Domain, tuple[Callable[[float], bool], str]]] = {
    "positive": (lambda v: v > 0, "must be a finite number > 0"),
    "non_negative": (lambda v: v >= 0, "must be a finite number >= 0"),
    "fraction": (lambda v: 0 <= v <= 1, "must be a number in [0, 1]"),
    "finite": (lambda v: True, "must be a finite number"),
}


def metric_value_problem(metric: str, value: float) -> str | None:
    """Why ``value`` cannot be a value of ``metric`` (NaN, infinite, or outside the metric's
    domain: a latency <= 0), or None when it can. Unknown metrics need only be finite."""
    base, bound = split_bound(metric)
    if bound == 2:  # degrees of freedom: a count >= 1
        ok = isinstance(value, numbers.Real) and math.isfinite(value) and value >= 1
        return None if ok and float(value).is_integer() else "must be a whole number >= 1"
    within, text = _DOMAINS[spec_of(base).domain]
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    return None if number and math.isfinite(value) and within(value) else text


Verdict = Literal["regressed", "improved", "changed", "within noise", "unchanged", "not judged"]
FAMILY_ALPHA: Final = 0.05  # chance of a false alarm among all the metrics of a comparison
WINDOW_SPREADS: Final = 1.0
"""A change within this many window spreads (std of a run's window means, the larger) is noise:
identical 2-core gloo runs moved up to 3x their floors, as their windows spread (BENCHMARKS.md)."""


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
