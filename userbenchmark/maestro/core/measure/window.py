"""One window of a pattern on this rank, the one place its iterations are issued (through the
lanes) and timed: a warmup, whose host timings size the gate's lead, and a measured window, timed
by the rig's profiler and reduced over the ranks. The isolated baseline, the overlapped window
and every what-if round are one call of :func:`measure_window` each; nothing is left behind."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ..analysis.aggregate import WindowAggregate, local_summary, reduce_summaries
from ..analysis.intervals import HostTimings, WindowTimings
from ..profilers.profiler import Profiler
from .lanes import Lane, calibrated_lead_us, default_lead_us, gc_paused
from .prepare import Plan
from .rig import Rig, reducer

log = logging.getLogger("maestro.pattern")


@dataclass(frozen=True, kw_only=True)
class Window:
    """One measured window: this rank's timings and the lanes' account of it, and its figures
    over the ranks (the same on every rank)."""

    timings: WindowTimings
    host: HostTimings
    agg: WindowAggregate


def issue(
    rig: Rig,
    plan: Plan,
    lanes: Sequence[Lane],
    num_iters: int,
    *,
    present: np.ndarray,
    lead_us: float,
    sync: str | None = None,
    profiler: Profiler | None = None,
) -> HostTimings:
    """Run ``lanes`` for ``num_iters`` iterations (the garbage collector paused) under
    ``profiler`` (default: the rig's), timing the blocks ``present``; ``sync`` overrides the
    pattern's."""
    profiler = rig.profiler if profiler is None else profiler
    rig.window_id += 1
    profiler.begin_window(rig.window_id, len(plan.names), num_iters, present)
    with gc_paused():
        return rig.lanes.run_window(
            lanes,
            num_iters,
            profiler,
            sync=sync or plan.pattern.sync,
            block_names=plan.names,
            order=plan.pattern.issue_order,
            lead_us=lead_us,
        )


def warm_up(
    rig: Rig, plan: Plan, lanes: Sequence[Lane], *, present: np.ndarray, sync: str | None = None
) -> float:
    """Run the warmup iterations (never timed) and return the gate's lead they call for, from the
    default lead (no pattern inherits another's). Ranks agree on the longest: ranks whose gates
    opened apart would start their collectives apart and time each other."""
    cuda = rig.place.is_cuda
    lead_us = default_lead_us(cuda=cuda)
    if plan.pattern.warmup_iters <= 0:
        return lead_us
    # With the measured window's profiler hooks (CUPTI's push/pop cost host time), so the lead is
    # sized for them; never ended: the next window's begin discards its records.
    host = issue(
        rig, plan, lanes, plan.pattern.warmup_iters, present=present, lead_us=lead_us, sync=sync
    )
    proposal = np.array([calibrated_lead_us(host, cuda=cuda)])
    lead_us = float(reducer(rig.sync_group)(proposal, "max")[0])
    log.debug(
        "pattern %s: gate lead %.1f µs (this rank's warmup enqueue µs: %s)",
        plan.pattern.name,
        lead_us,
        host.enqueue_ns / 1e3,
    )
    return lead_us


def measure_window(
    rig: Rig,
    plan: Plan,
    lanes: Sequence[Lane],
    *,
    present: np.ndarray,
    lead_us: float,
    sync: str | None = None,
) -> Window:
    """One measured window of the pattern's iterations: ``lanes`` run behind a gate of
    ``lead_us``, the blocks ``present`` timed by the rig's profiler, the figures reduced over
    the ranks."""
    host = issue(
        rig, plan, lanes, plan.pattern.num_iters, present=present, lead_us=lead_us, sync=sync
    )
    timings = rig.profiler.end_window()
    return Window(timings=timings, host=host, agg=summarize(rig, plan, timings, host))


def summarize(rig: Rig, plan: Plan, timings: WindowTimings, host: HostTimings) -> WindowAggregate:
    """The window's figures over the ranks: each rank's summary, combined by all_reduces."""
    place = rig.place
    local = local_summary(
        timings,
        lane_of_block=plan.lane_starts,
        is_comm=plan.is_comm,
        is_compute=plan.is_compute,
        rank=place.rank,
        world_size=place.world_size,
        shared_clock=place.one_host,
        host=host,
    )
    reduce = reducer(rig.sync_group)
    return reduce_summaries(local, rank=place.rank, world_size=place.world_size, reduce=reduce)


def joined(windows: Sequence[Window]) -> tuple[WindowTimings, HostTimings]:
    """The timings of ``windows`` (of one pattern, one after another) as those of one window of
    all their iterations in order. Named device activities (``--trace``) are the first
    window's: its iterations are the first ones."""
    first = windows[0]
    if len(windows) == 1:
        return first.timings, first.host

    def cat(values: Sequence[Any]) -> Any:  # along the iterations: every array's last axis
        return None if values[0] is None else np.concatenate(values, axis=-1)

    t = [w.timings for w in windows]
    per_iteration = ("starts_ns", "ends_ns", "gate_open_ns")
    counts, ctas = [x.activity_counts for x in t], [x.kernel_ctas_max for x in t]
    timings = replace(
        first.timings,
        **{name: cat([getattr(x, name) for x in t]) for name in per_iteration},
        activity_counts=None if counts[0] is None else np.sum(counts, axis=0),
        kernel_ctas_max=None if ctas[0] is None else np.max(ctas, axis=0),
    )
    arrays = [f.name for f in fields(HostTimings) if f.name != "gate_us"]  # one gate per pattern
    host = replace(first.host, **{n: cat([getattr(w.host, n) for w in windows]) for n in arrays})
    return timings, host
