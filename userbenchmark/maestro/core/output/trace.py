"""The time layout both trace writers share (patterns one after another, rebased to one origin
where the ranks share a clock, else each rank to its own), and ``trace.json``: Chrome Trace Event
Format with a process per rank, a track per lane, an event per (block, iteration)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..analysis.activities import DeviceActivities
from ..analysis.records import BlockResult, PatternOutcome, RankTimeline, Timeline

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


PATTERN_TRACK_TID = 1  # each rank's "pattern" track; lanes take 2, 3, ... in order of appearance
BLOCK_ARG_METRICS = ("latency_avg_us", "algbw_gbps", "busbw_gbps", "tflops")  # where finite
TIME_ALIGNMENT_NOTE = (
    "Each pattern is placed after the previous one. Where its ranks share a clock (one host, "
    "and timestamps of that host's clock: cupti or perf_counter), the pattern is rebased to the "
    "earliest start over all ranks and the ranks' tracks line up in time. Otherwise "
    "(several hosts, or CUDA events, which count from each rank's own reference) every rank is "
    "rebased to its own first start: tracks of different ranks do not line up in time. "
    "Durations are exact on every rank."
)


def _figures(result: BlockResult | None) -> dict[str, Any]:
    """A block's size and the figures that are numbers (NaN means 'not applicable': left out)."""
    if result is None:
        return {}
    args = {} if result.size_bytes is None else {"size_bytes": int(result.size_bytes)}
    figures = {name: getattr(result, name) for name in BLOCK_ARG_METRICS}
    return args | {n: float(v) for n, v in figures.items() if v is not None and math.isfinite(v)}


def _write_rank(out: TraceEvents, place: Placement, part: RankPart) -> None:
    timeline, rank = place.timeline, part.rt.rank
    pid = out.process(rank + PROCESS_ID_OFFSET, f"rank {rank}", rank)
    out.thread(pid, PATTERN_TRACK_TID, "pattern")
    start_us, span_us = place.at(part, part.lo_ns), (part.hi_ns - part.lo_ns) / 1000.0
    span = {"pattern": timeline.pattern, "rank": rank, "clock": part.rt.clock}
    out.complete(timeline.pattern, "pattern", pid, PATTERN_TRACK_TID, start_us, span_us, span)
    results = {b.block: b for b in place.outcome.blocks}
    names = place.block_args(rank)
    for b in np.flatnonzero(part.present).tolist():
        name, lane = timeline.block_names[b], timeline.block_lanes[b]
        tid = out.thread(pid, PATTERN_TRACK_TID + 1 + place.lanes[lane], lane)
        args = {**names[b], **_figures(results.get(name))}
        ends = part.ends[b].tolist()
        for it, (start_ns, end_ns) in enumerate(zip(part.starts[b].tolist(), ends, strict=True)):
            ts, dur = place.at(part, start_ns), (end_ns - start_ns) / 1000.0
            out.complete(name, args["op"], pid, tid, ts, dur, {**args, "iteration": it})


def build_trace(outcomes: Sequence[PatternOutcome]) -> dict[str, Any]:
    """Trace Event Format dict of every outcome that has a timeline, in microseconds from the
    first pattern's start (``TIME_ALIGNMENT_NOTE`` says what cross-rank alignment means)."""
    out = TraceEvents()
    patterns_meta: list[dict[str, Any]] = []
    for place in place_patterns(outcomes):
        for part in place.parts:
            _write_rank(out, place, part)
        patterns_meta.append(
            {
                "pattern": place.timeline.pattern,
                "start_us": place.start_us,
                "span_us": place.span_us,
                "clocks": sorted({part.rt.clock for part in place.parts}),
                "ranks_share_a_clock": place.timeline.shared_clock,
            }
        )
    return {
        "traceEvents": out.all(),
        "metadata": {
            "generator": "maestro",
            "time_unit": "us",
            "time_alignment": TIME_ALIGNMENT_NOTE,
            "patterns": patterns_meta,
        },
    }


def trace_text(outcomes: Sequence[PatternOutcome]) -> str:
    """``build_trace(outcomes)`` as compact, strict JSON text."""
    # allow_nan=False: a NaN would make the file unreadable by strict JSON parsers.
    return json.dumps(build_trace(outcomes), allow_nan=False, separators=(",", ":"))
