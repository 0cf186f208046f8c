"""The layout that ``trace.json`` and the per-rank traces share: patterns one after another on
one time axis, rebased to one origin where the ranks share a clock (else each rank to its own),
and the Trace Event Format's named tracks and complete events."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..analysis.activities import DeviceActivities
from ..analysis.records import PatternOutcome, RankTimeline, Timeline

# The gap after a pattern: a fraction of its span (visible at any zoom), at least 10 µs.
PATTERN_GAP_FRACTION = 0.1
PATTERN_GAP_MIN_US = 10.0
PROCESS_ID_OFFSET = 1  # a rank's (host) pid is rank + 1: Perfetto takes pid 0 for the idle task


def launched(acts: DeviceActivities) -> np.ndarray:
    """Per launch call, the index of an activity with its correlation id (there is one)."""
    order = np.argsort(acts.correlation_id, kind="stable")
    at = np.searchsorted(acts.correlation_id[order], acts.launches.correlation_id)
    return order[np.minimum(at, len(acts) - 1)]


def iteration_bounds(
    rt: RankTimeline, starts: np.ndarray, ends: np.ndarray, present: np.ndarray, launches=True
) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration, a rank's first start and last end over the blocks it runs (``launches``:
    its CUDA launch calls included)."""
    s = np.where(present[:, None], starts, np.iinfo(np.int64).max).min(axis=0)
    e = np.where(present[:, None], ends, np.iinfo(np.int64).min).max(axis=0)
    acts = rt.activities
    if launches and acts is not None and len(acts.launches):
        it = acts.iteration[launched(acts)]  # a launch's iteration is its activities'
        np.minimum.at(s, it, acts.launches.start_ns)
        np.maximum.at(e, it, acts.launches.end_ns)
    return s, e


@dataclass(frozen=True)
class RankPart:
    """One rank's share of one pattern: its intervals and extent on its own clock."""

    rt: RankTimeline
    starts: np.ndarray
    ends: np.ndarray
    present: np.ndarray
    lo_ns: int
    hi_ns: int
    origin_ns: int  # the clock reading placed at the pattern's start_us


@dataclass(frozen=True)
class Placement:
    """Where one pattern lies on the trace's time axis (microseconds)."""

    outcome: PatternOutcome
    timeline: Timeline
    parts: tuple[RankPart, ...]
    start_us: float
    span_us: float
    next_us: float  # where the next pattern starts: after this one and its gap
    lanes: Mapping[str, int]  # each lane's index in the whole trace, in order of appearance

    def at(self, part: RankPart, t_ns: int) -> float:
        """A reading of ``part``'s clock on the trace's axis."""
        return self.start_us + (t_ns - part.origin_ns) / 1000.0

    def block_args(self, rank: int) -> list[dict[str, Any]]:
        """What every event of each block carries first: its pattern, name, op, lane, rank."""
        ops = {b.block: b.op for b in self.outcome.blocks}
        t = self.timeline
        return [
            {"pattern": t.pattern, "block": n, "op": ops.get(n, "block"), "lane": ln, "rank": rank}
            for n, ln in zip(t.block_names, t.block_lanes, strict=True)
        ]


def place_patterns(
    outcomes: Sequence[PatternOutcome],
    *,
    launches: bool = False,
    whole_us: bool = False,
) -> Iterator[Placement]:
    """Every outcome whose timeline some rank ran, each after the previous one (``launches``:
    a rank's extent includes its CUDA launch calls; ``whole_us``: on a whole microsecond)."""
    start_us, lanes = 0.0, {}
    for outcome in outcomes:
        timeline = outcome.timeline
        rows = timeline.rank_arrays() if timeline is not None else []
        if not rows:
            continue
        for lane in timeline.block_lanes:
            lanes.setdefault(lane, len(lanes))
        bounds = [iteration_bounds(*row, launches) for row in rows]
        extents = [(int(s.min()), int(e.max())) for s, e in bounds]
        common_ns = min(lo for lo, _ in extents)
        parts = tuple(
            RankPart(rt, s, e, p, lo, hi, common_ns if timeline.shared_clock else lo)
            for (rt, s, e, p), (lo, hi) in zip(rows, extents, strict=True)
        )
        span_us = max(p.hi_ns - p.origin_ns for p in parts) / 1000.0
        gap_us = max(PATTERN_GAP_MIN_US, PATTERN_GAP_FRACTION * span_us)
        next_us = start_us + (span_us + gap_us)
        if whole_us:
            next_us = float(math.ceil(next_us))
        yield Placement(outcome, timeline, parts, start_us, span_us, next_us, lanes)
        start_us = next_us


class TraceEvents:
    """The events of one trace file: each process and track named once, then complete events
    (metadata first, as trace processors expect)."""

    def __init__(self) -> None:
        self.meta: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._processes: set[int] = set()
        self._threads: set[tuple[int, int]] = set()

    def process(self, pid: int, name: str, sort_index: int) -> int:
        """``pid``, named and ordered on its first use."""
        if pid not in self._processes:
            self._processes.add(pid)
            self._meta("process_name", pid, 0, {"name": name})
            self._meta("process_sort_index", pid, 0, {"sort_index": sort_index})
        return pid

    def thread(self, pid: int, tid: int, name: str) -> int:
        """``tid`` of ``pid``, named (and ordered by tid) on its first use."""
        if (pid, tid) not in self._threads:
            self._threads.add((pid, tid))
            self._meta("thread_name", pid, tid, {"name": name})
            self._meta("thread_sort_index", pid, tid, {"sort_index": tid})
        return tid

    def _meta(self, name: str, pid: int, tid: int, args: dict[str, Any]) -> None:
        self.meta.append({"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args})

    def complete(
        self, name: str, cat: str, pid: int, tid: int, ts: float, dur: float, args: dict
    ) -> None:
        event = {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": max(dur, 0.0)}
        self.events.append({**event, "pid": pid, "tid": tid, "args": args})

    def all(self) -> list[dict[str, Any]]:
        return self.meta + self.events
