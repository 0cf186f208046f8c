"""Chrome Trace Event Format (Perfetto-readable) JSON of every rank's measured intervals.

One process per rank, one track per lane, one complete event per (block, iteration); patterns
are laid out one after another on a shared time axis, each with a span on a "pattern" track.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ..analysis.records import BlockResult, PatternOutcome

PATTERN_GAP_FRACTION = 0.1
"""Gap left after a pattern, as a fraction of its span (so it stays visible at any zoom)."""
PATTERN_GAP_MIN_US = 10.0
"""Smallest gap between two patterns, in microseconds."""
PATTERN_TRACK_TID = 1
"""Thread id of each rank's "pattern" track; lanes take 2, 3, ... in order of appearance."""
PROCESS_ID_OFFSET = 1
"""pid = rank + 1: Perfetto treats pid 0 as the Linux idle task (renames its threads)."""
BLOCK_ARG_METRICS = ("latency_avg_us", "algbw_gbps", "busbw_gbps", "tflops")
"""BlockResult fields copied into each event's args where they are finite."""
TIME_ALIGNMENT_NOTE = (
    "Each pattern is placed after the previous one. Where its ranks share a clock (one host, "
    "and timestamps of that host's clock: cupti or perf_counter), the pattern is rebased to the "
    "earliest start over all ranks and the ranks' tracks line up in time. Otherwise "
    "(several hosts, or CUDA events, which count from each rank's own reference) every rank is "
    "rebased to its own first start: tracks of different ranks do not line up in time. "
    "Durations are exact on every rank."
)


def _finite_args(block: BlockResult | None) -> dict[str, Any]:
    """The block's figures that are numbers (NaN means 'not applicable': left out)."""
    if block is None:
        return {}
    args: dict[str, Any] = {}
    for name in BLOCK_ARG_METRICS:
        value = getattr(block, name)
        if value is not None and math.isfinite(value):
            args[name] = float(value)
    return args


def build_trace(outcomes: Sequence[PatternOutcome]) -> dict[str, Any]:
    """Trace Event Format dict of every outcome that has a timeline (others are skipped).

    Times are microseconds (floats) from the start of the first pattern; see
    ``TIME_ALIGNMENT_NOTE`` for what cross-rank alignment means.
    """
    events: list[dict[str, Any]] = []
    metadata_events: list[dict[str, Any]] = []
    lane_tids: dict[str, int] = {}
    named_processes: set[int] = set()
    named_threads: set[tuple[int, int]] = set()
    patterns_meta: list[dict[str, Any]] = []
    offset_us = 0.0

    def name_process(pid: int, rank: int) -> None:
        if pid in named_processes:
            return
        named_processes.add(pid)
        metadata_events.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"rank {rank}"},
            }
        )
        metadata_events.append(
            {
                "name": "process_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"sort_index": rank},
            }
        )

    def name_thread(pid: int, tid: int, name: str) -> None:
        if (pid, tid) in named_threads:
            return
        named_threads.add((pid, tid))
        metadata_events.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        )
        metadata_events.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )

    for outcome in outcomes:
        timeline = outcome.timeline
        if timeline is None:
            continue
        rows = timeline.rank_arrays()
        if not rows:
            continue
        results = {b.block: b for b in outcome.blocks}
        for lane in timeline.block_lanes:
            lane_tids.setdefault(lane, PATTERN_TRACK_TID + 1 + len(lane_tids))
        # One origin for all ranks where they share a clock; else each rank its own.
        shared = timeline.shared_clock
        common_ns = min(int(starts[present].min()) for _, starts, _, present in rows)
        span_us = (
            max(
                (int(ends[present].max()) - (common_ns if shared else int(starts[present].min())))
                for _, starts, ends, present in rows
            )
            / 1000.0
        )
        for rt, starts, ends, present in rows:
            origin_ns = common_ns if shared else int(starts[present].min())
            pid = rt.rank + PROCESS_ID_OFFSET
            name_process(pid, rt.rank)
            name_thread(pid, PATTERN_TRACK_TID, "pattern")
            rank_first = int(starts[present].min())
            rank_last = int(ends[present].max())
            events.append(
                {
                    "name": timeline.pattern,
                    "cat": "pattern",
                    "ph": "X",
                    "ts": offset_us + (rank_first - origin_ns) / 1000.0,
                    "dur": (rank_last - rank_first) / 1000.0,
                    "pid": pid,
                    "tid": PATTERN_TRACK_TID,
                    "args": {"pattern": timeline.pattern, "rank": rt.rank, "clock": rt.clock},
                }
            )
            for b, block_name in enumerate(timeline.block_names):
                if not present[b]:
                    continue
                lane = timeline.block_lanes[b]
                tid = lane_tids[lane]
                name_thread(pid, tid, lane)
                result = results.get(block_name)
                op = result.op if result is not None else "block"
                base_args: dict[str, Any] = {
                    "pattern": timeline.pattern,
                    "block": block_name,
                    "op": op,
                    "lane": lane,
                    "rank": rt.rank,
                }
                if result is not None and result.size_bytes is not None:
                    base_args["size_bytes"] = int(result.size_bytes)
                base_args.update(_finite_args(result))
                for it in range(starts.shape[1]):
                    start_ns = int(starts[b, it])
                    end_ns = int(ends[b, it])
                    events.append(
                        {
                            "name": block_name,
                            "cat": op,
                            "ph": "X",
                            "ts": offset_us + (start_ns - origin_ns) / 1000.0,
                            "dur": (end_ns - start_ns) / 1000.0,
                            "pid": pid,
                            "tid": tid,
                            "args": {**base_args, "iteration": it},
                        }
                    )
        patterns_meta.append(
            {
                "pattern": timeline.pattern,
                "start_us": offset_us,
                "span_us": span_us,
                "clocks": sorted({rt.clock for rt, *_ in rows}),
                "ranks_share_a_clock": shared,
            }
        )
        offset_us += span_us + max(PATTERN_GAP_MIN_US, PATTERN_GAP_FRACTION * span_us)

    return {
        "traceEvents": metadata_events + events,
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
