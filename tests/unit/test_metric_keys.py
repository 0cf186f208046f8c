"""Unit tests for metric key syntax, directions, thresholds and verdicts."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from userbenchmark.maestro.core.output.metric_keys import (
    BLOCK_METRICS,
    METRICS,
    PAIR_METRICS,
    PATTERN_METRICS,
    UNKNOWN_DIRECTION_THRESHOLD,
    MetricKey,
    Threshold,
    check_name,
    default_threshold,
    judge,
    judge_key,
    metric_direction,
    metric_key,
    metric_value_problem,
    pair_name,
    parse_metric_key,
    relative_delta,
)

LOWER = [
    "latency_avg_us",
    "latency_min_us",
    "latency_max_us",
    "latency_p50_us",
    "latency_p99_us",
    "isolated_latency_avg_us",
    "slowdown",
    "wrong_elements",
    "start_skew_us",
    "duration_spread_us",
    "makespan_avg_us",
    "makespan_p99_us",
    "serial_us",
    "ideal_us",
    "lane_skew_p50_us",
    "lane_skew_p99_us",
    "lane_skew_max_us",
    "gate_skew_p50_us",
    "gate_skew_max_us",
]
HIGHER = [
    "algbw_gbps",
    "busbw_gbps",
    "tflops",
    "overlap_efficiency",
    "shared_busbw_gbps",
    "comm_compute_overlap",
]
TWO_SIDED = ["pairwise_overlap"]  # descriptive: neither direction is better


def test_block_key_round_trips():
    key = metric_key("fsdp-overlap", "ag_rs", "allgather", "busbw_gbps")
    assert key == "fsdp-overlap/ag_rs/allgather/busbw_gbps"
    assert parse_metric_key(key) == MetricKey(
        suite="fsdp-overlap", pattern="ag_rs", block="allgather", metric="busbw_gbps"
    )


def test_pattern_key_round_trips():
    key = metric_key("quickstart", "ag_rs", None, "makespan_avg_us")
    assert key == "quickstart/ag_rs/makespan_avg_us"
    parsed = parse_metric_key(key)
    assert parsed.block is None
    assert str(parsed) == key


@pytest.mark.parametrize(
    "pattern", ["ar_sweep[size=4M]", "ar_sweep[size=4M,dtype=bf16]", "x[size=1.5M]", "p.v2-b"]
)
def test_sweep_suffixes_are_valid_pattern_names(pattern):
    key = metric_key("suite", pattern, "ar", "latency_avg_us")
    assert parse_metric_key(key).pattern == pattern


@pytest.mark.parametrize(
    ("suite", "pattern", "block", "metric"),
    [
        ("a/b", "p", "b", "latency_avg_us"),
        ("s", "p/q", "b", "latency_avg_us"),
        ("s", "p", "b/c", "latency_avg_us"),
        ("s", "p", "b", "lat/us"),
        ("", "p", "b", "latency_avg_us"),
        ("s", "", "b", "latency_avg_us"),
        ("s", "p", "", "latency_avg_us"),
        ("AG+RS (256M)", "p", "b", "latency_avg_us"),
        ("s", "p[size=4M", "b", "latency_avg_us"),
        ("s", "[size=4M]", "b", "latency_avg_us"),
        ("s", "p[]", "b", "latency_avg_us"),
        ("s", "p", "blk[x=1]", "latency_avg_us"),
        ("s", "p", "b", ""),
        ("s", "p", 3, "latency_avg_us"),
    ],
)
def test_metric_key_rejects_invalid_parts(suite, pattern, block, metric):
    with pytest.raises(ValueError, match="invalid"):
        metric_key(suite, pattern, block, metric)


@pytest.mark.parametrize(
    "key",
    ["", "a", "a/b", "a/b/c/d/e", "a//c", "s/p/b/", "/p/b/m", "s/p q/b/m", "s/p[/b]/m"],
)
def test_parse_rejects_malformed_keys(key):
    with pytest.raises(ValueError, match="malformed metric key"):
        parse_metric_key(key)


def test_parse_rejects_non_strings():
    with pytest.raises(ValueError):
        parse_metric_key(42)  # type: ignore[arg-type]


def test_check_name_names_the_part_and_rejects_unknown_parts():
    assert check_name("block", "gemm_0") == "gemm_0"
    with pytest.raises(ValueError, match="invalid suite name"):
        check_name("suite", "has space")
    with pytest.raises(ValueError, match="unknown key part"):
        check_name("lane", "x")  # type: ignore[arg-type]


_names = st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True)
_sweep = st.from_regex(r"\[[A-Za-z0-9_.,=+-]{1,12}\]", fullmatch=True)


@given(
    suite=_names,
    base=_names,
    suffix=st.one_of(st.just(""), _sweep),
    block=st.one_of(st.none(), _names),
    metric=_names,
)
def test_every_valid_key_round_trips(suite, base, suffix, block, metric):
    key = metric_key(suite, base + suffix, block, metric)
    assert parse_metric_key(key) == MetricKey(
        suite=suite, pattern=base + suffix, block=block, metric=metric
    )


@given(suite=_names, base=_names, suffix=st.one_of(st.just(""), _sweep), a=_names, b=_names)
def test_every_valid_pair_key_round_trips(suite, base, suffix, a, b):
    key = metric_key(suite, base + suffix, None, "pairwise_overlap", pair=(a, b))
    assert key == f"{suite}/{base}{suffix}/{a}+{b}/pairwise_overlap"
    parsed = parse_metric_key(key)
    assert parsed == MetricKey(
        suite=suite, pattern=base + suffix, block=None, metric="pairwise_overlap", pair=(a, b)
    )
    assert parsed.level == "pair" and str(parsed) == key


def test_pair_keys():
    key = metric_key("fsdp", "ag_rs[size=4M,x=a+b]", None, "pairwise_overlap", pair=("ag", "rs"))
    assert key == "fsdp/ag_rs[size=4M,x=a+b]/ag+rs/pairwise_overlap"
    assert parse_metric_key(key).pair == ("ag", "rs")
    assert parse_metric_key(key).block is None
    assert parse_metric_key("s/p/b/m").level == "block"
    assert parse_metric_key("s/p/m").level == "pattern"
    assert pair_name("ag", "rs") == check_name("pair", "ag+rs") == "ag+rs"
    with pytest.raises(ValueError, match="invalid block name"):
        check_name("block", "ag+rs")  # the separator is in no block name
    with pytest.raises(ValueError, match="invalid pair name"):
        check_name("pair", "ag")
    with pytest.raises(ValueError, match="invalid block name"):
        pair_name("ag", "r/s")
    with pytest.raises(ValueError, match="block or a pair, not both"):
        metric_key("s", "p", "b", "m", pair=("a", "b"))
    with pytest.raises(ValueError, match="invalid pair"):
        metric_key("s", "p", None, "m", pair=("a", "b", "c"))  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["s/p/a+b+c/m", "s/p/+b/m", "s/p/a+/m", "s/p/a b+c/m", "s/a+b/m"])
def test_parse_rejects_malformed_pair_keys(key):
    with pytest.raises(ValueError, match="malformed metric key"):
        parse_metric_key(key)


def test_known_metric_sets_are_disjoint_and_complete():
    assert set(BLOCK_METRICS).isdisjoint(PATTERN_METRICS)
    assert set(PAIR_METRICS).isdisjoint(set(BLOCK_METRICS) | set(PATTERN_METRICS))
    assert set(METRICS) == set(BLOCK_METRICS) | set(PATTERN_METRICS) | set(PAIR_METRICS)
    assert set(METRICS) == set(LOWER) | set(HIGHER) | set(TWO_SIDED)
    assert all(spec.level == "block" for spec in BLOCK_METRICS.values())
    assert all(spec.level == "pattern" for spec in PATTERN_METRICS.values())
    assert all(spec.level == "pair" for spec in PAIR_METRICS.values())
    assert [METRICS[m].direction for m in TWO_SIDED] == [None] * len(TWO_SIDED)


@pytest.mark.parametrize("metric", LOWER)
def test_lower_is_better(metric):
    assert metric_direction(metric) == "lower"


@pytest.mark.parametrize("metric", HIGHER)
def test_higher_is_better(metric):
    assert metric_direction(metric) == "higher"


@pytest.mark.parametrize(
    ("metric", "direction"),
    [("latency_stdev_us", "lower"), ("p2p_gbps", "higher"), ("fp8_tflops", "higher")],
)
def test_unknown_metric_direction_comes_from_unit_suffix(metric, direction):
    assert metric_direction(metric) == direction


def test_unknown_metric_without_unit_is_an_error_listing_known_names():
    with pytest.raises(ValueError, match="latency_avg_us"):
        metric_direction("mystery")
    with pytest.raises(ValueError):
        default_threshold("mystery")


def test_default_thresholds():
    assert default_threshold("latency_avg_us") == Threshold(kind="relative", value=0.05)
    assert default_threshold("busbw_gbps") == Threshold(kind="relative", value=0.05)
    for noisy in ("latency_p99_us", "latency_max_us", "latency_min_us", "start_skew_us"):
        assert default_threshold(noisy) == Threshold(kind="relative", value=0.10)
    assert default_threshold("wrong_elements") == Threshold(kind="absolute", value=0.0)
    assert default_threshold("overlap_efficiency").kind == "absolute"
    # Unknown names: noisy statistics get the larger default.
    assert default_threshold("latency_stdev_us").value == 0.10
    assert default_threshold("copy_gbps").value == 0.05


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, True])
def test_threshold_rejects_bad_values(value):
    with pytest.raises(ValueError):
        Threshold(kind="relative", value=value)


def test_threshold_rejects_unknown_kind_and_is_frozen():
    with pytest.raises(ValueError):
        Threshold(kind="percent", value=0.1)  # type: ignore[arg-type]
    t = Threshold(kind="relative", value=0.05)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.value = 0.2  # type: ignore[misc]
    assert t.with_value(0.2) == Threshold(kind="relative", value=0.2)
    assert t.describe() == "5%"
    assert Threshold(kind="absolute", value=0).describe() == "abs 0"


def test_relative_delta():
    assert relative_delta(100.0, 120.0) == pytest.approx(0.2)
    assert relative_delta(100.0, 80.0) == pytest.approx(-0.2)
    assert relative_delta(-2.0, -1.0) == pytest.approx(0.5)
    assert relative_delta(0.0, 0.0) == 0.0
    assert relative_delta(0.0, 3.0) == math.inf
    assert relative_delta(0.0, -3.0) == -math.inf
    with pytest.raises(ValueError):
        relative_delta(math.nan, 1.0)


@pytest.mark.parametrize(
    ("metric", "control", "treatment", "verdict"),
    [
        ("latency_avg_us", 100.0, 120.0, "regressed"),
        ("latency_avg_us", 100.0, 104.0, "unchanged"),
        ("latency_avg_us", 100.0, 80.0, "improved"),
        ("busbw_gbps", 100.0, 80.0, "regressed"),
        ("busbw_gbps", 100.0, 120.0, "improved"),
        ("busbw_gbps", 100.0, 96.0, "unchanged"),
        ("latency_p99_us", 100.0, 108.0, "unchanged"),  # noisy metric: 10 %
        ("latency_p99_us", 100.0, 111.0, "regressed"),
        ("wrong_elements", 0.0, 1.0, "regressed"),
        ("wrong_elements", 0.0, 0.0, "unchanged"),
        ("wrong_elements", 2.0, 0.0, "improved"),
        ("overlap_efficiency", 0.02, 0.01, "unchanged"),  # -50 % relative, 1 point absolute
        ("overlap_efficiency", 0.9, 0.8, "regressed"),
        ("latency_avg_us", 0.0, 1.0, "regressed"),
        ("tflops", 0.0, 1.0, "improved"),
    ],
)
def test_judge(metric, control, treatment, verdict):
    assert judge(metric, control, treatment) == verdict


def test_judge_at_exactly_the_threshold_is_unchanged():
    t = Threshold(kind="absolute", value=5.0)
    assert judge("latency_avg_us", 100.0, 105.0, t) == "unchanged"
    assert judge("latency_avg_us", 100.0, 105.5, t) == "regressed"


def test_judge_uses_a_given_threshold():
    t = Threshold(kind="relative", value=0.5)
    assert judge("latency_avg_us", 100.0, 140.0, t) == "unchanged"


def test_judge_key_applies_overrides_by_metric_name():
    key = "s/p/b/latency_avg_us"
    assert judge_key(key, 100.0, 120.0).verdict == "regressed"
    j = judge_key(key, 100.0, 120.0, threshold_overrides={"latency_avg_us": 0.25})
    assert j.verdict == "unchanged"
    assert j.threshold == Threshold(kind="relative", value=0.25)
    assert j.direction == "lower"
    assert j.delta == pytest.approx(0.2)


def test_judge_key_reports_large_changes_of_unknown_direction():
    j = judge_key("s/p/b/mystery", 10.0, 20.0)
    assert j.direction is None
    assert j.verdict == "changed"
    assert j.threshold == UNKNOWN_DIRECTION_THRESHOLD
    assert judge_key("s/p/b/mystery", 10.0, 10.5).verdict == "unchanged"
    assert judge_key("not a key", 10.0, 5.0).verdict == "changed"


def test_lane_skew_p99_is_a_lower_is_better_tail():
    spec = PATTERN_METRICS["lane_skew_p99_us"]
    assert spec.direction == "lower"
    assert spec.threshold == Threshold(kind="relative", value=0.10)


def test_pairwise_overlap_is_descriptive_and_judged_two_sided_by_5_points():
    with pytest.raises(ValueError, match="descriptive"):
        metric_direction("pairwise_overlap")
    with pytest.raises(ValueError, match="descriptive"):
        judge("pairwise_overlap", 0.5, 0.9)
    assert default_threshold("pairwise_overlap") == Threshold(kind="absolute", value=0.05)
    key = "s/p/ag+rs/pairwise_overlap"
    for control, treatment, verdict in [
        (0.90, 0.96, "changed"),
        (0.90, 0.84, "changed"),
        (0.90, 0.94, "unchanged"),
        (0.02, 0.01, "unchanged"),  # -50 % relative, 1 point absolute
        (0.0, 0.06, "changed"),
    ]:
        j = judge_key(key, control, treatment)
        assert (j.verdict, j.direction) == (verdict, None), (control, treatment)
        assert j.threshold == Threshold(kind="absolute", value=0.05)
    j = judge_key(key, 0.9, 0.8, threshold_overrides={"pairwise_overlap": 0.2})
    assert j.verdict == "unchanged" and j.threshold == Threshold(kind="absolute", value=0.2)


def test_judge_rejects_non_finite_values():
    with pytest.raises(ValueError):
        judge("latency_avg_us", math.inf, 1.0)
    with pytest.raises(ValueError):
        judge("latency_avg_us", 1.0, math.nan)


@pytest.mark.parametrize(
    ("metric", "good", "bad"),
    [
        ("latency_avg_us", [5e-324, 1.0, 1e300], [0.0, -0.0, -1.0, math.nan, math.inf]),
        ("busbw_gbps", [0.5], [0.0, -math.inf]),
        ("slowdown", [0.9, 3.0], [0.0]),
        ("wrong_elements", [0.0, 7.0], [-1.0, math.nan]),
        ("lane_skew_p99_us", [0.0, 2.5], [-0.5]),
        ("pairwise_overlap", [0.0, 0.5, 1.0], [-0.01, 1.01, math.nan]),
        ("overlap_efficiency", [-3.0, 0.0, 1.2], [math.inf, math.nan]),
        ("mystery", [-1.0, 0.0], [math.nan, -math.inf]),  # unknown: finite is enough
    ],
)
def test_metric_value_problem(metric, good, bad):
    for value in good:
        assert metric_value_problem(metric, value) is None, value
    for value in bad:
        assert metric_value_problem(metric, value) is not None, value
    assert metric_value_problem(metric, True) is not None  # type: ignore[arg-type]


def test_every_known_metric_states_its_domain():
    domains = {spec.name: spec.domain for spec in METRICS.values()}
    assert {m for m, d in domains.items() if d == "positive"} >= {
        "latency_avg_us", "latency_min_us", "latency_max_us", "latency_p50_us",
        "latency_p99_us", "algbw_gbps", "busbw_gbps", "tflops", "isolated_latency_avg_us",
        "makespan_avg_us", "makespan_p99_us", "shared_busbw_gbps",
    }  # fmt: skip
    assert domains["overlap_efficiency"] == "finite"
    assert metric_value_problem("latency_avg_us", 0.0) == "must be a finite number > 0"
