"""Metric keys of maestro's TorchBench metrics file, with each metric's direction and threshold.

The single source of truth for key syntax (``suite/pattern/block/metric``,
``suite/pattern/metric`` and ``suite/pattern/a+b/metric`` for a pair of blocks), which way is
better for every metric, and how large a change must be before it counts. Pure functions.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Final, Literal

__all__ = [
    "BLOCK_METRICS",
    "METRICS",
    "PAIR_METRICS",
    "PAIR_SEPARATOR",
    "PATTERN_METRICS",
    "UNKNOWN_DIRECTION_THRESHOLD",
    "Direction",
    "Domain",
    "Judgement",
    "MetricKey",
    "MetricSpec",
    "Threshold",
    "Verdict",
    "check_name",
    "default_threshold",
    "judge",
    "judge_key",
    "metric_direction",
    "metric_key",
    "metric_value_problem",
    "pair_name",
    "parse_metric_key",
    "relative_delta",
]

Direction = Literal["lower", "higher"]
Verdict = Literal["regressed", "improved", "unchanged", "changed"]
NamePart = Literal["suite", "pattern", "block", "pair", "metric"]
Level = Literal["block", "pattern", "pair"]
Domain = Literal["positive", "non_negative", "fraction", "finite"]

PAIR_SEPARATOR: Final = "+"
"""Joins the two block names of a pair key (``ag+rs``); no block name can contain it."""

_NAME_CHARS = r"[A-Za-z0-9_.-]+"
# A sweep point's suffix, as the loader writes it: "ar_sweep[size=4M]" or "[size=4M,dtype=bf16]".
_SWEEP_SUFFIX = r"\[[A-Za-z0-9_.,=+-]+\]"
_PART_RES: Final[dict[str, re.Pattern[str]]] = {
    "suite": re.compile(_NAME_CHARS),
    "pattern": re.compile(rf"{_NAME_CHARS}(?:{_SWEEP_SUFFIX})?"),
    "block": re.compile(_NAME_CHARS),
    "pair": re.compile(rf"{_NAME_CHARS}\+{_NAME_CHARS}"),
    "metric": re.compile(_NAME_CHARS),
}
_PART_HINTS: Final[dict[str, str]] = {
    "suite": "letters, digits and _ . -",
    "pattern": "letters, digits and _ . -, optionally followed by a sweep suffix like [size=4M]",
    "block": "letters, digits and _ . -",
    "pair": "two block names joined by +, like ag+rs",
    "metric": "letters, digits and _ . -",
}


@dataclass(frozen=True, kw_only=True)
class Threshold:
    """How large a change in the worse direction must be before it counts as a regression."""

    kind: Literal["relative", "absolute"]
    """``relative``: a fraction of the control value; ``absolute``: in the metric's own unit."""
    value: float
    """0.05 means 5 % for ``relative``; 0 for ``absolute`` means any worsening counts."""

    def __post_init__(self) -> None:
        if self.kind not in ("relative", "absolute"):
            raise ValueError(f"threshold kind must be 'relative' or 'absolute', got {self.kind!r}")
        if isinstance(self.value, bool) or not math.isfinite(self.value) or self.value < 0:
            raise ValueError(f"threshold value must be a finite number >= 0, got {self.value!r}")

    def with_value(self, value: float) -> Threshold:
        """The same kind of threshold with another value (used for user overrides)."""
        return replace(self, value=float(value))

    def describe(self) -> str:
        """Short text for tables: ``5%`` or ``abs 0``."""
        if self.kind == "relative":
            return f"{self.value * 100:g}%"
        return f"abs {self.value:g}"


@dataclass(frozen=True, kw_only=True)
class MetricSpec:
    """One known metric: the level it belongs to, which way is better, and its default threshold."""

    name: str
    level: Level
    direction: Direction | None
    """None: descriptive, neither way is better; a change past the threshold is ``changed``."""
    threshold: Threshold
    description: str
    domain: Domain = "finite"
    """Values the metric can take: ``positive`` (> 0), ``non_negative``, ``fraction`` (in
    [0, 1]) or any ``finite`` number; anything else is invalid, never judged."""


def _rel(value: float) -> Threshold:
    return Threshold(kind="relative", value=value)


def _abs(value: float) -> Threshold:
    return Threshold(kind="absolute", value=value)


# Averages, sums and bandwidths move little between identical runs: 5 %. Tails, extremes,
# skews and ratios of two measurements are noisier: 10 %. Fractions in [0, 1] can sit near
# zero, where any relative threshold fires on noise, so they use 0.05 absolute (5 points).
_AVG = _rel(0.05)
_TAIL = _rel(0.10)
_FRACTION = _abs(0.05)
_TABLE: Final[tuple[tuple[str, Level, Direction | None, Threshold, str], ...]] = (
    # (name, level, better direction, default threshold, meaning)
    ("latency_avg_us", "block", "lower", _AVG, "mean of the per-iteration max-over-ranks latency"),
    ("latency_min_us", "block", "lower", _TAIL, "smallest iteration latency"),
    ("latency_max_us", "block", "lower", _TAIL, "largest iteration latency"),
    ("latency_p50_us", "block", "lower", _AVG, "median iteration latency (nearest rank)"),
    ("latency_p99_us", "block", "lower", _TAIL, "99th-percentile latency (nearest rank)"),
    ("algbw_gbps", "block", "higher", _AVG, "size / avg latency, GB = 1e9 bytes"),
    ("busbw_gbps", "block", "higher", _AVG, "algbw times the collective's bus factor"),
    ("tflops", "block", "higher", _AVG, "GEMM rate, 2mnk / avg latency, 1e12 FLOP/s"),
    ("isolated_latency_avg_us", "block", "lower", _AVG, "mean latency of the block run alone"),
    ("slowdown", "block", "lower", _TAIL, "overlapped avg / isolated avg latency"),
    ("wrong_elements", "block", "lower", _abs(0.0), "elements that failed check mode"),
    ("start_skew_us", "block", "lower", _TAIL, "spread of the block's start across ranks"),
    ("duration_spread_us", "block", "lower", _TAIL, "spread of per-rank mean durations"),
    ("makespan_avg_us", "pattern", "lower", _AVG, "mean of last end - first start"),
    ("makespan_p99_us", "pattern", "lower", _TAIL, "99th-percentile makespan"),
    ("serial_us", "pattern", "lower", _AVG, "sum of the blocks' isolated latencies"),
    ("ideal_us", "pattern", "lower", _AVG, "critical path of isolated latencies (perfect overlap)"),
    ("overlap_efficiency", "pattern", "higher", _FRACTION, "(serial-makespan)/(serial-ideal)"),
    ("shared_busbw_gbps", "pattern", "higher", _AVG, "all collectives' bus bytes / makespan"),
    ("comm_compute_overlap", "pattern", "higher", _FRACTION, "|comm & compute| / |comm|"),
    ("lane_skew_p50_us", "pattern", "lower", _TAIL, "median gap between the lanes' first kernels"),
    ("lane_skew_p99_us", "pattern", "lower", _TAIL, "p99 gap between the lanes' first kernels"),
    ("lane_skew_max_us", "pattern", "lower", _TAIL, "largest gap between the lanes' first kernels"),
    ("gate_skew_p50_us", "pattern", "lower", _TAIL, "median spread of the ranks' gate openings"),
    ("gate_skew_max_us", "pattern", "lower", _TAIL, "largest spread of the ranks' gate openings"),
    # Descriptive: blocks that overlap more are not better or worse (two blocks on one lane
    # are meant not to), so no direction; a move of 5 points either way is reported.
    ("pairwise_overlap", "pair", None, _FRACTION, "|A & B| / min(|A|, |B|) of two blocks"),
)
# What a measured value can be. Latencies, bandwidths, rates and their ratios are > 0 whenever
# they were measured at all (an untimed block has no value, not a 0); counts and skews are
# >= 0; overlap fractions lie in [0, 1]; overlap efficiency is any number (below 0: slower than
# serial; above 1: beat the ideal).
_DOMAINS: Final[Mapping[str, Domain]] = MappingProxyType(
    {
        **dict.fromkeys(
            (
                "latency_avg_us",
                "latency_min_us",
                "latency_max_us",
                "latency_p50_us",
                "latency_p99_us",
                "algbw_gbps",
                "busbw_gbps",
                "tflops",
                "isolated_latency_avg_us",
                "slowdown",
                "makespan_avg_us",
                "makespan_p99_us",
                "serial_us",
                "ideal_us",
                "shared_busbw_gbps",
            ),
            "positive",
        ),
        **dict.fromkeys(
            (
                "wrong_elements",
                "start_skew_us",
                "duration_spread_us",
                "lane_skew_p50_us",
                "lane_skew_p99_us",
                "lane_skew_max_us",
                "gate_skew_p50_us",
                "gate_skew_max_us",
            ),
            "non_negative",
        ),
        **dict.fromkeys(("comm_compute_overlap", "pairwise_overlap"), "fraction"),
        "overlap_efficiency": "finite",
    }
)
assert set(_DOMAINS) == {row[0] for row in _TABLE}, "every known metric states its domain"
_SPECS: Final[tuple[MetricSpec, ...]] = tuple(
    MetricSpec(
        name=name,
        level=level,
        direction=direction,
        threshold=threshold,
        description=text,
        domain=_DOMAINS[name],
    )
    for name, level, direction, threshold, text in _TABLE
)

BLOCK_METRICS: Final[Mapping[str, MetricSpec]] = MappingProxyType(
    {s.name: s for s in _SPECS if s.level == "block"}
)
"""Known per-block metrics, by name."""
PATTERN_METRICS: Final[Mapping[str, MetricSpec]] = MappingProxyType(
    {s.name: s for s in _SPECS if s.level == "pattern"}
)
"""Known per-pattern metrics, by name."""
PAIR_METRICS: Final[Mapping[str, MetricSpec]] = MappingProxyType(
    {s.name: s for s in _SPECS if s.level == "pair"}
)
"""Known metrics of a pair of blocks of a pattern, by name."""
METRICS: Final[Mapping[str, MetricSpec]] = MappingProxyType({s.name: s for s in _SPECS})
"""Every known metric, by name."""

UNKNOWN_DIRECTION_THRESHOLD: Final[Threshold] = _rel(0.10)
"""Two-sided threshold for a metric whose better direction cannot be told from its name."""

# Name tokens of tail, extreme and spread statistics: noisier, so they get the 10 % default.
_NOISY_TOKENS: Final[frozenset[str]] = frozenset({"p99", "max", "min", "skew", "stdev"})


@dataclass(frozen=True, kw_only=True)
class MetricKey:
    """A parsed metric key; ``block`` and ``pair`` are None for a pattern-level metric, and
    ``pair`` is (block_a, block_b) for a metric of two blocks (then ``block`` is None)."""

    suite: str
    pattern: str
    block: str | None
    metric: str
    pair: tuple[str, str] | None = None

    def __str__(self) -> str:
        return metric_key(self.suite, self.pattern, self.block, self.metric, pair=self.pair)

    @property
    def level(self) -> Level:
        """``block``, ``pair`` or ``pattern``."""
        if self.pair is not None:
            return "pair"
        return "pattern" if self.block is None else "block"


def check_name(part: NamePart, value: object) -> str:
    """Return ``value`` when it is a valid ``part`` of a metric key; else raise ValueError."""
    regex = _PART_RES.get(part)
    if regex is None:
        raise ValueError(f"unknown key part {part!r}; expected one of {sorted(_PART_RES)}")
    if not isinstance(value, str) or not regex.fullmatch(value):
        raise ValueError(
            f"invalid {part} name {value!r} in a metric key: expected {_PART_HINTS[part]}"
        )
    return value


def pair_name(block_a: str, block_b: str) -> str:
    """``block_a+block_b``: the third part of a pair key; ValueError for an invalid name."""
    return PAIR_SEPARATOR.join((check_name("block", block_a), check_name("block", block_b)))


def metric_key(
    suite: str,
    pattern: str,
    block: str | None,
    metric: str,
    *,
    pair: tuple[str, str] | None = None,
) -> str:
    """Build ``suite/pattern/block/metric``, ``suite/pattern/a+b/metric`` for ``pair=(a, b)``,
    or ``suite/pattern/metric`` when both are None."""
    parts = [check_name("suite", suite), check_name("pattern", pattern)]
    if pair is not None:
        if block is not None:
            raise ValueError(f"a metric key has a block or a pair, not both: {block!r}, {pair!r}")
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ValueError(f"invalid pair {pair!r} in a metric key: expected (block_a, block_b)")
        parts.append(pair_name(*pair))
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


def metric_direction(metric: str) -> Direction:
    """``lower`` or ``higher`` is better; unknown names go by unit suffix, else ValueError
    (also for a known descriptive metric, which has no better direction)."""
    spec = METRICS.get(metric)
    if spec is not None and spec.direction is None:
        raise ValueError(
            f"{metric} is descriptive: neither lower nor higher is better "
            "(judge_key reports a change past its threshold either way as 'changed')"
        )
    if spec is not None:
        return spec.direction
    if metric.endswith("_us"):
        return "lower"
    if metric.endswith("_gbps") or metric.endswith("tflops"):
        return "higher"
    raise ValueError(
        f"unknown metric {metric!r}: cannot tell whether lower or higher is better "
        f"(known: {', '.join(METRICS)}; or end the name in _us, _gbps or tflops)"
    )


def default_threshold(metric: str) -> Threshold:
    """Default regression threshold of ``metric`` (see the table in docs/torchbench.md)."""
    spec = METRICS.get(metric)
    if spec is not None:
        return spec.threshold
    metric_direction(metric)  # raises for a name whose direction is unknown
    if _NOISY_TOKENS.intersection(metric.split("_")):
        return _TAIL
    return _AVG


_DOMAIN_TEXT: Final[Mapping[Domain, str]] = MappingProxyType(
    {
        "positive": "must be a finite number > 0",
        "non_negative": "must be a finite number >= 0",
        "fraction": "must be a number in [0, 1]",
        "finite": "must be a finite number",
    }
)


def metric_value_problem(metric: str, value: float) -> str | None:
    """Why ``value`` cannot be a value of ``metric`` (NaN, infinite, or outside the metric's
    domain: a latency <= 0), or None when it can. Unknown metrics need only be finite."""
    spec = METRICS.get(metric)
    domain: Domain = "finite" if spec is None else spec.domain
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return _DOMAIN_TEXT[domain]
    ok = math.isfinite(value) and (
        domain == "finite"
        or (domain == "positive" and value > 0)
        or (domain == "non_negative" and value >= 0)
        or (domain == "fraction" and 0 <= value <= 1)
    )
    return None if ok else _DOMAIN_TEXT[domain]


def relative_delta(control: float, treatment: float) -> float:
    """(treatment - control) / |control|; ±inf when control is 0 and treatment is not, else 0."""
    _check_finite(control, "control")
    _check_finite(treatment, "treatment")
    diff = treatment - control
    if control == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / abs(control)


def judge(
    metric: str, control: float, treatment: float, threshold: Threshold | None = None
) -> Verdict:
    """Whether ``treatment`` regressed, improved or stayed within ``threshold`` of ``control``.

    A change counts only when strictly larger than the threshold, in the metric's direction.
    """
    direction = metric_direction(metric)
    threshold = default_threshold(metric) if threshold is None else threshold
    _check_finite(control, "control")
    _check_finite(treatment, "treatment")
    # worse > 0 means the treatment is worse than the control, whatever the direction.
    worse = treatment - control if direction == "lower" else control - treatment
    if threshold.kind == "absolute":
        change = worse
    elif control == 0:
        change = 0.0 if worse == 0 else math.copysign(math.inf, worse)
    else:
        change = worse / abs(control)
    if change > threshold.value:
        return "regressed"
    if -change > threshold.value:
        return "improved"
    return "unchanged"


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """The verdict on one key, with what it was judged by."""

    key: str
    control: float
    treatment: float
    delta: float
    """Relative change (treatment - control) / |control|; ±inf when the control is 0."""
    direction: Direction | None
    """None when the metric's better direction is unknown (then any large change is reported)."""
    threshold: Threshold
    verdict: Verdict


def judge_key(
    key: str,
    control: float,
    treatment: float,
    *,
    threshold_overrides: Mapping[str, float] | None = None,
) -> Judgement:
    """Judge one metric key; ``threshold_overrides`` maps metric names to new threshold values.

    A key whose metric has no known direction is judged two-sided: a change past its
    threshold (a descriptive metric's own, else UNKNOWN_DIRECTION_THRESHOLD; or the override)
    is ``changed``, never silently ignored.
    """
    metric = _metric_name_of(key)
    override = None if threshold_overrides is None else threshold_overrides.get(metric)
    delta = relative_delta(control, treatment)
    try:
        direction: Direction | None = metric_direction(metric)
    except ValueError:
        direction = None
    if direction is None:
        spec = METRICS.get(metric)  # a descriptive metric keeps its own threshold
        threshold = UNKNOWN_DIRECTION_THRESHOLD if spec is None else spec.threshold
        if override is not None:
            threshold = threshold.with_value(override)
        change = abs(treatment - control) if threshold.kind == "absolute" else abs(delta)
        verdict: Verdict = "changed" if change > threshold.value else "unchanged"
    else:
        threshold = default_threshold(metric)
        if override is not None:
            threshold = threshold.with_value(override)
        verdict = judge(metric, control, treatment, threshold)
    return Judgement(
        key=key,
        control=control,
        treatment=treatment,
        delta=delta,
        direction=direction,
        threshold=threshold,
        verdict=verdict,
    )


def _metric_name_of(key: str) -> str:
    """The metric part of a well-formed key, or the text after the last '/' of any other key."""
    try:
        return parse_metric_key(key).metric
    except ValueError:
        return key.rsplit("/", 1)[-1]


def _check_finite(value: float, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{what} value must be a finite number, got {value!r}")
