"""``compare``: two runs' files (metrics JSON, result records or an ``--output-dir``) as
``{metric key: float}``, every common key judged against both runs' noise (metric_keys.py). Any
file, however malformed, ends in CompareError naming it, never in another exception."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

from ...errors import MaestroError
from .metric_keys import (
    METRICS,
    REQUIRED_METRICS,
    Judgement,
    Reading,
    judge_all,
    metric_value_problem,
    parse_metric_key,
    readings,
    split_bound,
)
from .reporter import measurement_settings, setting_differences, stack_line
from .results import (
    TABLE_FILES,
    Results,
    ResultsError,
    describe,
    load_results,
    metrics_from_results,
    read_json_file,
    records_of,
    results_from_records,
)


class CompareError(MaestroError, ValueError):
    """A file cannot be compared (missing, not JSON, wrong shape, an invalid value, nothing in
    common); the message names the file."""


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


@dataclass(frozen=True, kw_only=True)
class CompareResult:
    """Every key of both files, sorted by key, and what the treatment lacks."""

    path_a: str
    path_b: str
    judgements: tuple[Judgement, ...]
    only_a: Mapping[str, float]
    only_b: Mapping[str, float]
    missing: tuple[str, ...] = ()  # patterns and blocks A has and B lacks: B did not measure them
    nan_in_a: Mapping[str, float] = field(default_factory=dict)
    nan_in_b: Mapping[str, float] = field(default_factory=dict)
    """Keys of a figure every timed block or pattern has (its latency, its makespan) that this run
    lacks (NaN) and the other has (its value kept here): a failure."""
    failures: tuple[str, ...] = ()  # patterns B's failures.json says failed
    stack_a: str = "unknown"  # what each run ran on (versions, device), from its settings
    stack_b: str = "unknown"
    setting_differences: tuple[str, ...] = ()  # compared under --force
    notes: tuple[str, ...] = ()  # what could not be checked, and why

    @property
    def regressions(self) -> tuple[Judgement, ...]:
        return tuple(j for j in self.judgements if j.verdict == "regressed" and j.decides)

    def count(self, verdict: str) -> int:
        return sum(1 for j in self.judgements if j.verdict == verdict and j.decides)


def parse_threshold_overrides(items: Iterable[str]) -> dict[str, float]:
    """Parse ``METRIC=FLOOR`` strings (``latency_p99_us=0.2`` or ``=20%``; an absolute metric's
    floor in its unit) into a dict."""
    overrides: dict[str, float] = {}
    for item in items:
        metric, sep, text = (part.strip() for part in item.partition("="))
        if not sep or not metric or not text:
            raise CompareError(f"--threshold {item!r}: expected METRIC=FLOOR, e.g. busbw_gbps=0.1")
        try:
            overrides[metric] = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise CompareError(f"--threshold {item!r}: {text!r} is not a number") from None
    _check_floors(overrides)
    return overrides


def load_metrics(path: str | Path) -> dict[str, float]:
    """One file (or an ``--output-dir``) as ``{metric key: float}``; CompareError naming it."""
    return _load_side(Path(path)).metrics


@dataclass(frozen=True, kw_only=True)
class _Side:
    """One run as compare sees it: ``settings`` from the metrics file's environ or run.json,
    ``table_settings`` what the results tables record (None for a metrics file)."""

    metrics: dict[str, float]
    settings: dict[str, Any] | None
    table_settings: dict[str, str] | None = None
    failures: tuple[str, ...] = ()
    note: str = ""


def _load_side(path: Path) -> _Side:
    try:
        doc = None if path.is_dir() else read_json_file(path)
        if isinstance(doc, dict) and "metrics" in doc:
            environ = doc.get("environ")
            side = _Side(
                metrics=_from_metrics_json(doc, path),
                settings=dict(environ) if isinstance(environ, dict) else None,
            )
        elif doc is None or isinstance(doc, list):
            side = _results_side(path, doc)
        else:
            raise CompareError(
                f"{path}: expected a TorchBench metrics JSON object "
                '({"name", "environ", "metrics"}) or a list of maestro result records '
                "(results.json, patterns.json, pairs.json)"
            )
        readings(side.metrics)
    except CompareError:
        raise
    except (ResultsError, ValueError) as exc:
        text = str(exc)
        message = text if text.startswith(str(path)) else f"{path}: {text}"
        # Clipped: a malformed key can be megabytes long.
        raise CompareError(
            message if len(message) <= 500 else message[:500] + "... (cut)"
        ) from None
    if not side.metrics:
        raise CompareError(f"{path}: holds no metrics")
    return side


def _results_side(path: Path, records: list[Any] | None) -> _Side:
    folder = path if records is None else path.parent
    if records is None:
        if not (path / "results.json").exists():
            raise CompareError(
                f"{path}: is a directory without maestro results (results.json); expected a "
                "metrics JSON, a results.json / patterns.json / pairs.json, or an --output-dir"
            )
        results = load_results(path)
    else:
        results = results_from_records(records, str(path))
    settings, failures = (
        read_json_file(p) if p.exists() else None
        for p in (folder / "run.json", folder / "failures.json")
    )
    if failures is not None and not (
        isinstance(failures, list) and all(isinstance(f, dict) for f in failures)
    ):
        raise CompareError(f"{folder / 'failures.json'}: expected a list of {{pattern, error}}")
    note = ""
    if settings is None:
        note = (
            f"{path}: no run.json beside it; only the settings its results record (iterations, "
            "ops, dtypes, sizes) were checked"
        )
    metrics = metrics_from_results(results)  # a ValueError is named after the file by the caller
    for key, value in metrics.items():
        _checked(parse_metric_key(key).metric, value, f"{path}: {key}")
    return _Side(
        metrics=metrics,
        settings=settings if isinstance(settings, dict) else None,
        table_settings=_table_settings(results),
        failures=tuple(str(f.get("pattern", "?")) for f in failures or ()),
        note=note,
    )


def files_read(path: str | Path) -> list[Path]:
    """What compare may read for ``path``: the file or folder, and the results, run.json and
    failures.json in that folder (or beside that file), so that no output replaces one."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    return [path, *(folder / f"{stem}.json" for stem in (*TABLE_FILES.values(), "run", "failures"))]


def compare_files(
    path_a: str | Path,
    path_b: str | Path,
    *,
    threshold_overrides: Mapping[str, float] | None = None,
    force: bool = False,
    judge_harness: bool = False,
) -> CompareResult:
    """B (treatment) against A (control); CompareError when they share no metric key,
    SettingsDiffer when their measurement settings differ, unless ``force``. The harness's
    diagnostics are shown and decide nothing unless ``judge_harness``."""
    a, b = _load_side(Path(path_a)), _load_side(Path(path_b))
    differences = _setting_differences(a, b)
    if differences and not force:
        raise SettingsDiffer(str(path_a), str(path_b), differences)
    if not a.metrics.keys() & b.metrics.keys():
        raise CompareError(
            f"{path_a} and {path_b} have no metric key in common "
            f"(suites {_suites(a.metrics)} vs {_suites(b.metrics)})"
        )
    if threshold_overrides:
        _check_overrides(threshold_overrides, a.metrics.keys() | b.metrics.keys())
    ra, rb = readings(a.metrics), readings(b.metrics)
    notes = [side.note for side in (a, b) if side.note]
    if a.table_settings is None or b.table_settings is None:
        notes += [
            f"{name} records no settings: that both measured the same thing was not checked"
            for name, side in (("A", a), ("B", b))
            if side.settings is None
        ]
    nan_a, nan_b = sorted(rb.keys() & _unmeasured(ra)), sorted(ra.keys() & _unmeasured(rb))
    return CompareResult(
        path_a=str(path_a),
        path_b=str(path_b),
        judgements=tuple(
            judge_all(ra, rb, floors=threshold_overrides, judge_harness=judge_harness)
        ),
        only_a={k: ra[k].value for k in sorted(ra.keys() - rb.keys() - {*nan_b})},
        only_b={k: rb[k].value for k in sorted(rb.keys() - ra.keys() - {*nan_a})},
        missing=_missing(ra, rb),
        nan_in_a={k: rb[k].value for k in nan_a},
        nan_in_b={k: ra[k].value for k in nan_b},
        failures=b.failures,
        stack_a=stack_line(a.settings or {}),
        stack_b=stack_line(b.settings or {}),
        setting_differences=tuple(differences),
        notes=tuple(notes),
    )


def _setting_differences(a: _Side, b: _Side) -> list[str]:
    differences, recorded = [], set()
    if a.settings is not None and b.settings is not None:
        differences += setting_differences(a.settings, b.settings)
        recorded = measurement_settings(a.settings).keys() & measurement_settings(b.settings)
    if a.table_settings is not None and b.table_settings is not None:
        differences += setting_differences(a.table_settings, b.table_settings, skip=recorded)
    return sorted(differences)


def exit_code(result: CompareResult) -> int:
    """1 when a metric regressed beyond noise (the harness's only when judged), is NaN on one
    side, or the treatment lacks patterns or blocks of the control or recorded failures."""
    nan = result.nan_in_a or result.nan_in_b
    return 1 if result.regressions or nan or result.missing or result.failures else 0


def format_compare_table(result: CompareResult) -> str:
    """A table (key, A, B with their intervals, change and its interval, floor, verdict), what
    the treatment lacks, and a one-line summary."""
    rows = [_row(j) for j in result.judgements]
    one_sided = (
        ("only in A", result.only_a, True),
        ("only in B", result.only_b, False),
        ("NaN in B", result.nan_in_b, True),
        ("NaN in A", result.nan_in_a, False),
    )
    for verdict, values, in_a in one_sided:  # the value shown is the side that has one
        other = "NaN" if verdict.startswith("NaN") else ""
        for key, value in values.items():
            shown = _fmt(Reading(value=value))
            rows.append([key, *((shown, other) if in_a else (other, shown)), "", "", "", verdict])
    rows.sort(key=lambda row: row[0])
    headers = ["key", "A [95 %]", "B [95 %]", "change [at the comparison's level]", "floor"]
    text = tabulate(rows, headers=[*headers, "better", "verdict"], disable_numparse=True)
    verdicts = ("regressed", "improved", "changed", "within noise", "unchanged", "not judged")
    counts = [f"{result.count(v)} {v}" for v in verdicts if result.count(v)]
    harness = sum(not j.decides for j in result.judgements)
    others = (
        (len(result.nan_in_a) + len(result.nan_in_b), "NaN on one side"),
        (len(result.only_a), "only in A"),
        (len(result.only_b), "only in B"),
        (harness, "harness diagnostics (shown, deciding nothing)"),
    )
    counts += [f"{n} {what}" for n, what in others if n]
    head = [f"A: {result.path_a} ({result.stack_a})", f"B: {result.path_b} ({result.stack_b})"]
    if result.setting_differences:
        head.append(
            "WARNING: compared with --force although the runs' settings differ: "
            + "; ".join(result.setting_differences)
        )
    head += [f"note: {note}" for note in result.notes]
    tail = [
        f"FAILED: NaN in {side} where {other} has a value: {', '.join(keys)}"
        for side, other, keys in (("A", "B", result.nan_in_a), ("B", "A", result.nan_in_b))
        if keys
    ]
    if result.missing:
        tail.append(f"FAILED: B lacks what A measured: {', '.join(result.missing)}")
    if result.failures:
        tail.append(f"FAILED: B recorded failed patterns: {', '.join(result.failures)}")
    return "\n".join([*head, text, *tail, ", ".join(counts)])


def _row(j: Judgement) -> list[str]:
    change = _fmt_change(j.change, j.absolute)
    if not math.isnan(j.low):
        change += f" [{_fmt_change(j.low, j.absolute)}, {_fmt_change(j.high, j.absolute)}]"
    floor = "" if j.floor is None else (f"{j.floor:g}" if j.absolute else f"{j.floor * 100:g}%")
    verdict = j.verdict if j.decides else f"{j.verdict} (harness)"
    return [j.key, _fmt(j.control), _fmt(j.treatment), change, floor, j.direction or "", verdict]


def _unmeasured(readings: Mapping[str, Reading]) -> set[str]:
    """Keys of the figures every timed block or pattern has (fields a record requires) that a
    file lacks for a block or pattern it has: NaN there (a file leaves NaN out, or says null)."""
    units = {key.rpartition("/")[0]: parse_metric_key(key).level for key in readings}
    wanted = {f"{unit}/{name}" for unit, level in units.items() for name in REQUIRED_METRICS[level]}
    return wanted - readings.keys()


def _fmt(reading: Reading) -> str:
    # 6 significant digits: sub-microsecond latencies never print as 0.
    text = f"{reading.value:.6g}"
    return text + (f" [{reading.low:.4g}, {reading.high:.4g}]" if reading.has_interval else "")


def _fmt_change(change: float, absolute: bool) -> str:
    if absolute or math.isinf(change):  # an infinite change prints as +inf or -inf, no %
        return f"{change:+.4g}"
    return f"{change * 100:+.2f}%" if abs(change) < 100 else f"{change * 100:+.3g}%"


def _missing(a: Mapping[str, Reading], b: Mapping[str, Reading]) -> tuple[str, ...]:
    def units(keys: Iterable[str]) -> tuple[set[str], set[str]]:
        parsed = [parse_metric_key(k) for k in keys]
        patterns = {f"{k.suite}/{k.pattern}" for k in parsed}
        return patterns, {f"{k.suite}/{k.pattern}/{k.block}" for k in parsed if k.block}

    (pa, ba), (pb, bb) = units(a), units(b)
    lost = pa - pb
    return (*sorted(lost), *sorted(x for x in ba - bb if x.rsplit("/", 1)[0] not in lost))


def _table_settings(found: Results) -> dict[str, str]:
    out = {}
    for row in records_of(found.patterns):
        out[f"pattern.{row['pattern']}"] = (
            f"iters={row['iters']} warmup_iters={row['warmup_iters']} sync={row['sync']} "
            f"graph={row['graph']}"
        )
    for row in records_of(found.blocks):
        out[f"block.{row['pattern']}/{row['block']}"] = (
            f"op={row['op']} dtype={row['dtype']} team_size={row['team_size']} "
            f"size_bytes={row['size_bytes']} iters={row['iters']} {row['work']}"
        )
    return out


def _from_metrics_json(doc: Mapping[str, Any], path: Path) -> dict[str, float]:
    """A metrics file's ``metrics``: every value must be a finite number its metric can take
    (the file never holds 'not applicable': such metrics are left out of it)."""
    metrics = doc["metrics"]
    if not isinstance(metrics, dict):
        raise CompareError(f"{path}: 'metrics' must be an object mapping metric keys to numbers")
    out: dict[str, float] = {}
    for key, value in metrics.items():
        metric = parse_metric_key(key).metric  # a ValueError is named after the file by the caller
        where = f"{path}: metrics[{key!r}]"
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise CompareError(f"{where}: expected a number, got {describe(value)}")
        try:
            number = float(value)
        except OverflowError:
            raise CompareError(f"{where}: invalid value {describe(value)}: out of range") from None
        out[key] = _checked(metric, number, where)
    return out


def _checked(metric: str, value: float, where: str) -> float:
    """``value`` when ``metric`` (or the metric whose bound it is) can take it; else CompareError:
    an impossible value (a NaN, infinite or non-positive latency) is invalid, never judged."""
    problem = metric_value_problem(metric, value)
    if problem is not None:
        raise CompareError(f"{where}: invalid value {value!r} for {metric}: {problem}")
    return value


def _check_floors(overrides: Mapping[str, float]) -> None:
    for metric, value in overrides.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise CompareError(f"--threshold {metric}: expected a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise CompareError(f"--threshold {metric}: expected a finite value >= 0, got {value}")


def _check_overrides(overrides: Mapping[str, float], keys: Iterable[str]) -> None:
    _check_floors(overrides)
    present = {split_bound(parse_metric_key(k).metric)[0] for k in keys}
    unknown = sorted(set(overrides) - present - set(METRICS))
    if unknown:
        raise CompareError(
            f"--threshold for unknown metric(s) {', '.join(unknown)}; "
            f"metrics in these files: {', '.join(sorted(present))}"
        )


def _suites(metrics: Mapping[str, float]) -> list[str]:
    return sorted({parse_metric_key(k).suite for k in metrics})
