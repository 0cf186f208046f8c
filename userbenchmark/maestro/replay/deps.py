"""Which device work waited for which on one rank: cross-stream dependencies between items from
the sync events (``Stream Wait Event``, the recording stream inferred and checked against the
timeline), else the timeline; host syncs order what follows them (docs/replay.md, section 3)."""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

from .kineto import Launch
from .step import CLOCK_TOLERANCE_US as TOLERANCE_US
from .step import Item, RankStep

LAUNCH_LATENCY_US = 4.0
"""Least time from a host launch call to its kernel starting, as traces show it."""
HOLD_US = 8.0
"""An item that started this much later than its stream and its launch allowed was held."""
MATCH_US = 12.0
"""A held item depends on an item of another stream that ended at most this long before it."""


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
        launches = self.launches.get(stream)
        if launches is None:
            return None
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
        source = _recorded_source(index, records, call, target) or _latest_fitting(
            index, call.ts, target
        )
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
