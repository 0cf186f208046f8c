"""Unit tests for the TorchBench regression detector on synthetic control/treatment files."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import yaml

from userbenchmark.maestro import regression_detector
from userbenchmark.maestro.regression_detector import (
    TorchBenchABTestMetric,
    TorchBenchABTestResult,
    run,
)

LAT = "quickstart/ag_rs/allgather/latency_avg_us"
BUSBW = "quickstart/ag_rs/allgather/busbw_gbps"
RS_BUSBW = "quickstart/ag_rs/reduce_scatter/busbw_gbps"
WRONG = "quickstart/ag_rs/allgather/wrong_elements"
MAKESPAN = "quickstart/ag_rs/makespan_avg_us"


def _doc(metrics, git="abc123", **environ):
    return {
        "name": "maestro",
        "environ": {
            "pytorch_git_version": git,
            "pytorch_version": "2.13.0",
            "profiler": "cupti",
            **environ,
        },
        "metrics": metrics,
    }


def _ci(key, value, half=0.01):
    """A metric with a 95 % interval of +-``half`` (relative) over 30 degrees of freedom."""
    low, high = value * (1 - half), value * (1 + half)
    return {key: value, f"{key}_ci_low": low, f"{key}_ci_high": high, f"{key}_ci_df": 30}


def _measured(values):
    out = {}
    for key, value in values.items():
        out |= {key: value} if key == WRONG else _ci(key, value)
    return out


BASE = {LAT: 100.0, BUSBW: 50.0, RS_BUSBW: 40.0, WRONG: 0.0, MAKESPAN: 200.0}


def test_outside_torchbench_the_local_types_are_used():
    # This repository has no userbenchmark/utils.py: the stand-ins must be picked.
    assert TorchBenchABTestResult is regression_detector._LocalABTestResult
    assert TorchBenchABTestMetric is regression_detector._LocalABTestMetric
    fields = [f.name for f in dataclasses.fields(TorchBenchABTestResult)]
    assert fields == [
        "name",
        "control_env",
        "treatment_env",
        "details",
        "control_only_metrics",
        "treatment_only_metrics",
        "bisection",
        "bisection_mode",
        "bisection_config_file_path",
    ]
    assert [f.name for f in dataclasses.fields(TorchBenchABTestMetric)] == [
        "control",
        "treatment",
        "delta",
    ]


def test_identical_runs_have_no_details():
    result = run(_doc(BASE), _doc(BASE))
    assert isinstance(result, TorchBenchABTestResult)
    assert result.name == "maestro"
    assert result.details == {}
    assert result.control_only_metrics == {}
    assert result.treatment_only_metrics == {}


def test_direction_aware_regressions():
    treatment = dict(BASE)
    treatment[LAT] = 120.0  # latency up 20 %: regression
    treatment[BUSBW] = 40.0  # busbw down 20 %: regression
    treatment[RS_BUSBW] = 48.0  # busbw up 20 %: improvement, not reported
    treatment[WRONG] = 1.0  # any wrong element: regression
    treatment[MAKESPAN] = 150.0  # faster: improvement
    result = run(_doc(_measured(BASE)), _doc(_measured(treatment), git="def456"))
    assert set(result.details) == {LAT, BUSBW, WRONG}
    lat = result.details[LAT]
    assert isinstance(lat, TorchBenchABTestMetric)
    assert (lat.control, lat.treatment) == (100.0, 120.0)
    assert lat.delta == pytest.approx(0.2)
    assert result.details[BUSBW].delta == pytest.approx(-0.2)
    # A control of 0 has no relative change: TorchBench accepts a text delta.
    assert result.details[WRONG].delta == "0 -> 1"
    assert result.control_env["pytorch_git_version"] == "abc123"
    assert result.treatment_env["git_commit_hash"] == "def456"
    assert result.bisection == "pytorch"


def test_changes_below_the_floor_or_within_noise_are_not_reported():
    treatment = dict(BASE)
    treatment[LAT] = 104.0  # beyond noise, below the 5 % floor
    treatment[BUSBW] = 48.0
    assert run(_doc(_measured(BASE)), _doc(_measured(treatment))).details == {}
    noisy_a, noisy_b = _ci(LAT, 100.0, half=0.3), _ci(LAT, 130.0, half=0.3)
    assert run(_doc(noisy_a), _doc(noisy_b)).details == {}  # +30 % inside +-30 % noise
    assert run(_doc(BASE), _doc({**BASE, LAT: 200.0})).details == {}  # no interval: not judged


def test_threshold_overrides():
    treatment = dict(BASE)
    treatment[LAT] = 120.0
    result = run(
        _doc(_measured(BASE)),
        _doc(_measured(treatment)),
        threshold_overrides={"latency_avg_us": 0.3},
    )
    assert result.details == {}


def test_one_sided_metrics_are_reported_not_fatal():
    control = dict(BASE)
    control["quickstart/old/gemm/tflops"] = 10.0
    treatment = dict(BASE)
    treatment["quickstart/new/gemm/tflops"] = 12.0
    result = run(_doc(control), _doc(treatment))
    assert result.details == {}
    assert result.control_only_metrics == {"quickstart/old/gemm/tflops": 10.0}
    assert result.treatment_only_metrics == {"quickstart/new/gemm/tflops": 12.0}


def test_unknown_direction_and_non_numeric_values_are_reported():
    mystery = "quickstart/ag_rs/mystery"
    control = {**BASE, **_ci(mystery, 1.0), "quickstart/ag_rs/note": "a"}
    treatment = {**BASE, **_ci(mystery, 2.0), "quickstart/ag_rs/note": "b"}
    result = run(_doc(control), _doc(treatment))
    assert set(result.details) == {mystery, "quickstart/ag_rs/note"}  # changed, either way
    assert result.details["quickstart/ag_rs/note"].delta == "a -> b"


def test_runs_measured_with_different_settings_are_refused():
    with pytest.raises(ValueError, match="block.ar/ar: A 'size=1M', B 'size=4M'"):
        run(_doc(BASE, **{"block.ar/ar": "size=1M"}), _doc(BASE, **{"block.ar/ar": "size=4M"}))
    assert run(_doc(BASE, device="a"), _doc(BASE, device="b")).details == {}  # the stack may


def test_world_size_one_files_compare():
    # A one-rank team has no busbw (not 0): the key is absent on both sides.
    one = {**_ci(LAT, 100.0), "quickstart/ag_rs/allgather/algbw_gbps": 5.0}
    result = run(_doc(one, world_size="1"), _doc(one, world_size="1"))
    assert result.details == {} and not result.control_only_metrics


def test_inputs_are_not_modified():
    control, treatment = _doc(BASE), _doc({**BASE, LAT: 150.0})
    before = copy.deepcopy((control, treatment))
    run(control, treatment)
    assert (control, treatment) == before


def test_result_survives_yaml_safe_dump():
    # TorchBench writes the result with yaml.safe_dump(asdict(result)).
    result = run(_doc(_measured(BASE)), _doc(_measured({**BASE, LAT: 150.0, WRONG: 3.0})))
    text = yaml.safe_dump(dataclasses.asdict(result), sort_keys=False)
    loaded = yaml.safe_load(text)
    assert loaded["details"][LAT]["delta"] == pytest.approx(0.5)
    assert not math.isnan(loaded["details"][LAT]["treatment"])


def test_different_benchmarks_and_bad_shapes_raise():
    with pytest.raises(ValueError, match="different benchmarks"):
        run(_doc(BASE), {**_doc(BASE), "name": "other"})
    with pytest.raises(ValueError, match="metrics"):
        run({"name": "maestro"}, _doc(BASE))
    with pytest.raises(ValueError):
        run([], _doc(BASE))  # type: ignore[arg-type]


def test_a_run_without_settings_is_refused_unless_forced():
    bare = {"name": "maestro", "metrics": _measured(BASE)}
    for control, treatment in ((bare, _doc(BASE)), (_doc(BASE), bare)):
        with pytest.raises(ValueError, match="records no settings.*force=True"):
            run(control, treatment)
    assert run(bare, bare, force=True).details == {}


def test_a_rise_and_its_matching_fall_are_reported_alike():
    tflops = "quickstart/ag_rs/gemm/tflops"
    slow = "quickstart/ag_rs/gemm/latency_avg_us"
    for factor in (1.1, 1.5, 2.0, 3.0):
        before = _doc({**_ci(slow, 100.0, 0.05), **_ci(tflops, 10.0, 0.05)})
        after = _doc({**_ci(slow, 100.0 * factor, 0.05), **_ci(tflops, 10.0 / factor, 0.05)})
        details = run(before, after, threshold_overrides={"latency_avg_us": 0.6, "tflops": 0.6})
        assert (slow in details.details) == (tflops in details.details) == (factor > 1.6)
