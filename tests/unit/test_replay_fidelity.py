"""Replay fidelity: an imported pattern's replayed durations against its traced ones, per block,
per step and per rank, in the records, the files and the table; the traced keys' validation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.aggregate_scale import simulate_ranks
from userbenchmark.maestro.blocks.registry import resolve_op
from userbenchmark.maestro.core.analysis.aggregate import local_summary
from userbenchmark.maestro.core.analysis.intervals import WindowTimings
from userbenchmark.maestro.core.analysis.outcome import Isolated, build_outcome
from userbenchmark.maestro.core.config.loader import load_suite_text
from userbenchmark.maestro.core.output.results import results_of
from userbenchmark.maestro.core.output.table import Tables, format_fidelity
from userbenchmark.maestro.core.replay.fidelity import (
    error_groups,
    rank_steps,
    ratio,
    with_fidelity,
)
from userbenchmark.maestro.errors import ConfigError

STEP = """
name: imported
world_size: 2
patterns:
  - name: step3
    traced_us: 300.0
    traced_by_rank_us: [300.0, 250.0]
    iters: 4
    blocks:
      - {name: mm, op: gemm, m: 64, n: 64, k: 64, lane: compute, traced_us: 200.0,
         traced_kernel: nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT, traced_overlap: 0.5}
      - {name: ar, op: all_reduce, size: 4K, lane: comm, traced_us: 100.0}
      - {name: gap, op: sleep, duration_us: 5, lane: comm}
"""
CLOCK_NS = 1_700_000_000_000_000_000  # CLOCK_REALTIME scale: float64 would lose the ns


def test_ratio_is_the_replayed_mean_over_traced_with_the_mean_interval():
    durations_ns = np.array([90e3, 100e3, 110e3, 100e3, np.nan])
    value, low, high = ratio(durations_ns, 50.0)
    assert value == pytest.approx(2.0)  # mean 100 µs of the finite ones / 50 µs
    assert low < value < high  # four iterations: a wide interval, widened for its few blocks
    many = np.random.default_rng(1).normal(100e3, 1e3, 400)  # 1 % noise, 400 iterations
    v, lo, hi = ratio(many, 100.0)
    assert lo < v < hi and lo > 0.99 and hi < 1.01  # the mean's interval, not the spread's
    assert ratio(durations_ns, 50.0) == (value, low, high)  # seeded: reproducible
    assert ratio(np.full(8, 100e3), 100.0) == pytest.approx((1.0, 1.0, 1.0))
    one = ratio(np.array([100e3]), 100.0)
    assert one[0] == pytest.approx(1.0) and math.isnan(one[1]) and math.isnan(one[2])
    for traced in (None, 0.0):
        assert all(math.isnan(v) for v in ratio(durations_ns, traced))
    assert all(math.isnan(v) for v in ratio(np.full(3, np.nan), 10.0))


def test_rank_steps_are_exact_on_a_realtime_clock_and_summed_into_rows():
    starts = np.array([[0, 10_000], [500, 10_300]], dtype=np.int64) + CLOCK_NS
    ends = np.array([[1_001, 11_000], [2_003, 10_400]], dtype=np.int64) + CLOCK_NS
    mine = WindowTimings(
        starts_ns=starts, ends_ns=ends, present=np.array([True, True]), clock="cupti"
    )
    idle = WindowTimings(
        starts_ns=np.zeros((2, 2), dtype=np.int64),
        ends_ns=np.zeros((2, 2), dtype=np.int64),
        present=np.array([False, False]),
        clock="cupti",
    )
    total = rank_steps(mine, 0, 2) + rank_steps(idle, 1, 2)
    np.testing.assert_array_equal(total[0], [2_003, 1_000])
    assert np.isnan(total[1]).all()  # a rank that ran nothing has no step


def _outcome(suite, shift_ns=0, kernels=()):
    pattern = suite.patterns[0]
    classes = [resolve_op(b.op) for b in pattern.blocks]
    summaries, steps = [], []
    for rank in range(2):
        dur = np.array([[200e3, 220e3, 180e3, 200e3], [100e3] * 4, [5e3] * 4]) + rank * shift_ns
        starts = np.zeros((3, 4), dtype=np.int64) + CLOCK_NS
        starts[2] += np.int64(100_000)  # the gap runs after the all_reduce on its lane
        t = WindowTimings(
            starts_ns=starts,
            ends_ns=starts + dur.astype(np.int64),
            present=np.ones(3, dtype=bool),
            clock="cupti",
        )
        summaries.append(
            local_summary(
                t,
                lane_of_block=[0, 1, 1],
                is_comm=np.array([False, True, False]),
                is_compute=np.array([True, False, False]),
                rank=rank,
                world_size=2,
            )
        )
        steps.append(rank_steps(t, rank, 2))
    agg = simulate_ranks(summaries)
    out = build_outcome(
        suite,
        pattern,
        classes,
        agg,
        Isolated.unmeasured(3),
        None,
        None,
        profiler="cupti",
        team_sizes=[2, 2, 2],
    )
    return with_fidelity(out, pattern, agg, sum(steps), kernels)


def test_every_block_the_step_and_each_rank_get_their_figures():
    suite = load_suite_text(STEP)
    pattern = suite.patterns[0]
    assert pattern.traced and pattern.traced_by_rank_us == (300.0, 250.0)
    out = _outcome(suite, shift_ns=10e3)
    mm, ar, gap = out.blocks
    # Rank 1's GEMM is 10 µs longer: latency is the longest rank's (210 µs on average).
    assert mm.traced_us == 200.0 and mm.replay_ratio == pytest.approx(210 / 200)
    assert mm.replay_ratio_ci_low < mm.replay_ratio < mm.replay_ratio_ci_high
    assert ar.replay_ratio == pytest.approx(110 / 100)
    assert math.isnan(gap.traced_us) and math.isnan(gap.replay_ratio)  # nothing traced
    p = out.pattern
    assert p.traced_us == 300.0 and p.replay_ratio == pytest.approx(p.makespan_avg_us / 300)
    rows = json.loads(p.replay_by_rank)
    assert [r["rank"] for r in rows] == [0, 1]
    assert [r["traced_us"] for r in rows] == [300.0, 250.0]
    # Rank 0's step: the GEMM (200 µs on average) is its longest lane; rank 1's 10 µs more.
    assert [r["replayed_us"] for r in rows] == pytest.approx([200.0, 210.0])
    assert rows[1]["ratio"] == pytest.approx(210 / 250, abs=1e-4)
    assert rows[1]["ci_low"] <= rows[1]["ratio"] <= rows[1]["ci_high"]
    # The files carry the same figures (columns come from the record fields).
    results = results_of([out])
    blocks = results.blocks.set_index("block")
    assert blocks.loc["mm", "replay_ratio"] == pytest.approx(mm.replay_ratio)
    assert math.isnan(blocks.loc["gap", "traced_us"])
    assert json.loads(results.patterns.loc[0, "replay_by_rank"]) == rows


def test_the_table_shows_the_replay_section_only_for_traced_patterns():
    suite = load_suite_text(STEP)
    out = _outcome(suite)
    text = Tables().pattern(suite.patterns[0], out)
    section = text[text.index("replayed against the trace") :]
    assert "mm" in section and "gap" not in section
    assert "step (makespan)" in section and "step, rank 1" in section
    assert "1.000 [" in section  # mm: 200 µs replayed / 200 traced, with its interval
    untraced = load_suite_text(
        "name: s\nworld_size: 1\npatterns:\n  - name: p\n    blocks: [{name: z, op: sleep, "
        "duration_us: 5}]\n"
    )
    assert not untraced.patterns[0].traced
    assert format_fidelity(_untraced_outcome(untraced)) == ""


def test_the_table_says_whether_each_replay_falls_inside_the_traced_range():
    """A trace of several steps gives each block a range: the replay (mm 200 µs, ar 100 µs on
    average) inside it or not, per block and counted."""
    ranged = STEP.replace(
        "traced_us: 200.0,", "traced_us: 200.0, traced_min_us: 190, traced_max_us: 205,"
    )
    ranged = ranged.replace(
        "traced_us: 100.0}", "traced_us: 90.0, traced_min_us: 80, traced_max_us: 95}"
    )
    suite = load_suite_text(ranged)
    mm, ar = suite.patterns[0].blocks[:2]
    assert (mm.traced_min_us, mm.traced_max_us, ar.traced_max_us) == (190.0, 205.0, 95.0)
    text = Tables().pattern(suite.patterns[0], _outcome(suite))
    section = text[text.index("replayed against the trace") :]
    assert "inside the traced range" in section.splitlines()[0]
    rows = {line.split()[0]: line.split()[-1] for line in section.splitlines()[2:5]}
    assert rows["mm"] == "yes" and rows["ar"] == "no"
    assert "inside their traced range (min to max over the traced steps): 1 of 2 blocks" in text
    # One step: no range, no column.
    assert "inside" not in Tables().pattern(load_suite_text(STEP).patterns[0], _outcome(suite))


def _untraced_outcome(suite):
    pattern = suite.patterns[0]
    t = WindowTimings(
        starts_ns=np.zeros((1, 2), dtype=np.int64),
        ends_ns=np.full((1, 2), 5_000, dtype=np.int64),
        present=np.ones(1, dtype=bool),
        clock="perf_counter",
    )
    agg = simulate_ranks(
        [
            local_summary(
                t, lane_of_block=[0], is_comm=np.zeros(1, bool), is_compute=np.ones(1, bool)
            )
        ]
    )
    return build_outcome(
        suite,
        pattern,
        [resolve_op("sleep")],
        agg,
        Isolated.unmeasured(1),
        None,
        None,
        profiler="host",
        team_sizes=[1],
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[300.0]", "expected a list of 2 durations in µs, one per rank, got [300.0]"),
        ("300.0", "expected a list of 2 durations in µs, one per rank, got 300.0"),
        ("[300.0, -1]", "traced_by_rank_us[1]"),
    ],
)
def test_traced_by_rank_needs_one_duration_per_rank(value, message):
    text = STEP.replace("[300.0, 250.0]", value)
    with pytest.raises(ConfigError, match="patterns\\[0\\].traced_by_rank_us") as err:
        load_suite_text(text)
    assert message in str(err.value)


def test_gemms_that_overlapped_a_collective_are_judged_apart():
    ratios = [1.01, 1.02, 1.06, 0.995, math.nan]
    overlaps = [0.4, 1.0, None, 0.0, 0.3]  # None or 0: ran alone in the trace
    overlapped, alone = error_groups(ratios, overlaps, target=0.03)
    assert (overlapped.count, alone.count) == (2, 2)  # the NaN ratio is left out
    assert overlapped.mean_error == pytest.approx(0.015) and overlapped.within == 2
    assert alone.max_error == pytest.approx(0.06) and alone.within == 1
    assert load_suite_text(STEP).patterns[0].blocks[0].traced_overlap == 0.5


def test_each_block_carries_its_kernel_beside_the_traced_one_in_table_and_files():
    traced = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT"
    replayed = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopB_TNT"
    suite = load_suite_text(STEP)
    out = _outcome(suite, kernels=(replayed, "ncclDevKernel_AllReduce", ""))
    mm, ar, _ = out.blocks
    assert (mm.kernel, mm.traced_kernel, mm.traced_overlap) == (replayed, traced, 0.5)
    assert not mm.notes  # the table's kernel column names both: no note repeats them
    assert ar.kernel == "ncclDevKernel_AllReduce" and math.isnan(ar.traced_overlap)
    blocks = results_of([out]).blocks.set_index("block")
    assert blocks.loc["mm", "kernel"] == replayed and blocks.loc["mm", "traced_kernel"] == traced
    text = Tables().pattern(suite.patterns[0], out)
    assert f"{replayed} (traced: {traced})" in text
    # The GEMM overlapped a collective in the trace: its error is reported in that group.
    assert "GEMMs that overlapped a collective: 1, |replayed / traced - 1| mean 0.0%" in text
    assert "GEMMs that ran alone" not in text


def test_main_kernel_names_take_the_kernel_with_most_of_a_blocks_time():
    from userbenchmark.maestro.core.analysis.intervals import (
        KIND_KERNEL,
        KIND_MEMCPY,
        DeviceActivities,
        main_kernel_names,
    )

    n = 5
    acts = DeviceActivities(
        block=np.array([0, 0, 0, 1, 2], np.int32),
        iteration=np.zeros(n, np.int32),
        kind=np.array([KIND_KERNEL, KIND_KERNEL, KIND_KERNEL, KIND_MEMCPY, KIND_KERNEL], np.uint8),
        start_ns=np.zeros(n, np.int64),
        end_ns=np.array([10, 10, 30, 99, 5], np.int64),
        stream_id=np.zeros(n, np.int64),
        device_id=np.zeros(n, np.int32),
        correlation_id=np.arange(n, dtype=np.int64),
        grid=np.zeros((n, 3), np.int32),
        block_dims=np.zeros((n, 3), np.int32),
        size_bytes=np.zeros(n, np.int64),
        name_index=np.array([0, 0, 1, 2, 0], np.int32),
        names=("gemm_a", "gemm_b", "Memcpy DtoD (Device -> Device)"),
        launches=_no_launches(),
    )
    # Block 0: gemm_a 20 ns in two kernels against gemm_b 30 ns; block 1 has only a copy.
    assert main_kernel_names(acts, 4) == ("gemm_b", "", "gemm_a", "")
    assert main_kernel_names(None, 2) == ("", "")


def _no_launches():
    from userbenchmark.maestro.core.analysis.intervals import LaunchCalls

    return LaunchCalls(
        correlation_id=np.zeros(0, np.int64),
        start_ns=np.zeros(0, np.int64),
        end_ns=np.zeros(0, np.int64),
        api=np.zeros(0, np.uint8),
        cbid=np.zeros(0, np.int32),
        thread_id=np.zeros(0, np.int64),
        name_index=np.zeros(0, np.int32),
    )
