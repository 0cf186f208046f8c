"""From trace files to the imported pattern: read every rank, check they are one run, pick the
step, find its work and dependencies, group ranks into roles, and lay the blocks out."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import OptionError
from .assemble import PatternBlock, build_pattern_blocks, merge_siblings
from .group_axes import GroupAxes, one_rank_view, plan_axes
from .kineto import MAX_RANKS, RankTrace, TraceError, iter_trace_files, read_trace
from .layout import Layout, lay_out
from .roles import Dependencies, Role, group_roles, infer, role_blocks, split_apart
from .step import Census, RankStep, build_step, check_missing, choose_steps, set_windows, step_span

IDLE_US = 20.0
"""Default: gaps longer than this on a lane become ``sleep`` blocks; shorter gaps between
stand-in kernels stay inside the stand-in's duration."""
RUN_SKEW_S = 5.0
"""Ranks of one run start a step within this (plus two step durations) of each other."""


@dataclass(frozen=True, kw_only=True)
class ImportOptions:
    """How to import: which step (or annotation), what to do with idle gaps, and the world size
    of the replay when the files are some of a job's ranks."""

    step: int | None = None
    """``ProfilerStep#N`` (or the annotation's N-th span) to import; None: every complete one."""
    idle_us: float = IDLE_US
    keep_idle: bool = True
    world_size: int | None = None
    annotation: str | None = None
    """A ``record_function`` name whose spans are the steps (instead of ProfilerStep#N)."""

    def __post_init__(self) -> None:
        if not 0 <= self.idle_us < math.inf:  # NaN fails too
            raise OptionError(f"--idle-us {self.idle_us}: expected a number of µs, 0 or more")
        if self.world_size is not None and not 1 <= self.world_size < MAX_RANKS:
            raise OptionError(f"--world-size {self.world_size}: expected 1 to {MAX_RANKS - 1}")


@dataclass(kw_only=True)
class Imported:
    """Everything the pattern file says, and what its header reports."""

    traces: list[RankTrace]
    run: Run
    step_name: str
    options: ImportOptions
    steps: list[RankStep]
    deps: dict[int, Dependencies]
    roles: list[Role]
    axes: GroupAxes
    layout: Layout
    by_seq: bool = False
    """Collectives were matched across ranks by their sequence numbers (else by order)."""
    # Over the complete steps like this one (steps_used; unlike: the others): each block's
    # traced µs (by layout index: median, min, max) and each rank's step (median).
    spread: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    step_spread: tuple[float, ...] = ()
    steps_used: tuple[str, ...] = ()
    unlike: tuple[str, ...] = ()
    census: dict[int, Census] = field(default_factory=dict)
    traced_groups: dict[str, tuple] = field(default_factory=dict)
    """With --world-size over some ranks: group name -> (its description, its traced ranks)."""


@dataclass(frozen=True, kw_only=True)
class Run:
    """The files' place in their job: its traced world size, the given ranks, the replay's."""

    world: int
    traced_world: int | None
    given: tuple[int, ...]
    subset: bool
    paths: tuple[str, ...] = ()
    """Each given rank's file."""


def _one_run(traces: Sequence[RankTrace]) -> tuple[dict[int, RankTrace], int | None]:
    """The traces by rank and their traced world size (None: not written), or an error where
    they cannot be one run's files."""
    plain = [t.path for t in traces if not t.distributed]
    if plain and len(traces) > 1:
        raise TraceError(
            f"{plain[0]}: no distributedInfo (not a distributed run), yet several files "
            "were given: give one file per rank of one distributed run"
        )
    for key, what in (("world_size", "world sizes"), ("group_trace_id", "group_trace_ids")):
        if len({getattr(t, key) for t in traces} - {None, ""}) > 1:
            shown = ", ".join(f"{t.path}: {getattr(t, key)}" for t in traces)
            raise TraceError(f"the files have different {what} ({shown}): not one run")
    traced = next(iter({t.world_size for t in traces} - {None}), None)
    by_rank: dict[int, RankTrace] = {}
    for t in traces:
        if t.rank in by_rank:
            raise TraceError(f"two files for rank {t.rank}: {by_rank[t.rank].path} and {t.path}")
        if traced is not None and t.rank >= traced:
            raise TraceError(f"{t.path}: rank {t.rank} outside world size {traced}")
        by_rank[t.rank] = t
    return by_rank, traced


def read_run(paths: Sequence[str], world_size: int | None = None) -> tuple[list[RankTrace], Run]:
    """Every rank's trace, in rank order, and their place in the job; errors when they cannot be
    one run's files, or are some of its ranks and ``world_size`` (--world-size) is not given."""
    files = list(iter_trace_files(list(paths)))
    if not files:
        raise TraceError("no trace file given")
    by_rank, traced = _one_run([read_trace(f) for f in files])
    given = tuple(sorted(by_rank))
    whole = given == tuple(range(traced or len(given)))
    world = world_size or (traced if whole else None) or len(given)
    if not (whole and world == len(given)) and world_size is None:
        of = f"a world of {traced}" if traced else "a world whose size the files do not say"
        lacking = min(set(range(len(given) + 1)) - set(given))
        raise TraceError(
            f"rank {lacking}'s trace file is missing (the files hold rank(s) "
            f"{', '.join(map(str, given[:8]))} of {of}): give every rank's file, or replay "
            "these at a world size of your choice with --world-size N (each given rank "
            "standing for the ranks of its role)"
        )
    traces = [by_rank[r] for r in given]
    for t in traces:
        t.world_size = traced or world
    paths = tuple(t.path for t in traces)
    subset = not whole or world != len(given)
    return traces, Run(world=world, traced_world=traced, given=given, subset=subset, paths=paths)


def _check_same_run(traces: Sequence[RankTrace], step_name: str) -> None:
    spans = {t.rank: (t.base_time_us, step_span(t, step_name)) for t in traces}
    starts = {rank: base + span.ts for rank, (base, span) in spans.items()}
    first = min(starts.values())
    limit_us = RUN_SKEW_S * 1e6 + 2 * max(span.end - span.ts for _, span in spans.values())
    for rank, start in starts.items():
        if start - first > limit_us:
            raise TraceError(
                f"rank {rank}'s {step_name} starts {(start - first) / 1e6:.1f} s after the "
                f"earliest rank's: the files come from different runs (a run's ranks start a "
                "step together)"
            )


def _import_step(
    traces: Sequence[RankTrace], run: Run, name: str, options: ImportOptions, sizes: dict[str, int]
) -> Imported:
    """One step of the traces as the pattern's blocks; ``sizes``: each group's team size."""
    axes = plan_axes(traces, len(traces))
    steps = [build_step(t, name, sizes) for t in traces]
    deps = {st.rank: infer(st) for st in steps}
    # Calls are matched across ranks by ``Seq`` when every collective has one, else by order.
    comms = [it for st in steps for it in st.items if it.kind == "comm"]
    by_seq = bool(comms) and all(it.seq is not None for it in comms)
    apart: dict[int, tuple] = {}
    for _ in range(len(traces)):  # each round splits at least one role
        roles = group_roles(steps, deps, apart)
        blocks = {
            role.number: role_blocks(role, idle_us=options.idle_us, keep_idle=options.keep_idle)
            for role in roles
        }
        pattern_blocks, conflicts = build_pattern_blocks(roles, blocks, axes, by_seq=by_seq)
        if not conflicts:
            break
        apart = split_apart(roles, conflicts, apart)
    else:  # cannot happen: ranks in roles of their own have no conflict
        raise TraceError("cannot tell which ranks do the same work")
    layout = lay_out(merge_siblings(pattern_blocks), axes, len(traces))
    return Imported(
        traces=list(traces),
        run=run,
        step_name=name,
        options=options,
        steps=steps,
        deps=deps,
        roles=roles,
        axes=axes,
        layout=layout,
        by_seq=by_seq,
    )


def _duration(block: PatternBlock, steps: dict[int, RankStep], at: dict) -> float:
    """The block's traced duration in another step like the first (``steps``: by rank), its
    items at the first step's places (``at``); an idle gap grows or shrinks as the gap before
    the item it precedes does."""
    out = 0.0
    for rb in block.members:
        for rank in rb.role.ranks:
            places = [at[(rank, id(rb.role.items[i][rank]))] for i in rb.items]
            items = [steps[rank].streams[s][i] for s, i in places]
            if rb.kind != "idle":
                out = max(out, max(it.end for it in items) - min(it.start for it in items))
                continue
            (s, i), (start, end) = places[0], rb.times[rank]
            gaps = [
                step.streams[s][i].start - (step.streams[s][i - 1].end if i else step.start)
                for step in (rb.role.steps[rank], steps[rank])
            ]
            out = max(out, end - start + gaps[1] - gaps[0])
    return max(out, 0.0)


def _over_steps(first: Imported, others: dict[str, list[RankStep]]) -> None:
    """Each block's traced durations over the complete steps whose work is the first's, item
    for item: their median and range, and each rank's step's median."""
    program = [st.program for st in first.steps]
    like = {first.step_name: first.steps} | {
        name: steps for name, steps in others.items() if [st.program for st in steps] == program
    }
    at = {
        (st.rank, id(it)): (s, i)
        for st in first.steps
        for s, items in st.streams.items()
        for i, it in enumerate(items)
    }
    for index, block in enumerate(first.layout.blocks):
        durations = [_duration(block, {st.rank: st for st in v}, at) for v in like.values()]
        first.spread[index] = statistics.median(durations), min(durations), max(durations)
    by_rank = [
        [st.end - st.start for st in sorted(v, key=lambda st: st.rank)] for v in like.values()
    ]
    first.step_spread = tuple(statistics.median(col) for col in zip(*by_rank, strict=True))
    first.steps_used = tuple(like)
    first.unlike = tuple(name for name in others if name not in like)


def import_traces(paths: Sequence[str], options: ImportOptions | None = None) -> Imported:
    """Read the traces at ``paths`` and build the pattern of their steps: the last complete one's
    blocks, each with its traced duration's median and range over the complete steps like it."""
    options = options or ImportOptions()
    traces, run = read_run(paths, options.world_size)
    for t in traces:
        set_windows(t, options.annotation)
    census = {t.rank: Census(t) for t in traces}
    names = choose_steps(traces, census, options.step, options.annotation or "ProfilerStep")
    for t in traces:
        check_missing(census[t.rank], t, names[0])
    _check_same_run(traces, names[0])
    traced: dict[str, tuple] = {}
    if run.subset:
        view, sizes, traced = one_rank_view(traces, run.world, names[0])
        traces = [view]
    else:
        axes = plan_axes(traces, run.world)
        sizes = {name: len(g.ranks) for name, g in axes.groups.items()}
    first = _import_step(traces, run, names[0], options, sizes)
    _over_steps(first, {name: [build_step(t, name, sizes) for t in traces] for name in names[1:]})
    first.census, first.traced_groups = census, traced
    return first
