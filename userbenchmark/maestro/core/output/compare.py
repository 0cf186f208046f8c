"""``compare``: two runs' files (metrics JSON, result records or an ``--output-dir``) as
``{metric key: float}``, every common key judged against both runs' noise (metric_keys.py). Any
file, however malformed, ends in CompareError naming it, never in another exception."""

from __future__ import annotations

import math
import numbers
import textwrap
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tabulate import tabulate

from ...errors import MaestroError
from .metric_keys import (
    METRICS,
    REQUIRED_METRICS,
    Judgement,
    Reading,
    judge_all,
    metric_value_problem,
    noise_of,
    parse_metric_key,
    readings,
    spec_of,
    split_bound,
)
from .reporter import measurement_settings, setting_differences, stack_line
from .results import (
    TABLE_FILES,
    Results,
    ResultsError,
    describe,
    load_results,
    metrics_and_unmeasurable,
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
    # Keys that run's records hold as not measurable here, with the other run's values.
    unmeasurable_in_a: Mapping[str, float] = field(default_factory=dict)
    unmeasurable_in_b: Mapping[str, float] = field(default_factory=dict)
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
    nan: frozenset[str] = frozenset()  # keys it holds as NaN: measured without a value
    unmeasurable: frozenset[str] = frozenset()  # keys its records hold as not measurable here

    @property
    def environ(self) -> dict[str, Any]:
        return {**(self.table_settings or {}), **(self.settings or {})}


def _load_side(path: Path) -> _Side:
    try:
        doc = None if path.is_dir() else read_json_file(path)
        if isinstance(doc, dict) and "metrics" in doc:
            environ = doc.get("environ") if isinstance(doc.get("environ"), dict) else None
            metrics = _from_metrics_json(doc, path)
            side = _Side(
                metrics={k: v for k, v in metrics.items() if not math.isnan(v)},
                settings=environ,
                nan=frozenset(k for k, v in metrics.items() if math.isnan(v)),
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
    if not side.metrics and not side.nan:
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
    metrics, unmeasurable = metrics_and_unmeasurable(results)  # ValueError: the caller names it
    for key, value in metrics.items():
        _checked(parse_metric_key(key).metric, value, f"{path}: {key}")
    return _Side(
        metrics=metrics,
        settings=settings if isinstance(settings, dict) else None,
        table_settings=_table_settings(results),
        failures=tuple(str(f.get("pattern", "?")) for f in failures or ()),
        note=note,
        nan=frozenset(_unmeasured(readings(metrics))),
        unmeasurable=unmeasurable,
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
    for path, side in ((path_a, a), (path_b, b)):
        if not measurement_settings(side.environ) and not force:
            raise CompareError(
                f"{path}: records no settings (a metrics file without its environ), so that it "
                "measured what the other run did cannot be checked; compare anyway with --force"
            )
    differences = _setting_differences(a, b)
    if differences and not force:
        raise SettingsDiffer(str(path_a), str(path_b), differences)
    keys_a, keys_b = a.metrics.keys() | a.nan, b.metrics.keys() | b.nan
    if not keys_a & keys_b:
        raise CompareError(
            f"{path_a} and {path_b} have no metric key in common "
            f"(suites {_suites(keys_a)} vs {_suites(keys_b)})"
        )
    if threshold_overrides:
        _check_overrides(threshold_overrides, a.metrics.keys() | b.metrics.keys())
    ra, rb = readings(a.metrics), readings(b.metrics)
    notes = [side.note for side in (a, b) if side.note]
    notes += [
        f"{name} records no settings: that both measured the same thing was not checked"
        for name, side in (("A", a), ("B", b))
        if not measurement_settings(side.environ)
    ]
    nan_a, nan_b = _nan_keys(a, ra, rb, judge_harness), _nan_keys(b, rb, ra, judge_harness)
    noise = noise_of(a.environ, b.environ, ra.keys() & rb.keys())
    unmeasurable_in_b, only_a = _one_sided(ra, rb, nan_b, b)
    unmeasurable_in_a, only_b = _one_sided(rb, ra, nan_a, a)
    return CompareResult(
        path_a=str(path_a),
        path_b=str(path_b),
        judgements=tuple(
            judge_all(ra, rb, floors=threshold_overrides, judge_harness=judge_harness, noise=noise)
        ),
        only_a=only_a,
        only_b=only_b,
        unmeasurable_in_a=unmeasurable_in_a,
        unmeasurable_in_b=unmeasurable_in_b,
        missing=_missing(ra, rb),
        nan_in_a={k: rb[k].value for k in nan_a},
        nan_in_b={k: ra[k].value for k in nan_b},
        failures=b.failures,
        stack_a=stack_line(a.settings or {}),
        stack_b=stack_line(b.settings or {}),
        setting_differences=tuple(differences),
        notes=tuple(notes),
    )


def _one_sided(
    mine: Mapping[str, Reading], theirs: Mapping[str, Reading], nan: list[str], other: _Side
) -> tuple[dict[str, float], dict[str, float]]:
    """The values of the keys only ``mine`` has (the ``other`` run's NaNs aside): those the
    other run's records hold as not measurable here, and the rest."""
    keys = sorted(mine.keys() - theirs.keys() - {*nan})
    return (
        {k: mine[k].value for k in keys if k in other.unmeasurable},
        {k: mine[k].value for k in keys if k not in other.unmeasurable},
    )


def _nan_keys(
    side: _Side, mine: dict[str, Reading], other: Mapping[str, Reading], judge_harness: bool
) -> list[str]:
    """The keys ``side`` holds as NaN where the other run has a value: a judged figure's (a
    failure); a harness diagnostic's get a NaN reading in ``mine`` instead, shown, not judged."""
    failed = []
    for key in sorted(side.nan & other.keys()):
        if spec_of(parse_metric_key(key).metric).harness and not judge_harness:
            mine[key] = Reading(value=math.nan)
        else:
            failed.append(key)
    return failed


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


LEADING: Final = ("regressed", "improved", "changed")
"""The verdicts a table leads with; every other row is counted, and listed with ``--all``."""
TABLE_WIDTH: Final = 120


def format_compare_table(result: CompareResult, *, show_all: bool = False) -> str:
    """What changed (every row with ``show_all``) in a table of at most 120 columns, a line
    counting the rest by verdict, and what the treatment lacks."""
    one_sided = [
        (key, *((shown, other) if in_a else (other, shown)), verdict)
        for verdict, values, in_a in (
            ("only in A", result.only_a, True),
            ("only in B", result.only_b, False),
            ("NaN in B", result.nan_in_b, True),
            ("NaN in A", result.nan_in_a, False),
            ("not measurable in B", result.unmeasurable_in_b, True),
            ("not measurable in A", result.unmeasurable_in_a, False),
        )
        for key, value in values.items()  # the value shown is the side that has one
        for shown, other in [(_fmt(value), "NaN" if verdict.startswith("NaN") else "")]
    ]
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
    table = verdict_table(result.judgements, one_sided, show_all=show_all)
    return "\n".join([*head, table, *tail])


def verdict_table(
    judgements: Sequence[Judgement],
    one_sided: Sequence[tuple[str, str, str, str]] = (),
    *,
    show_all: bool = False,
) -> str:
    """The judgements that changed, regressed first (every row, and the ``one_sided`` (key, A,
    B, label) rows, with ``show_all``), at most 120 columns wide, then a line of counts."""
    order = {verdict: i for i, verdict in enumerate(LEADING)}
    shown = [j for j in judgements if show_all or (j.decides and j.verdict in order)]
    shown.sort(key=lambda j: (0 if show_all else order[j.verdict], j.key))
    rows = [
        [j.key, _fmt(j.control.value), _fmt(j.treatment.value), *_change_cells(j)] for j in shown
    ]
    if show_all:
        rows = sorted(rows + [[key, a, b, "", "", label] for key, a, b, label in one_sided])
    counts = Counter([_verdict(j) for j in judgements] + [row[3] for row in one_sided])
    listed = [f"{counts.pop(v)} {v}" for v in LEADING if v in counts]
    rest = ", ".join(f"{n} {label}" for label, n in sorted(counts.items(), key=_label_order))
    line = ", ".join(listed) or "nothing regressed or improved"
    if rest:
        line += f"; {rest}" + ("" if show_all else " (--all lists every row)")
    return (_fitted(rows) + "\n" if rows else "") + textwrap.fill(line, TABLE_WIDTH)


def _label_order(item: tuple[str, int]) -> tuple[bool, bool, int, str]:
    """Verdicts before the one-sided labels, the judged ones before the harness's, most first."""
    label, count = item
    one_sided = label.startswith(("only", "NaN", "not measurable"))
    return (one_sided, label.endswith("(harness)"), -count, label)


def _change_cells(j: Judgement) -> list[str]:
    change = _fmt_change(j.change, j.absolute)
    if not math.isnan(j.low):
        change += f" [{_fmt_change(j.low, j.absolute)}, {_fmt_change(j.high, j.absolute)}]"
    return [change, _fmt_floor(j.floor, j.absolute), _verdict(j)]


def _verdict(j: Judgement) -> str:
    return j.verdict if j.decides else f"{j.verdict} (harness)"


def _fitted(rows: list[list[str]]) -> str:
    """The rows as a table of at most TABLE_WIDTH columns: a suite every key shares moves to
    the header, and a key still too long wraps after a ``/``."""
    headers = ["key", "A", "B", "change", "floor", "verdict"]
    suites = {row[0].split("/", 1)[0] for row in rows}
    if len(suites) == 1:
        headers[0] = f"key (in {suites.pop()}/)"
        rows = [[row[0].split("/", 1)[-1], *row[1:]] for row in rows]
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=False)]
    room = max(24, TABLE_WIDTH - sum(widths[1:]) - 2 * (len(headers) - 1))
    rows = [[_wrap(row[0], room), *row[1:]] for row in rows]
    return tabulate(rows, headers=headers, disable_numparse=True)


def _wrap(key: str, width: int) -> str:
    lines = [""]
    for part in key.replace("/", "/\n").split("\n"):
        while len(part) > width:  # a name longer than the column: cut
            lines += [part[:width], ""]
            part = part[width:]
        if len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(line for line in lines if line)


def _unmeasured(readings: Mapping[str, Reading]) -> set[str]:
    """Keys of the figures every timed block or pattern has (fields a record requires) that a
    file lacks for a block or pattern it has: NaN there (a file leaves NaN out, or says null)."""
    units = {key.rpartition("/")[0]: parse_metric_key(key).level for key in readings}
    wanted = {f"{unit}/{name}" for unit, level in units.items() for name in REQUIRED_METRICS[level]}
    return wanted - readings.keys()


def _fmt(value: float) -> str:
    return f"{value:.6g}"  # 6 significant digits: sub-microsecond latencies never print as 0


def _fmt_change(change: float, absolute: bool) -> str:
    """A relative change as a percentage, or as the factor B / A once it is 2 or 1/2 or beyond
    (``x3.5``, ``x0.25``); an absolute one in the metric's unit."""
    if absolute or math.isnan(change):
        return f"{change:+.3g}"
    ratio = 1 + change
    if 0.5 < ratio < 2:
        return f"{change * 100:+.2f}%" if abs(change) < 0.1 else f"{change * 100:+.1f}%"
    return f"x{ratio:.3g}"


def _fmt_floor(floor: float | None, absolute: bool) -> str:
    """A floor as a percentage, or as the factor either way once it is 100 % or more (``x2.5``:
    beyond 2.5 times or 1 / 2.5)."""
    if floor is None:
        return ""
    return (
        f"{floor:.3g}" if absolute else f"{floor * 100:.3g}%" if floor < 1 else f"x{1 + floor:.3g}"
    )


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
        if row.get("profiler"):  # the device the floors depend on (metric_keys.noise_of)
            out["profiler"] = row["profiler"]
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
    (the file never holds 'not applicable': such metrics are left out of it), or NaN for a
    metric measured without a value (never for an interval's bound)."""
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
        nan = math.isnan(number) and split_bound(metric)[1] is None
        out[key] = number if nan else _checked(metric, number, where)
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


def _suites(keys: Iterable[str]) -> list[str]:
    return sorted({parse_metric_key(k).suite for k in keys})
