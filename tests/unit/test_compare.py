"""Unit tests for comparing two result files (metrics JSON, results.json, patterns.json)."""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from userbenchmark.maestro.core.output.compare import (
    CompareError,
    compare_files,
    exit_code,
    format_compare_table,
    load_metrics,
    parse_threshold_overrides,
)

LAT = "quickstart/ag_rs/allgather/latency_avg_us"
BUSBW = "quickstart/ag_rs/allgather/busbw_gbps"
MAKESPAN = "quickstart/ag_rs/makespan_avg_us"


ENVIRON = {"backend": "nccl", "profiler": "cupti", "world_size": "2"}


def _metrics_file(path, metrics, name="maestro", environ=ENVIRON):
    path.write_text(json.dumps({"name": name, "environ": environ, "metrics": metrics}))
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


def _ci(key, value, low, high, df=30):
    """A metric and its 95 % interval, as a metrics file carries them."""
    return {key: value, f"{key}_ci_low": low, f"{key}_ci_high": high, f"{key}_ci_df": df}


def _verdicts(result):
    return {j.key: j.verdict for j in result.judgements}


def test_a_change_beyond_noise_and_floor_regresses(tmp_path):
    a = {**_ci(LAT, 100.0, 98, 102), **_ci(BUSBW, 50.0, 49, 51), **_ci(MAKESPAN, 200.0, 190, 210)}
    b = {**_ci(LAT, 120.0, 118, 122), **_ci(BUSBW, 55.0, 54, 56), **_ci(MAKESPAN, 205.0, 195, 215)}
    result = compare_files(
        _metrics_file(tmp_path / "a.json", a), _metrics_file(tmp_path / "b.json", b)
    )
    assert _verdicts(result) == {LAT: "regressed", BUSBW: "improved", MAKESPAN: "within noise"}
    assert [j.key for j in result.regressions] == [LAT]
    assert exit_code(result) == 1
    table = format_compare_table(result)
    for text in ("ag_rs/allgather/latency_avg_us", "+20.0%", "1 regressed, 1 improved"):
        assert text in table
    assert "makespan" not in table and "1 within noise (--all lists every row)" in table
    # The floor shown is the one applied: 5 %, or the wider spread of a run's window means
    # (makespan's +-5 % interval over 31 windows: they spread by 14.6 %).
    floors = {j.key: j.floor for j in result.judgements}
    assert floors[LAT] >= 0.05 and abs(floors[MAKESPAN] - 0.146) < 0.001
    assert "14.6%" in format_compare_table(result, show_all=True)


def test_a_significant_change_below_the_floor_is_within_noise(tmp_path):
    a = _metrics_file(tmp_path / "a.json", _ci(LAT, 100.0, 99.9, 100.1))
    b = _metrics_file(tmp_path / "b.json", _ci(LAT, 104.0, 103.9, 104.1))
    result = compare_files(a, b)
    assert _verdicts(result) == {LAT: "within noise"}
    judged = result.judgements[0]
    assert judged.low > 0  # beyond noise: the interval of the change excludes 0 ...
    assert judged.change < judged.floor  # ... but 4 % is below the 5 % floor
    assert exit_code(result) == 0


def test_a_large_change_within_the_runs_noise_is_within_noise(tmp_path):
    a = _metrics_file(tmp_path / "a.json", _ci(LAT, 100.0, 60.0, 140.0, df=5))
    b = _metrics_file(tmp_path / "b.json", _ci(LAT, 130.0, 80.0, 180.0, df=5))
    result = compare_files(a, b)
    assert _verdicts(result) == {LAT: "within noise"}
    assert result.judgements[0].low < 0 < result.judgements[0].high
    assert "within noise" in format_compare_table(result)


def test_metrics_without_an_interval_are_not_judged(tmp_path):
    a = _metrics_file(tmp_path / "a.json", {LAT: 100.0, BUSBW: 50.0})
    b = _metrics_file(tmp_path / "b.json", {LAT: 200.0, BUSBW: 10.0})
    result = compare_files(a, b)
    assert set(_verdicts(result).values()) == {"not judged"}
    assert exit_code(result) == 0


def test_the_more_metrics_judged_the_larger_a_change_must_be(tmp_path):
    # +6 %: 3.9 combined standard errors (5 windows a run, which spread by 2.4 %), past the 5 %
    # floor: beyond noise when judged alone (t 2.3 at Welch's 8 degrees of freedom), not among
    # 201 metrics (t 6.4).
    a = _ci(LAT, 100.0, 97.0, 103.0, df=4)
    b = _ci(LAT, 106.0, 103.0, 109.0, df=4)
    alone = compare_files(
        _metrics_file(tmp_path / "a.json", a), _metrics_file(tmp_path / "b.json", b)
    )
    assert _verdicts(alone)[LAT] == "regressed"
    many_a, many_b = dict(a), dict(b)
    for i in range(200):
        key = f"quickstart/ag_rs/b{i}/latency_avg_us"
        many_a |= _ci(key, 100.0, 98.0, 102.0, df=1000)
        many_b |= _ci(key, 100.0, 98.0, 102.0, df=1000)
    crowd = compare_files(
        _metrics_file(tmp_path / "ma.json", many_a), _metrics_file(tmp_path / "mb.json", many_b)
    )
    assert _verdicts(crowd)[LAT] == "within noise"


def test_threshold_overrides_move_the_floor(tmp_path):
    a = _metrics_file(tmp_path / "a.json", _ci(LAT, 100.0, 99.0, 101.0))
    b = _metrics_file(tmp_path / "b.json", _ci(LAT, 120.0, 119.0, 121.0))
    result = compare_files(a, b, threshold_overrides={"latency_avg_us": 0.25})
    assert exit_code(result) == 0
    assert "25%" in format_compare_table(result, show_all=True)


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
    path.write_text(json.dumps([record, _pattern_record(gate_spin_us=2.0, num_blocks=2)]))
    metrics = load_metrics(path)
    assert not any(k.endswith(("stdev_us", "slowest_rank", "gate_spin_us")) for k in metrics)
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
    block = "quickstart/ag_rs/allgather"
    stats = {f"{block}/latency_{s}_us": v for s, v in (("min", 90.0), ("max", 130.0), ("p50", 99))}
    b = _metrics_file(tmp_path / "b.json", {LAT: 100.0, BUSBW: 18.0, MAKESPAN: 200.0, **stats})
    result = compare_files(a, b)
    assert _verdicts(result)[LAT] == "not judged"  # no interval in these files
    assert "quickstart/ag_rs/allgather/latency_p99_us" in result.only_a
    assert exit_code(result) == 0
    assert "only in A" in format_compare_table(result)


def test_a_figure_left_out_as_not_measurable_is_said_so_not_only_in_the_other(tmp_path):
    slowdown = "quickstart/ag_rs/allgather/slowdown"
    efficiency = "quickstart/ag_rs/overlap_efficiency"

    def records(slowdown_ci, efficiency_ci):
        block = _block_record(**_ci("slowdown", 1.2, *slowdown_ci, df=3))
        pattern = _pattern_record(**_ci("overlap_efficiency", 0.8, *efficiency_ci, df=3))
        return json.dumps([block, pattern])

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a = _write_text(tmp_path / "a" / "results.json", records((0.5, 2.0), (0.7, 0.9)))
    b = _write_text(tmp_path / "b" / "results.json", records((1.1, 1.3), (-0.2, 1.1)))
    result = compare_files(a, b)
    assert result.unmeasurable_in_a == {slowdown: 1.2}  # B's value, the figure A could not read
    assert result.unmeasurable_in_b == {efficiency: 0.8}
    assert slowdown not in result.only_b and efficiency not in result.only_a
    table = format_compare_table(result, show_all=True)
    assert "1 not measurable in A, 1 not measurable in B" in table and "only in" not in table
    assert exit_code(result) == 0
    # A metrics file leaves such figures out without a word: there they can only be "only in".
    c = _metrics_file(tmp_path / "c.json", load_metrics(a))
    assert result.unmeasurable_in_a and compare_files(c, b, force=True).only_b == {slowdown: 1.2}


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


def test_small_values_never_print_as_zero(tmp_path):
    a = _metrics_file(tmp_path / "a.json", {LAT: 0.0123})
    b = _metrics_file(tmp_path / "b.json", {LAT: 0.0124})
    assert "0.0123" in format_compare_table(compare_files(a, b), show_all=True)


# --- any JSON at all: a result or a CompareError naming the file, never another exception ------


def _write_text(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def _compare_error(path, match):
    with pytest.raises(CompareError, match=match) as info:
        load_metrics(path)
    assert str(path) in str(info.value)
    return str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"metrics": {"' + LAT + '": ' + "[" * 100_000 + "]" * 100_000 + "}}",
        '{"a": ' * 100_000 + "1" + "}" * 100_000,
    ],
)
def test_deeply_nested_json_is_a_compare_error(tmp_path, text):
    _compare_error(_write_text(tmp_path / "deep.json", text), "nested too deeply")


def test_nested_values_that_parse_are_described_not_printed(tmp_path):
    deep = "[" * 900 + "]" * 900  # parses; its repr would recurse
    path = _write_text(tmp_path / "a.json", '{"metrics": {"' + LAT + '": ' + deep + "}}")
    _compare_error(path, "expected a number, got a list")
    path = _write_text(
        tmp_path / "b.json", "[" + json.dumps(_block_record())[:-1] + ', "notes": ' + deep + "}]"
    )
    _compare_error(path, "'notes': expected a string, got a list")


@pytest.mark.parametrize("digits", [400, 5000, 100_000])
def test_huge_integers_are_out_of_range(tmp_path, digits):
    number = "9" * digits
    path = _write_text(tmp_path / "m.json", '{"metrics": {"' + LAT + '": ' + number + "}}")
    _compare_error(path, f"integer of {digits} digits is out of range")
    record = json.dumps(_block_record())[:-1] + ', "latency_max_us": -' + number + "}"
    _compare_error(_write_text(tmp_path / "r.json", f"[{record}]"), "out of range")


def test_an_integer_beyond_float64_is_out_of_range(tmp_path):
    number = str(2 * 10**308)  # 309 digits: a Python int, but no float
    path = _write_text(tmp_path / "m.json", '{"metrics": {"' + LAT + '": ' + number + "}}")
    _compare_error(path, r"metrics\[.*latency_avg_us'\]: invalid value .* out of range")
    path = _write_text(tmp_path / "r.json", json.dumps([_block_record(latency_avg_us=2 * 10**308)]))
    _compare_error(path, r"record 0: column 'latency_avg_us': .* is out of range")


@pytest.mark.parametrize(
    ("key", "text"),
    [
        (LAT, "Infinity"),
        (LAT, "-Infinity"),
        (LAT, "0"),
        (LAT, "-0.0"),
        (LAT, "-3.5"),
        (BUSBW, "0.0"),
        (f"{BUSBW}_ci_low", "NaN"),  # a bound is a number, or absent
        (MAKESPAN, "-1"),
        ("quickstart/ag_rs/allgather/slowdown", "0"),
        ("quickstart/ag_rs/allgather/wrong_elements", "-1"),
        ("quickstart/ag_rs/comm_compute_overlap", "1.5"),
        ("quickstart/ag_rs/allgather+reduce_scatter/pairwise_overlap", "-0.1"),
        ("quickstart/ag_rs/allgather/mystery_metric", "Infinity"),  # unknown: finite at least
    ],
)
def test_impossible_values_in_a_metrics_file_are_invalid_not_judged(tmp_path, key, text):
    base = key.removesuffix("_ci_low")
    path = _write_text(tmp_path / "m.json", f'{{"metrics": {{"{base}": 1, "{key}": {text}}}}}')
    message = _compare_error(path, "invalid value")
    assert key in message
    good = _metrics_file(tmp_path / "good.json", {base: 1.0})
    with pytest.raises(CompareError, match="invalid value"):
        compare_files(good, path)


def test_a_nan_fails_a_judged_figure_and_is_shown_for_a_harness_diagnostic(tmp_path):
    skew = "quickstart/ag_rs/allgather/start_skew_us"
    a = _metrics_file(tmp_path / "a.json", {LAT: 10.0, BUSBW: 5.0, skew: 3.0})
    text = json.dumps({"environ": ENVIRON, "metrics": {LAT: math.nan, skew: math.nan}})
    b = _write_text(tmp_path / "b.json", text)  # NaN: measured without a value
    result = compare_files(a, b)
    assert result.nan_in_b == {LAT: 10.0} and exit_code(result) == 1
    assert result.only_a == {BUSBW: 5.0}  # absent from B, not NaN there: only in A
    (shown,) = result.judgements
    assert shown.key == skew and shown.verdict == "not judged" and not shown.decides
    table = format_compare_table(result, show_all=True)
    assert "FAILED: NaN in B where A has a value: " + LAT in table
    (busbw_row,) = [line for line in table.splitlines() if "allgather/busbw_gbps" in line]
    assert busbw_row.endswith("only in A")
    metrics = {skew: math.nan, LAT: 10.0}
    c = _write_text(tmp_path / "c.json", json.dumps({"environ": ENVIRON, "metrics": metrics}))
    assert exit_code(compare_files(a, c)) == 0
    assert exit_code(compare_files(a, c, judge_harness=True)) == 1


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("latency_avg_us", math.inf),
        ("latency_p99_us", 0.0),
        ("latency_min_us", -2.0),
        ("busbw_gbps", 0),
        ("isolated_latency_avg_us", -math.inf),
    ],
)
def test_impossible_values_in_records_are_invalid(tmp_path, column, value):
    path = tmp_path / "results.json"
    path.write_text(json.dumps([_block_record(**{column: value})]))
    message = _compare_error(path, f"invalid value .* for {column}")
    assert f"quickstart/ag_rs/allgather/{column}" in message


def test_possible_edge_values_are_judged(tmp_path):
    a = _metrics_file(
        tmp_path / "a.json",
        {
            "quickstart/ag_rs/overlap_efficiency": -0.5,  # slower than serial: a real result
            "quickstart/ag_rs/allgather/wrong_elements": 0.0,
            "quickstart/ag_rs/allgather/rank_skew_us": 0.0,
            "quickstart/ag_rs/allgather+rs/pairwise_overlap": 1.0,
            LAT: 5e-324,
        },
    )
    assert {j.verdict for j in compare_files(a, a).judgements} == {"not judged", "unchanged"}


@pytest.fixture
def maestro_logging():
    """cli.main configures the "maestro" logger (handlers, no propagation): undone afterwards,
    so later tests' caplog still sees maestro's records."""
    logger = logging.getLogger("maestro")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


def test_invalid_input_exits_2_naming_the_file(tmp_path, capsys, maestro_logging):
    from userbenchmark.maestro.cli import main

    good = _metrics_file(tmp_path / "good.json", {LAT: 1.0})
    bad = _write_text(tmp_path / "bad.json", '{"metrics": {"' + LAT + '": -1}}')
    deep = _write_text(tmp_path / "deep.json", "[" * 100_000)
    for path in (bad, deep):
        assert main(["compare", str(good), str(path)]) == 2
        err = capsys.readouterr().err
        assert str(path) in err and "Traceback" not in err


def test_output_dirs_compare_with_the_same_keys_as_their_metrics_files(tmp_path):
    from tests.unit.test_golden_outputs import _outcomes
    from userbenchmark.maestro.core.output.writer import OutputWriter

    writer = OutputWriter(
        output_dir=tmp_path / "out", metrics_path=tmp_path / "m.json", environ=ENVIRON
    )
    for _, outcome, _ in _outcomes():
        writer.add(outcome)
    from_dir = load_metrics(tmp_path / "out")
    assert from_dir == load_metrics(tmp_path / "m.json")
    assert "golden/overlap/ag+rs/pairwise_overlap" in from_dir
    assert "golden/overlap/lane_skew_p50_us" in from_dir
    assert "golden/overlap/lane_skew_p99_us" not in from_dir  # 5 iterations: p99 is the max
    assert "golden/overlap/ag/latency_avg_us_ci_df" in from_dir
    pairs = load_metrics(tmp_path / "out" / "pairs.json")
    assert set(pairs) == {k for k in from_dir if k.endswith("/pairwise_overlap")}
    result = compare_files(tmp_path / "out", tmp_path / "m.json")
    assert {j.verdict for j in result.judgements} == {"within noise", "not judged", "unchanged"}
    assert exit_code(result) == 0


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**330), max_value=10**330),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "nan", "1e999", "bad name", "a+b", "x/y"]),
)
_JSON = st.recursive(
    _SCALARS,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)
_NAME = st.one_of(st.from_regex(r"[A-Za-z0-9_.-]{1,6}", fullmatch=True), st.text(max_size=6))
_METRIC = st.sampled_from(
    ["latency_avg_us", "busbw_gbps", "slowdown", "wrong_elements", "makespan_avg_us",
     "overlap_efficiency", "pairwise_overlap", "lane_skew_p99_us", "mystery", "x_us"]
)  # fmt: skip
_KEY = st.one_of(
    st.text(max_size=20),
    st.builds(lambda s, p, m: f"{s}/{p}/{m}", _NAME, _NAME, _METRIC),
    st.builds(lambda s, p, b, m: f"{s}/{p}/{b}/{m}", _NAME, _NAME, _NAME, _METRIC),
    st.builds(lambda s, p, a, b, m: f"{s}/{p}/{a}+{b}/{m}", _NAME, _NAME, _NAME, _NAME, _METRIC),
)
_COLUMN = st.sampled_from(
    ["suite", "pattern", "block", "block_a", "block_b", "size_bytes", "iters", "notes",
     "latency_avg_us", "busbw_gbps", "slowdown", "wrong_elements", "makespan_avg_us",
     "overlap_efficiency", "pairwise_overlap", "lane_skew_p99_us", "future_column"]
)  # fmt: skip
_VALUE = st.one_of(_JSON, _NAME, st.floats(min_value=-10, max_value=1e6))
_DOC = st.one_of(
    _JSON,
    st.fixed_dictionaries(
        {"name": _JSON, "metrics": st.one_of(_JSON, st.dictionaries(_KEY, _VALUE))}
    ),
    st.lists(st.dictionaries(_COLUMN, _VALUE, max_size=8), max_size=4),
    st.lists(
        st.fixed_dictionaries(
            {"suite": _NAME, "pattern": _NAME, "block": _NAME},
            optional={"latency_avg_us": _VALUE, "pairwise_overlap": _VALUE, "iters": _VALUE},
        ),
        max_size=4,
    ),
)


@settings(
    max_examples=int(os.environ.get("MAESTRO_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(a=_DOC, b=st.one_of(_DOC, st.binary(max_size=40)))
def test_any_json_gives_metrics_or_a_compare_error(a, b):
    with tempfile.TemporaryDirectory() as tmp:
        path_a = Path(tmp) / "a.json"
        path_a.write_text(json.dumps(a), encoding="utf-8")
        path_b = Path(tmp) / "b.json"
        if isinstance(b, bytes):
            path_b.write_bytes(b)
        else:
            path_b.write_text(json.dumps(b), encoding="utf-8")
        for path in (path_a, path_b):
            try:
                metrics = load_metrics(path)
            except CompareError as exc:
                assert str(path) in str(exc)
            else:
                assert metrics and all(math.isfinite(v) for v in metrics.values())
        try:
            result = compare_files(path_a, path_b)
        except CompareError:
            return
        format_compare_table(result)
        assert exit_code(result) in (0, 1)


# --- a treatment that crashed, settings that cannot be read, inputs that are not files --------


def _run_folder(tmp_path, name, outcomes, environ=None):
    from userbenchmark.maestro.core.output.writer import OutputWriter

    folder = tmp_path / name
    writer = OutputWriter(output_dir=folder, metrics_path=None, environ=environ or {"x": "1"})
    for outcome in outcomes:
        writer.add(outcome)
    return writer, folder


def test_a_treatment_missing_patterns_blocks_or_with_failures_fails(tmp_path):
    import dataclasses

    from tests.unit.test_golden_outputs import _outcomes

    outcomes = [o for _, o, _ in _outcomes()]
    _run_folder(tmp_path, "a", outcomes)
    _, lacking = _run_folder(tmp_path, "b", outcomes[:1])
    result = compare_files(tmp_path / "a", lacking)
    assert result.missing == ("golden/ar_sweep[size=1M]", "golden/ar_sweep[size=64K]")
    assert exit_code(result) == 1
    assert "B lacks what A measured: golden/ar_sweep[size=1M]" in format_compare_table(result)
    first = dataclasses.replace(outcomes[0], blocks=outcomes[0].blocks[:3])
    _run_folder(tmp_path, "c", [first, *outcomes[1:]])
    assert compare_files(tmp_path / "a", tmp_path / "c").missing == ("golden/overlap/nap",)
    writer, failed = _run_folder(tmp_path, "d", outcomes)
    writer.add_failure("ar_sweep[size=2M]", "rank 1 died")
    result = compare_files(tmp_path / "a", failed)
    assert result.failures == ("ar_sweep[size=2M]",) and exit_code(result) == 1
    assert "B recorded failed patterns: ar_sweep[size=2M]" in format_compare_table(result)


def test_without_run_json_the_results_settings_are_still_checked(tmp_path):
    import dataclasses

    from tests.unit.test_golden_outputs import _outcomes

    outcomes = [o for _, o, _ in _outcomes()]
    _run_folder(tmp_path, "a", outcomes)
    more = dataclasses.replace(outcomes[0].pattern, iters=50)
    _run_folder(tmp_path, "b", [dataclasses.replace(outcomes[0], pattern=more), *outcomes[1:]])
    (tmp_path / "b" / "run.json").unlink()
    with pytest.raises(CompareError, match=r"pattern\.overlap: A 'iters=5 .*B 'iters=50"):
        compare_files(tmp_path / "a", tmp_path / "b")
    result = compare_files(tmp_path / "a", tmp_path / "b", force=True)
    assert any("no run.json" in note for note in result.notes)


def test_pipes_devices_and_huge_files_are_refused_at_once(tmp_path, monkeypatch):
    from userbenchmark.maestro.core.output import results

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it would block until a writer came
    _compare_error(fifo, "not a regular file")
    if Path("/dev/zero").exists():
        _compare_error(Path("/dev/zero"), "not a regular file")
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate(results.MAX_FILE_BYTES + 1)  # sparse: refused by its size, never read
    _compare_error(big, "larger than 128 MiB")
    monkeypatch.setattr(results, "MAX_FILE_BYTES", 10)
    with pytest.raises(results.ResultsError, match="larger than"):
        results.read_text_file(_metrics_file(tmp_path / "m.json", {LAT: 1.0}), limit=10)
