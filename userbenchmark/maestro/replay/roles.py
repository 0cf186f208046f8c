"""Ranks doing the same work (the same sequences of work on their streams, up to the streams'
numbering) form a role, its lowest rank the reference; each role's step becomes a list of
blocks per stream, every rank's timing and dependencies attached."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from .deps import Dependencies
from .step import Item, RankStep


@dataclass(kw_only=True)
class Role:
    """Ranks doing the same work, and how each rank's items map to the reference's."""

    number: int
    ranks: tuple[int, ...]
    ref: RankStep
    items: dict[int, dict[int, Item]] = field(default_factory=dict)
    """Reference item index -> {rank: that rank's matching item}."""
    after: dict[int, set[int]] = field(default_factory=dict)
    """Reference item index -> reference items it waited for on some rank of the role."""
    steps: dict[int, RankStep] = field(default_factory=dict)


@dataclass(kw_only=True, eq=False)
class RoleBlock:
    """A block of one role: a collective, a GEMM, a run of other kernels, or an idle gap."""

    role: Role
    stream: int
    """The reference rank's stream."""
    kind: str
    """``comm``, ``p2p``, ``gemm``, ``busy`` (a stand-in for other kernels) or ``idle``."""
    items: list[int]
    times: dict[int, tuple[float, float]]
    """Rank -> (start, end) in µs from the rank's first device activity of the step."""
    after: set[RoleBlock] = field(default_factory=set)
    """Blocks of the same role this one waits for (on other streams)."""

    @property
    def first(self) -> Item:
        return self.role.ref.items[self.items[0]]

    def duration_us(self) -> float:
        """Traced duration: the longest of the ranks' own durations (maestro's latency rule)."""
        return max(end - start for start, end in self.times.values())


def group_roles(
    steps: Sequence[RankStep], deps: dict[int, Dependencies], apart: dict[int, tuple]
) -> list[Role]:
    """Ranks grouped by the work they do, in rank order; every item mapped to its reference.
    Ranks with different ``apart`` tags are never grouped (see :func:`split_apart`)."""
    keys = {
        st.rank: {s: tuple(it.signature for it in items) for s, items in st.streams.items()}
        for st in steps
    }
    programs: dict[tuple, list[RankStep]] = defaultdict(list)
    for st in sorted(steps, key=lambda s: s.rank):
        program = tuple(sorted(Counter(keys[st.rank].values()).items()))
        programs[(apart.get(st.rank, ()), program)].append(st)
    roles = []
    for number, members in enumerate(programs.values()):
        role = Role(
            number=number,
            ranks=tuple(m.rank for m in members),
            ref=members[0],
            steps={m.rank: m for m in members},
        )
        for member in members:
            _map_items(role, member, keys)
        _merge_deps(role, deps)
        roles.append(role)
    return roles


def split_apart(
    roles: Sequence[Role], pairs: set[tuple[int, int]], apart: dict[int, tuple]
) -> dict[int, tuple]:
    """Tags keeping each conflicting pair of ranks in different roles: the ranks of a role
    coloured greedily, in rank order, so that no pair shares a colour."""
    out = dict(apart)
    for role in roles:
        colour: dict[int, int] = {}
        for rank in role.ranks:
            taken = {colour[o] for a, b in pairs for o in (a, b) if rank in (a, b) and o in colour}
            colour[rank] = next(c for c in range(len(role.ranks)) if c not in taken)
            out[rank] = (*apart.get(rank, ()), colour[rank])
    return out


def _map_items(role: Role, member: RankStep, keys: dict[int, dict[int, tuple]]) -> None:
    ref_keys, own_keys = keys[role.ref.rank], keys[member.rank]
    free = sorted(member.streams, key=lambda s: member.streams[s][0].launch)
    for ref_stream in sorted(role.ref.streams, key=lambda s: role.ref.streams[s][0].launch):
        # One matches: the programs are equal as multisets.
        match = next(s for s in free if own_keys[s] == ref_keys[ref_stream])
        free.remove(match)
        pairs = zip(role.ref.streams[ref_stream], member.streams[match], strict=True)
        for ref_item, item in pairs:
            role.items.setdefault(ref_item.index, {})[member.rank] = item


def _merge_deps(role: Role, deps: dict[int, Dependencies]) -> None:
    """The union over the role's ranks of each item's dependencies, in reference terms."""
    to_ref: dict[int, dict[int, int]] = defaultdict(dict)
    for ref, by in role.items.items():
        for rank, item in by.items():
            to_ref[rank][item.index] = ref
    for rank in role.ranks:
        for dst, srcs in deps[rank].after.items():
            for src in srcs:
                if dst in to_ref[rank] and src in to_ref[rank]:
                    role.after.setdefault(to_ref[rank][dst], set()).add(to_ref[rank][src])


def role_blocks(role: Role, *, idle_us: float, keep_idle: bool) -> list[RoleBlock]:
    """The role's blocks: collectives, p2p and GEMMs alone, other kernels merged into runs
    (same annotation, nothing waiting in between, gaps up to ``idle_us``), idle gaps longer
    than ``idle_us`` as blocks of their own when ``keep_idle``."""
    sources = {src for srcs in role.after.values() for src in srcs}
    blocks: list[RoleBlock] = []
    for stream, items in role.ref.streams.items():
        current: RoleBlock | None = None
        for item in items:
            if (
                current is not None
                and item.kind == "other"
                and current.kind == "busy"
                and item.label == current.first.label
                and item.index not in role.after
                and current.items[-1] not in sources
                and _gap_us(role, current.items[-1], item.index) <= idle_us
            ):
                current.items.append(item.index)
                continue
            kind = "busy" if item.kind == "other" else item.kind
            current = RoleBlock(role=role, stream=stream, kind=kind, items=[item.index], times={})
            blocks.append(current)
    _time_and_link(role, blocks)
    return _with_idle(blocks, idle_us) if keep_idle else blocks


def _time_and_link(role: Role, blocks: list[RoleBlock]) -> None:
    for block in blocks:
        for rank in role.ranks:
            parts, start = [role.items[i][rank] for i in block.items], role.steps[rank].start
            block.times[rank] = (
                min(p.start for p in parts) - start,
                max(p.end for p in parts) - start,
            )
    owner = {i: b for b in blocks for i in b.items}
    for dst, srcs in role.after.items():
        target = owner[dst]
        target.after |= {owner[src] for src in srcs if owner[src].stream != target.stream}


def _gap_us(role: Role, before: int, after: int) -> float:
    a, b = role.items[before], role.items[after]
    return max(b[r].start - a[r].end for r in role.ranks)


def _with_idle(blocks: list[RoleBlock], idle_us: float) -> list[RoleBlock]:
    """An ``idle`` block before each one that started over ``idle_us`` after its lane, deps and
    step allowed (slowest rank); it takes over the dependencies, the block follows it."""
    out: list[RoleBlock] = []
    last_end: dict[tuple[int, int], float] = {}
    for block in sorted(blocks, key=lambda b: (b.stream, b.first.start)):
        ready = {}
        for rank in block.times:
            deps = [dep.times[rank][1] for dep in block.after]
            ready[rank] = max([last_end.get((block.stream, rank), 0.0), *deps])
        gap = max(block.times[r][0] - ready[r] for r in block.times)
        if gap > idle_us:
            idle = RoleBlock(
                role=block.role,
                stream=block.stream,
                kind="idle",
                items=[block.items[0]],
                times={r: (min(ready[r], start), start) for r, (start, _) in block.times.items()},
                after=block.after,
            )
            block.after = set()
            out.append(idle)
        out.append(block)
        last_end.update({(block.stream, r): end for r, (_, end) in block.times.items()})
    return out
