"""Unit tests for metric key syntax, interval keys, directions, floors and domains."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from userbenchmark.maestro.core.analysis.records import RECORDS, metrics_of
from userbenchmark.maestro.core.output.metric_keys import (
    METRICS,
    MetricKey,
    check_name,
    metric_key,
    metric_value_problem,
    parse_metric_key,
    spec_of,
    split_bound,
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
    "enqueue_avg_us",
    "gate_delay_max_us",
    "enqueue_max_us",
    "host_late_iters",
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
    assert parsed == MetricKey(
        suite="quickstart", pattern="ag_rs", block=None, metric="makespan_avg_us"
    )


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
    assert parsed.level == "pair"


def test_pair_keys():
    key = metric_key("fsdp", "ag_rs[size=4M,x=a+b]", None, "pairwise_overlap", pair=("ag", "rs"))
    assert key == "fsdp/ag_rs[size=4M,x=a+b]/ag+rs/pairwise_overlap"
    assert parse_metric_key(key).pair == ("ag", "rs")
    assert parse_metric_key(key).block is None
    assert parse_metric_key("s/p/b/m").level == "block"
    assert parse_metric_key("s/p/m").level == "pattern"
    assert metric_key("s", "p", None, "m", pair=("ag", "rs")) == "s/p/ag+rs/m"
    with pytest.raises(ValueError, match="invalid block name"):
        check_name("block", "ag+rs")  # the separator is in no block name
    with pytest.raises(ValueError, match="invalid block name"):
        metric_key("s", "p", None, "m", pair=("ag", "r/s"))
    with pytest.raises(ValueError, match="block or a pair, not both"):
        metric_key("s", "p", "b", "m", pair=("a", "b"))
    with pytest.raises(ValueError, match="invalid pair"):
        metric_key("s", "p", None, "m", pair=("a", "b", "c"))  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["s/p/a+b+c/m", "s/p/+b/m", "s/p/a+/m", "s/p/a b+c/m", "s/a+b/m"])
def test_parse_rejects_malformed_pair_keys(key):
    with pytest.raises(ValueError, match="malformed metric key"):
        parse_metric_key(key)


def test_known_metric_sets_are_disjoint_and_complete():
    block, pattern, pair = (
        set(metrics_of(RECORDS[level])) for level in ("block", "pattern", "pair")
    )
    assert block.isdisjoint(pattern)
    assert pair.isdisjoint(block | pattern)
    assert set(METRICS) == block | pattern | pair
    assert set(METRICS) == set(LOWER) | set(HIGHER) | set(TWO_SIDED)
    assert all(METRICS[name].level == "block" for name in block)
    assert all(METRICS[name].level == "pattern" for name in pattern)
    assert all(METRICS[name].level == "pair" for name in pair)
    assert [METRICS[m].better for m in TWO_SIDED] == [None] * len(TWO_SIDED)


@pytest.mark.parametrize("metric", LOWER)
def test_lower_is_better(metric):
    assert METRICS[metric].better == "lower"


@pytest.mark.parametrize("metric", HIGHER)
def test_higher_is_better(metric):
    assert METRICS[metric].better == "higher"


@pytest.mark.parametrize(
    ("metric", "direction", "floor"),
    [("new_us", "lower", 0.05), ("x_p99_us", "lower", 0.10), ("y_gbps", "higher", 0.05),
     ("ztflops", "higher", 0.05), ("mystery", None, 0.05)],
)  # fmt: skip
def test_an_unknown_metric_gets_its_direction_from_its_unit(metric, direction, floor):
    spec = spec_of(metric)
    assert (spec.better, spec.floor, spec.domain, spec.level) == (direction, floor, "finite", None)


def test_floors_and_what_is_judged():
    assert METRICS["latency_avg_us"].floor == 0.05 and not METRICS["latency_avg_us"].absolute
    assert METRICS["overlap_efficiency"].floor == 0.05 and METRICS["overlap_efficiency"].absolute
    assert METRICS["start_skew_us"].floor == 5.0 and METRICS["start_skew_us"].absolute
    assert METRICS["wrong_elements"].exact and not METRICS["wrong_elements"].interval
    not_judged = {name for name, spec in METRICS.items() if spec.floor is None}
    assert not_judged == {
        "latency_min_us", "latency_max_us", "latency_p99_us", "duration_spread_us",
        "makespan_p99_us", "lane_skew_p50_us", "lane_skew_p99_us", "lane_skew_max_us",
        "gate_skew_p50_us", "gate_skew_max_us", "pairwise_overlap", "enqueue_avg_us",
        "gate_delay_max_us", "enqueue_max_us", "host_late_iters",
    }  # fmt: skip
    assert METRICS["pairwise_overlap"].better is None


def test_the_harness_diagnostics_are_marked():
    harness = {name for name, spec in METRICS.items() if spec.harness}
    assert harness == {
        "start_skew_us", "lane_skew_p50_us", "lane_skew_p99_us", "lane_skew_max_us",
        "gate_skew_p50_us", "gate_skew_max_us", "gate_delay_max_us", "enqueue_avg_us",
        "enqueue_max_us", "host_late_iters",
    }  # fmt: skip


def test_interval_keys_split_back_into_their_metric():
    assert split_bound("latency_avg_us_ci_low") == ("latency_avg_us", 0)
    assert split_bound("latency_avg_us_ci_high") == ("latency_avg_us", 1)
    assert split_bound("slowdown_ci_df") == ("slowdown", 2)
    assert split_bound("latency_avg_us") == ("latency_avg_us", None)
    assert split_bound("_ci_low") == ("_ci_low", None)
    key = parse_metric_key("s/p/b/slowdown_ci_low")
    assert key.metric == "slowdown_ci_low" and key.block == "b"
    assert metric_value_problem("latency_avg_us_ci_low", 0.0) == "must be a finite number > 0"
    assert metric_value_problem("slowdown_ci_df", 4.0) is None
    for bad in (0.0, 2.5, math.nan):
        assert metric_value_problem("slowdown_ci_df", bad) == "must be a whole number >= 1"


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
