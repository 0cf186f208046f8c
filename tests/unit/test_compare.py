"""Unit tests for comparing two result files (metrics JSON, results.json, patterns.json)."""

from __future__ import annotations

import json
import math

import pytest

from userbenchmark.maestro.core.output.compare import (
    CompareError,
    compare_files,
    compare_metrics,
    exit_code,
    format_compare_table,
    load_metrics,
    parse_threshold_overrides,
)

LAT = "quickstart/ag_rs/allgather/latency_avg_us"
BUSBW = "quickstart/ag_rs/allgather/busbw_gbps"
MAKESPAN = "quickstart/ag_rs/makespan_avg_us"


def _metrics_file(path, metrics, name="maestro"):
    path.write_text(json.dumps({"name": name, "environ": {"x": "y"}, "metrics": metrics}))
    return path


def _block_record(**overrides):
    record = {
        "suite": "quickstart",
        "pattern": "ag_rs",
        "block": "allgather",
        "op": "all_gather",
        "axis": "world",
        "team_size": 2,
        "dtype": "bf16",
        "size_bytes": 4194304,
        "iters": 20,
        "latency_avg_us": 100.0,
        "latency_min_us": 90.0,
        "latency_max_us": 130.0,
        "latency_p50_us": 99.0,
        "latency_p99_us": 128.0,
        "algbw_gbps": 41.9,
        "busbw_gbps": 20.97,
        "tflops": None,
        "slowdown": "",
    }
    record.update(overrides)
    return record


def _pattern_record(**overrides):
    record = {
        "suite": "quickstart",
        "pattern": "ag_rs",
        "iters": 20,
        "makespan_avg_us": 200.0,
        "makespan_p99_us": 260.0,
        "overlap_efficiency": 0.8,
    }
    record.update(overrides)
    return record


def test_metrics_json_with_a_regression(tmp_path):
    a = _metrics_file(tmp_path / "a.json", {LAT: 100.0, BUSBW: 50.0, MAKESPAN: 200.0})
    b = _metrics_file(tmp_path / "b.json", {LAT: 120.0, BUSBW: 55.0, MAKESPAN: 201.0})
    result = compare_files(a, b)
    verdicts = {row.key: row.verdict for row in result.rows}
    assert verdicts == {LAT: "regressed", BUSBW: "improved", MAKESPAN: "unchanged"}
    assert [row.key for row in result.regressions] == [LAT]
    assert exit_code(result) == 1
    table = format_compare_table(result)
    for text in (LAT, "+20.00%", "lower", "higher", "5%", "regressed", "1 regressed"):
        assert text in table


def test_no_regression_exits_zero(tmp_path):
    a = _metrics_file(tmp_path / "a.json", {LAT: 100.0, BUSBW: 50.0})
    b = _metrics_file(tmp_path / "b.json", {LAT: 90.0, BUSBW: 50.5})
    assert exit_code(compare_files(a, b)) == 0


def test_threshold_overrides_change_the_verdict(tmp_path):
    a = _metrics_file(tmp_path / "a.json", {LAT: 100.0})
    b = _metrics_file(tmp_path / "b.json", {LAT: 120.0})
    result = compare_files(a, b, threshold_overrides={"latency_avg_us": 0.25})
    assert exit_code(result) == 0
    assert "25%" in format_compare_table(result)


def test_results_records_flatten_to_metric_keys(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps([_block_record(), _block_record(block="gemm", op="gemm")]))
    metrics = load_metrics(path)
    assert metrics[LAT] == 100.0
    assert metrics["quickstart/ag_rs/gemm/busbw_gbps"] == 20.97
    # Empty / None columns are "not applicable", descriptors are not metrics.
    assert not any(k.endswith(("/tflops", "/slowdown", "/size_bytes", "/iters")) for k in metrics)
    assert len(metrics) == 2 * 7


def test_records_take_only_known_metrics(tmp_path):
    # Diagnostics and descriptors (even with a unit suffix) are not compared, so a results.json
    # gives the same keys as the metrics JSON of the same run.
    path = tmp_path / "results.json"
    record = _block_record(latency_stdev_us=3.0, slowest_rank=1, profiler="host")
    path.write_text(json.dumps([record, _pattern_record(gate_delay_max_us=2.0, num_blocks=2)]))
    metrics = load_metrics(path)
    assert not any(k.endswith(("stdev_us", "slowest_rank", "gate_delay_max_us")) for k in metrics)
    assert "quickstart/ag_rs/overlap_efficiency" in metrics


def test_patterns_records_and_nan_values(tmp_path):
    path = tmp_path / "patterns.json"
    # pandas writes NaN as null; Python's json may write NaN: both mean "not applicable".
    path.write_text(json.dumps([_pattern_record(makespan_p99_us=math.nan, lane_skew_max_us=None)]))
    assert load_metrics(path) == {
        "quickstart/ag_rs/makespan_avg_us": 200.0,
        "quickstart/ag_rs/overlap_efficiency": 0.8,
    }


def test_results_json_compares_against_metrics_json(tmp_path):
    a = tmp_path / "results.json"
    a.write_text(json.dumps([_block_record(), _pattern_record()]))
    b = _metrics_file(tmp_path / "b.json", {LAT: 100.0, BUSBW: 18.0, MAKESPAN: 200.0})
    result = compare_files(a, b)
    verdicts = {row.key: row.verdict for row in result.rows}
    assert verdicts[LAT] == "unchanged"
    assert verdicts[BUSBW] == "regressed"
    assert verdicts["quickstart/ag_rs/allgather/latency_p99_us"] == "only in A"
    assert exit_code(result) == 1
    assert "only in A" in format_compare_table(result)


def test_sweep_pattern_names_are_kept(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps([_block_record(pattern="ar_sweep[size=4M]", block="ar")]))
    assert "quickstart/ar_sweep[size=4M]/ar/latency_avg_us" in load_metrics(a)


def test_missing_file(tmp_path):
    with pytest.raises(CompareError, match="no such file"):
        load_metrics(tmp_path / "nope.json")


def test_directory(tmp_path):
    with pytest.raises(CompareError, match="directory"):
        load_metrics(tmp_path)


def test_not_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("latency: 1\n")
    with pytest.raises(CompareError, match="not JSON"):
        load_metrics(path)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ({"name": "maestro"}, "expected a TorchBench metrics JSON"),
        (42, "expected a TorchBench metrics JSON"),
        ({"metrics": [1, 2]}, "'metrics' must be an object"),
        ({"metrics": {"flat_name": 1.0}}, "malformed metric key"),
        ({"metrics": {LAT: "fast"}}, "expected a number"),
        ({"metrics": {LAT: True}}, "expected a number"),
        ({"metrics": {}}, "no metrics"),
        ([], "no metrics"),
        ([1, 2], "expected an object"),
        ([{"pattern": "p", "latency_avg_us": 1.0}], "suite"),
        ([_block_record(latency_avg_us="slow")], "expected a number"),
        ([_block_record(block="bad name")], "invalid block name"),
        ([_block_record(), _block_record()], "duplicate"),
    ],
)
def test_wrong_shapes_raise_compare_error(tmp_path, content, match):
    path = tmp_path / "x.json"
    path.write_text(json.dumps(content))
    with pytest.raises(CompareError, match=match):
        load_metrics(path)


def test_files_without_common_keys(tmp_path):
    a = _metrics_file(tmp_path / "a.json", {LAT: 1.0})
    b = _metrics_file(tmp_path / "b.json", {"other/ag_rs/allgather/latency_avg_us": 1.0})
    with pytest.raises(CompareError, match=r"no metric key in common.*quickstart.*other"):
        compare_files(a, b)


def test_compare_error_is_a_value_error():
    assert issubclass(CompareError, ValueError)


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf])
def test_bad_override_values_are_compare_errors(tmp_path, value):
    a = _metrics_file(tmp_path / "a.json", {LAT: 1.0})
    with pytest.raises(CompareError, match="finite value"):
        compare_files(a, a, threshold_overrides={"latency_avg_us": value})


def test_unknown_override_metric_is_an_error(tmp_path):
    a = _metrics_file(tmp_path / "a.json", {LAT: 1.0})
    with pytest.raises(CompareError, match="unknown metric"):
        compare_files(a, a, threshold_overrides={"latency_avgus": 0.1})


def test_parse_threshold_overrides():
    assert parse_threshold_overrides(["busbw_gbps=0.1", "latency_p99_us = 20%"]) == {
        "busbw_gbps": 0.1,
        "latency_p99_us": pytest.approx(0.2),
    }
    for bad in ("busbw_gbps", "=0.1", "busbw_gbps=", "busbw_gbps=fast", "busbw_gbps=-1"):
        with pytest.raises(CompareError):
            parse_threshold_overrides([bad])


def test_compare_metrics_does_not_modify_inputs():
    a, b = {LAT: 1.0}, {LAT: 2.0, BUSBW: 3.0}
    rows = compare_metrics(a, b)
    assert a == {LAT: 1.0} and b == {LAT: 2.0, BUSBW: 3.0}
    assert [r.verdict for r in rows] == ["only in B", "regressed"]


def test_small_values_never_print_as_zero(tmp_path):
    a = _metrics_file(tmp_path / "a.json", {LAT: 0.0123})
    b = _metrics_file(tmp_path / "b.json", {LAT: 0.0124})
    assert "0.0123" in format_compare_table(compare_files(a, b))
