"""Kineto-style trace files, one per rank, that HolisticTraceAnalysis and Perfetto both read.

``traces/rank<r>.json`` holds rank r's patterns one after another, a ``ProfilerStep#<k>`` per
measured iteration (numbered across the file) and an empty last step that only marks the end
(HolisticTraceAnalysis drops a file's last step). On CUDA with the cupti profiler and
``--trace``, the device events are CUPTI's own records (kernel names, streams, correlation
ids) with their launching runtime/driver calls; otherwise each (block, iteration) is a CPU
``user_annotation`` with no stream, so no tool counts it as GPU work.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis import overlap
from ..analysis.activities import API_DRIVER, KIND_KERNEL, KIND_NAMES
from ..analysis.records import BlockResult, PatternOutcome, RankTimeline, Timeline

TRACES_DIR = "traces"
"""Folder of the output dir holding one file per rank (and no other JSON)."""
STEP_TID = 1
"""Host track of each rank's pattern spans and ProfilerStep events."""
LANE_TID_BASE = 2
"""Host tracks of lanes (CPU block intervals): 2, 3, ... in order of appearance."""
API_TID_BASE = 100
"""Host tracks of the threads that called the CUDA API: 100, 101, ..."""
DEVICE_PID_BASE = 1 << 20
"""Device processes are ``DEVICE_PID_BASE + device``; host processes ``rank + 1`` (as in
trace.json: Perfetto treats pid 0 as the Linux idle task)."""
PATTERN_GAP_FRACTION = 0.1
PATTERN_GAP_MIN_US = 10.0
END_STEP_DUR_US = 1.0
"""Length of the empty last ProfilerStep."""
EVENT_CATEGORIES = {1: "kernel", 2: "gpu_memcpy", 3: "gpu_memset"}
"""Kineto's categories of device activities, by activity kind."""
_RANK_FILE = re.compile(r"^rank\d+\.json$")
TIME_NOTE = (
    "ts/dur are microseconds with nanosecond decimals, on a layout: each pattern starts after "
    "the previous one (maestroPatterns[].start_us; the gaps are not time that passed). Where "
    "ranks share a clock the pattern is rebased to its earliest event over all ranks, so the "
    "ranks' files line up; otherwise each rank is rebased to its own first event. "
    "maestroPatterns[].origin_ns is the clock reading at start_us."
)


def rank_file_name(rank: int) -> str:
    """``rank<r>.json``."""
    return f"rank{rank}.json"


def _us(value_ns: float) -> float:
    return round(value_ns / 1000.0, 3)


@dataclass
class _RankPart:
    """One rank's share of one pattern, with its extent on the rank's own clock."""

    rt: RankTimeline
    starts: np.ndarray
    ends: np.ndarray
    present: np.ndarray
    lo_ns: int
    hi_ns: int


def _rank_parts(timeline: Timeline) -> dict[int, _RankPart]:
    parts = {}
    for rt, starts, ends, present in timeline.rank_arrays():
        lo, hi = int(starts[present].min()), int(ends[present].max())
        acts = rt.activities
        if acts is not None and len(acts.launches):
            lo = min(lo, int(acts.launches.start_ns.min()))
            hi = max(hi, int(acts.launches.end_ns.max()))
        parts[rt.rank] = _RankPart(rt, starts, ends, present, lo, hi)
    return parts


def _iteration_bounds(part: _RankPart) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration, this rank's first start and last end (launch calls included)."""
    s = np.where(part.present[:, None], part.starts, np.iinfo(np.int64).max).min(axis=0)
    e = np.where(part.present[:, None], part.ends, np.iinfo(np.int64).min).max(axis=0)
    acts = part.rt.activities
    if acts is not None and len(acts.launches):
        # A launch's iteration is that of the activities with its correlation id.
        order = np.argsort(acts.correlation_id, kind="stable")
        at = np.searchsorted(acts.correlation_id[order], acts.launches.correlation_id)
        it = acts.iteration[order][np.minimum(at, len(acts) - 1)]
        np.minimum.at(s, it, acts.launches.start_ns)
        np.maximum.at(e, it, acts.launches.end_ns)
    return s, e


def _finite_or_none(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


class _RankFile:
    """The events of one rank's file, built pattern by pattern."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.host_pid = rank + 1
        self.meta: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._named: set[tuple[int, int]] = set()
        self._pids: set[int] = set()
        self.patterns: list[dict[str, Any]] = []
        self.hidden_ns = 0.0
        self.comm_ns = 0.0
        self.overlap_known = True
        self.clocks: set[str] = set()
        self.shared: list[bool] = []
        self._api_tids: dict[int, int] = {}

    def name_process(self, pid: int, name: str, order: int) -> None:
        if pid in self._pids:
            return
        self._pids.add(pid)
        for key, args in (
            ("process_name", {"name": name}),
            ("process_sort_index", {"sort_index": order}),
        ):
            self.meta.append({"name": key, "ph": "M", "pid": pid, "tid": 0, "args": args})

    def name_thread(self, pid: int, tid: int, name: str) -> None:
        if (pid, tid) in self._named:
            return
        self._named.add((pid, tid))
        self.meta.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        )
        self.meta.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )

    def api_tid(self, thread_id: int) -> int:
        if thread_id not in self._api_tids:
            self._api_tids[thread_id] = API_TID_BASE + len(self._api_tids)
        return self._api_tids[thread_id]

    def host(self) -> int:
        self.name_process(self.host_pid, f"rank {self.rank} host", 2 * self.rank)
        return self.host_pid

    def complete(
        self, name: str, cat: str, pid: int, tid: int, ts: float, dur: float, args: dict
    ) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": ts,
                "dur": max(dur, 0.0),
                "args": args,
            }
        )


def _block_args(
    timeline: Timeline, b: int, rank: int, results: dict[str, BlockResult]
) -> dict[str, Any]:
    """maestro's attribution of an event. Its iteration goes in ``pattern_iteration`` (added
    by the callers), not ``iteration``: HolisticTraceAnalysis fills an ``iteration`` column of
    its own (the ProfilerStep number) and fails to load an arg of that name when it parses
    every arg. The kernel's thread-block dims are ``block dims``: ``block`` is maestro's."""
    name = timeline.block_names[b]
    result = results.get(name)
    args: dict[str, Any] = {
        "pattern": timeline.pattern,
        "block": name,
        "op": result.op if result is not None else "block",
        "lane": timeline.block_lanes[b],
        "rank": rank,
    }
    if b < len(timeline.block_categories):
        args["category"] = timeline.block_categories[b]
    return args


def _write_cpu_blocks(
    f: _RankFile,
    timeline: Timeline,
    part: _RankPart,
    at: Any,
    lane_tids: dict[str, int],
    results: dict[str, BlockResult],
) -> None:
    """Each (block, iteration) as a CPU user annotation on its lane's host track."""
    pid = f.host()
    for b in np.flatnonzero(part.present).tolist():
        lane = timeline.block_lanes[b]
        tid = lane_tids[lane]
        f.name_thread(pid, tid, f"lane {lane}")
        base = _block_args(timeline, b, f.rank, results)
        for it in range(part.starts.shape[1]):
            s, e = int(part.starts[b, it]), int(part.ends[b, it])
            f.complete(
                timeline.block_names[b],
                "user_annotation",
                pid,
                tid,
                at(s),
                _us(e - s),
                {**base, "pattern_iteration": it},
            )


def _write_device_activities(
    f: _RankFile, timeline: Timeline, part: _RankPart, at: Any, results: dict[str, BlockResult]
) -> None:
    """CUPTI's records as Kineto writes them, their launching calls, and per (block,
    iteration, stream) a ``gpu_user_annotation`` named after the block."""
    acts = part.rt.activities
    assert acts is not None
    names = acts.names
    block_args = {
        b: _block_args(timeline, b, f.rank, results) for b in np.unique(acts.block).tolist()
    }
    device_pids = {}
    for device in np.unique(acts.device_id).tolist():
        pid = DEVICE_PID_BASE + int(device)
        f.name_process(pid, f"rank {f.rank} GPU {device}", 2 * f.rank + 1)
        device_pids[device] = pid
    streams = set()
    for i in range(len(acts)):
        kind = int(acts.kind[i])
        b, it = int(acts.block[i]), int(acts.iteration[i])
        stream = int(acts.stream_id[i])
        pid = device_pids[int(acts.device_id[i])]
        if (pid, stream) not in streams:
            streams.add((pid, stream))
            f.name_thread(pid, stream, f"stream {stream}")
        s, e = int(acts.start_ns[i]), int(acts.end_ns[i])
        args: dict[str, Any] = {
            "device": int(acts.device_id[i]),
            "stream": stream,
            "correlation": int(acts.correlation_id[i]),
            **block_args[b],
            "pattern_iteration": it,
        }
        if kind == KIND_KERNEL:
            args["grid"] = acts.grid[i].tolist()
            args["block dims"] = acts.block_dims[i].tolist()
        else:
            nbytes = int(acts.size_bytes[i])
            args["bytes"] = nbytes
            if e > s:
                args["memory bandwidth (GB/s)"] = round(nbytes / (e - s), 3)
        f.complete(
            names[int(acts.name_index[i])],
            EVENT_CATEGORIES[kind],
            pid,
            stream,
            at(s),
            _us(e - s),
            args,
        )
    # The launching API calls (CPU side); an activity whose call CUPTI did not report gets a
    # stand-in at its own start, so that every device event keeps its CPU correlation.
    launches = acts.launches
    order = np.argsort(acts.correlation_id, kind="stable")
    sorted_corr = acts.correlation_id[order]
    host = f.host()
    for j in range(len(launches)):
        corr = int(launches.correlation_id[j])
        i = int(order[np.searchsorted(sorted_corr, corr)])
        tid = f.api_tid(int(launches.thread_id[j]))
        f.name_thread(host, tid, f"host thread {int(launches.thread_id[j])}")
        s, e = int(launches.start_ns[j]), int(launches.end_ns[j])
        f.complete(
            names[int(launches.name_index[j])],
            "cuda_driver" if int(launches.api[j]) == API_DRIVER else "cuda_runtime",
            host,
            tid,
            at(s),
            _us(e - s),
            {
                "cbid": int(launches.cbid[j]),
                "correlation": corr,
                **block_args[int(acts.block[i])],
                "pattern_iteration": int(acts.iteration[i]),
            },
        )
    missing = ~np.isin(acts.correlation_id, launches.correlation_id)
    if missing.any():
        tid = f.api_tid(-1)
        f.name_thread(host, tid, "launches CUPTI did not report")
        seen: set[int] = set()
        for i in np.flatnonzero(missing).tolist():
            corr = int(acts.correlation_id[i])
            if corr in seen:
                continue
            seen.add(corr)
            f.complete(
                f"{KIND_NAMES[int(acts.kind[i])]} launch (no API record)",
                "cuda_runtime",
                host,
                tid,
                at(int(acts.start_ns[i])),
                0.0,
                {
                    "correlation": corr,
                    "synthesised": True,
                    **block_args[int(acts.block[i])],
                    "pattern_iteration": int(acts.iteration[i]),
                },
            )
    # Block spans per stream: HTA's get_gpu_kernels_with_user_annotations names each
    # kernel's block from them; no "stream" arg, so nothing counts them as GPU work.
    key = np.stack([acts.block, acts.iteration, acts.device_id, acts.stream_id], axis=1)
    if not len(acts):
        return
    groups, inverse = np.unique(key.astype(np.int64), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    first = np.full(groups.shape[0], np.iinfo(np.int64).max)
    last = np.full(groups.shape[0], np.iinfo(np.int64).min)
    np.minimum.at(first, inverse, acts.start_ns)
    np.maximum.at(last, inverse, acts.end_ns)
    for g, (b, it, device, stream) in enumerate(groups.tolist()):
        f.complete(
            timeline.block_names[b],
            "gpu_user_annotation",
            device_pids[device],
            stream,
            at(int(first[g])),
            _us(int(last[g]) - int(first[g])),
            {**block_args[b], "pattern_iteration": it},
        )


def build_rank_traces(outcomes: Sequence[PatternOutcome]) -> dict[int, dict[str, Any]]:
    """Rank -> Kineto-style trace dict of every outcome that has a timeline."""
    files: dict[int, _RankFile] = {}
    lane_tids: dict[str, int] = {}
    world_size = 0
    backend = ""
    offset_us = 0.0
    step = 0
    for outcome in outcomes:
        timeline = outcome.timeline
        if timeline is None:
            continue
        world_size = max(world_size, len(timeline.ranks))
        backend = backend or timeline.backend
        for rt in timeline.ranks:
            files.setdefault(rt.rank, _RankFile(rt.rank))
        parts = _rank_parts(timeline)
        if not parts:
            continue
        for lane in timeline.block_lanes:
            lane_tids.setdefault(lane, LANE_TID_BASE + len(lane_tids))
        shared = timeline.shared_clock
        common = min(p.lo_ns for p in parts.values())
        span_ns = max(p.hi_ns - (common if shared else p.lo_ns) for p in parts.values())
        num_iters = next(iter(parts.values())).starts.shape[1]
        results = {b.block: b for b in outcome.blocks}
        cc = outcome.comm_compute_overlap_by_rank
        comm = np.array([c == "comm" for c in timeline.block_categories], dtype=bool)
        compute = np.array([c == "compute" for c in timeline.block_categories], dtype=bool)
        for rank, part in parts.items():
            f = files[rank]
            origin = common if shared else part.lo_ns

            def at(t_ns: int, origin: int = origin, offset: float = offset_us) -> float:
                return round(offset + (t_ns - origin) / 1000.0, 3)

            f.clocks.add(part.rt.clock)
            f.shared.append(shared)
            pid = f.host()
            f.name_thread(pid, STEP_TID, "maestro: patterns and ProfilerSteps")
            f.complete(
                timeline.pattern,
                "user_annotation",
                pid,
                STEP_TID,
                at(part.lo_ns),
                _us(part.hi_ns - part.lo_ns),
                {"pattern": timeline.pattern, "rank": rank, "clock": part.rt.clock},
            )
            s, e = _iteration_bounds(part)
            for it in range(num_iters):
                end = int(e[it]) if it + 1 == num_iters else min(int(e[it]), int(s[it + 1]))
                f.complete(
                    f"ProfilerStep#{step + it}",
                    "user_annotation",
                    pid,
                    STEP_TID,
                    at(int(s[it])),
                    _us(end - int(s[it])),
                    {"pattern": timeline.pattern, "pattern_iteration": it},
                )
            if part.rt.activities is not None:
                _write_device_activities(f, timeline, part, at, results)
            else:
                _write_cpu_blocks(f, timeline, part, at, lane_tids, results)
            if comm.shape == part.present.shape and (comm & part.present).any():
                hidden, comm_ns = overlap.comm_hidden_under_compute_ns(
                    part.starts, part.ends, comm & part.present, compute & part.present
                )
                f.hidden_ns += hidden
                f.comm_ns += comm_ns
            elif comm.shape != part.present.shape:
                f.overlap_known = False
            f.patterns.append(
                {
                    "pattern": timeline.pattern,
                    "start_us": offset_us,
                    "span_us": span_ns / 1000.0,
                    "origin_ns": origin,
                    "first_step": step,
                    "num_steps": num_iters,
                    "clock": part.rt.clock,
                    "ranks_share_a_clock": shared,
                    "comm_compute_overlap": _finite_or_none(cc[rank]) if rank < len(cc) else None,
                    "device_activities": part.rt.activities is not None,
                }
            )
        step += num_iters
        gap = max(PATTERN_GAP_MIN_US, PATTERN_GAP_FRACTION * span_ns / 1000.0)
        # Whole microseconds: HolisticTraceAnalysis rounds fractional ones (see the docs).
        offset_us = float(math.ceil(offset_us + span_ns / 1000.0 + gap))
    world_size = max([world_size, *(r + 1 for r in files)])
    for rank in range(world_size):
        files.setdefault(rank, _RankFile(rank))
    return {rank: _document(f, world_size, backend, offset_us, step) for rank, f in files.items()}


def _document(
    f: _RankFile, world_size: int, backend: str, end_us: float, step: int
) -> dict[str, Any]:
    pid = f.host()
    f.name_thread(pid, STEP_TID, "maestro: patterns and ProfilerSteps")
    f.complete(
        f"ProfilerStep#{step}",
        "user_annotation",
        pid,
        STEP_TID,
        end_us,
        END_STEP_DUR_US,
        {"maestro": "end marker, no work: HolisticTraceAnalysis drops a trace's last step"},
    )
    overlap_value = None
    if f.overlap_known and f.comm_ns > 0:
        overlap_value = f.hidden_ns / f.comm_ns
    return {
        "schemaVersion": 1,
        "distributedInfo": {
            "backend": backend or "unknown",
            "rank": f.rank,
            "world_size": world_size,
        },
        "maestro": {
            "generator": "maestro",
            "time_unit": "us",
            "time_note": TIME_NOTE,
            "clocks": ", ".join(sorted(f.clocks)),
            "ranks_share_a_clock": bool(f.shared) and all(f.shared),
            "comm_compute_overlap": overlap_value,
            "comm_compute_overlap_note": (
                "this rank's communication time hidden under compute / its communication "
                "time, over every pattern of the file (maestroPatterns[] has each pattern's); "
                "blocks count by category, (block, iteration) spans as intervals"
            ),
            "num_steps": step,
        },
        "maestroPatterns": f.patterns,
        "traceEvents": f.meta + f.events,
    }


def rank_trace_texts(outcomes: Sequence[PatternOutcome]) -> dict[str, str]:
    """File name (``rank<r>.json``) -> strict JSON text of that rank's trace."""
    # Default separators: HolisticTraceAnalysis finds the rank with the regex '"rank":\s+(\d+)'.
    return {
        rank_file_name(rank): json.dumps(doc, allow_nan=False)
        for rank, doc in sorted(build_rank_traces(outcomes).items())
    }


def stale_rank_files(folder: Path, keep: Iterable[str]) -> list[Path]:
    """Rank files in ``folder`` that this run did not write (a previous, larger run's):
    HolisticTraceAnalysis would read them as ranks of this run."""
    if not folder.is_dir():
        return []
    wanted = set(keep)
    return sorted(p for p in folder.iterdir() if _RANK_FILE.match(p.name) and p.name not in wanted)
