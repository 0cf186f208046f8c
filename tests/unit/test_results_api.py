"""The results API: typed frames, the files written from them, and load_results reading them back."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.unit.test_golden_outputs import _outcomes as golden_outcomes
from userbenchmark.maestro import Results, load_results
from userbenchmark.maestro.core.analysis.records import (
    BlockResult,
    PairResult,
    PatternOutcome,
    PatternResult,
)
from userbenchmark.maestro.core.analysis.stats import measurable
from userbenchmark.maestro.core.output.metric_keys import METRICS, parse_metric_key
from userbenchmark.maestro.core.output.results import (
    BLOCK_COLUMNS,
    PAIR_COLUMNS,
    PATTERN_COLUMNS,
    ResultsError,
    metrics_from_results,
    read_table,
    records_of,
    results_of,
)
from userbenchmark.maestro.core.output.writer import OutputWriter

INT_COLUMNS = {
    "team_size",
    "size_bytes",
    "iters",
    "wrong_elements",
    "last_to_start_rank",
    "kernel_ctas_max",
    "ranks_per_gpu",
    "num_blocks",
    "warmup_iters",
    "host_late_iters",
    "peak_memory_bytes",
}
BOOL_COLUMNS = {"graph"}
INTERVALS = {name for name, spec in METRICS.items() if spec.interval}
STRING_COLUMNS = {
    "suite",
    "pattern",
    "variant",
    "block",
    "op",
    "axis",
    "lane",
    "dtype",
    "profiler",
    "notes",
    "work",
    "sync",
    "block_a",
    "block_b",
    "replay_by_rank",
    "kernel",
    "traced_kernel",
}


def _tricky_outcome() -> PatternOutcome:
    """Values that break naive CSV/JSON: quotes, commas, newlines, NA-like words, -0.0,
    subnormals, the largest float, inf, 63-bit integers, missing integers."""
    block = BlockResult(
        suite="s", pattern="p[size=4M]", block="x", op="all_gather", axis="dp", lane="NA",
        team_size=8, dtype="bf16", size_bytes=2**62, iters=3, latency_avg_us=0.1,
        latency_min_us=5e-324, latency_max_us=1.7976931348623157e308, latency_p50_us=1 / 3,
        latency_p99_us=-0.0, latency_stdev_us=math.inf, algbw_gbps=123456789.12345679,
        wrong_elements=None, last_to_start_rank=None, profiler="null",
        notes='TF32 on; said "hi", twice\nsecond line; µs; nan',
    )  # fmt: skip
    other = dataclasses.replace(block, block="y", size_bytes=None, notes="", profiler="None")
    pattern = PatternResult(
        suite="s",
        pattern="p[size=4M]",
        iters=3,
        num_blocks=2,
        makespan_avg_us=2.5,
        makespan_p99_us=1e-7,
        host_late_iters=None,
        peak_memory_bytes=None,
        profiler="",
    )
    pairs = tuple(
        PairResult(suite="s", pattern="p[size=4M]", blocks=blocks, pairwise_overlap=value)
        for blocks, value in ((("x", "y"), 1 / 3), (("y", "x"), math.nan))
    )
    return PatternOutcome(blocks=(block, other), pattern=pattern, pairs=pairs)


def _all_outcomes() -> list[PatternOutcome]:
    return [outcome for _, outcome, _ in golden_outcomes()] + [_tricky_outcome()]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("out")
    writer = OutputWriter(output_dir=folder, metrics_path=None, environ={})
    outcomes = _all_outcomes()
    for outcome in outcomes:
        writer.add(outcome)
    return folder, outcomes


def _same(a, b) -> bool:
    """Equal values, NaN/None-aware and bit-exact for floats (-0.0 is not 0.0)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, float) and isinstance(b, float) and repr(a) == repr(b)
    return type(a) is type(b) and a == b


def _assert_same_records(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert list(g) == list(e)
        bad = {k: (g[k], e[k]) for k in e if not _same(g[k], e[k])}
        assert not bad, bad


def _record(result) -> dict:
    """The dataclass's fields, NaN as None, a pair's blocks as block_a and block_b, each
    interval beside its metric: built here, independently of the frames."""
    record = {}
    fields = dataclasses.asdict(result)
    intervals = fields.pop("intervals", {})
    for key, value in fields.items():
        if key == "blocks":
            record["block_a"], record["block_b"] = value
            continue
        record[key] = None if isinstance(value, float) and math.isnan(value) else value
        if key in INTERVALS:
            low, high, df = intervals.get(key, (None, None, None))
            record |= {f"{key}_ci_low": low, f"{key}_ci_high": high, f"{key}_ci_df": df}
    return record


def _expected_records(outcomes):
    blocks = [_record(b) for o in outcomes for b in o.blocks]
    patterns = [_record(o.pattern) for o in outcomes]
    pairs = [_record(p) for o in outcomes for p in o.pairs]
    return blocks, patterns, pairs


def test_columns_are_the_record_fields():
    for record, columns in ((BlockResult, BLOCK_COLUMNS), (PatternResult, PATTERN_COLUMNS)):
        expected = []
        for f in dataclasses.fields(record):
            if f.name == "intervals":
                continue
            expected.append(f.name)
            if f.name in INTERVALS:
                expected += [f"{f.name}_ci_low", f"{f.name}_ci_high", f"{f.name}_ci_df"]
        assert list(columns) == expected
    assert list(PAIR_COLUMNS) == [
        "suite",
        "pattern",
        "variant",
        "block_a",
        "block_b",
        "pairwise_overlap",
    ]
    assert {"latency_avg_us", "slowdown", "overlap_efficiency"} <= INTERVALS


def test_frames_have_sound_dtypes():
    results = results_of(_all_outcomes())
    for frame, columns in (
        (results.blocks, BLOCK_COLUMNS),
        (results.patterns, PATTERN_COLUMNS),
        (results.pairs, PAIR_COLUMNS),
    ):
        assert list(frame.columns) == list(columns)
        for name in frame.columns:
            dtype = frame[name].dtype
            if name in INT_COLUMNS or name.endswith("_ci_df"):
                assert dtype == pd.Int64Dtype(), name
            elif name in STRING_COLUMNS:
                assert isinstance(dtype, pd.StringDtype), name
                assert not frame[name].isna().any(), name  # "" stays "", never NA
            elif name in BOOL_COLUMNS:
                assert dtype == pd.BooleanDtype(), name
            else:
                assert dtype == "float64", name
    blocks = results.blocks
    assert blocks["notes"].iloc[0] == ""
    assert blocks["size_bytes"].isna().sum() == 1 + sum(  # the sleep and GEMM blocks, and "y"
        b.size_bytes is None for _, o, _ in golden_outcomes() for b in o.blocks
    )
    assert math.isnan(blocks["tflops"].iloc[0])  # not applicable: NaN, not None or 0


def test_files_read_back_exactly(written):
    folder, outcomes = written
    loaded = load_results(folder)
    assert isinstance(loaded, Results)
    blocks, patterns, pairs = _expected_records(outcomes)
    _assert_same_records(records_of(loaded.blocks), blocks)
    _assert_same_records(records_of(loaded.patterns), patterns)
    _assert_same_records(records_of(loaded.pairs), pairs)
    built = results_of(outcomes)
    for table in ("blocks", "patterns", "pairs"):
        pd.testing.assert_frame_equal(
            getattr(loaded, table), getattr(built, table), check_exact=True
        )


def test_each_csv_file_holds_its_json_files_values_as_text(written):
    # CSV (for spreadsheets) is not read back: its cells are the JSON values, floats as repr.
    folder, _ = written
    for stem in ("results", "patterns", "pairs"):
        records = json.loads((folder / f"{stem}.json").read_text())
        with (folder / f"{stem}.csv").open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert len(rows) == len(records)
        for row, record in zip(rows, records, strict=True):
            assert row == {name: _csv_text(value) for name, value in record.items()}


def _csv_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)  # a float's str is its repr


def test_the_files_hold_no_pairwise_overlap_column(written):
    folder, _ = written
    pd.testing.assert_frame_equal(
        load_results(folder).blocks, read_table(folder / "results.json", "blocks")
    )
    assert "pairwise_overlap" not in json.loads((folder / "patterns.json").read_text())[0]
    assert "pairwise_overlap" not in (folder / "patterns.csv").read_text().splitlines()[0]
    assert (folder / "pairs.csv").read_text().splitlines()[0] == (
        "suite,pattern,variant,block_a,block_b,pairwise_overlap"
    )


def test_integers_are_written_as_integers(written):
    folder, _ = written
    header, first = (folder / "results.csv").read_text().splitlines()[:2]
    row = dict(zip(header.split(","), first.split(","), strict=True))
    assert row["size_bytes"] == "4194304" and row["team_size"] == "2"


def test_a_folder_of_maestro_before_0_2_is_not_read(tmp_path):
    # Before pairs.*, patterns carried a pairwise_overlap object: no pairs file to read.
    (tmp_path / "results.json").write_text(
        json.dumps([{"suite": "s", "pattern": "p", "block": "a", "size_bytes": 4096}])
    )
    pattern = {"suite": "s", "pattern": "p", "iters": 5, "pairwise_overlap": {"a|b": 0.25}}
    (tmp_path / "patterns.json").write_text(json.dumps([pattern]))
    with pytest.raises(ResultsError, match=r"pairs\.json: no such file"):
        load_results(tmp_path)
    (tmp_path / "pairs.json").write_text("[]")
    loaded = load_results(tmp_path)
    assert loaded.blocks["size_bytes"].iloc[0] == 4096
    assert loaded.blocks["size_bytes"].dtype == pd.Int64Dtype()
    assert math.isnan(loaded.blocks["latency_avg_us"].iloc[0])  # absent column: NA


def test_columns_of_a_newer_version_are_kept(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps([{"suite": "s", "pattern": "p", "block": "a", "future_us": 1.5}]))
    frame = read_table(path, "blocks")
    assert list(frame.columns) == [*BLOCK_COLUMNS, "future_us"]
    assert frame["future_us"].iloc[0] == 1.5


@pytest.mark.parametrize(
    ("records", "match"),
    [
        ({"suite": "s"}, "expected a list of records"),
        ([1], r"record 0: expected an object, got 1"),
        ([{"pattern": "p", "block": "a"}], r"record 0: needs a non-empty string 'suite'"),
        ([{"suite": "s", "pattern": "p", "block": "a", "iters": 2.5}], "'iters': expected an integer"),
        ([{"suite": "s", "pattern": "p", "block": "a", "iters": "2"}], "'iters': expected an integer"),
        ([{"suite": "s", "pattern": "p", "block": "a", "iters": 2**63}], "'iters': 9223372036854775808 is out of range"),
        ([{"suite": "s", "pattern": "p", "block": "a", "slowdown": "1.2"}], "'slowdown': expected a number"),
        ([{"suite": "s", "pattern": "p", "block": "a", "slowdown": [1]}], "expected a number, got a list"),
        ([{"suite": "s", "pattern": "p", "block": "a", "notes": 3}], "'notes': expected a string, got 3"),
    ],
)  # fmt: skip
def test_malformed_files_raise_results_error_naming_the_file(tmp_path, records, match):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(records))
    with pytest.raises(ResultsError, match=match) as info:
        read_table(path, "blocks")
    assert str(path) in str(info.value)


def test_missing_files_are_results_errors(tmp_path):
    with pytest.raises(ResultsError, match="not a directory"):
        load_results(tmp_path / "nope")
    with pytest.raises(ResultsError, match=r"results\.json: no such file"):
        load_results(tmp_path)
    with pytest.raises(TypeError, match="format"):
        load_results(tmp_path, format="csv")  # type: ignore[call-arg]


def test_the_documented_analysis_runs(written, tmp_path, monkeypatch, capsys):
    docs = Path(__file__).resolve().parents[2] / "docs" / "results-api.md"
    text = docs.read_text(encoding="utf-8")
    marker = "<!-- results-api-example"
    assert marker in text
    block = text.split(marker, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len([line for line in block.splitlines() if line.strip()]) == 5
    folder, _ = written
    shutil.copytree(folder, tmp_path / "out")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(docs), "exec"), {})
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    # The pivot: busbw per op at both sweep sizes (Int64 sizes as the index), no diagonal.
    assert lines[0] == ["op", "all_reduce", "all_to_all"]
    assert lines[2] == ["65536", "0.501269", "0.139082"]
    assert lines[3] == ["1048576", "7.760837", "2.193872"]
    # The golden blocks slowed down past 1.1 beyond noise (5 iterations: wide intervals).
    assert lines[4] == ["pattern", "block", "slowdown"]
    slowed = {(row[1], row[2]) for row in lines[5:]}
    assert ("ar_sweep[size=1M]", "ar") in slowed and ("overlap", "nap") not in slowed


def test_metrics_hold_every_pair_and_interval_and_parse_back(tmp_path):
    writer = OutputWriter(output_dir=tmp_path, metrics_path=tmp_path / "m.json", environ={})
    for outcome in _all_outcomes():
        writer.add(outcome)
    metrics = json.loads((tmp_path / "m.json").read_text())["metrics"]
    assert metrics == metrics_from_results(load_results(tmp_path))
    parsed = {key: parse_metric_key(key) for key in metrics}
    pairs = {
        (k.pattern, *k.pair): value
        for key, value in metrics.items()
        if (k := parsed[key]).pair is not None and k.metric == "pairwise_overlap"
    }
    expected = {
        (pair.pattern, *pair.blocks): pair.pairwise_overlap
        for o in _all_outcomes()
        for pair in o.pairs
        if not math.isnan(pair.pairwise_overlap)  # not applicable: left out
    }
    assert pairs == expected and ("p[size=4M]", "x", "y") in pairs
    assert ("p[size=4M]", "y", "x") not in pairs
    skews = {
        k.pattern: v
        for key, v in metrics.items()
        if (k := parsed[key]).metric == "lane_skew_p50_us"
    }
    assert skews == {o.pattern.pattern: o.pattern.lane_skew_p50_us for _, o, _ in golden_outcomes()}
    assert not any(k.metric == "lane_skew_p99_us" for k in parsed.values())  # 5 iterations
    bounds = [k for k in parsed.values() if k.metric.startswith("slowdown_ci_")]
    blocks = [b for _, o, _ in golden_outcomes() for b in o.blocks]
    shown = [b for b in blocks if measurable("slowdown", b.slowdown, *b.intervals["slowdown"][:2])]
    assert len(bounds) == 3 * len(shown) and 0 < len(shown) < len(blocks)  # the rest: too wide
