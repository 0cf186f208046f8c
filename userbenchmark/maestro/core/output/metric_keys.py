"""Metric keys, and what each metric is (read from its record field, core/analysis/records.py). A
key is ``suite/pattern/block/metric``, ``suite/pattern/metric`` or ``suite/pattern/a+b/metric`` (a
pair of blocks); a metric's 95 % interval is ``<metric>_ci_low``, ``_ci_high``, ``_ci_df``."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from types import MappingProxyType
from typing import Final, Literal

from ..analysis.records import RECORDS, Direction, Domain, Level, Metric, metrics_of

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
    known = METRICS.get(metric)
    if known is not None:
        return known
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
        if self.pair is not None:
            return "pair"
        return "pattern" if self.block is None else "block"


def check_name(part: NamePart, value: object) -> str:
    """``value`` when it is a valid ``part`` of a metric key; else ValueError."""
    if part not in _PARTS:
        raise ValueError(f"unknown key part {part!r}; expected one of {sorted(_PARTS)}")
    regex, hint = _PARTS[part]
    if not isinstance(value, str) or not regex.fullmatch(value):
        raise ValueError(f"invalid {part} name {value!r} in a metric key: expected {hint}")
    return value


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
