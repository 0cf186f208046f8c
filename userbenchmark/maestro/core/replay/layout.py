"""Lanes, axes, order and names of the pattern's blocks: a traced CUDA stream is a lane, a
group's collectives on a second stream get an axis ``like:`` the first, and every rank's lane
order and every ``after:`` hold in the file's order (docs/replay.md, section 3)."""

from __future__ import annotations

import graphlib
import heapq
import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from .assemble import PatternBlock, _UnionFind
from .group_axes import GroupAxes, Names, Teams, fresh_name, slug
from .kineto import TraceError
from .roles import RoleBlock


@dataclass(kw_only=True)
class Layout:
    """The pattern's blocks in file order, with their axes and lanes resolved."""

    blocks: list[PatternBlock]
    teams: dict[str, Teams] = field(default_factory=dict)
    """The axes the file defines (mesh and ``world`` axes need none) -> their teams."""
    likes: dict[str, str] = field(default_factory=dict)
    """An axis ``like:`` another -> that axis."""
    lanes: dict[str, dict[int, int]] = field(default_factory=dict)
    """Lane name -> {rank: traced stream}."""
    like_notes: list[str] = field(default_factory=list)


def _same_teams(a: Teams, b: Teams) -> bool:
    return sorted(tuple(sorted(t)) for t in a) == sorted(tuple(sorted(t)) for t in b) and (
        all(len(t) <= 2 for t in a) or sorted(a) == sorted(b)
    )


class _Axes:
    """Base axis of every block: the traced group's, or a new one with the block's teams."""

    def __init__(self, axes: GroupAxes, world_size: int) -> None:
        self.known: dict[str, Teams] = dict(axes.teams)
        self.world = tuple(range(world_size))
        self.taken = Names([*self.known, "world"])

    def base(self, block: PatternBlock) -> str:
        teams = block.teams
        if block.kind not in ("comm", "p2p"):
            if teams == (self.world,):
                return "world"
            return self._named(teams, f"stage{block.members[0].role.number}")
        if block.family and _same_teams(teams, self.known.get(block.family, ())):
            return block.family
        # A transfer may run on any axis whose teams are its pairs (the pipeline's axis);
        # a collective on part of its group's axis gets an axis of its own.
        for name, known in self.known.items():
            if block.kind == "p2p" and _same_teams(teams, known):
                return name
        if block.kind == "p2p" and len(teams) == 1:
            return self._named(teams, "p2p_" + "_".join(str(r) for r in teams[0]))
        suffix = "p2p" if block.kind == "p2p" else "part"
        return self._named(teams, f"{block.family or 'group'}_{suffix}")

    def _named(self, teams: Teams, base: str) -> str:
        name = next((n for n, known in self.known.items() if known == teams), None)
        if name is None:
            name = fresh_name(base, self.taken)
            self.known[name] = teams
        return name


def _instances(block: PatternBlock) -> list[tuple[int, int, RoleBlock]]:
    return [
        (rank, rb.role.items[rb.items[0]][rank].stream, rb)
        for rb in block.members
        for rank in rb.role.ranks
    ]


def lay_out(blocks: Sequence[PatternBlock], axes: GroupAxes, world_size: int) -> Layout:
    """Axes, lanes, dependencies, order and names of the pattern's blocks."""
    axis_plan = _Axes(axes, world_size)
    base_axis = {id(b): axis_plan.base(b) for b in blocks}
    lane_of, lanes = _lanes(blocks)
    layout = Layout(blocks=[])
    comm_axis = _comm_axes(blocks, base_axis, lane_of, layout)
    taken = axis_plan.taken | set(comm_axis.values())
    lane_names = _name_lanes(blocks, lane_of, lanes, comm_axis, taken, layout)
    for block in blocks:
        block.axis = comm_axis.get(id(block), base_axis[id(block)])
        block.lane = lane_names[lane_of[id(block)]]
    _link_after(blocks)
    layout.blocks = _ordered(blocks)
    position = {id(b): i for i, b in enumerate(layout.blocks)}
    for block in layout.blocks:  # in file order: the same file from the same traces
        block.after.sort(key=lambda b: position[id(b)])
    names = Names()
    for block in layout.blocks:
        block.name = fresh_name(_base_name(block)[:56], names)
    defined = {b.axis for b in layout.blocks} | set(layout.likes.values())
    defined -= {*layout.likes, "world", *axes.mesh}
    layout.teams = {name: axis_plan.known[name] for name in sorted(defined)}
    layout.likes = dict(sorted(layout.likes.items()))
    return layout


def _lanes(blocks: Sequence[PatternBlock]) -> tuple[dict[int, int], dict[int, set]]:
    """Each block's lane (a component of (rank, stream) pairs tied by the blocks)."""
    uf = _UnionFind()
    node_ids: dict[tuple[int, int], int] = {}
    for block in blocks:
        nodes = [node_ids.setdefault((r, s), len(node_ids)) for r, s, _ in _instances(block)]
        for node in nodes[1:]:
            uf.union(node, nodes[0])
    lane_of = {id(b): uf.find(node_ids[_instances(b)[0][:2]]) for b in blocks}
    lanes: dict[int, set] = defaultdict(set)
    for (rank, stream), node in node_ids.items():
        lanes[uf.find(node)].add((rank, stream))
    return lane_of, lanes


def _comm_axes(
    blocks: Sequence[PatternBlock],
    base_axis: dict[int, str],
    lane_of: dict[int, int],
    layout: Layout,
) -> dict[int, str]:
    """The axis of each collective: its base axis on the base's first lane, an axis ``like``
    the base (its own communicator) on each other lane."""
    first_lane: dict[str, int] = {}
    variant: dict[tuple[str, int], str] = {}
    taken = Names([*base_axis.values(), "world"])
    out = {}
    for block in sorted(blocks, key=lambda b: b.start_key()):
        if block.kind not in ("comm", "p2p"):
            continue
        base, lane = base_axis[id(block)], lane_of[id(block)]
        if first_lane.setdefault(base, lane) != lane and (base, lane) not in variant:
            op = Counter(
                b.op for b in blocks if base_axis[id(b)] == base and lane_of[id(b)] == lane
            ).most_common(1)[0][0]
            initials = "".join(w[0] for w in op.split("_"))
            name = variant[(base, lane)] = fresh_name(f"{base}_{initials}", taken)  # world_rs
            layout.likes[name] = base
            layout.like_notes.append(
                f"group of axis {base} used on two streams: its {op} calls run on axis {name} "
                f"(like: {base}, a communicator of its own)"
            )
        out[id(block)] = variant.get((base, lane), base)
    return out


def _name_lanes(
    blocks: Sequence[PatternBlock],
    lane_of: dict[int, int],
    lanes: dict[int, set],
    comm_axis: dict[int, str],
    taken: set[str],
    layout: Layout,
) -> dict[int, str]:
    """Each lane's name: its collectives' axis, else ``compute`` (the busiest's stream) or
    ``stream<N>``; lanes of disjoint ranks (pipeline stages) may share one."""
    names: dict[int, str] = {}
    work: Counter = Counter()
    for block in sorted(blocks, key=lambda b: b.start_key()):
        lane = lane_of[id(block)]
        if id(block) in comm_axis:
            names.setdefault(lane, comm_axis[id(block)])
        if block.kind in ("gemm", "busy"):
            work[lane] += block.traced_us()
    used: dict[str, set[int]] = defaultdict(set)
    for lane, name in names.items():
        used[name] |= {r for r, _ in lanes[lane]}
    others = sorted((lane for lane in lanes if lane not in names), key=lambda la: -work[la])
    main = min(lanes[others[0]])[1] if others else None
    for lane in others:
        ranks = {r for r, _ in lanes[lane]}
        stream = min(lanes[lane])[1]
        base = "compute" if stream == main else f"stream{stream}"
        tried = itertools.chain([base], (f"{base}_{i}" for i in itertools.count(2)))
        name = next(n for n in tried if n not in taken and not used[n] & ranks)
        used[name] |= ranks
        names[lane] = name
    for lane, name in names.items():
        layout.lanes.setdefault(name, {}).update(sorted(lanes[lane]))
        layout.lanes[name] = dict(sorted(layout.lanes[name].items()))
    return names


def _link_after(blocks: Sequence[PatternBlock]) -> None:
    """Each block's ``after`` as pattern blocks (a role block split in several waits in the
    first and is waited for through the last)."""
    of: dict[int, list[PatternBlock]] = defaultdict(list)
    for block in blocks:
        for rb in block.members:
            of[id(rb)].append(block)
    for block in blocks:
        after: list[PatternBlock] = []
        for rb in block.members:
            if of[id(rb)][0] is not block:
                continue
            for src in rb.after:
                source = of[id(src)][-1]
                if source is not block and source.lane != block.lane and source not in after:
                    after.append(source)
        block.after = after


def _ordered(blocks: Sequence[PatternBlock]) -> list[PatternBlock]:
    """Blocks in an order keeping each rank's lane order and every dependency, the earliest
    traced start first among those free to go."""
    index = {id(b): i for i, b in enumerate(blocks)}
    graph = graphlib.TopologicalSorter({i: () for i in range(len(blocks))})
    queues: dict[tuple[int, str], list[tuple[float, float, int]]] = defaultdict(list)
    for i, block in enumerate(blocks):
        for rank, _, rb in _instances(block):
            queues[(rank, block.lane)].append((*rb.times[rank], i))
        graph.add(i, *(index[id(src)] for src in block.after))
    for queue in queues.values():
        queue.sort()
        for (_, _, a), (_, _, b) in itertools.pairwise(queue):
            if a != b:
                graph.add(b, a)
    try:
        graph.prepare()
    except graphlib.CycleError as err:  # its nodes: a cycle, the first again at the end
        what = ", ".join(f"{blocks[i].op} on lane {blocks[i].lane}" for i in err.args[1][1:5])
        raise TraceError(
            f"cannot order the blocks: the ranks issue work on shared lanes in different "
            f"orders (among: {what})"
        ) from None
    heap: list[tuple[float, int]] = []
    out = []
    while graph.is_active():
        for i in graph.get_ready():
            heapq.heappush(heap, (blocks[i].start_key(), i))
        _, i = heapq.heappop(heap)
        out.append(blocks[i])
        graph.done(i)
    return out


def _base_name(block: PatternBlock) -> str:
    item = block.members[0].first
    label = slug(item.label, fallback="step") if item.label else ""
    if block.kind == "p2p" and len(block.edges) == 1:  # one transfer: who sends to whom
        src, dst = block.edges[0]
        return label or f"send_{src}_to_{dst}"
    if block.kind in ("comm", "p2p"):
        return label or block.op
    if block.kind == "gemm":
        return f"{label}_{block.op}" if label else block.op
    if block.kind == "idle":
        return "idle"
    op = slug(item.opname.split("::")[-1], fallback="kernel")
    return f"{label}_{op}" if label else op
