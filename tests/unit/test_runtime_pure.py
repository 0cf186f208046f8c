"""Pure pieces of the runtime: launch detection, env handling, aggregation, outcome, outputs."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from bench.aggregate_scale import simulate_ranks
from userbenchmark.maestro.blocks.registry import registered_ops
from userbenchmark.maestro.core.analysis.aggregate import local_summary
from userbenchmark.maestro.core.analysis.intervals import WindowTimings
from userbenchmark.maestro.core.analysis.outcome import Isolated, build_outcome
from userbenchmark.maestro.core.config.spec import (
    AxisSpec,
    BlockSpec,
    PatternSpec,
    SuiteSpec,
    frozen_mapping,
)
from userbenchmark.maestro.core.output.locations import atomic_write_bytes
from userbenchmark.maestro.core.output.results import metrics_from_results, results_of
from userbenchmark.maestro.core.output.table import format_pattern
from userbenchmark.maestro.core.output.writer import OutputWriter
from userbenchmark.maestro.core.runtime.rendezvous import apply_env, detect_launch, resolve_backend
from userbenchmark.maestro.errors import LaunchError, OptionError


def test_rank_beats_slurm_procid():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
    }
    info = detect_launch(env)
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (3, 8, 1, "torchrun")


def test_slurm_when_no_rank():
    info = detect_launch({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1"})
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (5, 16, 1, "slurm")


def test_no_launcher_is_one_rank():
    assert detect_launch({}).world_size == 1


def test_bad_rank_variable_is_a_clear_error():
    with pytest.raises(LaunchError, match="RANK='x' is not an integer"):
        detect_launch({"RANK": "x", "WORLD_SIZE": "2"})


def test_backend_auto():
    assert resolve_backend("auto", False) == "gloo"
    assert resolve_backend("auto", True) == "nccl"
    with pytest.raises(OptionError, match="--backend nccl needs CUDA"):
        resolve_backend("nccl", False)


def test_apply_env_touches_only_named_keys(monkeypatch):
    monkeypatch.setenv("MAESTRO_TEST_KEEP", "1")
    monkeypatch.delenv("MAESTRO_TEST_SET", raising=False)
    before = dict(os.environ)
    apply_env({"MAESTRO_TEST_SET": "x"})
    assert os.environ["MAESTRO_TEST_SET"] == "x"
    after = dict(os.environ)
    after.pop("MAESTRO_TEST_SET")
    assert after == before
    monkeypatch.delenv("MAESTRO_TEST_SET")


def _timings(starts, ends, present=None, gate=None):
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    present = np.ones(starts.shape[0], dtype=bool) if present is None else np.asarray(present)
    return WindowTimings(
        starts_ns=starts,
        ends_ns=ends,
        present=present,
        clock="test",
        gate_open_ns=None if gate is None else np.asarray(gate, np.int64),
    )


def test_latency_is_max_over_ranks_and_overlap_uses_each_ranks_own_clock():
    # Two ranks, two blocks, two iterations. Rank 1's clock is offset by 1e18 ns: overlap and
    # makespan must not care, because each rank's intervals are only compared with its own.
    r0 = _timings([[0, 100], [10, 120]], [[50, 130], [40, 200]])
    off = 10**18
    r1 = _timings(
        [[off + 0, off + 100], [off + 60, off + 150]],
        [[off + 30, off + 170], [off + 90, off + 160]],
    )
    lanes = [0, 1]
    comm = np.array([True, False])
    comp = np.array([False, True])
    agg = simulate_ranks(
        [
            local_summary(
                t, lane_of_block=lanes, is_comm=comm, is_compute=comp, rank=r, world_size=2
            )
            for r, t in enumerate((r0, r1))
        ]
    )
    np.testing.assert_allclose(agg.latency_ns, [[50, 70], [30, 80]])
    # Makespan per iteration: max over ranks of (last end - first start) on that rank.
    np.testing.assert_allclose(agg.makespan_ns, [max(50 - 0, 90 - 0), max(200 - 100, 170 - 100)])
    # Pairwise overlap on rank 0: it0 |[0,50]∩[10,40]|=30/min(50,30)=1; it1 [100,130]∩[120,200]
    # = 10/30; rank 1: it0 [0,30]∩[60,90] = 0; it1 [100,170]∩[150,160] = 10/10 = 1.
    expected = np.mean([np.mean([1.0, 10 / 30]), np.mean([0.0, 1.0])])
    assert agg.pairwise_overlap[0, 1] == pytest.approx(expected)
    # Duration spread: mean durations per rank: block0 r0 40, r1 50 -> 10.
    assert agg.duration_spread_ns[0] == pytest.approx(10)
    # The clocks are 1e18 ns apart (not shared): no start is compared across ranks.
    assert np.isnan(agg.start_skew_ns).all() and (agg.last_to_start_rank == -1).all()
    # Lane skew: lanes' first starts differ by 10 (r0 it0), 20 (r0 it1), 60, 50 (r1).
    np.testing.assert_allclose(agg.lane_skew_ns, [60, 50])


def test_absent_blocks_do_not_count():
    r0 = _timings([[0], [0]], [[10], [0]], present=[True, False])
    r1 = _timings([[0], [5]], [[20], [25]])
    agg = simulate_ranks(
        [
            local_summary(
                t,
                lane_of_block=[0, 0],
                is_comm=np.array([1, 1], bool),
                is_compute=np.zeros(2, bool),
                rank=r,
                world_size=2,
            )
            for r, t in enumerate((r0, r1))
        ]
    )
    np.testing.assert_allclose(agg.latency_ns, [[20], [20]])
    # Block 1 runs on one rank only: no spread between ranks.
    assert agg.duration_spread_ns[0] == pytest.approx(10) and np.isnan(agg.duration_spread_ns[1])


def test_cross_rank_figures_where_the_ranks_share_a_clock():
    # One host clock (perf_counter). Block 0 is a collective: rank 1 arrives 30 ns late in
    # both iterations, so rank 0 waits for it; the block ends together on both ranks.
    t0 = 10**15
    r0 = WindowTimings(
        starts_ns=np.array([[t0, t0 + 1000], [t0, t0 + 1000]]),
        ends_ns=np.array([[t0 + 100, t0 + 1100], [t0 + 50, t0 + 1040]]),
        present=np.ones(2, bool),
        clock="perf_counter",
        gate_open_ns=np.array([t0 - 5, t0 + 995]),
    )
    r1 = WindowTimings(
        starts_ns=np.array([[t0 + 30, t0 + 1030], [t0 + 30, t0 + 1030]]),
        ends_ns=np.array([[t0 + 100, t0 + 1100], [t0 + 130, t0 + 1090]]),
        present=np.ones(2, bool),
        clock="perf_counter",
        gate_open_ns=np.array([t0 - 2, t0 + 999]),
    )
    comm, comp = np.array([True, False]), np.array([False, True])
    summaries = [
        local_summary(
            t, lane_of_block=[0, 1], is_comm=comm, is_compute=comp, rank=r, world_size=2,
            shared_clock=True,
        )
        for r, t in enumerate((r0, r1))
    ]  # fmt: skip
    agg = simulate_ranks(summaries)
    np.testing.assert_allclose(agg.start_skew_ns[0], [30, 30])
    assert agg.last_to_start_rank[0] == 1  # the one the collective waited for
    np.testing.assert_allclose(agg.gate_skew_ns, [3, 4])
    # Durations: rank 0 100 and 100 (it waited), rank 1 70 and 70 -> spread 30.
    assert agg.duration_spread_ns[0] == pytest.approx(30)
    # Comm hidden under compute, per rank over the window: rank 0 [t0, t0+50] of 100 in it 0
    # and [1000, 1040] of 100 in it 1 -> 90 / 200; rank 1: [30, 100] ∩ [30, 130] = 70 of 70,
    # [1030, 1090] of 70 -> 130 / 140. Time-weighted over ranks: 220 / 340.
    np.testing.assert_allclose(agg.comm_compute_overlap_by_rank, [90 / 200, 130 / 140])
    assert agg.comm_compute_overlap == pytest.approx(220 / 340)
    # The same timings without a shared clock compare nothing across ranks.
    apart = simulate_ranks(
        [
            local_summary(
                t, lane_of_block=[0, 1], is_comm=comm, is_compute=comp, rank=r, world_size=2
            )
            for r, t in enumerate((r0, r1))
        ]
    )
    assert np.isnan(apart.start_skew_ns).all() and np.isnan(apart.gate_skew_ns).all()
    assert apart.comm_compute_overlap == pytest.approx(220 / 340)  # per rank: no clock needed


def _pattern(blocks, iters=4):
    return PatternSpec(
        name="p",
        base_name="p",
        blocks=tuple(blocks),
        warmup_iters=0,
        num_iters=iters,
        baseline=True,
        check=False,
    )


def _block(name, op, **params):
    return BlockSpec(
        name=name, op=op, axis="world", lane=name, dtype="bf16", params=frozen_mapping(params)
    )


def test_build_outcome_formulas():
    ops = registered_ops()
    blocks = [
        _block("ar", "all_reduce", size=2**20, reduce_op="sum"),
        _block("mm", "gemm", m=4096, n=4096, k=4096),
    ]
    pattern = _pattern(blocks)
    suite = SuiteSpec(
        name="s",
        source="x",
        world_size=4,
        axes=frozen_mapping({"world": AxisSpec(name="world", teams=((0, 1, 2, 3),))}),
        patterns=(pattern,),
    )
    lat = np.array([[100e3, 100e3, 100e3, 100e3], [1e6, 1e6, 1e6, 1e6]])
    r = [_timings(np.zeros((2, 4)), lat)]
    agg = simulate_ranks(
        [
            local_summary(
                t,
                lane_of_block=[0, 1],
                is_comm=np.array([True, False]),
                is_compute=np.array([False, True]),
            )
            for t in r
        ]
    )
    iso = Isolated(latency_ns=np.repeat([[80e3], [1000e3]], 4, axis=1))
    out = build_outcome(
        suite,
        pattern,
        [ops["all_reduce"], ops["gemm"]],
        agg,
        iso,
        None,
        None,
        profiler="host",
        team_sizes=[4, 4],
    )
    ar, mm = out.blocks
    assert ar.algbw_gbps == pytest.approx(2**20 / 100e-6 / 1e9)
    assert ar.busbw_gbps == pytest.approx(ar.algbw_gbps * 2 * 3 / 4)
    assert mm.tflops == pytest.approx(2 * 4096**3 / 1e-3 / 1e12)
    assert ar.slowdown == pytest.approx(100.0 / 80.0)
    p = out.pattern
    assert p.makespan_avg_us == pytest.approx(1000.0)
    assert p.serial_us == pytest.approx(1080.0) and p.ideal_us == pytest.approx(1000.0)
    assert p.overlap_efficiency == pytest.approx((1080 - 1000) / (1080 - 1000))
    # Shared busbw divides the bus bytes by the makespan, not by the longest block.
    assert p.shared_busbw_gbps == pytest.approx(2**20 * 1.5 / 1e-3 / 1e9)
    assert p.comm_compute_overlap == pytest.approx(1.0)
    text = format_pattern(out, precision=1)
    assert "ar" in text and "busbw" in text and "overlap efficiency" in text
    metrics = metrics_from_results(results_of([out]))
    assert metrics["s/p/ar/busbw_gbps"] == pytest.approx(ar.busbw_gbps)
    assert metrics["s/p/overlap_efficiency"] == pytest.approx(1.0)
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    assert "s/p/mm/busbw_gbps" not in metrics  # not applicable is left out, never 0


def test_table_never_prints_zero_for_small_latency():
    ops = registered_ops()
    pattern = _pattern([_block("ar", "all_reduce", size=1024, reduce_op="sum")], iters=2)
    suite = SuiteSpec(name="s", source="x", world_size=1, patterns=(pattern,))
    t = _timings([[0, 0]], [[30, 40]])  # 30-40 ns
    agg = simulate_ranks(
        [
            local_summary(
                t, lane_of_block=[0], is_comm=np.array([True]), is_compute=np.array([False])
            )
        ]
    )
    out = build_outcome(
        suite,
        pattern,
        [ops["all_reduce"]],
        agg,
        Isolated.unmeasured(1),
        None,
        None,
        profiler="host",
        team_sizes=[1],
    )
    text = format_pattern(out, precision=1)
    row = next(line for line in text.splitlines() if line.startswith("ar "))
    assert " 0.0 " not in row and "0.04" in row


def test_outputs_are_complete_after_each_pattern(tmp_path):
    ops = registered_ops()
    pattern = _pattern([_block("ar", "all_reduce", size=1024, reduce_op="sum")], iters=2)
    suite = SuiteSpec(name="s", source="x", world_size=1, patterns=(pattern,))
    t = _timings([[0, 0]], [[3000, 4000]])
    agg = simulate_ranks(
        [
            local_summary(
                t, lane_of_block=[0], is_comm=np.array([True]), is_compute=np.array([False])
            )
        ]
    )
    out = build_outcome(
        suite,
        pattern,
        [ops["all_reduce"]],
        agg,
        Isolated.unmeasured(1),  # one block: it is its own isolated run
        None,
        None,
        profiler="host",
        team_sizes=[1],
    )
    writer = OutputWriter(
        output_dir=tmp_path / "o", metrics_path=tmp_path / "m.json", environ={"k": "v"}
    )
    writer.add(out)
    records = json.loads((tmp_path / "o" / "results.json").read_text())
    assert records[0]["latency_avg_us"] == pytest.approx(3.5)
    header = (tmp_path / "o" / "results.csv").read_text().splitlines()[0].split(",")
    for col in (
        "suite",
        "pattern",
        "block",
        "op",
        "axis",
        "team_size",
        "dtype",
        "size_bytes",
        "iters",
        "latency_avg_us",
        "latency_min_us",
        "latency_max_us",
        "latency_p50_us",
        "latency_p99_us",
        "algbw_gbps",
        "busbw_gbps",
        "tflops",
    ):
        assert col in header
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["name"] == "maestro" and doc["environ"] == {"k": "v"}
    assert not list(tmp_path.rglob("*.tmp"))


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    path = tmp_path / "f.json"
    atomic_write_bytes(path, b"old")
    with pytest.raises(TypeError):
        atomic_write_bytes(path, 123)  # type: ignore[arg-type]  (fails inside the write)
    assert path.read_text() == "old"
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    ("op", "params", "idle"),
    [
        ("all_reduce", {"size": 4096, "reduce_op": "sum"}, True),
        ("broadcast", {"size": 4096, "root": 0}, True),
        ("reduce", {"size": 4096, "reduce_op": "sum", "root": 0}, True),
        ("all_gather", {"size": 4096, "in_place": True}, True),
        ("reduce_scatter", {"size": 4096, "reduce_op": "sum", "in_place": True}, True),
        ("all_gather", {"size": 4096, "in_place": False}, False),  # copies its input
        ("reduce_scatter", {"size": 4096, "reduce_op": "sum", "in_place": False}, False),
        ("all_to_all", {"size": 4096}, False),
        ("gemm", {"m": 8, "n": 8, "k": 8}, False),
    ],
)
def test_idle_reason_only_for_one_rank_nccl_calls_without_a_copy(op, params, idle):
    cls = registered_ops()[op]
    reason = cls.idle_reason(params, team_size=1, backend="nccl")
    assert (reason is not None) == idle
    if idle:
        assert op in reason and "2 or more ranks" in reason
    # Two ranks, or gloo (host-timed), always time the block.
    assert cls.idle_reason(params, team_size=2, backend="nccl") is None
    assert cls.idle_reason(params, team_size=1, backend="gloo") is None


def test_gemm_notes_report_tf32_only_for_fp32_on_cuda():
    gemm = registered_ops()["gemm"]
    assert gemm.notes({"tf32": False}, dtype="fp32", device="cuda") == ("TF32 off (IEEE fp32)",)
    assert gemm.notes({"tf32": True}, dtype="fp32", device="cuda") == ("TF32 on",)
    assert gemm.notes({"tf32": True}, dtype="bf16", device="cuda") == ()
    assert gemm.notes({"tf32": True}, dtype="fp32", device="cpu") == ()


def test_build_outcome_untimed_block_is_nan_with_its_note_and_pattern_survives():
    ops = registered_ops()
    blocks = [
        _block("ar", "all_reduce", size=2**20, reduce_op="sum"),
        _block("mm", "gemm", m=1024, n=1024, k=1024),
    ]
    pattern = _pattern(blocks)
    suite = SuiteSpec(
        name="s",
        source="x",
        world_size=1,
        axes=frozen_mapping({"world": AxisSpec(name="world", teams=((0,),))}),
        patterns=(pattern,),
    )
    lat = np.array([[0.0, 0.0, 0.0, 0.0], [2e3, 2e3, 2e3, 2e3]])
    t = _timings(np.zeros((2, 4)), lat)
    t = WindowTimings(
        starts_ns=t.starts_ns, ends_ns=t.ends_ns, present=np.array([False, True]), clock="host"
    )
    agg = simulate_ranks(
        [
            local_summary(
                t,
                lane_of_block=[0, 1],
                is_comm=np.array([True, False]),
                is_compute=np.array([False, True]),
            )
        ]
    )
    note = "not timed: a 1-rank NCCL all_reduce launches no device work"
    out = build_outcome(
        suite,
        pattern,
        [ops["all_reduce"], ops["gemm"]],
        agg,
        Isolated(latency_ns=np.array([[math.nan] * 4, [2e3] * 4])),
        np.array([0.0, 0.0]),
        None,
        profiler="cupti",
        team_sizes=[1, 1],
        notes=[(note,), ()],
    )
    ar, mm = out.blocks
    assert math.isnan(ar.latency_avg_us) and math.isnan(ar.busbw_gbps)
    assert ar.notes == note and mm.notes == ""
    assert mm.latency_avg_us == pytest.approx(2.0)
    assert math.isnan(out.pattern.overlap_efficiency)  # no isolated time for ar
    assert out.pattern.makespan_avg_us == pytest.approx(2.0)
    table = format_pattern(out)
    assert "not timed" in table
    metrics = metrics_from_results(results_of([out]))
    assert not any(k.startswith("s/p/ar/") and "latency" in k for k in metrics)


def test_a_rank_runs_one_intra_op_thread_unless_the_user_chose():
    import torch

    from userbenchmark.maestro.core.runtime.phases import one_intra_op_thread_unless_chosen

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        one_intra_op_thread_unless_chosen({"OMP_NUM_THREADS": "2"})
        assert torch.get_num_threads() == 2
        one_intra_op_thread_unless_chosen({})
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
