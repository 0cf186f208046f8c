"""Metric keys (``suite/pattern[/block or a+b]/metric``), what each metric is (its record field),
and the noise model behind every A/B verdict: Welch's t over both runs' intervals, Bonferroni over
the metrics judged at once, past the metric's floor or window spread (docs/torchbench.md)."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from types import MappingProxyType
from typing import Final, Literal

import numpy as np

from ...blocks.registry import registered_ops
from ..analysis.records import RECORDS, Direction, Domain, Level, Metric, metrics_of
from ..analysis.stats import t_quantile
from ..analysis.verdict import beyond_noise, independent_change, paired_change

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
a level that wanders inside a run moves between runs too (BENCHMARKS.md)."""
PROCESSES_FLOOR: Final = 0.01
"""A relative metric's floor when both runs hold two or more processes: their intervals are
made between processes, so only a change too small to act on is left out."""
PROCESS_FLOORS: Final[Mapping[str, float]] = MappingProxyType(
    {"comm": 6.0, "compute": 1.5, "other": 0.05, "absolute": 0.3}
)
"""A metric's floor in a one-process run on CPU (profiler ``host``), by its block's category or
in its unit for an absolute one: the spread between processes (docs/torchbench.md has how)."""


@dataclass(frozen=True, kw_only=True)
class Noise:
    """What two runs' intervals hold: the spread between processes (both runs of two or more
    processes), or one process each, judged with ``process_floors`` (key: fraction)."""

    between_processes: bool = False
    process_floors: Mapping[str, float] = field(default_factory=dict)


def noise_of(
    environ_a: Mapping[str, object] | None,
    environ_b: Mapping[str, object] | None,
    keys: Iterable[str],
) -> Noise:
    """The noise two runs are judged against: between processes when both hold two or more,
    else on CPU (or an unsaid device) each key's :data:`PROCESS_FLOORS`, from the categories
    of the blocks the runs' settings list."""
    processes = [str((e or {}).get("processes", "1")) for e in (environ_a, environ_b)]
    if all(text.isdigit() and int(text) >= 2 for text in processes):
        return Noise(between_processes=True)
    environ = {**(environ_b or {}), **(environ_a or {})}
    if environ.get("profiler", "host") != "host":
        return Noise()
    widest = max(f for kind, f in PROCESS_FLOORS.items() if kind != "absolute")
    ops = registered_ops()
    floors: dict[str, dict[str, float]] = {}  # pattern: {block: floor}
    for name, value in environ.items():
        if name.startswith("block.") and "/" in name:
            unit = name.removeprefix("block.")
            op = str(value).split(" ", 1)[0].removeprefix("op=")
            kind = environ.get(f"category.{unit}") or getattr(ops.get(op), "category", "")
            pattern, _, block = unit.rpartition("/")
            floors.setdefault(pattern, {})[block] = PROCESS_FLOORS.get(str(kind), widest)
    out = {}
    for key in keys:
        parsed = parse_metric_key(key)
        blocks = floors.get(parsed.pattern, {})
        scope = [blocks.get(parsed.block, widest)] if parsed.block else list(blocks.values())
        absolute = spec_of(parsed.metric).absolute
        out[key] = PROCESS_FLOORS["absolute"] if absolute else max(scope, default=widest)
    return Noise(process_floors=out)


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
    low: float  # the change's interval at the family's level, on the change's scale; NaN: none
    high: float
    floor: float | None  # the one applied: a fraction (judged as log1p), or in the metric's unit
    absolute: bool
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
    noise: Noise | None = None,
) -> list[Judgement]:
    """Judge every key the two runs share (sorted) against ``noise`` (default: one process each,
    no process floor); ``floors`` overrides metrics' floors. The harness's diagnostics decide
    nothing unless ``judge_harness`` (nor count in the family)."""
    floors, noise = floors or {}, noise or Noise()
    keys = sorted(control.keys() & treatment.keys())
    metric = {key: key.rsplit("/", 1)[-1] for key in keys}  # a key's last part is its metric
    decides = {key: judge_harness or not spec_of(metric[key]).harness for key in keys}
    count = sum(
        decides[k] and _has_noise(control[k], treatment[k], metric[k], floors) for k in keys
    )
    level = 1 - FAMILY_ALPHA / max(count, 1)
    return [
        replace(_judge(key, control[key], treatment[key], level, floors, noise), decides=d)
        for key, d in decides.items()
    ]


def judge_paired(
    control: Mapping[str, Sequence[float]], treatment: Mapping[str, Sequence[float]]
) -> list[Judgement]:
    """Judge every key both runs hold (sorted), ``treatment`` against ``control`` paired by
    round (one value per round, each round a process of each): the change's interval is over
    the rounds, with the floors of runs of several processes. The harness decides nothing."""
    keys = control.keys() & treatment.keys()
    rounds = {k: (np.asarray(control[k], float), np.asarray(treatment[k], float)) for k in keys}
    specs = {key: spec_of(key.rsplit("/", 1)[-1]) for key in keys}
    judged = {
        key
        for key, spec in specs.items()
        for a, b in [rounds[key]]
        if spec.interval
        and len(a) == len(b) >= 2
        and np.isfinite([*a, *b]).all()
        and (spec.absolute or min(a.min(), b.min()) > 0)
    }
    level = 1 - FAMILY_ALPHA / max(1, sum(not specs[key].harness for key in judged))
    between = Noise(between_processes=True)
    out = []
    for key, spec in sorted(specs.items()):
        a, b = rounds[key]
        means = (Reading(value=float(a.mean())), Reading(value=float(b.mean())))
        judgement = _judge(key, *means, level, {}, between)  # exact or not judged
        if key in judged:
            moved = paired_change(a, b, absolute=spec.absolute, level=level)
            back = float if spec.absolute else _expm1  # float: the identity on floats
            beyond = beyond_noise(moved, judgement.floor or 0.0, absolute=spec.absolute)
            judgement = replace(
                judgement,
                change=back(moved.value),
                low=back(moved.low),
                high=back(moved.high),
                verdict=_way(spec.better, moved.value) if beyond else "within noise",
            )
        out.append(replace(judgement, decides=not spec.harness))
    return out


def _has_noise(a: Reading, b: Reading, metric: str, floors: Mapping[str, float]) -> bool:
    spec = spec_of(metric)
    return (
        floors.get(metric, spec.floor) is not None
        and not spec.exact
        and a.has_interval
        and b.has_interval
        and (spec.absolute or min(a.low, b.low) > 0)
    )


def _floor(key: str, spec: MetricSpec, floors: Mapping[str, float], noise: Noise) -> float | None:
    """The floor before the window spread: the user's, else the metric's, widened to its process
    floor in a one-process run; a relative one's narrowed to PROCESSES_FLOOR between processes."""
    if spec.name in floors or spec.floor is None or spec.exact or spec.harness:
        return floors.get(spec.name, spec.floor)
    if noise.between_processes:
        return spec.floor if spec.absolute else min(spec.floor, PROCESSES_FLOOR)
    return max(spec.floor, noise.process_floors.get(key, 0.0))


def _judge(
    key: str, a: Reading, b: Reading, level: float, floors: Mapping[str, float], noise: Noise
) -> Judgement:
    spec = spec_of(key.rsplit("/", 1)[-1])
    floor = _floor(key, spec, floors, noise)
    change = b.value - a.value if spec.absolute else _relative(a.value, b.value)
    low = high = math.nan
    verdict: Verdict = "not judged"
    if floor is not None and spec.exact:
        verdict = "unchanged" if abs(change) <= floor else _way(spec.better, change)
    elif floor is not None and _has_noise(a, b, spec.name, floors):
        to, back = (float, float) if spec.absolute else (math.log, _expm1)
        delta = to(b.value) - to(a.value)
        up = delta >= 0  # each run's interval on the side facing the other run
        half_a = to(a.high) - to(a.value) if up else to(a.value) - to(a.low)
        half_b = to(b.value) - to(b.low) if up else to(b.high) - to(b.value)
        se_a, se_b = half_a / t_quantile(0.975, a.df), half_b / t_quantile(0.975, b.df)
        moved = independent_change(delta, se_a, a.df, se_b, b.df, level=level)
        low, high = back(moved.low), back(moved.high)
        if not noise.between_processes:  # a level wandering inside a run moves between runs
            spread = WINDOW_SPREADS * max(_window_spread(a, to), _window_spread(b, to))
            floor = max(floor, back(spread))
        beyond = beyond_noise(moved, floor, absolute=spec.absolute)
        verdict = _way(spec.better, delta) if beyond else "within noise"
    return Judgement(
        key=key,
        control=a,
        treatment=b,
        change=change,
        low=low,
        high=high,
        floor=floor,
        absolute=spec.absolute,
        verdict=verdict,
    )


def _expm1(value: float) -> float:
    return math.expm1(min(value, 700.0))


def _window_spread(r: Reading, to: Callable[[float], float]) -> float:
    """The standard deviation of a run's window means, on the judged scale: its interval's
    standard error times the square root of its windows (degrees of freedom + 1)."""
    if not math.isfinite(r.df):
        return 0.0
    return (to(r.high) - to(r.low)) / 2 / t_quantile(0.975, r.df) * math.sqrt(r.df + 1)


def _relative(a: float, b: float) -> float:
    if a == 0:
        return 0.0 if b == 0 else math.copysign(math.inf, b)
    return (b - a) / abs(a)


def _way(better: Direction | None, change: float) -> Verdict:
    if better is None:
        return "changed"
    worse = change > 0 if better == "lower" else change < 0
    return "regressed" if worse else "improved"
