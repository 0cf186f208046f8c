"""Result tables as pandas DataFrames (one row per block, pattern, pair of blocks): the files
of ``--output-dir`` are written from them (JSON, and CSV for spreadsheets), :func:`load_results`
reads the JSON back bit for bit, and ``compare`` and the metrics file are built on them."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal

import numpy as np
import pandas as pd

from ...errors import MaestroError
from ..analysis.records import BlockResult, PairResult, PatternOutcome, PatternResult, metrics_of
from ..analysis.stats import measurable
from ..analysis.verdict import process_mean
from ..analysis.whatif import WhatIfResult
from ..config.spec import whatif_label
from .metric_keys import BOUNDS, metric_key

Table = Literal["blocks", "patterns", "pairs", "whatif"]

_INT, _FLOAT, _STR, _BOOL = "Int64", "float64", "string", "boolean"
_DTYPES: Final = {"str": _STR, "int": _INT, "int | None": _INT, "float": _FLOAT, "bool": _BOOL}
_BOUND_DTYPES = (_FLOAT, _FLOAT, _INT)


def _columns_of(record_type: type) -> Mapping[str, str]:
    """File columns of a record type and their pandas dtypes, in field order (a field's metadata
    ``columns`` may give several); a metric with an interval is followed by its BOUNDS."""
    columns: dict[str, str] = {}
    for f in dataclasses.fields(record_type):
        if "intervals" in f.metadata:
            continue
        for name in f.metadata.get("columns", (f.name,)):
            columns[name] = _STR if "columns" in f.metadata else _DTYPES[str(f.type)]
        if "metric" in f.metadata and f.metadata["metric"].interval:
            columns.update({f.name + b: t for b, t in zip(BOUNDS, _BOUND_DTYPES, strict=True)})
    return MappingProxyType(columns)


_RECORD_TYPES: Final[Mapping[Table, type]] = {"blocks": BlockResult, "patterns": PatternResult,
                                                "pairs": PairResult, "whatif": WhatIfResult}  # fmt: skip
# Each table's columns and their pandas dtypes, in file order (results.*, patterns.*, pairs.*).
_COLUMNS: Final = {table: _columns_of(record_type) for table, record_type in _RECORD_TYPES.items()}
BLOCK_COLUMNS: Final = _COLUMNS["blocks"]
PATTERN_COLUMNS: Final = _COLUMNS["patterns"]
PAIR_COLUMNS: Final = _COLUMNS["pairs"]
# A variant's change in the metrics file: no interval keys, so compare shows it and judges none.
WHATIF_METRICS: Final = ("change_pct", "change_ci_low_pct", "change_ci_high_pct")
_KEY_COLUMNS: Final = {
    "blocks": ("suite", "pattern", "block"),
    "patterns": ("suite", "pattern"),
    "pairs": ("suite", "pattern", "block_a", "block_b"),
    "whatif": ("suite", "pattern", "variant"),
}
# File stem of each table in --output-dir: results.json, patterns.csv, ..., whatif.json (only
# for a run with whatif: variants)
TABLE_FILES: Final[Mapping[Table, str]] = MappingProxyType(
    {"blocks": "results", "patterns": "patterns", "pairs": "pairs", "whatif": "whatif"}
)

_MAX_INT_DIGITS = 309  # no float64 or int64 has more: longer JSON integers are refused early


PROCESS_COLUMN: Final = "process"
"""Which process of a ``run --repeat`` (0, 1, ...) measured a row; absent from a one-process run."""

_Row = tuple[str, Mapping[str, Any]]  # a raw row and where it was read: "file: record 3"


class ResultsError(MaestroError, ValueError):
    """A results file cannot be read (missing, not JSON, wrong shape); names the file."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Results:
    """The three result tables of a run (or of several: rows carry suite and pattern): one row
    per (pattern, block), :data:`BLOCK_COLUMNS`; per pattern; per pair of blocks."""

    blocks: pd.DataFrame
    patterns: pd.DataFrame
    pairs: pd.DataFrame
    whatif: pd.DataFrame = field(default_factory=lambda: record_frame((), WhatIfResult))
    """One row per (pattern, variant): its change against the pattern (whatif.*)."""


def _column(values: Sequence[Any], dtype: str) -> Any:
    if dtype == _FLOAT:
        return np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)
    if dtype in (_INT, _BOOL):
        return pd.array([None if v is None else _PLAIN[dtype][0](v) for v in values], dtype=dtype)
    return pd.array(list(values), dtype=_STR)


def _row(record: Any) -> dict[str, Any]:
    row: dict[str, Any] = {}
    intervals = getattr(record, "intervals", {})
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        names = f.metadata.get("columns")
        row.update(zip(names, value, strict=True) if names else ((f.name, value),))
        if "metric" in f.metadata and f.metadata["metric"].interval:
            bounds = intervals.get(f.name, (None, None, None))
            row.update(zip((f.name + b for b in BOUNDS), bounds, strict=True))
    return row


def record_frame(records: Iterable[Any], record_type: type) -> pd.DataFrame:
    """The table of ``records`` (all of ``record_type``), in their order."""
    rows = [_row(r) for r in records]
    columns = _columns_of(record_type)
    return pd.DataFrame(
        {name: _column([row[name] for row in rows], t) for name, t in columns.items()}
    )


def results_of(outcomes: Iterable[PatternOutcome], whatif: Iterable[WhatIfResult] = ()) -> Results:
    """The tables of finished patterns (a variant's rows after its own), in their order."""
    outcomes = list(outcomes)
    return Results(
        blocks=record_frame((b for o in outcomes for b in o.blocks), BlockResult),
        patterns=record_frame((o.pattern for o in outcomes), PatternResult),
        pairs=record_frame((p for o in outcomes for p in o.pairs), PairResult),
        whatif=record_frame(whatif, WhatIfResult),
    )


# Each column type's plain Python type, and what a cell of it must be (for error messages).
_PLAIN: Final = {
    _INT: (int, "an integer"),
    _FLOAT: (float, "a number"),
    _STR: (str, "a string"),
    _BOOL: (bool, "true or false"),
}


def records_of(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows of a result table as dicts of plain values (None = not applicable), in order."""
    cells = [frame[name].to_numpy(dtype=object, na_value=None) for name in frame.columns]
    return [dict(zip(frame.columns, row, strict=True)) for row in zip(*cells, strict=True)]


def json_text(frame: pd.DataFrame) -> str:
    """The JSON file of a table: a list of records, null for 'not applicable'."""
    return json.dumps(records_of(frame), indent=1) + "\n"


def run_texts(
    results: Results,
    environ: Mapping[str, str],
    failures: Sequence[Mapping[str, Any]],
    output_dir: Path | None,
    metrics_path: Path | None,
    metrics: Mapping[str, float] | None = None,
) -> dict[Path, str]:
    """Each file of a run and its text: in ``output_dir`` the tables (whatif.* only with
    variants), failures.json (only with failures) and run.json; the metrics file, of
    ``metrics`` (by default ``results``'s)."""
    texts: dict[Path, str] = {}
    if output_dir is not None:
        for table, stem in TABLE_FILES.items():
            frame = getattr(results, table)
            if table != "whatif" or len(frame):
                texts[output_dir / f"{stem}.json"] = json_text(frame)
                texts[output_dir / f"{stem}.csv"] = csv_text(frame)
        if failures:
            texts[output_dir / "failures.json"] = json.dumps(list(failures), indent=1) + "\n"
        # What produced these numbers (the metrics file's environ): compare reads it.
        texts[output_dir / "run.json"] = json.dumps(environ, indent=1, sort_keys=True) + "\n"
    if metrics_path is not None:
        metrics = metrics_from_results(results) if metrics is None else metrics
        doc = {"name": "maestro", "environ": environ, "metrics": metrics}
        texts[metrics_path] = json.dumps(doc, indent=2) + "\n"
    return texts


def _csv_cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # as JSON writes it
    return "" if value is None else str(value)  # a float's str is its repr: reads back exactly


def csv_text(frame: pd.DataFrame) -> str:
    """The CSV file of a table: empty cells for 'not applicable', floats as ``repr`` (exact)."""
    rows = [[_csv_cell(v) for v in row.values()] for row in records_of(frame)]
    text = pd.DataFrame(rows, columns=list(frame.columns), dtype=object)
    return text.to_csv(index=False, lineterminator="\n")


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > _MAX_INT_DIGITS:
        raise ResultsError(f"an integer of {digits} digits is out of range")
    return int(text)


def describe(value: Any, limit: int = 60) -> str:
    """A short, safe description of a JSON value for an error message (never a deep repr)."""
    for kind, text in ((dict, "an object"), (list, "a list"), (type(None), "null")):
        if isinstance(value, kind):
            return text
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of about {int(value.bit_length() * math.log10(2))} digits"
    text = repr(value[: limit + 1] if isinstance(value, str) else value)
    return text if len(text) <= limit else text[:limit] + "..."


MAX_FILE_BYTES = 128 * 2**20  # largest results or metrics file read: about 50,000 block rows


def read_text_file(path: str | Path, *, limit: int = MAX_FILE_BYTES) -> str:
    """A regular file's text, at most ``limit`` bytes; ResultsError naming the file otherwise
    (a FIFO or a device such as /dev/zero is refused before it is opened)."""
    path = Path(path)
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise ResultsError(f"{path}: is a directory, expected a file")
        if not stat.S_ISREG(info.st_mode):
            raise ResultsError(f"{path}: not a regular file (a pipe or a device)")
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise ResultsError(f"{path}: larger than {limit // 2**20} MiB, not a maestro file")
        return data.decode("utf-8")
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: cannot read: {exc}") from None


def read_json_file(path: str | Path) -> Any:
    """Parse a JSON file; ResultsError naming the file for anything that stops it."""
    path = Path(path)
    text = read_text_file(path)
    try:
        return json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not JSON ({exc})") from None
    except ResultsError as exc:
        raise ResultsError(f"{path}: {exc}") from None
    except RecursionError:
        raise ResultsError(f"{path}: JSON nested too deeply to read") from None
    except ValueError as exc:  # anything else the decoder refuses
        raise ResultsError(f"{path}: not usable JSON ({exc})") from None


def _cell(value: Any, dtype: str) -> Any:
    """A JSON value as its column's type; None and "" are NA. TypeError or ValueError when it is
    not of that type, OverflowError out of range."""
    if value is None or value == "":
        return "" if dtype == _STR else None
    if isinstance(value, str) and dtype != _STR:
        raise TypeError  # a number in quotes is not a number
    if dtype in (_STR, _BOOL):
        if not isinstance(value, _PLAIN[dtype][0]):
            raise TypeError
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError
    if dtype == _FLOAT:
        return float(value)  # OverflowError for an integer beyond float64
    if isinstance(value, numbers.Integral) or (math.isfinite(value) and float(value).is_integer()):
        if not -(2**63) <= (number := int(value)) < 2**63:
            raise OverflowError
        return number
    raise TypeError


def _typed_frame(rows: Sequence[_Row], table: Table) -> pd.DataFrame:
    """Checked, typed frame of raw (where, row)s; a column absent from a row is NA there (files
    of older or newer versions still load)."""
    columns = dict(_COLUMNS[table])
    if any(PROCESS_COLUMN in row for _, row in rows):  # a run --repeat's: typed as it was written
        columns[PROCESS_COLUMN] = _INT
    data: dict[str, Any] = {}
    for name, dtype in columns.items():
        values = []
        for where, row in rows:
            raw = row.get(name)
            try:
                value = _cell(raw, dtype)
            except OverflowError:
                raise ResultsError(
                    f"{where}: column {name!r}: {describe(raw)} is out of range"
                ) from None
            except (TypeError, ValueError):
                raise ResultsError(
                    f"{where}: column {name!r}: expected {_PLAIN[dtype][1]}, got {describe(raw)}"
                ) from None
            if name in _KEY_COLUMNS[table] and not value:
                raise ResultsError(
                    f"{where}: needs a non-empty string {name!r} "
                    f"(key columns: {', '.join(_KEY_COLUMNS[table])})"
                )
            values.append(value)
        data[name] = _column(values, dtype)
    frame = pd.DataFrame(data, columns=list(columns))
    extra = [n for _, row in rows for n in row if n not in columns]
    for name in dict.fromkeys(extra):  # columns this version does not know: kept, untyped
        # fromiter: a list stays one cell (np.array would make a 2-D array of equal lists)
        frame[name] = np.fromiter((row.get(name) for _, row in rows), dtype=object, count=len(rows))
    return frame


def results_from_records(records: Any, where: str, *, table: Table | None = None) -> Results:
    """Tables from JSON records, each row in ``table`` or where its columns say."""
    if not isinstance(records, list):
        raise ResultsError(f"{where}: expected a list of records, got {describe(records)}")
    rows: dict[Table, list[_Row]] = {"blocks": [], "patterns": [], "pairs": [], "whatif": []}
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ResultsError(
                f"{where}: record {index}: expected an object, got {describe(record)}"
            )
        kind = "blocks" if record.get("block") not in (None, "") else "patterns"
        kind = "pairs" if "block_a" in record or "block_b" in record else kind
        kind = "whatif" if "change_pct" in record else kind
        rows[table or kind].append((f"{where}: record {index}", record))
    return Results(**{kind: _typed_frame(rows[kind], kind) for kind in rows})


def read_table(path: str | Path, table: Table) -> pd.DataFrame:
    """One table from its JSON file; ResultsError naming the file."""
    found = results_from_records(read_json_file(path), str(path), table=table)
    return getattr(found, table)


def load_results(directory: str | Path) -> Results:
    """The tables of an ``--output-dir`` from its JSON files, exactly as written (whatif.json
    only where the run had variants); ResultsError, naming the file, when one is missing or
    malformed (a folder of maestro before 0.2 has no pairs.json)."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: not a directory of maestro results")
    tables = {}
    for table, stem in TABLE_FILES.items():
        path = folder / f"{stem}.json"
        if table != "whatif" or path.exists():
            tables[table] = read_table(path, table)
    return Results(**tables)


def metrics_from_results(results: Results) -> dict[str, float]:
    """``{metric key: float}`` of the records' metrics (NA left out, and with their bounds the
    figures not measurable here, ``stats.measurable``: a dashboard would plot noise as a change;
    the results files keep them), pattern by pattern: its blocks', its own, its pairs', each
    followed by its interval's bounds; ValueError for a name that cannot be part of a key, or a
    key met twice."""
    return metrics_and_unmeasurable(results)[0]


def metrics_and_unmeasurable(results: Results) -> tuple[dict[str, float], frozenset[str]]:
    """:func:`metrics_from_results`, and the keys it leaves out as not measurable here."""
    groups: dict[tuple[str, str], dict[str, float]] = {}
    unmeasurable: set[str] = set()

    def add(row: Mapping[str, Any], metrics: Mapping[str, Any], **where: Any) -> None:
        group = groups.setdefault((row["suite"], row["pattern"]), {})
        for name, spec in metrics.items():
            bounds = [name + b for b in BOUNDS] if spec.interval else []
            if any(row.get(b) is None for b in bounds):
                bounds = []
            low, high = (float(row[b]) for b in bounds[:2]) if bounds else (math.nan, math.nan)
            if row.get(name) is None:
                continue
            if not measurable(name, row[name], low, high):
                unmeasurable.add(metric_key(row["suite"], row["pattern"], metric=name, **where))
                continue
            for column in (name, *bounds):
                key = metric_key(row["suite"], row["pattern"], metric=column, **where)
                if key in group:
                    raise ValueError(f"duplicate row for {key}")
                group[key] = float(row[column])

    for table in ("blocks", "patterns", "pairs"):
        for row in _over_processes(records_of(getattr(results, table)), table):
            block = row["block"] if table == "blocks" else None
            pair = (row["block_a"], row["block_b"]) if table == "pairs" else None
            add(row, metrics_of(_RECORD_TYPES[table]), block=block, pair=pair)
    for row in records_of(results.whatif):
        suite, label = row["suite"], whatif_label(row["pattern"], row["variant"])
        groups.setdefault((suite, label), {}).update(_whatif_metrics(row, suite, label))
    metrics = {key: value for group in groups.values() for key, value in group.items()}
    return metrics, frozenset(unmeasurable)


def _whatif_metrics(row: Mapping[str, Any], suite: str, label: str) -> dict[str, float]:
    """A what-if record's change metrics, keyed under its variant's label."""
    names = (name for name in WHATIF_METRICS if row[name] is not None)
    return {metric_key(suite, label, None, name): float(row[name]) for name in names}


def _over_processes(rows: list[dict[str, Any]], table: Table) -> list[dict[str, Any]]:
    """The rows of one block (pattern, pair) from several processes (the ``process`` column of
    ``run --repeat``) as one row: each metric's mean over the processes, with the Student t
    interval between them as its bounds (df = processes - 1; none where one process has it)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for index, row in enumerate(rows):
        unit = tuple(row[k] for k in _KEY_COLUMNS[table])
        groups.setdefault(unit if row.get(PROCESS_COLUMN) is not None else (index,), []).append(row)
    specs = metrics_of(_RECORD_TYPES[table])
    many = len({row.get(PROCESS_COLUMN) for row in rows}) > 1
    out = []
    for group in groups.values():
        merged = dict(group[0])
        if len({row.get(PROCESS_COLUMN) for row in group}) < len(group):
            unit = "/".join(str(merged[k]) for k in _KEY_COLUMNS[table])
            raise ValueError(f"duplicate row for {unit}: process {merged[PROCESS_COLUMN]} twice")
        for name, spec in specs.items() if many else ():
            values = [row[name] for row in group if row.get(name) is not None]
            mean, bounds = process_mean(values, absolute=spec.absolute)
            merged[name] = None if math.isnan(mean) else mean
            if bounds and spec.domain in ("fraction", "non_negative"):  # t's interval, clipped
                top = 1.0 if spec.domain == "fraction" else math.inf
                bounds = (max(bounds[0], 0.0), min(bounds[1], top), bounds[2])
            if spec.interval:
                merged.update(zip((name + b for b in BOUNDS), bounds or (None,) * 3, strict=True))
        out.append(merged)
    return out
