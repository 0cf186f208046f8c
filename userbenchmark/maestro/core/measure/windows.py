"""One window of a pattern (``run``: a PatternRun) and its figures over the ranks: issued under a
profiler with the garbage collector paused, the gate sized from a warmup, the timings reduced
to the cross-rank summary, every rank's intervals gathered for a trace."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from ..analysis import outcome
from ..analysis.aggregate import Reducer, WindowAggregate, local_summary, reduce_summaries
from ..analysis.intervals import HostTimings, WindowTimings
from ..analysis.records import RankTimeline, Timeline
from ..profilers.profiler import Profiler
from .gate import (
    DEFAULT_GATE_US,
    DEFAULT_START_MARGIN_US,
    calibrated_gate_us,
    calibrated_start_margin_us,
    gc_paused,
)
from .lanes import Lane

log = logging.getLogger("maestro.pattern")


def reducer(group: Any) -> Reducer:
    """A :data:`Reducer` over a (gloo) process group."""
    ops = {"max": tdist.ReduceOp.MAX, "min": tdist.ReduceOp.MIN, "sum": tdist.ReduceOp.SUM}

    def reduce(values: np.ndarray, op: str) -> np.ndarray:
        array = np.asarray(values)  # float64 or int64 (exact instants): the dtype is kept
        dtype = np.int64 if np.issubdtype(array.dtype, np.integer) else np.float64
        tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=dtype)).clone()
        tdist.all_reduce(tensor, op=ops[op], group=group)
        return tensor.numpy()

    return reduce


def issue(
    run: Any,
    lanes: Sequence[Lane],
    num_iters: int,
    present: np.ndarray,
    profiler: Profiler,
    sync: str | None = None,
) -> HostTimings:
    """Run ``lanes`` for ``num_iters`` under ``profiler``; ``sync`` overrides the pattern's."""
    rig = run.rig
    rig.window_id += 1
    profiler.begin_window(rig.window_id, len(run.names), num_iters, present)
    with gc_paused():
        sync = sync or run.pattern.sync
        return rig.lanes.run_window(
            lanes, num_iters, profiler, sync=sync, block_names=run.names, order=run.order
        )


def timed(
    run: Any, lanes: Sequence[Lane], num_iters: int, present: np.ndarray, sync: str | None = None
) -> tuple[WindowTimings, HostTimings]:
    host = issue(run, lanes, num_iters, present, run.rig.profiler, sync)
    return run.rig.profiler.end_window(), host


def warmup(run: Any, lanes: Sequence[Lane], present: np.ndarray, sync: str | None = None) -> None:
    """Run the warmup iterations (never timed) and size the gate from their enqueue, from the
    default gate (no pattern inherits another's). Ranks agree on the longest gate: ranks whose
    gates opened apart would start their collectives apart and time each other."""
    rig, cuda = run.rig, run.rig.place.is_cuda
    if cuda:
        rig.lanes.gate_us = DEFAULT_GATE_US
    else:
        rig.lanes.start_margin_us = DEFAULT_START_MARGIN_US
    if run.pattern.warmup_iters <= 0:
        return
    # With the measured window's profiler hooks (CUPTI's push/pop cost host time), so the gate
    # is sized for them; never ended: the next window's begin discards its records.
    host = issue(run, lanes, run.pattern.warmup_iters, present, rig.profiler, sync)
    reduce = reducer(rig.sync_group)
    if not cuda:
        proposal = np.array([calibrated_start_margin_us(host.agree_ns)])
        rig.lanes.start_margin_us = float(reduce(proposal, "max")[0])
        return
    rig.lanes.gate_us = float(reduce(np.array([calibrated_gate_us(host.enqueue_ns)]), "max")[0])
    log.debug(
        "pattern %s: gate spin %.1f µs (this rank's warmup enqueue µs: %s)",
        run.pattern.name,
        rig.lanes.gate_us,
        host.enqueue_ns / 1e3,
    )


def summary(run: Any, timings: WindowTimings, host: HostTimings) -> WindowAggregate:
    """The window's cross-rank summary (the same on every rank)."""
    place = run.rig.place
    local = local_summary(
        timings,
        lane_of_block=run.lane_starts,
        is_comm=run.is_comm,
        is_compute=run.is_compute,
        rank=place.rank,
        world_size=place.world_size,
        shared_clock=place.one_host,
        host=host,
    )
    reduce = reducer(run.rig.sync_group)
    return reduce_summaries(local, rank=place.rank, world_size=place.world_size, reduce=reduce)


def timeline(run: Any, timings: WindowTimings) -> Timeline | None:
    """Every rank's intervals on rank 0 (None elsewhere): one object per rank, blocks x
    iterations each, gathered only for ``--trace``/``--plot``."""
    place = run.rig.place
    mine = RankTimeline(
        rank=place.rank,
        starts_ns=np.asarray(timings.starts_ns, dtype=np.int64),
        ends_ns=np.asarray(timings.ends_ns, dtype=np.int64),
        present=np.asarray(timings.present, dtype=bool),
        clock=timings.clock,
        activities=timings.activities,  # CUPTI with --trace only
    )
    gathered: list[Any] = [None] * place.world_size
    tdist.all_gather_object(gathered, mine, group=run.rig.sync_group)
    if place.rank != 0:
        return None
    return Timeline(
        pattern=run.pattern.name,
        block_names=tuple(run.names),
        block_lanes=tuple(run.pattern.lanes[i] for i in run.lane_of_block),
        ranks=tuple(sorted(gathered, key=lambda r: r.rank)),
        shared_clock=place.one_host and timings.host_clock,
        block_categories=tuple(c.category for c in run.classes),
        backend=place.backend,
    )


def rank_steps(run: Any, timings: WindowTimings) -> np.ndarray:
    """(world, iters): every rank's makespan per iteration (ns), on every rank."""
    place = run.rig.place
    mine = outcome.rank_steps(timings, place.rank, place.world_size)
    return reducer(run.rig.sync_group)(mine, "sum")
