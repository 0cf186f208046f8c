"""From trace files to the imported pattern: read every rank, check they are one run, pick the
step, find its work and dependencies, group ranks into roles, and lay the blocks out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import OptionError
from .assemble import build_pattern_blocks, merge_siblings
from .group_axes import GroupAxes, plan_axes
from .kineto import RankTrace, TraceError, iter_trace_files, read_trace
from .layout import Layout, lay_out
from .roles import Dependencies, Role, group_roles, infer, role_blocks, split_apart
from .step import RankStep, build_step, choose_step, step_span

IDLE_US = 20.0
"""Default: gaps longer than this on a lane become ``sleep`` blocks; shorter gaps between
stand-in kernels stay inside the stand-in's duration."""
RUN_SKEW_S = 5.0
"""Ranks of one run start a step within this (plus two step durations) of each other."""


@dataclass(frozen=True, kw_only=True)
class ImportOptions:
    """How to import: which step, and what to do with idle gaps."""

    step: int | None = None
    """``ProfilerStep#N`` to import; None: the last one complete on every rank."""
    idle_us: float = IDLE_US
    keep_idle: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.idle_us < math.inf:  # NaN fails too
            raise OptionError(f"--idle-us {self.idle_us}: expected a number of µs, 0 or more")


@dataclass(kw_only=True)
class Imported:
    """Everything the pattern file says, and what its header reports."""

    traces: list[RankTrace]
    step_name: str
    options: ImportOptions
    steps: list[RankStep]
    deps: dict[int, Dependencies]
    roles: list[Role]
    axes: GroupAxes
    layout: Layout
    by_seq: bool = False
    """Collectives were matched across ranks by their sequence numbers (else by order)."""

    @property
    def world_size(self) -> int:
        return self.traces[0].world_size


def read_run(paths: Sequence[str]) -> list[RankTrace]:
    """Every rank's trace, in rank order; errors when they cannot be one run's files."""
    files = list(iter_trace_files(list(paths)))
    if not files:
        raise TraceError("no trace file given")
    traces = [read_trace(f) for f in files]
    plain = [t.path for t in traces if not t.distributed]
    if plain and len(traces) > 1:
        raise TraceError(
            f"{plain[0]}: no distributedInfo (not a distributed run), yet several files "
            "were given: give one file per rank of one distributed run"
        )
    sizes = sorted({t.world_size for t in traces})
    if len(sizes) > 1:
        shown = ", ".join(f"{t.path}: {t.world_size}" for t in traces)
        raise TraceError(f"the files have different world sizes ({shown}): not one run")
    by_rank: dict[int, RankTrace] = {}
    for t in traces:
        if t.rank in by_rank:
            raise TraceError(f"two files for rank {t.rank}: {by_rank[t.rank].path} and {t.path}")
        if not 0 <= t.rank < t.world_size:
            raise TraceError(f"{t.path}: rank {t.rank} outside world size {t.world_size}")
        by_rank[t.rank] = t
    missing = sorted(set(range(sizes[0])) - set(by_rank))
    if missing:
        got = ", ".join(str(r) for r in sorted(by_rank))
        raise TraceError(
            f"rank {missing[0]}'s trace file is missing: world size {sizes[0]}, files for "
            f"rank(s) {got}; give every rank's file (or the folder holding them)"
        )
    return [by_rank[r] for r in sorted(by_rank)]


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


def import_traces(paths: Sequence[str], options: ImportOptions | None = None) -> Imported:
    """Read the traces at ``paths`` and build the pattern of one profiler step."""
    options = options or ImportOptions()
    traces = read_run(paths)
    step_name = choose_step(traces, options.step)
    _check_same_run(traces, step_name)
    axes = plan_axes(traces, traces[0].world_size)
    sizes = {name: len(g.ranks) for name, g in axes.groups.items()}
    steps = [build_step(t, step_name, sizes) for t in traces]
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
    try:  # one block per call on sibling teams, unless that cannot be ordered
        layout = lay_out(merge_siblings(pattern_blocks), axes, traces[0].world_size)
    except TraceError:
        layout = lay_out(pattern_blocks, axes, traces[0].world_size)
    return Imported(
        traces=traces,
        step_name=step_name,
        options=options,
        steps=steps,
        deps=deps,
        roles=roles,
        axes=axes,
        layout=layout,
        by_seq=by_seq,
    )
