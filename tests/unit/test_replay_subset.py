"""Traces as users have them: some ranks of a bigger job replayed at ``--world-size N``, a world
size the files lack, a trace without ProfilerStep (the whole span, or ``--annotation``), steps
whose launches lack device work in every step, and traced durations over several steps."""

from __future__ import annotations

import pytest

from userbenchmark.maestro.core.replay.group_axes import team_size
from userbenchmark.maestro.core.replay.kineto import TraceError

from .replay_scenarios import ddp_rank, mesh_rank
from .replay_traces import TraceBuilder, write_all
from .test_replay_import import blocks_of, by_op, check_structure, imported


def test_one_rank_of_a_mesh_replays_at_a_bigger_world(tmp_path):
    """Rank 0 of a dp 4 x tp 2 job at 16 ranks: each group keeps its traced size and stride,
    the default group is every rank, each collective what one rank sends."""
    imp, text, data = imported(tmp_path / "m", [mesh_rank(0, shape=(4, 2))], world_size=16)
    check_structure(data)
    assert data["world_size"] == 16 and imp.run.traced_world == 8 and imp.run.given == (0,)
    (gather,) = by_op(data, "all_gather")
    assert gather["size"] == 1024 * 4 * 2  # S as traced: the team keeps its 4 ranks
    dp = {tuple(t) for t in data["axes"][gather["axis"]]["teams"]}
    assert (0, 2, 4, 6) in dp and (9, 11, 13, 15) in dp and len(dp) == 4
    assert "World size: 16 (--world-size; the files hold rank(s) 0 of 8 ranks" in text
    assert "dp0 (mesh_dp): 4 ranks -> axis dp, teams of 4" in text
    assert len(blocks_of(data)) == 3  # the tp all_reduce, the dp all_gather, the ep all_reduce


def test_a_group_larger_than_the_new_world_becomes_the_world():
    assert team_size(4, 16, "mesh_dp") == 4
    assert team_size(4, 2, "mesh_dp") == 2  # does not fit: every rank
    assert team_size(3, 8, "group") == 8  # 8 is no multiple of 3
    assert team_size(2, 16, "default_pg") == 16  # the default group is every rank


def test_ranks_doing_other_work_are_refused_with_world_size(tmp_path):
    """Rank 0 and rank 1 of the mesh: one issues an ep all_reduce, the other none."""
    ranks = [mesh_rank(0, shape=(4, 2)), mesh_rank(1, shape=(4, 2))]
    with pytest.raises(TraceError, match="rank 1 does other work than rank 0.*one rank's file"):
        imported(tmp_path / "o", ranks, world_size=16)
    _, _, data = imported(
        tmp_path / "s", [mesh_rank(0, shape=(4, 2)), mesh_rank(2, shape=(4, 2))], world_size=16
    )
    assert data["world_size"] == 16  # ranks 0 and 2 do the same work: rank 0's step


def test_a_gathered_size_follows_the_new_team(tmp_path):
    _, _, data = imported(tmp_path / "m", [mesh_rank(0, shape=(4, 2))], world_size=2)
    (gather,) = by_op(data, "all_gather")
    assert gather["size"] == 1024 * 2 * 2  # each rank still sends 1024 bf16 elements
    assert data["world_size"] == 2


def test_a_subset_without_world_size_is_refused_naming_the_option(tmp_path):
    write_all([mesh_rank(1, shape=(4, 2))], tmp_path)
    with pytest.raises(TraceError, match=r"rank 0's trace file is missing.*--world-size N"):
        imported(tmp_path / "x", [mesh_rank(1, shape=(4, 2))])


def test_a_rank_without_world_size_is_taken_with_world_size(tmp_path):
    """distributedInfo with a rank and no world size: a subset needing --world-size; rank 0
    alone is a world of one."""
    one = ddp_rank(1, world=2)
    doc = one.document()
    del doc["distributedInfo"]["world_size"]
    one.document = lambda: doc  # type: ignore[method-assign]
    with pytest.raises(TraceError, match="a world whose size the files do not say.*--world-size"):
        imported(tmp_path / "a", [one])
    imp, text, data = imported(tmp_path / "b", [one], world_size=4)
    assert data["world_size"] == 4 and "of an unknown number of ranks" in text
    zero = ddp_rank(0, world=1)
    doc0 = zero.document()
    del doc0["distributedInfo"]["world_size"]
    zero.document = lambda: doc0  # type: ignore[method-assign]
    _, text, data = imported(tmp_path / "c", [zero])
    assert data["world_size"] == 1 and "World size: 1 (the files do not say it" in text


def _no_steps() -> TraceBuilder:
    """The DDP step's work with no ProfilerStep, and a record_function span around it."""
    b = ddp_rank(0, world=1)
    b.events = [e for e in b.events if not e["name"].startswith("ProfilerStep#")]
    b.annotate("train_step", 0, 3000)
    return b


def test_without_profiler_step_the_whole_span_with_device_work_is_the_step(tmp_path):
    imp, text, data = imported(tmp_path / "w", [_no_steps()])
    assert imp.step_name == "the whole trace" and data["patterns"][0]["name"] == "the_whole_trace"
    assert "the trace has no ProfilerStep#N" in text.replace("\n#   ", " ")
    assert len(by_op(data, "gemm")) == 2
    imp, _, data = imported(tmp_path / "a", [_no_steps()], annotation="train_step")
    assert imp.step_name == "train_step#0" and len(by_op(data, "gemm")) == 2
    with pytest.raises(TraceError, match="no record_function span named 'fwd'"):
        imported(tmp_path / "b", [_no_steps()], annotation="fwd")


def _steps_lacking(memsets: int, lacking_kernels: int = 0, steps: int = 3) -> TraceBuilder:
    """``steps`` steps of 20 kernels, each with ``memsets`` memsets CUPTI never records and
    ``lacking_kernels`` of its kernels without their device work."""
    b = TraceBuilder(rank=0, world_size=1)
    for s in range(steps):
        t0 = 10_000 * s
        b.step(s, t0, t0 + 9000)
        for i in range(20):
            t = t0 + 100 * i
            b.launch(stream=7, launch=t, start=t + 10, dur=50, with_activity=i >= lacking_kernels)
        for i in range(memsets):
            b.launch(stream=7, launch=t0 + 5000 + i, start=0, dur=0, cat="gpu_memset",
                     with_activity=False)  # fmt: skip
    return b


def test_launches_cupti_records_in_no_step_do_not_count_against_a_step(tmp_path):
    """A V100 trace's every step held cuDNN memsets without device work: each step is whole."""
    imp, text, _ = imported(tmp_path / "v", [_steps_lacking(memsets=5)])
    assert imp.step_name == "ProfilerStep#2" and imp.steps_used == tuple(
        f"ProfilerStep#{i}" for i in (2, 1, 0)
    )
    assert "ignored (no device work in any step): cudaMemcpyAsync x5" in text


def test_a_step_lacking_much_device_work_is_refused_naming_the_threshold(tmp_path):
    with pytest.raises(TraceError, match=r"5 of its 20 launches have no device work.*over 10%"):
        imported(tmp_path / "h", [_steps_lacking(memsets=0, lacking_kernels=5)])
    imp, text, _ = imported(tmp_path / "f", [_steps_lacking(memsets=0, lacking_kernels=1)])
    assert (
        "launches without device work in this step (at most 10% allowed): cudaLaunchKernel x1"
        in (text.replace("\n#     ", " "))
    )
    assert imp.step_name == "ProfilerStep#2"


def test_traced_durations_are_the_median_over_the_steps_with_their_range(tmp_path):
    b = TraceBuilder(rank=0, world_size=1)
    for s, dur in enumerate((300, 100, 200)):
        t0 = 10_000 * s
        b.step(s, t0, t0 + 5000)
        b.gemm(stream=7, launch=t0 + 10, start=t0 + 20, dur=dur, m=64, n=64, k=64)
    _, text, data = imported(tmp_path / "s", [b])
    (gemm,) = by_op(data, "gemm")
    assert (gemm["traced_us"], gemm["traced_min_us"], gemm["traced_max_us"]) == (200, 100, 300)
    assert "the median over the 3 complete steps like it" in text.replace("\n#   ", " ")
    _, _, data = imported(tmp_path / "one", [b], step=1)
    (gemm,) = by_op(data, "gemm")
    assert gemm["traced_us"] == 100 and "traced_min_us" not in gemm
