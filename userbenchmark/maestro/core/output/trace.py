"""The trace writer: a Kineto-style ``traces/rank<r>.json`` per rank (Chrome Trace Event Format,
a track per lane, read by Perfetto and HolisticTraceAnalysis), on one layout: patterns one after
another, rebased to one origin where the ranks share a clock."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis import overlap
from ..analysis.intervals import API_DRIVER, KIND_KERNEL, KIND_NAMES, DeviceActivities
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
    rt: RankTimeline, starts: np.ndarray, ends: np.ndarray, present: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration, a rank's first start and last end over the blocks it runs, its CUDA launch
    calls included."""
    s = np.where(present[:, None], starts, np.iinfo(np.int64).max).min(axis=0)
    e = np.where(present[:, None], ends, np.iinfo(np.int64).min).max(axis=0)
    acts = rt.activities
    if acts is not None and len(acts.launches):
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
        ops = {b.block: b.op for b in self.outcome.blocks}
        t = self.timeline
        return [
            {"pattern": t.pattern, "block": n, "op": ops.get(n, "block"), "lane": ln, "rank": rank}
            for n, ln in zip(t.block_names, t.block_lanes, strict=True)
        ]


def place_patterns(outcomes: Sequence[PatternOutcome]) -> Iterator[Placement]:
    """Every outcome whose timeline some rank ran, each after the previous one on a whole µs (a
    rank's extent includes its CUDA launch calls)."""
    start_us, lanes = 0.0, {}
    for outcome in outcomes:
        timeline = outcome.timeline
        rows = timeline.rank_arrays() if timeline is not None else []
        if not rows:
            continue
        for lane in timeline.block_lanes:
            lanes.setdefault(lane, len(lanes))
        bounds = [iteration_bounds(*row) for row in rows]
        extents = [(int(s.min()), int(e.max())) for s, e in bounds]
        common_ns = min(lo for lo, _ in extents)
        parts = tuple(
            RankPart(rt, s, e, p, lo, hi, common_ns if timeline.shared_clock else lo)
            for (rt, s, e, p), (lo, hi) in zip(rows, extents, strict=True)
        )
        span_us = max(p.hi_ns - p.origin_ns for p in parts) / 1000.0
        next_us = start_us + (span_us + max(PATTERN_GAP_MIN_US, PATTERN_GAP_FRACTION * span_us))
        # Whole microseconds: HolisticTraceAnalysis rounds fractional ones (see the docs).
        next_us = float(math.ceil(next_us))
        yield Placement(outcome, timeline, parts, start_us, span_us, next_us, lanes)
        start_us = next_us


# traces/rank<r>.json: a ProfilerStep per iteration and an empty last one (HolisticTraceAnalysis
# drops a file's last step); CUPTI's device records with their API calls, else each (block,
# iteration) a CPU user_annotation with no stream, which no tool counts as GPU work.
TRACES_DIR = "traces"  # the output dir's folder of rank files (and no other JSON)
STEP_TID = 1  # host track of each rank's pattern spans and ProfilerStep events
LANE_TID_BASE = 2  # host tracks of lanes (CPU block intervals), in order of appearance
API_TID_BASE = 100  # host tracks of the threads that called the CUDA API
DEVICE_PID_BASE = 1 << 20  # a GPU's process is this + its device; a host's is its rank + 1
EVENT_CATEGORIES = {1: "kernel", 2: "gpu_memcpy", 3: "gpu_memset"}  # Kineto's, by kind
_RANK_FILE = re.compile(r"^rank\d+\.json$")
TIME_NOTE = (
    "ts/dur are microseconds with nanosecond decimals, on a layout: each pattern starts after "
    "the previous one (maestroPatterns[].start_us; the gaps are not time that passed). Where "
    "ranks share a clock the pattern is rebased to its earliest event over all ranks, so the "
    "ranks' files line up; otherwise each rank is rebased to its own first event. "
    "maestroPatterns[].origin_ns is the clock reading at start_us."
)
OVERLAP_NOTE = (
    "this rank's communication time hidden under compute / its communication time, over every "
    "pattern of the file (maestroPatterns[] has each pattern's); blocks count by category, "
    "(block, iteration) spans as intervals"
)


class _RankFile:
    """The events of one rank's file: each process and track named once, then complete events
    (metadata first, as trace processors expect)."""

    def __init__(self, rank: int) -> None:
        self.meta: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._processes: set[int] = set()
        self._threads: set[tuple[int, int]] = set()
        self.rank = rank
        self.patterns: list[dict[str, Any]] = []
        self.hidden_ns = 0.0
        self.comm_ns = 0.0
        self.overlap_known = True
        self._api_tids: dict[int, int] = {}

    def process(self, pid: int, name: str, sort_index: int) -> int:
        if pid not in self._processes:
            self._processes.add(pid)
            self._meta("process_name", pid, 0, {"name": name})
            self._meta("process_sort_index", pid, 0, {"sort_index": sort_index})
        return pid

    def thread(self, pid: int, tid: int, name: str) -> int:
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

    def host(self, tid: int = STEP_TID, name: str = "maestro: patterns and ProfilerSteps") -> int:
        pid = self.process(self.rank + PROCESS_ID_OFFSET, f"rank {self.rank} host", 2 * self.rank)
        self.thread(pid, tid, name)
        return pid

    def api_thread(self, thread_id: int, name: str) -> tuple[int, int]:
        tid = self._api_tids.setdefault(thread_id, API_TID_BASE + len(self._api_tids))
        return self.host(tid, name), tid

    def device(self, device: int) -> int:
        name = f"rank {self.rank} GPU {device}"
        return self.process(DEVICE_PID_BASE + device, name, 2 * self.rank + 1)

    def document(self, world_size: int, backend: str, end_us: float, step: int) -> dict:
        """The file's JSON document, closed by an empty last ProfilerStep at ``end_us``."""
        end = {"maestro": "end marker, no work: HolisticTraceAnalysis drops a trace's last step"}
        name = f"ProfilerStep#{step}"
        self.complete(name, "user_annotation", self.host(), STEP_TID, end_us, 1.0, end)
        known = self.overlap_known and self.comm_ns > 0
        shared = [p["ranks_share_a_clock"] for p in self.patterns]
        return {
            "schemaVersion": 1,
            "distributedInfo": {"backend": backend, "rank": self.rank, "world_size": world_size},
            "maestro": {
                "generator": "maestro",
                "time_unit": "us",
                "time_note": TIME_NOTE,
                "clocks": ", ".join(sorted({p["clock"] for p in self.patterns})),
                "ranks_share_a_clock": bool(shared) and all(shared),
                "comm_compute_overlap": self.hidden_ns / self.comm_ns if known else None,
                "comm_compute_overlap_note": OVERLAP_NOTE,
                "num_steps": step,
            },
            "maestroPatterns": self.patterns,
            "traceEvents": self.meta + self.events,
        }


class _PatternOnRank:
    def __init__(self, f: _RankFile, place: Placement, part: RankPart) -> None:
        self.f, self.place, self.part = f, place, part
        self.timeline = place.timeline
        # The iteration goes in "pattern_iteration" (added per event), not "iteration":
        # HolisticTraceAnalysis fills an "iteration" column of its own (the ProfilerStep) and
        # fails to load an arg of that name. A kernel's thread-block dims are "block dims":
        # "block" is maestro's.
        self.block_args = place.block_args(f.rank)
        for args, category in zip(self.block_args, place.timeline.block_categories, strict=False):
            args["category"] = category

    def slice(self, name: str, cat: str, pid: int, tid: int, start_ns: int, end_ns: int, args):
        ts = round(self.place.at(self.part, start_ns), 3)
        self.f.complete(name, cat, pid, tid, ts, round((end_ns - start_ns) / 1000.0, 3), args)

    def of_block(self, b: Any, it: Any, **more: Any) -> dict[str, Any]:
        return {**more, **self.block_args[int(b)], "pattern_iteration": int(it)}

    def steps(self, first_step: int) -> None:
        part, pattern = self.part, self.timeline.pattern
        pid = self.f.host()
        args = {"pattern": pattern, "rank": self.f.rank, "clock": part.rt.clock}
        self.slice(pattern, "user_annotation", pid, STEP_TID, part.lo_ns, part.hi_ns, args)
        s, e = iteration_bounds(part.rt, part.starts, part.ends, part.present)
        num_iters = part.starts.shape[1]
        for it in range(num_iters):
            end = int(e[it]) if it + 1 == num_iters else min(int(e[it]), int(s[it + 1]))
            args = {"pattern": pattern, "pattern_iteration": it}
            name = f"ProfilerStep#{first_step + it}"
            self.slice(name, "user_annotation", pid, STEP_TID, int(s[it]), end, args)

    def cpu_blocks(self) -> None:
        part = self.part
        for b in np.flatnonzero(part.present).tolist():
            lane, name = self.timeline.block_lanes[b], self.timeline.block_names[b]
            tid = LANE_TID_BASE + self.place.lanes[lane]
            pid = self.f.host(tid, f"lane {lane}")
            ends = part.ends[b].tolist()
            for it, (s, e) in enumerate(zip(part.starts[b].tolist(), ends, strict=True)):
                self.slice(name, "user_annotation", pid, tid, s, e, self.of_block(b, it))

    def device_activities(self, acts: DeviceActivities) -> None:
        """CUPTI's records as Kineto writes them, on a track per (GPU, stream)."""
        for i in range(len(acts)):
            kind, b, it = int(acts.kind[i]), int(acts.block[i]), int(acts.iteration[i])
            device, stream = int(acts.device_id[i]), int(acts.stream_id[i])
            s, e = int(acts.start_ns[i]), int(acts.end_ns[i])
            pid = self.f.device(device)
            self.f.thread(pid, stream, f"stream {stream}")
            correlation = int(acts.correlation_id[i])
            args = self.of_block(b, it, device=device, stream=stream, correlation=correlation)
            if kind == KIND_KERNEL:
                args["grid"] = acts.grid[i].tolist()
                args["block dims"] = acts.block_dims[i].tolist()
            else:
                args["bytes"] = nbytes = int(acts.size_bytes[i])
                if e > s:
                    args["memory bandwidth (GB/s)"] = round(nbytes / (e - s), 3)
            name = acts.names[int(acts.name_index[i])]
            self.slice(name, EVENT_CATEGORIES[kind], pid, stream, s, e, args)

    def launch_calls(self, acts: DeviceActivities) -> None:
        """The API calls that launched the activities, on a host track per calling thread; an
        activity whose call CUPTI did not report gets a stand-in at its own start, so that
        every device event keeps its CPU correlation."""
        calls = acts.launches
        for j, i in enumerate(launched(acts).tolist()):
            thread = int(calls.thread_id[j])
            pid, tid = self.f.api_thread(thread, f"host thread {thread}")
            api = "cuda_driver" if int(calls.api[j]) == API_DRIVER else "cuda_runtime"
            corr = int(calls.correlation_id[j])
            args = self.of_block(
                acts.block[i], acts.iteration[i], cbid=int(calls.cbid[j]), correlation=corr
            )
            name = acts.names[int(calls.name_index[j])]
            self.slice(name, api, pid, tid, int(calls.start_ns[j]), int(calls.end_ns[j]), args)
        missing = ~np.isin(acts.correlation_id, calls.correlation_id)
        if not missing.any():
            return
        pid, tid = self.f.api_thread(-1, "launches CUPTI did not report")
        _, first = np.unique(acts.correlation_id[missing], return_index=True)
        for i in np.sort(np.flatnonzero(missing)[first]).tolist():  # one per correlation id
            c = int(acts.correlation_id[i])
            name = f"{KIND_NAMES[int(acts.kind[i])]} launch (no API record)"
            args = self.of_block(acts.block[i], acts.iteration[i], correlation=c, synthesised=True)
            start = int(acts.start_ns[i])
            self.slice(name, "cuda_runtime", pid, tid, start, start, args)

    def block_spans(self, acts: DeviceActivities) -> None:
        """Per (block, iteration, stream) a ``gpu_user_annotation`` named after the block:
        HolisticTraceAnalysis's get_gpu_kernels_with_user_annotations names each kernel's block
        from them; no "stream" arg, so nothing counts them as GPU work."""
        if not len(acts):
            return
        key = np.stack([acts.block, acts.iteration, acts.device_id, acts.stream_id], axis=1)
        groups, inverse = np.unique(key.astype(np.int64), axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        first = np.full(groups.shape[0], np.iinfo(np.int64).max)
        last = np.full(groups.shape[0], np.iinfo(np.int64).min)
        np.minimum.at(first, inverse, acts.start_ns)
        np.maximum.at(last, inverse, acts.end_ns)
        for g, (b, it, device, stream) in enumerate(groups.tolist()):
            name, pid = self.timeline.block_names[b], self.f.device(device)
            args = self.of_block(b, it)
            self.slice(name, "gpu_user_annotation", pid, stream, int(first[g]), int(last[g]), args)

    def overlap(self) -> None:
        categories, present = self.timeline.block_categories, self.part.present
        comm = np.array([c == "comm" for c in categories], dtype=bool)
        compute = np.array([c == "compute" for c in categories], dtype=bool)
        if comm.shape != present.shape:
            self.f.overlap_known = False
        elif (comm & present).any():
            hidden, comm_ns = overlap.comm_hidden_under_compute_ns(
                self.part.starts, self.part.ends, comm & present, compute & present
            )
            self.f.hidden_ns += hidden
            self.f.comm_ns += comm_ns

    def write(self, first_step: int) -> None:
        part, f = self.part, self.f
        self.steps(first_step)
        acts = part.rt.activities
        if acts is not None:
            self.device_activities(acts)
            self.launch_calls(acts)
            self.block_spans(acts)
        else:
            self.cpu_blocks()
        self.overlap()
        by_rank = self.place.outcome.comm_compute_overlap_by_rank
        mine = by_rank[f.rank] if f.rank < len(by_rank) else math.nan
        f.patterns.append(
            {
                "pattern": self.timeline.pattern,
                "start_us": self.place.start_us,
                "span_us": self.place.span_us,
                "origin_ns": part.origin_ns,
                "first_step": first_step,
                "num_steps": part.starts.shape[1],
                "clock": part.rt.clock,
                "ranks_share_a_clock": self.timeline.shared_clock,
                "comm_compute_overlap": float(mine) if math.isfinite(mine) else None,
                "device_activities": acts is not None,
            }
        )


def build_rank_traces(outcomes: Sequence[PatternOutcome]) -> dict[int, dict[str, Any]]:
    """Rank -> Kineto-style trace dict of every outcome that has a timeline; every rank of the
    world gets one (a rank that ran nothing, an empty one)."""
    timelines = [o.timeline for o in outcomes if o.timeline is not None]
    ranks = {rt.rank for t in timelines for rt in t.ranks}
    world_size = max([len(t.ranks) for t in timelines] + [r + 1 for r in ranks], default=0)
    backend = next((t.backend for t in timelines if t.backend), "unknown")
    files = {rank: _RankFile(rank) for rank in range(world_size)}
    step, end_us = 0, 0.0
    for place in place_patterns(outcomes):
        for part in place.parts:
            _PatternOnRank(files[part.rt.rank], place, part).write(step)
        step += place.parts[0].starts.shape[1]
        end_us = place.next_us
    return {rank: f.document(world_size, backend, end_us, step) for rank, f in files.items()}


def rank_trace_texts(outcomes: Sequence[PatternOutcome]) -> dict[str, str]:
    """File name (``rank<r>.json``) -> strict JSON text of that rank's trace."""
    # Default separators: HolisticTraceAnalysis finds the rank with the regex '"rank":\s+(\d+)'.
    return {
        f"rank{rank}.json": json.dumps(doc, allow_nan=False)
        for rank, doc in sorted(build_rank_traces(outcomes).items())
    }


def stale_rank_files(folder: Path, keep: Iterable[str]) -> list[Path]:
    """Rank files in ``folder`` that this run did not write (a previous, larger run's):
    HolisticTraceAnalysis would read them as ranks of this run."""
    wanted = set(keep)
    return sorted(p for p in folder.iterdir() if _RANK_FILE.match(p.name) and p.name not in wanted)
