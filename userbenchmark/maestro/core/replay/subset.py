"""Some of a job's ranks replayed at ``--world-size N``: the given rank stands for every rank of
its role, each traced process group becomes an axis of the N-rank world (teams of its traced
size where N is a multiple of it, else one team of N; the default group is every rank), and each
collective keeps what one rank sends and receives (docs/replay.md, section 2)."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Sequence

from ...blocks.comm import SendRecv
from ...blocks.registry import traced_op
from ..config.axes import mesh_teams
from ..config.spec import SuiteSpec, frozen_mapping
from .group_axes import Teams, find_mesh
from .kineto import CommRecord, ProcessGroup, RankTrace, TraceError
from .step import build_step


def team_size(traced: int, world: int, desc: str) -> int:
    """A traced group's team size in a world of ``world`` ranks."""
    fits = traced <= world and world % traced == 0
    return traced if fits and desc != "default_pg" else world


def _rescaled(rec: CommRecord, team: int) -> CommRecord:
    """The record on a team of ``team`` ranks sending and receiving what one rank did: the
    side that held every rank's part (a gathered output, a scattered input) is the other
    side's ``team`` times."""
    ins, outs = rec.in_nelems, rec.out_nelems
    if outs > ins:
        outs = ins * team
    elif ins > outs:
        ins = outs * team
    return dataclasses.replace(rec, in_nelems=ins, out_nelems=outs, group_ranks=(0,))


def _view(trace: RankTrace, world: int) -> tuple[RankTrace, dict[str, int], dict[str, tuple]]:
    every = tuple(range(trace.world_size or 1))
    traced = {g.name: (g.desc, g.ranks or every) for g in trace.groups}
    for rec in trace.comms.values():
        if rec.group_name:
            traced.setdefault(rec.group_name, (rec.group_desc, rec.group_ranks or (trace.rank,)))
        elif traced_op(rec.name) is not None:  # older torch names no group: the default one
            traced.setdefault("", ("default_pg", every))
    sizes = {name: team_size(len(ranks), world, desc) for name, (desc, ranks) in traced.items()}
    comms = {  # transfers to ranks not in the files are stand-ins (their kernel alone)
        ext: _rescaled(rec, sizes[rec.group_name])
        for ext, rec in trace.comms.items()
        if traced_op(rec.name) is not SendRecv and rec.group_name in traced
    }
    groups = tuple(dataclasses.replace(g, ranks=(0,)) for g in trace.groups)
    groups += (ProcessGroup(name="", desc="default_pg", ranks=(0,)),) * ("" in traced)
    view = dataclasses.replace(trace, rank=0, world_size=1, groups=groups, comms=comms)
    return view, sizes, traced


def one_rank_view(
    traces: Sequence[RankTrace], world: int, step: str
) -> tuple[RankTrace, dict[str, int], dict[str, tuple]]:
    """The first trace as a one-rank run whose groups have the team sizes they take in
    ``world`` (returned by group name, with each group's traced description and ranks); the
    other traces must do the same work in ``step``."""
    views = [_view(t, world) for t in traces]
    programs = [Counter(it.signature for it in build_step(v, step, n).items) for v, n, _ in views]
    for trace, program in zip(traces, programs, strict=True):
        if program != programs[0]:
            raise TraceError(
                f"rank {trace.rank} does other work than rank {traces[0].rank} in {step}: with "
                "--world-size, give one rank's file (it stands for every rank), or files of "
                "ranks that do the same work"
            )
    return views[0]


def _teams(ranks: tuple[int, ...], team: int, world: int) -> Teams:
    """Teams of ``team`` ranks over ``world``, strided as the traced group was where it fits:
    the DeviceMesh teams of that stride."""
    stride = ranks[1] - ranks[0] if len(ranks) > 1 else 1
    even = stride > 0 and all(b - a == stride for a, b in itertools.pairwise(ranks))
    stride = stride if even and world % (team * stride) == 0 else 1
    return mesh_teams([world // (team * stride), team, stride], 1)


def widen(suite: SuiteSpec, world: int, groups: dict[str, tuple[str, Teams]]) -> SuiteSpec:
    """The one-rank suite at ``world`` ranks; ``groups``: axis -> (traced group's description,
    its traced ranks); every other axis (world, compute) is one team of every rank."""
    axes = {}
    for name, spec in suite.axes.items():
        desc, ranks = groups.get(spec.like or name, ("default_pg", ()))
        team = team_size(len(ranks), world, desc) if ranks else world
        axes[name] = dataclasses.replace(spec, teams=_teams(tuple(ranks), team, world))
    mesh = find_mesh({n: a.teams for n, a in axes.items() if not a.like}, world)
    pattern = suite.patterns[0]
    pattern = dataclasses.replace(pattern, traced_by_rank_us=pattern.traced_by_rank_us * world)
    return dataclasses.replace(
        suite,
        world_size=world,
        axes=frozen_mapping(axes),
        mesh=frozen_mapping(mesh),
        patterns=(pattern,),
    )
