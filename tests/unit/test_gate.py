"""The gate's calibration and the host-side launch-bound test (pure; no GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.aggregate_scale import simulate_ranks
from userbenchmark.maestro.blocks.registry import registered_ops
from userbenchmark.maestro.core.analysis.aggregate import local_summary
from userbenchmark.maestro.core.analysis.intervals import HostTimings, WindowTimings
from userbenchmark.maestro.core.analysis.outcome import Isolated, build_outcome
from userbenchmark.maestro.core.analysis.records import PatternResult
from userbenchmark.maestro.core.config.spec import BlockSpec, PatternSpec, SuiteSpec, frozen_mapping
from userbenchmark.maestro.core.measure.lanes import (
    DEFAULT_GATE_US,
    DEFAULT_START_MARGIN_US,
    MAX_GATE_US,
    MIN_GATE_US,
    calibrated_lead_us,
)
from userbenchmark.maestro.core.output.results import record_frame, records_of
from userbenchmark.maestro.core.output.table import format_pattern


def calibrated_gate_us(enqueue_ns: np.ndarray) -> float:
    return calibrated_lead_us(HostTimings(enqueue_ns=enqueue_ns), cuda=True)


def test_the_cpu_start_margin_is_twice_the_slowest_agreement_after_the_first():
    agree_ns = np.array([90_000_000, 1_500_000, 2_000_000])
    assert calibrated_lead_us(HostTimings(agree_ns=agree_ns), cuda=False) == 2 * 2000.0 + 100.0
    assert calibrated_lead_us(HostTimings(), cuda=False) == DEFAULT_START_MARGIN_US


def test_gate_is_twice_the_slowest_warmup_enqueue_after_the_first():
    # The first iteration waited for a whole earlier gate (a kernel's first launch): ignored.
    enqueue_ns = np.array([486_000_000, 40_000, 55_000, 45_000])
    assert calibrated_gate_us(enqueue_ns) == pytest.approx(2 * 55.0 + 20.0)


def test_gate_does_not_grow_from_pattern_to_pattern():
    # Each pattern's warmup starts from the default gate and its first iteration pays it:
    # calibrating on the result again and again must give the same gate, not 2x each time.
    gate = DEFAULT_GATE_US
    for _ in range(10):
        first = gate * 1e3 + 30_000  # blocked for the whole spin, plus the enqueue itself
        gate = calibrated_gate_us(np.array([first, 30_000, 31_000]))
    assert gate == pytest.approx(2 * 31.0 + 20.0)


def test_gate_bounds_and_single_sample():
    assert calibrated_gate_us(np.array([], dtype=np.int64)) == DEFAULT_GATE_US
    assert calibrated_gate_us(np.array([1_000])) == MIN_GATE_US  # one sample: used as is
    assert calibrated_gate_us(np.array([5_000_000])) == pytest.approx(2 * 5000.0 + 20.0)
    assert calibrated_gate_us(np.array([0, 10**12])) == MAX_GATE_US


def test_host_late_compares_enqueue_with_the_spin():
    host = HostTimings(enqueue_ns=np.array([99_000, 100_000, 100_001, 250_000]), gate_us=100.0)
    one = np.ones(1, dtype=bool)
    timings = WindowTimings(
        starts_ns=np.zeros((1, 4), np.int64),
        ends_ns=np.ones((1, 4), np.int64),
        present=one,
        clock="t",
    )
    summary = local_summary(timings, lane_of_block=[0], is_comm=~one, is_compute=one, host=host)
    assert (summary.late > 0).tolist() == [False, False, True, True]


def _pattern(n_blocks: int, iters: int) -> tuple[SuiteSpec, PatternSpec]:
    blocks = tuple(
        BlockSpec(
            name=f"g{i}",
            op="gemm",
            axis="world",
            lane=f"l{i}",
            dtype="bf16",
            params=frozen_mapping({"m": 64, "n": 64, "k": 64}),
        )
        for i in range(n_blocks)
    )
    pattern = PatternSpec(
        name="p",
        base_name="p",
        blocks=blocks,
        warmup_iters=0,
        num_iters=iters,
        baseline=False,
        check=False,
    )
    return SuiteSpec(name="s", source="x", world_size=2, patterns=(pattern,)), pattern


def _outcome(timings, hosts):
    suite, pattern = _pattern(timings[0].starts_ns.shape[0], timings[0].starts_ns.shape[1])
    n = pattern.blocks
    agg = simulate_ranks(
        [
            local_summary(
                t,
                lane_of_block=list(range(len(n))),
                is_comm=np.zeros(len(n), bool),
                is_compute=np.ones(len(n), bool),
                rank=r,
                world_size=len(timings),
                host=h,
            )
            for r, (t, h) in enumerate(zip(timings, hosts, strict=True))
        ]
    )
    gemm = registered_ops()["gemm"]
    return agg, build_outcome(
        suite,
        pattern,
        [gemm] * len(n),
        agg,
        Isolated.unmeasured(len(n)),
        None,
        None,
        profiler="cupti",
        team_sizes=[2] * len(n),
    )


def _window(gate_open, first_start):
    starts = np.array([[first_start, first_start], [first_start + 20_000, first_start + 20_000]])
    return WindowTimings(
        starts_ns=starts,
        ends_ns=starts + 5_000,
        present=np.ones(2, bool),
        clock="cupti",
        gate_open_ns=np.array([gate_open, gate_open]),
    )


def test_a_lane_waiting_for_the_gpu_is_not_launch_bound():
    # The second lane starts 20 µs after the gate (SMs busy), but the host was done in time.
    t = _window(gate_open=0, first_start=1_000)
    h = HostTimings(
        enqueue_ns=np.array([60_000, 70_000]),
        launch_ns=np.array([[25_000, 30_000], [20_000, 22_000]]),
        gate_us=140.0,
    )
    agg, out = _outcome([t, t], [h, h])
    assert out.warnings == ()
    p = out.pattern
    assert p.host_late_iters == 0
    assert p.gate_spin_us == pytest.approx(140.0)
    assert p.enqueue_max_us == pytest.approx(70.0)
    assert p.gate_delay_max_us == pytest.approx(21.0)
    assert p.lane_skew_p50_us == p.lane_skew_max_us == pytest.approx(20.0)
    # Two iterations: p99 would be the max, so it is left out and the table says so.
    assert math.isnan(p.lane_skew_p99_us)
    assert "lane start skew p50 20.00 µs, max 20.00 µs" in format_pattern(out)
    assert "p99 left out: with 2 iterations" in format_pattern(out)
    assert [b.enqueue_avg_us for b in out.blocks] == pytest.approx([27.5, 21.0])
    assert "gate spin 140.0 µs, host enqueue up to 70.0 µs" in format_pattern(out)


def test_host_late_on_one_rank_is_reported_with_its_numbers():
    t = _window(gate_open=0, first_start=1_000)
    fast = HostTimings(
        enqueue_ns=np.array([60_000, 70_000]),
        launch_ns=np.full((2, 2), 20_000),
        gate_us=140.0,
    )
    slow = HostTimings(
        enqueue_ns=np.array([60_000, 150_000]),
        launch_ns=np.array([[20_000, 100_000], [20_000, 20_000]]),
        gate_us=140.0,
    )
    agg, out = _outcome([t, t], [fast, slow])
    assert (agg.late > 0).tolist() == [False, True]
    assert out.pattern.host_late_iters == 1
    # The slowest rank's mean launch time per block (max over ranks).
    assert [b.enqueue_avg_us for b in out.blocks] == pytest.approx([60.0, 20.0])
    (warning,) = out.warnings
    assert "1 of 2 iterations (1)" in warning and "150.0 µs" in warning and "140.0 µs" in warning
    assert "(1 iteration launch-bound)" in format_pattern(out)


def test_cpu_windows_have_no_host_figures():
    t = _window(gate_open=0, first_start=1_000)
    agg, out = _outcome([t], [HostTimings()])
    assert math.isnan(out.pattern.gate_spin_us) and out.pattern.host_late_iters is None
    assert all(math.isnan(b.enqueue_avg_us) for b in out.blocks)
    assert "gate spin" not in format_pattern(out)
    assert records_of(record_frame([out.pattern], PatternResult))[0]["gate_spin_us"] is None


def test_gc_is_paused_inside_a_window_and_restored():
    import gc

    from userbenchmark.maestro.core.measure.lanes import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


class _EventDoneAt:
    """A CUDA event stand-in that completes ``after_s`` seconds from now; counts its queries."""

    def __init__(self, after_s: float) -> None:
        import time

        self._done_at = time.monotonic() + after_s
        self.queries = 0

    def query(self) -> bool:
        import time

        self.queries += 1
        return time.monotonic() >= self._done_at


def test_a_device_wait_sleeps_between_its_queries():
    # Each query is a CUDA runtime call (and a CUPTI record): a 50 ms wait must not poll
    # thousands of times, as the wait that polled 2000 times before its first sleep did.
    from userbenchmark.maestro.core.measure.lanes import POLL_MAX_S, wait_for_events

    event = _EventDoneAt(0.05)
    wait_for_events([event], timeout_s=5.0)
    assert event.queries <= 0.05 / POLL_MAX_S + 20


def test_a_device_wait_that_never_ends_is_a_run_error():
    from userbenchmark.maestro.core.measure.lanes import wait_for_events
    from userbenchmark.maestro.errors import RunError

    with pytest.raises(RunError, match="did not finish within timeout_s 0.05 s"):
        wait_for_events([_EventDoneAt(60.0)], timeout_s=0.05)
