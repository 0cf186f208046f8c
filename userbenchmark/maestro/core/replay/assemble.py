"""The pattern's blocks: role blocks joined across roles where they are one call (the i-th call
on a group, a transfer's two ends); compute stays per role. Ranks that disagree on a call mean
the files are not one run's step: an error says which ranks and group."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ...blocks.base import Block, TracedCall
from ...blocks.comm import AllToAll, SendRecv
from ...blocks.compute import Busy, Gemm, Sleep
from .group_axes import GroupAxes
from .kineto import TraceError
from .roles import Role, RoleBlock
from .step import Item, RankStep


@dataclass(kw_only=True, eq=False)
class PatternBlock:
    """One block of the imported pattern, before it gets its name, lane and axis."""

    members: list[RoleBlock]
    """Role blocks it runs as: one per role at most."""
    kind: str
    block: type[Block]
    params: dict
    """A ``busy`` or ``sleep`` block's are {}: emit gives it its median traced duration."""
    dtype: str | None = None
    teams: tuple[tuple[int, ...], ...] = ()
    """Who runs it, as the teams of its axis."""
    family: str = ""
    """Axis of the traced group (collectives and p2p); '' for compute."""
    edges: tuple[tuple[int, int], ...] = ()
    """Transfers (sender, receiver) of a point-to-point block."""
    notes: list[str] = field(default_factory=list)
    after: list[PatternBlock] = field(default_factory=list)
    name: str = ""
    axis: str = ""
    lane: str = ""

    @property
    def op(self) -> str:
        return self.block.op

    def traced_us(self) -> float:
        return max(rb.duration_us() for rb in self.members)

    def start_key(self) -> float:
        return min(start for rb in self.members for start, _ in rb.times.values())


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


def _call_keys(steps: dict[int, RankStep], by_seq: bool) -> dict[tuple[int, int], list[tuple]]:
    """(rank, item index) -> keys naming the call across ranks: ('c', group, i), collective i
    on a group (by sequence number, or order), ('p', group, src, dst, i), transfer i src -> dst."""
    keys: dict[tuple[int, int], list[tuple]] = {}
    for rank, step in steps.items():
        seq: dict[tuple, Iterator[int]] = defaultdict(itertools.count)  # each key: its next number
        for item in sorted(step.items, key=lambda it: it.launch):
            if item.kind == "comm":
                number = item.seq if by_seq else next(seq[("c", item.group)])
                keys[(rank, item.index)] = [("c", item.group, number)]
            elif item.kind == "p2p":
                own = []
                for peer, _ in item.sends:
                    own.append(("p", item.group, rank, peer, next(seq[("s", item.group, peer)])))
                for peer, _ in item.recvs:
                    own.append(("p", item.group, peer, rank, next(seq[("r", item.group, peer)])))
                keys[(rank, item.index)] = own
    return keys


def _check_calls(
    keys: dict[tuple[int, int], list[tuple]],
    axes: GroupAxes,
    steps: dict[int, RankStep],
    by_seq: bool,
) -> None:
    holders: dict[tuple, set[int]] = defaultdict(set)
    for (rank, _), own in keys.items():
        for key in own:
            holders[key].add(rank)
    for key, ranks in holders.items():
        if key[0] == "c":
            group = axes.groups.get(key[1])
            team = set(group.ranks) if group else ranks
            missing = sorted(team - ranks)
            if missing:
                desc = f"{group.desc} {list(group.ranks)}" if group else key[1]
                calls = Counter(r for (r, _), own in keys.items() for k in own if k[:2] == key[:2])
                counts = ", ".join(f"rank {r}: {calls[r]}" for r in sorted(team) if r in steps)
                lacking = ", ".join(map(str, missing))
                which = f"; rank(s) {lacking} lack the call of sequence number {key[2]}"
                raise TraceError(
                    f"the ranks issued different collectives on group {desc} in this step "
                    f"({counts}{which if by_seq else ''}): the files are not one run's step"
                )
        elif ranks != {key[2], key[3]} and key[3] in steps and key[2] in steps:
            _, group, src, dst, i = key
            raise TraceError(
                f"rank {src} sends to rank {dst} (group {group!r}) {i + 1} time(s) or more, "
                f"but rank {dst} receives from rank {src} fewer times in this step: the files "
                "are not one run's step"
            )


def build_pattern_blocks(
    roles: Sequence[Role], blocks: dict[int, list[RoleBlock]], axes: GroupAxes, *, by_seq: bool
) -> tuple[list[PatternBlock], set[tuple[int, int]]]:
    """Pattern blocks from every role's blocks, comm blocks joined across roles (by sequence
    number, or by order), and no conflict; or none, and the pairs of ranks to split apart."""
    steps = {rank: role.steps[rank] for role in roles for rank in role.ranks}
    keys = _call_keys(steps, by_seq)
    _check_calls(keys, axes, steps, by_seq)
    everything = [rb for role in roles for rb in blocks[role.number]]
    uf = _UnionFind()
    first_holder: dict[tuple, int] = {}
    linking: list[tuple[int, int]] = []  # (block id, rank whose call joined it)
    for i, rb in enumerate(everything):
        if rb.kind not in ("comm", "p2p"):
            continue
        for rank in rb.role.ranks:
            item = rb.role.items[rb.items[0]][rank]
            for key in keys.get((rank, item.index), ()):
                uf.union(i, first_holder.setdefault(key, i))
                linking.append((i, rank))
    classes: dict[int, list[RoleBlock]] = defaultdict(list)
    for i, rb in enumerate(everything):
        classes[uf.find(i)].append(rb)
    conflicts = _conflicts(uf, everything, linking)
    if conflicts:
        return [], conflicts
    out: list[PatternBlock] = []
    for members in classes.values():
        kind = members[0].kind
        if kind == "comm":
            out.append(_collective_block(members, axes))
        elif kind == "p2p":
            out.extend(_p2p_blocks(members, axes))
        else:
            out.append(_compute_block(members[0]))
    return out, set()


def _conflicts(
    uf: _UnionFind, everything: list[RoleBlock], linking: list[tuple[int, int]]
) -> set[tuple[int, int]]:
    """Pairs of ranks of one role whose calls joined different blocks of that role (the middle
    stages of a pipeline look alike but one sends to the other): they must be split apart."""
    joined: dict[tuple[int, int], dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    for block_id, rank in linking:
        joined[(uf.find(block_id), everything[block_id].role.number)][block_id].add(rank)
    pairs: set[tuple[int, int]] = set()
    for by_block in joined.values():
        for a, b in itertools.combinations(by_block.values(), 2):
            pairs |= {(min(x, y), max(x, y)) for x in a for y in b if x != y}
    return pairs


def _collective_block(members: list[RoleBlock], axes: GroupAxes) -> PatternBlock:
    items = [(rank, rb.role.items[rb.items[0]][rank]) for rb in members for rank in rb.role.ranks]
    calls = [(rank, item) for rank, item in items if item.block is not None]
    _check_one_call(calls)
    first = calls[0][1]
    cls, size = first.block, first.block.message_size_bytes
    groups = sorted({item.group for _, item in items})
    teams = tuple(sorted({axes.groups[g].ranks for g in groups if g in axes.groups}))
    if not teams:  # a group the traces do not describe: its callers as one team
        teams = (tuple(sorted({rank for rank, _ in items})),)
    largest = max((item for _, item in calls), key=lambda it: size(it.params))
    noted = sorted((rank, item.note) for rank, item in calls if item.note)
    notes = [f"rank {noted[0][0]}: {noted[0][1]}"] if noted else []
    if len({note for _, note in noted}) > 1:
        notes[0] += f" (and {len(noted) - 1} more ranks, each its own splits)"
    sizes = {size(item.params) for _, item in calls}
    if len(sizes) > 1:
        notes.append(
            f"{cls.op} bytes sent differ between ranks ({min(sizes)}-{max(sizes)}): replayed "
            "with the largest"
        )
    return PatternBlock(
        members=members,
        kind="comm",
        block=cls,
        params=dict(largest.params),
        dtype=first.dtype,
        teams=teams,
        family=axes.axis_of.get(groups[0], ""),
        notes=notes,
    )


def _check_one_call(calls: list[tuple[int, Item]]) -> None:
    """All_to_all's sizes may differ between ranks (uneven splits)."""
    (first_rank, first), size = calls[0], calls[0][1].block.message_size_bytes
    for rank, item in calls:
        if (item.block, item.dtype) != (first.block, first.dtype) or (
            first.block is not AllToAll and size(item.params) != size(first.params)
        ):
            raise TraceError(
                f"rank {first_rank} and rank {rank} disagree on one collective call "
                f"({first.block.op} {size(first.params)} bytes {first.dtype} against "
                f"{item.opname} {size(item.params)} bytes {item.dtype}): the files are not one "
                "run's step"
            )


def _compute_block(rb: RoleBlock) -> PatternBlock:
    item, gemm = rb.first, rb.kind == "gemm"
    noted = item.note and item.note != "gemm-shapes" and rb.kind != "idle"
    return PatternBlock(
        members=[rb],
        kind=rb.kind,
        block={"gemm": Gemm, "idle": Sleep}.get(rb.kind, Busy),
        params=dict(item.params) if gemm else {},
        dtype=item.dtype if gemm else None,
        teams=(tuple(sorted(rb.role.ranks)),),
        notes=[item.note] if noted else [],
    )


def _p2p_blocks(members: list[RoleBlock], axes: GroupAxes) -> list[PatternBlock]:
    """Blocks of one set of joined transfers: send_recv on rings where the transfers form
    rings (exact), else on pairs (each pair exchanges: one-way sends become two-way)."""
    carrier: dict[tuple[int, int, str], RoleBlock] = {}
    edges: dict[tuple[int, int], int] = defaultdict(int)
    group = ""
    for rb in members:
        for rank in rb.role.ranks:
            item = rb.role.items[rb.items[0]][rank]
            group = item.group
            for peer, nbytes in item.sends:
                edges[(rank, peer)] = max(edges[(rank, peer)], nbytes)
                carrier[(rank, peer, "send")] = rb
            for peer, _ in item.recvs:
                carrier[(rank, peer, "recv")] = rb
    family = axes.axis_of.get(group, "")
    dtype = members[0].first.dtype
    rings = _rings(edges)
    if rings is not None and len(members) <= len({rb.role.number for rb in members}):
        by_len: dict[int, list[tuple[int, ...]]] = defaultdict(list)
        for ring in rings:
            by_len[len(ring)].append(ring)
        return [
            _send_recv_block(_ring_edges(rs), members, edges, family, dtype, tuple(sorted(rs)))
            for rs in by_len.values()
        ]
    return _pair_blocks(edges, carrier, family, dtype)


def _rings(edges: dict[tuple[int, int], int]) -> list[tuple[int, ...]] | None:
    """The transfers as disjoint rings (each rank sends once and receives once), or None."""
    nxt, prev = {a: b for a, b in edges}, {b: a for a, b in edges}
    if not len(nxt) == len(prev) == len(edges) or set(nxt) != set(prev):
        return None
    rings, seen = [], set()
    for start in sorted(nxt):
        if start in seen:
            continue
        ring, r = [], start
        while r not in seen:
            seen.add(r)
            ring.append(r)
            r = nxt[r]
        rings.append(tuple(ring))
    return rings


def _ring_edges(rings: list[tuple[int, ...]]) -> list[tuple[int, int]]:
    return [(ring[i], ring[(i + 1) % len(ring)]) for ring in rings for i in range(len(ring))]


def _pair_blocks(
    edges: dict[tuple[int, int], int],
    carrier: dict[tuple[int, int, str], RoleBlock],
    family: str,
    dtype: str,
) -> list[PatternBlock]:
    """send_recv on pairs: a pair's two directions are one block when each role carries them in
    one call, else one per direction; pairs sharing no rank or role call are one block's teams."""
    units: list[tuple[tuple[tuple[int, int], ...], list[RoleBlock]]] = []
    for pair in sorted({(min(a, b), max(a, b)) for a, b in edges}):
        directed = [e for e in (pair, pair[::-1]) if e in edges]
        both = _carriers(directed, carrier)
        if len({rb.role.number for rb in both}) == len(both):
            units.append((tuple(directed), both))
        else:
            units.extend(((e,), _carriers([e], carrier)) for e in directed)
    groups: list[tuple[list, list[RoleBlock]]] = []
    for directed, members in units:  # joins the first group it shares no rank or role call with
        ranks = set(itertools.chain(*directed))
        for group_edges, group_members in groups:
            fresh = [rb for rb in members if rb not in group_members]
            roles = {rb.role.number for rb in group_members} & {rb.role.number for rb in fresh}
            if not ranks & set(itertools.chain(*group_edges)) and not roles:
                group_edges.extend(directed)
                group_members.extend(fresh)
                break
        else:
            groups.append((list(directed), list(members)))
    return [_send_recv_block(e, m, edges, family, dtype) for e, m in groups]


def _carriers(
    directed: list[tuple[int, int]], carrier: dict[tuple[int, int, str], RoleBlock]
) -> list[RoleBlock]:
    found = (carrier.get(key) for a, b in directed for key in ((a, b, "send"), (b, a, "recv")))
    return list(dict.fromkeys(rb for rb in found if rb is not None))


def _send_recv_block(
    directed: list[tuple[int, int]],
    members: list[RoleBlock],
    edges: dict[tuple[int, int], int],
    family: str,
    dtype: str,
    teams: tuple[tuple[int, ...], ...] | None = None,
) -> PatternBlock:
    """send_recv of the transfers ``directed`` on ``teams`` (rings), else on their pairs, each
    pair exchanging (one-way sends noted); each rank sends the most any of them sent."""
    notes = []
    if teams is None:
        teams = tuple(sorted({(min(a, b), max(a, b)) for a, b in directed}))
        one_way = [(a, b) for a, b in directed if (b, a) not in directed]
        if one_way:
            shown = ", ".join(f"{a}->{b}" for a, b in one_way[:4])
            more = f" and {len(one_way) - 4} more" if len(one_way) > 4 else ""
            notes.append(
                f"one-way sends {shown}{more} replayed as exchanges (send_recv sends both ways)"
            )
    nbytes = max(edges[e] for e in directed)
    return PatternBlock(
        members=members,
        kind="p2p",
        block=SendRecv,
        params=SendRecv.traced_params(TracedCall(in_elems=nbytes))[0],
        dtype=dtype,
        teams=teams,
        family=family,
        notes=notes,
        edges=tuple(directed),
    )


def merge_siblings(blocks: Sequence[PatternBlock]) -> list[PatternBlock]:
    """Collectives of different roles that are the same call on sibling teams of one axis
    (stage 0's k-th data-parallel all_reduce on team [0, 2], stage 1's on [1, 3]) as one block
    on the axis's teams; everything else as it was."""
    counts: dict[tuple, int] = defaultdict(int)
    groups: dict[tuple, list[PatternBlock]] = defaultdict(list)
    out: list[PatternBlock] = []
    for block in sorted(blocks, key=lambda b: b.start_key()):
        if block.kind != "comm" or not block.family:
            out.append(block)
            continue
        roles = frozenset(rb.role.number for rb in block.members)
        k = counts[(roles, block.family)]
        counts[(roles, block.family)] += 1
        key = (block.family, block.op, tuple(sorted(block.params.items())), block.dtype, k)
        groups[key].append(block)
    for members in groups.values():
        merged: list[PatternBlock] = []
        for block in members:
            ranks = {r for t in block.teams for r in t}
            roles = {rb.role.number for rb in block.members}
            for other in merged:
                other_ranks = {r for t in other.teams for r in t}
                other_roles = {rb.role.number for rb in other.members}
                if not ranks & other_ranks and not roles & other_roles:
                    other.members = other.members + block.members
                    other.teams = tuple(sorted(other.teams + block.teams))
                    other.notes = sorted(set(other.notes) | set(block.notes))
                    break
            else:
                merged.append(block)
        out.extend(merged)
    return out
