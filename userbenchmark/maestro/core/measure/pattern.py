"""One pattern on one rank, phase by phase: each phase a plain function from the frozen values of
the phases before it to a frozen value of its own, run through the cluster shell's ``step``
(core/runtime/phases.py), which agrees with every rank after it. A pattern with what-if variants
measures them against itself in interleaved rounds. One window (:func:`issue`) is the one place
iterations are issued and timed: a warmup, whose host timings size the gate's lead, and a measured
window (the baseline, the overlapped window and each round), reduced over the ranks."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as tdist

from ...errors import RunError
from ..analysis.aggregate import WindowAggregate, local_summary, reduce_summaries
from ..analysis.intervals import HostTimings, WindowTimings, main_kernel_names
from ..analysis.outcome import Isolated, build_outcome
from ..analysis.records import PatternOutcome, RankTimeline, Timeline
from ..analysis.whatif import WhatIfResult, build_whatif
from ..config.spec import PatternSpec
from ..profilers.profiler import Profiler
from ..replay.fidelity import rank_steps, with_fidelity
from .lanes import calibrated_lead_us, default_lead_us, gc_paused
from .prepare import Allocated, Plan, Ready, capture, lanes_alone, make_plan, setup
from .rig import Rig, reducer

log = logging.getLogger("maestro.pattern")

T = TypeVar("T")
Step = Callable[[str, str, Callable[[], T]], T]
"""``step(phase, pattern label, work)`` runs one phase: ``work``'s value once every rank agreed
that the phase succeeded (the cluster shell's agreement step), else a RunError."""


@dataclass(frozen=True, kw_only=True)
class Measured:
    """A pattern's outcomes on this rank: its own, then each variant's (in the order of
    ``PatternSpec.variants``), and the what-if results (empty without variants)."""

    outcomes: tuple[tuple[PatternSpec, PatternOutcome], ...]
    whatif: tuple[WhatIfResult, ...] = ()


def measure_pattern(
    rig: Rig, pattern: PatternSpec, held: Allocated, step: Step, *, rounds: int
) -> Measured:
    """Every phase of ``pattern`` on this rank, each through ``step``: setup, measure (with
    variants: each warmed up, then ``rounds`` rounds of a window of each), baseline (of the
    pattern itself), check and analysis. ``held`` keeps what they allocate for the teardown."""
    name, sides = pattern.name, (pattern, *pattern.variants)
    readies = step("setup", name, lambda: setup(rig, [make_plan(rig, s) for s in sides], held))
    if pattern.variants:
        warms = tuple(
            step("measure", r.plan.pattern.label, functools.partial(warm, rig, r, held))
            for r in readies
        )
        windows = interleaved(rig, warms, step, rounds)
    else:

        def alone() -> tuple[Ready, Window]:
            warmed = warm(rig, readies[0], held)
            return warmed, measure_window(rig, warmed)

        first, window = step("measure", name, alone)
        warms, windows = (first,), ((window,),)
    isolated = Isolated.unmeasured(len(pattern.blocks))
    if pattern.baseline and len(pattern.blocks) > 1:
        isolated = step("baseline", name, lambda: baseline(rig, warms[0]))
    wrong: tuple[np.ndarray | None, ...] = (None,) * len(sides)
    if pattern.check:
        wrong = tuple(
            step("check", w.plan.pattern.label, functools.partial(check, rig, w)) for w in warms
        )
    return step("analysis", name, lambda: analyse(rig, warms, windows, isolated, wrong))


def warm(rig: Rig, ready: Ready, held: Allocated) -> Ready:
    """``ready`` warmed up, its gate sized. CUDA-graph mode: an eager warmup first (communicators,
    library handles), then each block captured, then a warmup of the replays, which sizes the
    gate for them. The measured windows come after all of it: capture and warmups never reach
    the numbers."""
    plan = ready.plan
    ready = warm_up(rig, ready)
    if plan.pattern.graph:
        if plan.pattern.warmup_iters == 0:  # communicators exist before capture
            issue(rig, ready, 1, present=ready.present, profiler=Profiler())
        ready = capture(ready, rig.place.device, held)
        ready = warm_up(rig, ready)
    return ready


def interleaved(
    rig: Rig, warms: Sequence[Ready], step: Step, rounds: int
) -> tuple[tuple[Window, ...], ...]:
    """``rounds`` rounds of one measured window of each of ``warms`` (each window a phase of its
    own), the order rotated from round to round: the first window after a switch can run cold,
    so each takes every place in turn. Each one's windows, round by round."""
    got: list[list[Window]] = [[] for _ in warms]
    for r in range(rounds):
        for k in range(len(warms)):
            side = (r + k) % len(warms)
            warmed = warms[side]
            phase = f"measure, round {r + 1} of {rounds}"
            work = functools.partial(measure_window, rig, warmed)
            got[side].append(step(phase, warmed.plan.pattern.label, work))
    return tuple(tuple(windows) for windows in got)


def per_round(windows: Sequence[Window]) -> tuple[np.ndarray, np.ndarray]:
    """Each round's average makespan (rounds,) and each block's average latency per round
    (blocks, rounds; NaN where untimed), in ns, from one window per round."""
    makespan = np.array([w.agg.makespan_ns.mean() for w in windows])
    return makespan, np.stack([w.agg.latency_ns.mean(axis=1) for w in windows], axis=1)


def baseline(rig: Rig, ready: Ready) -> Isolated:
    """Each block of warmed-up ``ready`` alone, for the pattern's iterations."""
    plan, note = ready.plan, rig.note
    num_blocks = len(plan.names)
    rows = np.full((num_blocks, plan.pattern.num_iters), np.nan)
    for b in range(num_blocks):
        if note is not None:
            note(f"{plan.pattern.name}: baseline", b, num_blocks)
        if plan.idle[b] is not None:
            continue  # nothing to time (the same on every rank)
        alone = dataclasses.replace(ready, lanes=lanes_alone(ready.lanes, b))
        # On CUDA a block alone that talks to no other rank needs no cross-rank start: its
        # iterations follow each other on the device, each after its gate spin, with no
        # host barrier or alignment collective between them. On CPU its lane would then
        # run warm where the pattern's ran after a wait.
        sync = "none" if rig.place.is_cuda and not plan.is_comm[b] else None
        alone = warm_up(rig, alone, sync=sync)
        window = measure_window(rig, alone, sync=sync)
        rows[b] = window.agg.latency_ns[b]
    return Isolated(latency_ns=rows)


def check(rig: Rig, ready: Ready) -> np.ndarray:
    """Wrong output elements of each block, summed over the ranks, after one iteration on
    deterministic inputs."""
    blocks = [(i, block) for i, block in enumerate(ready.blocks) if block is not None]
    for _, block in blocks:
        block.prepare_check()
    plan = ready.plan
    issue(rig, ready, 1, present=ready.present, profiler=Profiler())
    if rig.place.is_cuda:
        torch.cuda.synchronize(rig.place.device)
    wrong = np.zeros(len(plan.names))
    for i, block in blocks:
        try:
            wrong[i] = block.verify()
        except Exception as exc:
            raise RunError(
                f"verify failed: {type(exc).__name__}: {exc}", block=plan.names[i]
            ) from exc
    return reducer(rig.sync_group)(wrong, "sum")


BASE_ONLY_NOTE = (
    "isolated baseline: measured for the pattern itself, not for its what-if variants (their "
    "slowdown and overlap efficiency are not measured)"
)


def analyse(
    rig: Rig,
    warms: Sequence[Ready],
    windows: Sequence[Sequence[Window]],
    isolated: Isolated,
    wrong: Sequence[np.ndarray | None],
) -> Measured:
    """Each outcome, from all of its windows' iterations, the pattern's baseline and its check;
    then the what-if results."""
    peak = None
    if rig.place.is_cuda:
        mine = np.array([float(torch.cuda.max_memory_allocated(rig.place.device))])
        peak = int(reducer(rig.sync_group)(mine, "max")[0])
    outcomes = []
    for side, (ready, measured, checked) in enumerate(zip(warms, windows, wrong, strict=True)):
        alone = isolated if side == 0 else Isolated.unmeasured(len(ready.plan.names))
        outcome = _outcome(rig, ready, measured, alone, checked, peak)
        if side > 0 and isolated.latency_ns.size:  # the pattern's baseline ran
            result = outcome.pattern
            notes = "; ".join(n for n in (result.notes, BASE_ONLY_NOTE) if n)
            outcome = dataclasses.replace(outcome, pattern=dataclasses.replace(result, notes=notes))
        outcomes.append((ready.plan.pattern, outcome))
    base, *variants = (w.plan.pattern for w in warms)
    base_makespan, base_blocks = per_round(windows[0])
    whatif = []
    for variant, measured in zip(variants, windows[1:], strict=True):
        makespan, blocks = per_round(measured)
        whatif.append(
            build_whatif(
                base,
                variant,
                base_makespan_ns=base_makespan,
                variant_makespan_ns=makespan,
                base_block_ns=base_blocks,
                variant_block_ns=blocks,
            )
        )
    return Measured(outcomes=tuple(outcomes), whatif=tuple(whatif))


def _outcome(
    rig: Rig,
    ready: Ready,
    windows: Sequence[Window],
    isolated: Isolated,
    wrong: np.ndarray | None,
    peak: int | None,
) -> PatternOutcome:
    plan, place = ready.plan, rig.place
    timings, host = joined(windows)
    agg = windows[0].agg if len(windows) == 1 else summarize(rig, plan, timings, host)
    outcome = build_outcome(
        rig.suite,
        plan.pattern,
        plan.classes,
        agg,
        isolated,
        wrong,
        peak,
        profiler=rig.profiler.name,
        team_sizes=plan.team_sizes,
        notes=ready.notes,
        ranks_per_gpu=place.ranks_per_gpu,
    )
    if plan.pattern.traced:  # an imported step reports every rank's makespan
        steps = reducer(rig.sync_group)(rank_steps(timings, place.rank, place.world_size), "sum")
        kernels = main_kernel_names(timings.activities, len(plan.names))
        outcome = with_fidelity(outcome, plan.pattern, agg, steps, kernels)
    if rig.collect_timeline:
        outcome = dataclasses.replace(outcome, timeline=_gather_timeline(rig, plan, timings))
    return outcome


def _gather_timeline(rig: Rig, plan: Plan, timings: WindowTimings) -> Timeline | None:
    # Every rank's intervals on rank 0 (None elsewhere), only for --trace/--plot.
    place = rig.place
    mine = RankTimeline(
        rank=place.rank,
        starts_ns=np.asarray(timings.starts_ns, dtype=np.int64),
        ends_ns=np.asarray(timings.ends_ns, dtype=np.int64),
        present=np.asarray(timings.present, dtype=bool),
        clock=timings.clock,
        activities=timings.activities,  # CUPTI with --trace only
    )
    gathered: list[Any] = [None] * place.world_size
    tdist.all_gather_object(gathered, mine, group=rig.sync_group)
    if place.rank != 0:
        return None
    return Timeline(
        pattern=plan.pattern.label,
        block_names=plan.names,
        block_lanes=tuple(plan.pattern.lanes[i] for i in plan.lane_of_block),
        ranks=tuple(sorted(gathered, key=lambda r: r.rank)),
        shared_clock=place.one_host and timings.host_clock,
        block_categories=tuple(c.category for c in plan.classes),
        backend=place.backend,
    )


@dataclass(frozen=True, kw_only=True)
class Window:
    """One measured window: this rank's timings and the lanes' account of it, and its figures
    over the ranks (the same on every rank)."""

    timings: WindowTimings
    host: HostTimings
    agg: WindowAggregate


def issue(
    rig: Rig,
    ready: Ready,
    num_iters: int,
    *,
    present: np.ndarray,
    sync: str | None = None,
    profiler: Profiler | None = None,
) -> HostTimings:
    """Run ``ready``'s lanes for ``num_iters`` iterations behind its gate's lead (the garbage
    collector paused) under ``profiler`` (default: the rig's), timing the blocks ``present``;
    ``sync`` overrides the pattern's."""
    plan = ready.plan
    profiler = rig.profiler if profiler is None else profiler
    rig.window_id += 1
    profiler.begin_window(rig.window_id, len(plan.names), num_iters, present)
    with gc_paused():
        return rig.lanes.run_window(
            ready.lanes,
            num_iters,
            profiler,
            sync=sync or plan.pattern.sync,
            block_names=plan.names,
            order=plan.pattern.issue_order,
            lead_us=ready.lead_us,
        )


def warm_up(rig: Rig, ready: Ready, *, sync: str | None = None) -> Ready:
    """``ready`` after its warmup iterations (never timed), with the gate's lead they call for,
    from the default lead (no pattern inherits another's). Ranks agree on the longest: ranks
    whose gates opened apart would start their collectives apart and time each other."""
    plan, cuda = ready.plan, rig.place.is_cuda
    ready = dataclasses.replace(ready, lead_us=default_lead_us(cuda=cuda))
    if plan.pattern.warmup_iters <= 0:
        return ready
    # With the measured window's profiler hooks (CUPTI's push/pop cost host time), so the lead is
    # sized for them; never ended: the next window's begin discards its records.
    host = issue(rig, ready, plan.pattern.warmup_iters, present=ready.present, sync=sync)
    proposal = np.array([calibrated_lead_us(host, cuda=cuda)])
    lead_us = float(reducer(rig.sync_group)(proposal, "max")[0])
    log.debug(
        "pattern %s: gate lead %.1f µs (this rank's warmup enqueue µs: %s)",
        plan.pattern.name,
        lead_us,
        host.enqueue_ns / 1e3,
    )
    return dataclasses.replace(ready, lead_us=lead_us)


def measure_window(rig: Rig, ready: Ready, *, sync: str | None = None) -> Window:
    """One measured window of the pattern's iterations: ``ready``'s lanes run behind its gate's
    lead, their timed blocks timed by the rig's profiler, the figures reduced over the ranks."""
    plan = ready.plan
    present = ready.present & plan.timed
    host = issue(rig, ready, plan.pattern.num_iters, present=present, sync=sync)
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
    timings = dataclasses.replace(
        first.timings,
        **{name: cat([getattr(x, name) for x in t]) for name in per_iteration},
        activity_counts=None if counts[0] is None else np.sum(counts, axis=0),
        kernel_ctas_max=None if ctas[0] is None else np.max(ctas, axis=0),
    )
    # gate_us stays the first window's: one gate per pattern
    arrays = [f.name for f in dataclasses.fields(HostTimings) if f.name != "gate_us"]
    per_window = {n: cat([getattr(w.host, n) for w in windows]) for n in arrays}
    host = dataclasses.replace(first.host, **per_window)
    return timings, host
