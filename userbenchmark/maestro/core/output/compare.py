"""Compare two maestro result files metric by metric (the ``compare`` subcommand's library side).

Reads TorchBench metrics JSON, maestro's results.json / patterns.json / pairs.json records or a
whole ``--output-dir`` (through the results frames of core/output/results.py), normalises each
to ``{metric key: float}`` and judges every common key with core/output/metric_keys.py. Any
file, however malformed, ends in CompareError naming it, never in another exception.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from ...errors import MaestroError
from .metric_keys import (
    METRICS,
    Direction,
    Threshold,
    judge_key,
    metric_direction,
    metric_value_problem,
    parse_metric_key,
)
from .results import (
    Results,
    ResultsError,
    describe,
    load_results,
    metrics_from_results,
    read_json_file,
    results_from_records,
)
from .settings import setting_differences, stack_line

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
    """A file cannot be compared (missing, not JSON, wrong shape, an invalid value, nothing in
    common); the message names the file."""


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
    stack_a: str = "unknown"
    stack_b: str = "unknown"
    """What each run ran on (versions, device), from its settings."""
    setting_differences: tuple[str, ...] = ()
    """Measurement settings both runs record with different values (compared anyway)."""
    unrecorded: tuple[str, ...] = ()
    """Sides (A, B) whose settings are not known, so they could not be checked."""

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
    """Read one file (or an ``--output-dir``) into ``{metric key: float}``; CompareError,
    naming the file, when it cannot be used or holds a value no metric can take."""
    path = Path(path)
    try:
        if path.is_dir():
            metrics = _from_output_dir(path)
        else:
            doc = read_json_file(path)
            if isinstance(doc, dict) and "metrics" in doc:
                metrics = _from_metrics_json(doc, path)
            elif isinstance(doc, list):
                metrics = _from_results(results_from_records(doc, str(path)), path)
            else:
                raise CompareError(
                    f"{path}: expected a TorchBench metrics JSON object "
                    '({"name", "environ", "metrics"}) or a list of maestro result records '
                    "(results.json, patterns.json, pairs.json)"
                )
    except ResultsError as exc:
        raise CompareError(_clip(str(exc))) from None
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


class SettingsDiffer(CompareError):
    """The two runs measured different things (their measurement settings differ)."""

    def __init__(self, path_a: str, path_b: str, differences: list[str]) -> None:
        shown = differences[:20]
        more = f"\n  ... and {len(differences) - 20} more" if len(differences) > 20 else ""
        super().__init__(
            f"{path_a} and {path_b} were measured with different settings, so their numbers "
            "do not compare:\n  " + "\n  ".join(shown) + more + "\nCompare them anyway with "
            "--force (the table then says so)."
        )
        self.differences = tuple(differences)


def load_settings(path: str | Path) -> dict[str, Any] | None:
    """A run's settings: a metrics file's ``environ``, or ``run.json`` beside results files
    (in an ``--output-dir``); None when the run records none (older files)."""
    path = Path(path)
    if path.is_dir():
        candidate = path / "run.json"
    elif path.name in ("results.json", "patterns.json", "pairs.json"):
        candidate = path.with_name("run.json")
    else:
        try:
            doc = read_json_file(path)
        except ResultsError as exc:
            raise CompareError(_clip(str(exc))) from None
        environ = doc.get("environ") if isinstance(doc, dict) else None
        return dict(environ) if isinstance(environ, dict) else None
    if not candidate.is_file():
        return None
    try:
        doc = read_json_file(candidate)
    except ResultsError as exc:
        raise CompareError(_clip(str(exc))) from None
    return dict(doc) if isinstance(doc, dict) else None


def compare_files(
    path_a: str | Path,
    path_b: str | Path,
    *,
    threshold_overrides: Mapping[str, float] | None = None,
    force: bool = False,
) -> CompareResult:
    """Load both files and compare B against A.

    CompareError when they share no metric key; SettingsDiffer when their measurement
    settings differ, unless ``force`` (then the result lists the differences).
    """
    settings_a, settings_b = load_settings(path_a), load_settings(path_b)
    differences: list[str] = []
    if settings_a is not None and settings_b is not None:
        differences = setting_differences(settings_a, settings_b)
        if differences and not force:
            raise SettingsDiffer(str(path_a), str(path_b), differences)
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
    return CompareResult(
        path_a=str(path_a),
        path_b=str(path_b),
        rows=rows,
        stack_a=stack_line(settings_a or {}),
        stack_b=stack_line(settings_b or {}),
        setting_differences=tuple(differences),
        unrecorded=tuple(side for side, s in (("A", settings_a), ("B", settings_b)) if s is None),
    )


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
    head = [f"A: {result.path_a} ({result.stack_a})", f"B: {result.path_b} ({result.stack_b})"]
    if result.setting_differences:
        head.append(
            "WARNING: compared with --force although the runs' settings differ: "
            + "; ".join(result.setting_differences)
        )
    if result.unrecorded:
        head.append(
            f"note: {' and '.join(result.unrecorded)} record no settings (older files): "
            "that they measured the same thing was not checked"
        )
    return "\n".join(head) + f"\n{text}\n{summary}"


def exit_code(result: CompareResult) -> int:
    """1 when any metric regressed past its threshold, else 0."""
    return 1 if result.regressions else 0


def _from_output_dir(path: Path) -> dict[str, float]:
    if not (path / "results.json").exists():
        raise CompareError(
            f"{path}: is a directory without maestro results (results.json); expected a "
            "metrics JSON, a results.json / patterns.json / pairs.json, or an --output-dir"
        )
    return _from_results(load_results(path), path)


def _from_metrics_json(doc: Mapping[str, Any], path: Path) -> dict[str, float]:
    """A metrics file's ``metrics``: every value must be a finite number its metric can take
    (the file never holds 'not applicable': such metrics are left out of it)."""
    metrics = doc["metrics"]
    if not isinstance(metrics, dict):
        raise CompareError(f"{path}: 'metrics' must be an object mapping metric keys to numbers")
    out: dict[str, float] = {}
    for key, value in metrics.items():
        try:
            metric = parse_metric_key(key).metric
        except ValueError as exc:
            raise CompareError(_clip(f"{path}: {exc}")) from None
        where = f"{path}: metrics[{key!r}]"
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise CompareError(f"{where}: expected a number, got {describe(value)}")
        try:
            number = float(value)
        except OverflowError:
            raise CompareError(f"{where}: invalid value {describe(value)}: out of range") from None
        out[key] = _checked(metric, number, where)
    return out


def _from_results(results: Results, path: Path) -> dict[str, float]:
    """Metrics of result tables: the same keys as the run's metrics file (known metrics only;
    empty, null or NaN cells are 'not applicable' and left out)."""
    try:
        metrics = metrics_from_results(results)
    except ValueError as exc:
        raise CompareError(_clip(f"{path}: {exc}")) from None
    for key, value in metrics.items():
        _checked(parse_metric_key(key).metric, value, f"{path}: {key}")
    return metrics


def _checked(metric: str, value: float, where: str) -> float:
    """``value`` when ``metric`` can take it; else CompareError: an impossible value (a NaN,
    infinite or non-positive latency) is reported as invalid, never judged."""
    problem = metric_value_problem(metric, value)
    if problem is not None:
        raise CompareError(f"{where}: invalid value {value!r} for {metric}: {problem}")
    return value


def _clip(message: str, limit: int = 500) -> str:
    """A message cut to ``limit`` characters (a malformed key can be megabytes long)."""
    return message if len(message) <= limit else message[:limit] + "... (cut)"


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
