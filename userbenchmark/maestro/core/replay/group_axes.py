"""Axes from the traces' process groups (``distributedInfo.pg_config``): groups of one
description and size are the teams of one axis (``default_pg`` is ``world``, ``mesh_dp`` is
``dp``), and ``mesh:`` where the ``mesh_*`` axes lay the ranks out as a DeviceMesh does.

Some of a job's ranks replayed at ``--world-size N``: the given rank stands for every rank of
its role, each traced process group becomes an axis of the N-rank world (teams of its traced
size where N is a multiple of it, else one team of N; the default group is every rank), and each
collective keeps what one rank sends and receives (docs/replay.md, section 2)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ...blocks.comm import SendRecv
from ...blocks.registry import traced_op
from ..config.axes import mesh_teams
from ..config.spec import SuiteSpec, frozen_mapping
from .kineto import CommRecord, ProcessGroup, RankTrace, TraceError
from .step import build_step

Teams = tuple[tuple[int, ...], ...]


def slug(text: str, *, fallback: str = "x", limit: int = 48) -> str:
    """``text`` as a maestro name: lower case, ``_`` for anything but letters and digits."""
    out = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:limit].strip("_")
    if not out:
        return fallback
    return out if out[0].isalpha() else f"{fallback}_{out}"


@dataclass(kw_only=True)
class GroupAxes:
    """Every traced process group, and the axis each belongs to."""

    groups: dict[str, ProcessGroup]
    axis_of: dict[str, str] = field(default_factory=dict)
    """Group name -> axis name."""
    teams: dict[str, Teams] = field(default_factory=dict)
    """Axis name -> its teams (every group of the axis)."""
    mesh: dict[str, int] = field(default_factory=dict)
    """Mesh dimension -> degree, outer to inner, when the mesh axes form a DeviceMesh."""


def collect_groups(traces: Sequence[RankTrace]) -> dict[str, ProcessGroup]:
    """Every group of every file by name; the same name with other ranks is an error."""
    groups: dict[str, ProcessGroup] = {}
    where: dict[str, str] = {}
    for trace in traces:
        # A default group listed without its ranks (some versions write none) holds them all.
        world = tuple(range(trace.world_size))
        listed = [
            dataclasses.replace(g, ranks=world) if not g.ranks and g.desc == "default_pg" else g
            for g in trace.groups
        ]
        found = listed + [  # a group missing from pg_config: take the record's
            ProcessGroup(name=rec.group_name, desc=rec.group_desc, ranks=rec.group_ranks)
            for rec in trace.comms.values()
            if rec.group_name and rec.group_name not in groups and rec.group_ranks
        ]
        for group in found:
            if not group.ranks:
                continue  # ranks not listed: the group's records may tell them
            old = groups.get(group.name)
            if old is None:
                groups[group.name] = group
                where[group.name] = trace.path
            elif old.ranks != group.ranks and group in listed:
                raise TraceError(
                    f"process group {group.name!r} ({group.desc}) has ranks {list(old.ranks)} "
                    f"in {where[group.name]} but {list(group.ranks)} in {trace.path}: the "
                    "files come from different runs"
                )
    return groups


def _axis_name(desc: str, size: int, world_size: int) -> str:
    if desc == "default_pg" or (desc in ("", "undefined") and size == world_size):
        return "world"
    if desc.startswith("mesh_"):
        return slug(desc.removeprefix("mesh_"), fallback="mesh")
    return slug(desc, fallback="group")


def plan_axes(traces: Sequence[RankTrace], world_size: int) -> GroupAxes:
    """Axes of the traced groups: teams per axis, and the mesh when there is one."""
    groups = collect_groups(traces)
    out = GroupAxes(groups=groups)
    families: dict[tuple[str, int], list[ProcessGroup]] = {}
    for group in sorted(groups.values(), key=lambda g: (g.desc, g.ranks)):
        if group.ranks:
            families.setdefault((group.desc, len(group.ranks)), []).append(group)
    taken = Names()
    for (desc, size), members in families.items():
        for part in _disjoint(members):
            base = _axis_name(desc, size, world_size)
            whole = len(part) == 1 and len(part[0].ranks) == world_size
            if base == "world" and not (whole and "world" not in taken):
                base = "group"
            name = fresh_name(base, taken)
            out.teams[name] = tuple(g.ranks for g in part)
            out.axis_of |= {g.name: name for g in part}
    out.mesh = find_mesh(out.teams, world_size)
    return out


def _disjoint(members: list[ProcessGroup]) -> list[list[ProcessGroup]]:
    """Groups split into sets whose teams share no rank (one axis each)."""
    parts: list[list[ProcessGroup]] = []
    for group in members:
        for part in parts:
            if all(not set(group.ranks) & set(g.ranks) for g in part):
                part.append(group)
                break
        else:
            parts.append([group])
    return parts


class Names(set):
    """Names taken, with each base's next number: naming n blocks of one base is linear."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        super().__init__(names)
        self.next: dict[str, int] = {}


def fresh_name(base: str, taken: Names) -> str:
    """``base``, else ``base_2``, ``base_3``...: the first not in ``taken``, which takes it."""
    numbers = itertools.count(taken.next.get(base, 2))
    names = itertools.chain([base], (f"{base}_{i}" for i in numbers))
    name = next(n for n in names if n not in taken)
    taken.add(name)
    if name != base:
        taken.next[base] = int(name.rpartition("_")[2]) + 1
    return name


def find_mesh(teams: dict[str, Teams], world_size: int) -> dict[str, int]:
    """The DeviceMesh shape (axis -> degree, outer to inner) whose teams are exactly the
    traced teams of some axes covering every rank, or {} when none is."""
    candidates = {
        name: t
        for name, t in teams.items()
        if name != "world" and len(t) * len(t[0]) == world_size and len(t[0]) > 1
    }
    names = sorted(candidates)
    for count in range(len(names), 1, -1):
        for subset in itertools.combinations(names, count):
            degrees = [len(candidates[n][0]) for n in subset]
            if math.prod(degrees) != world_size:
                continue
            for order in itertools.permutations(range(count)):
                shape = [degrees[i] for i in order]
                if all(
                    sorted(mesh_teams(shape, dim)) == sorted(candidates[subset[i]])
                    for dim, i in enumerate(order)
                ):
                    return {subset[i]: degrees[i] for i in order}
    return {}


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
