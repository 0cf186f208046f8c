"""Each rank's cross-stream dependencies: from the sync events (the recording stream inferred,
checked against the timeline), else the timeline; host syncs order what follows (docs/replay.md,
section 3). Ranks doing the same work form a role (its lowest rank the reference), in blocks."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...blocks.compute import Busy
from .kineto import Launch, TraceError
from .step import CLOCK_TOLERANCE_US as TOLERANCE_US
from .step import Item, RankStep

LAUNCH_LATENCY_US = 4.0
"""Least time from a host launch call to its kernel starting, as traces show it."""
HOLD_US = 8.0
"""An item that started this much later than its stream and its launch allowed was held."""
MATCH_US = 12.0
"""A held item depends on an item of another stream that ended at most this long before it."""
MAX_BUSY_US = next(p.maximum for p in Busy.params if p.name == "duration_us")
"""Kernels merge into one stand-in up to the longest ``busy`` block its loader accepts."""


@dataclass(frozen=True, kw_only=True)
class Dependencies:
    """Cross-stream edges of one rank: ``after[i]`` = items item ``i`` waited for."""

    after: dict[int, frozenset[int]]
    method: str
    """``sync events`` or ``timeline``."""
    unresolved: int = 0
    """Waits whose source could not be told, or held items with no source in reach."""


class _Index:
    """Items of a rank by stream in launch order, and by launching thread."""

    def __init__(self, step: RankStep) -> None:
        self.by_stream = {
            s: sorted(items, key=lambda it: it.launch) for s, items in step.streams.items()
        }
        self.launches = {s: [it.launch for it in items] for s, items in self.by_stream.items()}
        self.by_thread: dict[int, list[tuple[float, Item]]] = defaultdict(list)
        for call in step.launches:
            item = step.launch_items.get(call.corr)
            if item is not None:
                self.by_thread[call.tid].append((call.ts, item))
        self.thread_ts = {tid: [ts for ts, _ in v] for tid, v in self.by_thread.items()}
        # A stream runs its items in order, so their ends never decrease along it.
        self.ends = {s: [it.end for it in items] for s, items in self.by_stream.items()}

    def last_before(self, stream: int, ts: float) -> Item | None:
        i = bisect.bisect_left(self.launches[stream], ts) - 1
        return self.by_stream[stream][i] if i >= 0 else None

    def first_after(self, stream: int, ts: float) -> Item | None:
        launches = self.launches.get(stream, [])  # a stream without items: none
        i = bisect.bisect_right(launches, ts)
        return self.by_stream[stream][i] if i < len(launches) else None

    def thread_last_before(self, tid: int, ts: float) -> Item | None:
        i = bisect.bisect_left(self.thread_ts.get(tid, []), ts) - 1
        return self.by_thread[tid][i][1] if i >= 0 else None


def infer(step: RankStep) -> Dependencies:
    """The cross-stream dependencies of one rank's step."""
    index = _Index(step)
    after: dict[int, set[int]] = defaultdict(set)
    if step.trace.syncs:  # recorded with sync events (a step may have no stream wait)
        method, unresolved = "sync events", _from_sync_events(step, index, after)
    else:
        method, unresolved = "timeline", _from_timeline(index, after)
    _from_host_syncs(step, index, after)
    frozen = {dst: frozenset(srcs) for dst, srcs in after.items() if srcs}
    return Dependencies(after=frozen, method=method, unresolved=unresolved)


def _from_sync_events(step: RankStep, index: _Index, after: dict[int, set[int]]) -> int:
    if len(index.by_stream) == 1:
        return 0  # one stream: nothing to wait for but its own order
    calls = {c.corr: c for c in step.launches}
    waits = [s for s in step.trace.syncs if "Wait" in s.kind and s.corr in calls and s.stream >= 0]
    records: dict[int, list[float]] = defaultdict(list)
    for call in step.launches:
        if "EventRecord" in call.name:  # cudaEventRecord(WithFlags), cuEventRecord
            records[call.tid].append(call.ts)
    unresolved = 0
    for wait in waits:
        call = calls[wait.corr]
        target = index.first_after(wait.stream, call.ts)
        if target is None:
            continue
        source = _recorded_source(index, records, call, target)
        source = source or _latest_fitting(index, call.ts, target)
        if source is None:
            unresolved += 1
        else:
            after[target.index].add(source.index)
    return unresolved


def _recorded_source(
    index: _Index, records: dict[int, list[float]], call: Launch, target: Item
) -> Item | None:
    """The item the waited event most likely recorded: on the stream of the last work the
    waiting thread launched before its last event record, if the timeline agrees."""
    times = records.get(call.tid, [])
    i = bisect.bisect_left(times, call.ts) - 1
    if i < 0:
        return None
    recorded_at = times[i]
    hint = index.thread_last_before(call.tid, recorded_at)
    if hint is None or hint.stream == target.stream:
        return None
    source = index.last_before(hint.stream, recorded_at)
    return None if source is None or source.end > target.start + TOLERANCE_US else source


def _latest_fitting(index: _Index, ts: float, target: Item) -> Item | None:
    """Of the items of other streams launched before host time ``ts``, the one that ended
    last before ``target`` started (what a waiting stream was most likely released by)."""
    best = None
    for stream, items in index.by_stream.items():
        if stream == target.stream:
            continue
        launched = bisect.bisect_left(index.launches[stream], ts)
        done = bisect.bisect_right(index.ends[stream], target.start + TOLERANCE_US, 0, launched)
        if done and (best is None or items[done - 1].end > best.end):
            best = items[done - 1]
    return best


def _from_timeline(index: _Index, after: dict[int, set[int]]) -> int:
    ends = sorted(
        (it.end, it.stream, it.launch, it.index)
        for items in index.by_stream.values()
        for it in items
    )
    end_times = [e[0] for e in ends]
    unresolved = 0
    for items in index.by_stream.values():
        previous_end = float("-inf")
        for item in items:
            ready = max(previous_end, item.launch + LAUNCH_LATENCY_US)
            previous_end = max(previous_end, item.end)
            if item.start - ready <= HOLD_US:
                continue
            lo = bisect.bisect_left(end_times, item.start - MATCH_US)
            hi = bisect.bisect_right(end_times, item.start + TOLERANCE_US)
            found = [e for e in ends[lo:hi] if e[1] != item.stream and e[2] < item.launch]
            if found:
                after[item.index].add(max(found)[3])
            else:
                unresolved += 1
    return unresolved


def _from_host_syncs(step: RankStep, index: _Index, after: dict[int, set[int]]) -> None:
    for call in step.launches:
        if "Synchronize" not in call.name:  # device, stream, event and context syncs
            continue
        sources = [index.last_before(s, call.ts) for s in index.by_stream]
        done = [s for s in sources if s is not None and s.end <= call.end + TOLERANCE_US]
        for stream in index.by_stream:
            target = index.first_after(stream, call.end)
            if target is None:
                continue
            for source in done:
                if source.stream != stream and source.end <= target.start + TOLERANCE_US:
                    after[target.index].add(source.index)


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
    programs: dict[tuple, list[RankStep]] = defaultdict(list)
    for st in sorted(steps, key=lambda s: s.rank):
        program = tuple(sorted(Counter(st.program.values()).items()))
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
            _map_items(role, member)
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


def _map_items(role: Role, member: RankStep) -> None:
    ref_keys, own_keys = role.ref.program, member.program
    free = sorted(member.streams, key=lambda s: member.streams[s][0].launch)
    for ref_stream in sorted(role.ref.streams, key=lambda s: role.ref.streams[s][0].launch):
        # One matches: the programs are equal as multisets.
        match = next((s for s in free if own_keys[s] == ref_keys[ref_stream]), None)
        if match is None:
            raise TraceError(f"rank {member.rank}: no stream matches stream {ref_stream}")
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
                and _span_us(role, current.items[0], item.index) <= MAX_BUSY_US
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


def _span_us(role: Role, first: int, last: int) -> float:
    a, b = role.items[first], role.items[last]
    return max(b[r].end - a[r].start for r in role.ranks)


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
