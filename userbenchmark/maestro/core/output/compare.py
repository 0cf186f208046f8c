"""Compare two maestro result files metric by metric (the ``compare`` subcommand's library side).

Reads TorchBench metrics JSON or maestro's results.json / patterns.json records, normalises both
to ``{metric key: float}`` and judges every common key with core.metric_keys.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from ...errors import MaestroError
from .metric_keys import (
    BLOCK_METRICS,
    METRICS,
    PATTERN_METRICS,
    Direction,
    Threshold,
    judge_key,
    metric_direction,
    metric_key,
    parse_metric_key,
)

__all__ = [
    "CompareError",
    "CompareResult",
    "CompareRow",
    "compare_files",
    "compare_metrics",
    "exit_code",
    "format_compare_table",
    "load_metrics",
    "parse_threshold_overrides",
]


class CompareError(MaestroError, ValueError):
    """A file cannot be compared (missing, not JSON, wrong shape, nothing in common)."""


@dataclass(frozen=True, kw_only=True)
class CompareRow:
    """One metric key of the comparison; ``a`` or ``b`` is None when the key is on one side only."""

    key: str
    a: float | None
    b: float | None
    delta: float | None
    """Relative change (b - a) / |a|; ±inf when a is 0; None for a one-sided key."""
    direction: Direction | None
    threshold: Threshold | None
    verdict: str
    """regressed, improved, unchanged, changed (direction unknown), only in A, only in B."""


@dataclass(frozen=True, kw_only=True)
class CompareResult:
    """Every key of both files, sorted by key."""

    path_a: str
    path_b: str
    rows: tuple[CompareRow, ...]

    @property
    def regressions(self) -> tuple[CompareRow, ...]:
        return tuple(r for r in self.rows if r.verdict == "regressed")

    def count(self, verdict: str) -> int:
        """Number of rows with ``verdict``."""
        return sum(1 for r in self.rows if r.verdict == verdict)


def parse_threshold_overrides(items: Iterable[str]) -> dict[str, float]:
    """Parse ``METRIC=FRACTION`` strings (``latency_p99_us=0.2`` or ``=20%``) into a dict."""
    overrides: dict[str, float] = {}
    for item in items:
        metric, sep, text = item.partition("=")
        metric, text = metric.strip(), text.strip()
        if not sep or not metric or not text:
            raise CompareError(
                f"--threshold {item!r}: expected METRIC=FRACTION, e.g. busbw_gbps=0.1"
            )
        try:
            value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise CompareError(f"--threshold {item!r}: {text!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise CompareError(f"--threshold {item!r}: expected a finite value >= 0")
        overrides[metric] = value
    return overrides


def load_metrics(path: str | Path) -> dict[str, float]:
    """Read one file into ``{metric key: float}``; CompareError when it cannot be used."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CompareError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CompareError(f"{path}: is a directory, expected a JSON file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CompareError(f"{path}: cannot read: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: not JSON ({exc})") from None

    if isinstance(doc, dict) and "metrics" in doc:
        metrics = _from_metrics_json(doc, path)
    elif isinstance(doc, list):
        metrics = _from_records(doc, path)
    else:
        raise CompareError(
            f"{path}: expected a TorchBench metrics JSON object "
            '({"name", "environ", "metrics"}) or a list of maestro result records '
            "(results.json, patterns.json)"
        )
    if not metrics:
        raise CompareError(f"{path}: holds no metrics")
    return metrics


def compare_metrics(
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    threshold_overrides: Mapping[str, float] | None = None,
) -> tuple[CompareRow, ...]:
    """Judge every key of ``a`` and ``b`` (B against A); one row per key, sorted by key."""
    rows = []
    for key in sorted(a.keys() | b.keys()):
        if key not in b:
            rows.append(_one_sided(key, a=a[key], b=None, verdict="only in A"))
        elif key not in a:
            rows.append(_one_sided(key, a=None, b=b[key], verdict="only in B"))
        else:
            j = judge_key(key, a[key], b[key], threshold_overrides=threshold_overrides)
            rows.append(
                CompareRow(
                    key=key,
                    a=j.control,
                    b=j.treatment,
                    delta=j.delta,
                    direction=j.direction,
                    threshold=j.threshold,
                    verdict=j.verdict,
                )
            )
    return tuple(rows)


def compare_files(
    path_a: str | Path,
    path_b: str | Path,
    *,
    threshold_overrides: Mapping[str, float] | None = None,
) -> CompareResult:
    """Load both files and compare B against A; CompareError when they share no metric key."""
    a = load_metrics(path_a)
    b = load_metrics(path_b)
    if not a.keys() & b.keys():
        raise CompareError(
            f"{path_a} and {path_b} have no metric key in common "
            f"(suites {_suites(a)} vs {_suites(b)})"
        )
    if threshold_overrides:
        _check_overrides(threshold_overrides, a.keys() | b.keys())
    rows = compare_metrics(a, b, threshold_overrides=threshold_overrides)
    return CompareResult(path_a=str(path_a), path_b=str(path_b), rows=rows)


def format_compare_table(result: CompareResult) -> str:
    """A table (key, A, B, delta %, direction, threshold, verdict) and a one-line summary."""
    table = [
        [
            row.key,
            _fmt_value(row.a),
            _fmt_value(row.b),
            _fmt_delta(row.delta),
            row.direction or "?",
            row.threshold.describe() if row.threshold else "",
            row.verdict,
        ]
        for row in result.rows
    ]
    headers = ["key", "A", "B", "delta %", "direction", "threshold", "verdict"]
    align = ("left", "right", "right", "right", "left", "left", "left")
    text = tabulate(table, headers=headers, disable_numparse=True, colalign=align)
    verdicts = ("regressed", "improved", "unchanged", "changed", "only in A", "only in B")
    summary = ", ".join(f"{result.count(v)} {v}" for v in verdicts if result.count(v))
    return f"A: {result.path_a}\nB: {result.path_b}\n{text}\n{summary}"


def exit_code(result: CompareResult) -> int:
    """1 when any metric regressed past its threshold, else 0."""
    return 1 if result.regressions else 0


def _from_metrics_json(doc: Mapping[str, Any], path: Path) -> dict[str, float]:
    metrics = doc["metrics"]
    if not isinstance(metrics, dict):
        raise CompareError(f"{path}: 'metrics' must be an object mapping metric keys to numbers")
    out: dict[str, float] = {}
    for key, value in metrics.items():
        try:
            parse_metric_key(key)
        except ValueError as exc:
            raise CompareError(f"{path}: {exc}") from None
        number = _number(value, f"{path}: metrics[{key!r}]")
        if number is not None:
            out[key] = number
    return out


def _from_records(records: list[Any], path: Path) -> dict[str, float]:
    """Flatten result records: block rows (with a ``block``) and pattern rows (without).

    Only the known metrics of each level are taken, so a run's results.json/patterns.json
    give the same keys as its metrics JSON; descriptors and diagnostics are skipped.
    """
    out: dict[str, float] = {}
    for index, record in enumerate(records):
        where = f"{path}: record {index}"
        if not isinstance(record, dict):
            raise CompareError(f"{where}: expected an object, got {type(record).__name__}")
        suite, pattern = record.get("suite"), record.get("pattern")
        if not isinstance(suite, str) or not isinstance(pattern, str):
            raise CompareError(f"{where}: needs string 'suite' and 'pattern' columns")
        block = record.get("block")
        if block in (None, ""):
            block, known = None, PATTERN_METRICS
        else:
            known = BLOCK_METRICS
        for column, value in record.items():
            if column not in known:
                continue
            number = _number(value, f"{where}: {column}")
            if number is None:
                continue
            try:
                key = metric_key(suite, pattern, block, column)
            except ValueError as exc:
                raise CompareError(f"{where}: {exc}") from None
            if key in out:
                raise CompareError(f"{where}: duplicate row for {key}")
            out[key] = number
    return out


def _number(value: Any, where: str) -> float | None:
    """The value as float; None when empty or NaN (not applicable); CompareError otherwise."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise CompareError(f"{where}: expected a number, got {value!r}")
    number = float(value)
    if math.isnan(number):
        return None
    if math.isinf(number):
        raise CompareError(f"{where}: infinite value")
    return number


def _check_overrides(overrides: Mapping[str, float], keys: Iterable[str]) -> None:
    for metric, value in overrides.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise CompareError(f"--threshold {metric}: expected a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise CompareError(f"--threshold {metric}: expected a finite value >= 0, got {value}")
    present = {parse_metric_key(k).metric for k in keys}
    unknown = sorted(set(overrides) - present - set(METRICS))
    if unknown:
        raise CompareError(
            f"--threshold for unknown metric(s) {', '.join(unknown)}; "
            f"metrics in these files: {', '.join(sorted(present))}"
        )


def _suites(metrics: Mapping[str, float]) -> list[str]:
    return sorted({parse_metric_key(k).suite for k in metrics})


def _one_sided(key: str, *, a: float | None, b: float | None, verdict: str) -> CompareRow:
    try:
        direction: Direction | None = metric_direction(parse_metric_key(key).metric)
    except ValueError:
        direction = None
    return CompareRow(
        key=key, a=a, b=b, delta=None, direction=direction, threshold=None, verdict=verdict
    )


def _fmt_value(value: float | None) -> str:
    # 6 significant digits: sub-microsecond latencies never print as 0.
    return "" if value is None else f"{value:.6g}"


def _fmt_delta(delta: float | None) -> str:
    if delta is None:
        return ""
    if math.isinf(delta):
        return "+inf" if delta > 0 else "-inf"
    return f"{delta * 100:+.2f}%"
