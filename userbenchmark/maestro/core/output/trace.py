"""Chrome Trace Event Format (Perfetto-readable) JSON of every rank's measured intervals: a
process per rank, a track per lane, an event per (block, iteration), patterns one after another
on a shared time axis, each with a span on a "pattern" track."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..analysis.records import BlockResult, PatternOutcome
from .trace_layout import PROCESS_ID_OFFSET, Placement, RankPart, TraceEvents, place_patterns

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
