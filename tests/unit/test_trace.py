"""Unit tests for the per-rank trace files (Trace Event Format) built from pattern timelines."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from userbenchmark.maestro.core.analysis.records import (
    BlockResult,
    PatternOutcome,
    PatternResult,
    RankTimeline,
    Timeline,
)
from userbenchmark.maestro.core.output.trace import (
    LANE_TID_BASE,
    PROCESS_ID_OFFSET,
    STEP_TID,
    build_rank_traces,
)

BLOCKS = ("allgather", "gemm", "reduce_scatter")
LANES = ("dp", "tp", "dp")
OPS = ("all_gather", "gemm", "reduce_scatter")
NUM_ITERS = 4


def block_result(pattern: str, name: str, op: str, lane: str, **metrics) -> BlockResult:
    base = dict(
        suite="s",
        pattern=pattern,
        block=name,
        op=op,
        axis=lane,
        lane=lane,
        team_size=2,
        dtype="bf16",
        size_bytes=None if op == "gemm" else 4 << 20,
        iters=NUM_ITERS,
        latency_avg_us=10.0,
        latency_min_us=9.0,
        latency_max_us=11.0,
        latency_p50_us=10.0,
        latency_p99_us=11.0,
        latency_stdev_us=0.5,
    )
    base.update(metrics)
    return BlockResult(**base)


def rank_intervals(base_ns: int, present: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Starts/ends (blocks, iters): blocks 0 and 2 in order on lane dp, block 1 on lane tp."""
    starts = np.zeros((3, NUM_ITERS), dtype=np.int64)
    ends = np.zeros((3, NUM_ITERS), dtype=np.int64)
    for it in range(NUM_ITERS):
        t0 = base_ns + it * 100_000
        starts[0, it], ends[0, it] = t0, t0 + 20_000 + 1_000 * it
        starts[1, it], ends[1, it] = t0 + 500, t0 + 35_123
        starts[2, it], ends[2, it] = ends[0, it] + 7, ends[0, it] + 30_001
    # Rows of absent blocks hold garbage: they must never be read.
    for b, p in enumerate(present):
        if not p:
            starts[b], ends[b] = -(10**12), -(10**12) - 5
    return starts, ends


def make_outcome(
    pattern: str = "ag_rs@4M",
    base_ns: int = 1_700_000_000_000_000_000,
    shared_clock: bool = True,
):
    blocks = (
        block_result(pattern, "allgather", "all_gather", "dp", algbw_gbps=40.0, busbw_gbps=20.0),
        block_result(pattern, "gemm", "gemm", "tp", tflops=300.0, isolated_latency_avg_us=8.0),
        block_result(pattern, "reduce_scatter", "reduce_scatter", "dp", busbw_gbps=math.nan),
    )
    ranks = []
    for rank, offset, present in ((0, 0, [True, True, True]), (1, 3_000, [True, False, True])):
        starts, ends = rank_intervals(base_ns + offset, present)
        ranks.append(
            RankTimeline(
                rank=rank,
                starts_ns=starts,
                ends_ns=ends,
                present=np.array(present),
                clock="perf_counter",
            )
        )
    timeline = Timeline(
        pattern=pattern,
        block_names=BLOCKS,
        block_lanes=LANES,
        ranks=tuple(ranks),
        shared_clock=shared_clock,
    )
    result = PatternResult(
        suite="s", pattern=pattern, iters=NUM_ITERS, num_blocks=3, makespan_avg_us=60.0,
        makespan_p99_us=61.0,
    )  # fmt: skip
    return PatternOutcome(blocks=blocks, pattern=result, timeline=timeline)


def check_schema(doc: dict) -> None:
    """Strict Trace Event Format checks for the event kinds maestro writes."""
    # No displayTimeUnit: "ts" and "dur" are µs as the format defines, and a "ns" display unit
    # made some trace processors read them as nanoseconds.
    assert "displayTimeUnit" not in doc
    named_threads = set()
    used_threads = set()
    named_pids = set()
    for ev in doc["traceEvents"]:
        assert isinstance(ev, dict)
        assert isinstance(ev["name"], str) and ev["name"]
        assert isinstance(ev["pid"], int) and ev["pid"] >= 1
        assert isinstance(ev["tid"], int) and ev["tid"] >= 0
        if ev["ph"] == "X":
            assert set(ev) == {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}
            assert isinstance(ev["ts"], float) and isinstance(ev["dur"], float)
            assert math.isfinite(ev["ts"]) and math.isfinite(ev["dur"])
            assert ev["ts"] >= 0.0 and ev["dur"] >= 0.0
            assert isinstance(ev["cat"], str) and ev["cat"]
            assert isinstance(ev["args"], dict)
            used_threads.add((ev["pid"], ev["tid"]))
        elif ev["ph"] == "M":
            assert "ts" not in ev
            assert ev["name"] in {
                "process_name",
                "thread_name",
                "process_sort_index",
                "thread_sort_index",
            }
            if ev["name"].endswith("_name"):
                assert set(ev["args"]) == {"name"} and isinstance(ev["args"]["name"], str)
            else:
                assert set(ev["args"]) == {"sort_index"}
                assert isinstance(ev["args"]["sort_index"], int)
            if ev["name"] == "thread_name":
                named_threads.add((ev["pid"], ev["tid"]))
            if ev["name"] == "process_name":
                named_pids.add(ev["pid"])
        else:
            pytest.fail(f"unexpected event phase {ev['ph']!r}")
    # Every track that holds a slice has a name, and so does its process.
    assert used_threads <= named_threads
    assert {pid for pid, _ in used_threads} <= named_pids
    json.dumps(doc, allow_nan=False)


def block_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] in BLOCKS]


def test_schema_counts_and_tracks():
    docs = build_rank_traces([make_outcome()])
    assert sorted(docs) == [0, 1]
    for doc in docs.values():
        check_schema(doc)
    # rank 0 runs 3 blocks, rank 1 runs 2 (gemm absent), 4 iterations each.
    assert len(block_events(docs[0])) == 3 * NUM_ITERS
    assert len(block_events(docs[1])) == 2 * NUM_ITERS
    for rank, doc in docs.items():
        meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
        procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
        assert procs == {rank + PROCESS_ID_OFFSET: f"rank {rank} host"}
        spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "ag_rs@4M"]
        assert [e["tid"] for e in spans] == [STEP_TID]
        # One track per lane, the same tid on every rank; events sit on their lane's track.
        for e in block_events(doc):
            assert e["tid"] == LANE_TID_BASE + ("dp", "tp").index(e["args"]["lane"])
    assert not [e for e in block_events(docs[1]) if e["name"] == "gemm"]


def test_times_durations_and_rebase():
    outcome = make_outcome()
    docs = build_rank_traces([outcome])
    timeline = outcome.timeline
    origin = min(
        int(rt.starts_ns[np.asarray(rt.present)].min()) for rt in timeline.ranks
    )  # fmt: skip
    seen = set()
    for rank, doc in docs.items():
        rt = timeline.ranks[rank]
        for e in block_events(doc):
            b = timeline.block_names.index(e["name"])
            it = e["args"]["pattern_iteration"]
            start, end = int(rt.starts_ns[b, it]), int(rt.ends_ns[b, it])
            assert e["dur"] == (end - start) / 1000.0
            assert e["ts"] == (start - origin) / 1000.0
            seen.add((rank, b, it))
    assert len(seen) == 20
    assert min(e["ts"] for e in block_events(docs[0])) == 0.0
    # Rank 1 started 3 µs after rank 0 on the shared clock: its first slice keeps that offset.
    assert min(e["ts"] for e in block_events(docs[1])) == 3.0


def test_missing_or_empty_timelines_give_valid_traces():
    no_timeline = PatternOutcome(blocks=make_outcome().blocks, pattern=make_outcome().pattern)
    empty = PatternOutcome(
        blocks=(),
        pattern=make_outcome().pattern,
        timeline=Timeline(pattern="e", block_names=(), block_lanes=(), ranks=()),
    )
    none_present = make_outcome("nobody")
    tl = none_present.timeline
    absent = Timeline(
        pattern="nobody",
        block_names=tl.block_names,
        block_lanes=tl.block_lanes,
        ranks=tuple(
            RankTimeline(
                rank=rt.rank, starts_ns=rt.starts_ns, ends_ns=rt.ends_ns,
                present=np.zeros(3, dtype=bool), clock=rt.clock,
            )
            for rt in tl.ranks
        ),
    )  # fmt: skip
    absent_outcome = PatternOutcome(
        blocks=none_present.blocks, pattern=none_present.pattern, timeline=absent
    )
    for outcomes in ([], [no_timeline], [empty], [absent_outcome]):
        for doc in build_rank_traces(outcomes).values():
            check_schema(doc)
            assert doc["maestroPatterns"] == [] and block_events(doc) == []
    # Skipped outcomes leave no hole before the next pattern.
    docs = build_rank_traces([no_timeline, absent_outcome, make_outcome()])
    assert min(e["ts"] for e in block_events(docs[0])) == 0.0
    assert docs[0]["maestroPatterns"][0]["start_us"] == 0.0


def test_mismatched_shapes_raise():
    outcome = make_outcome()
    rt = outcome.timeline.ranks[0]
    bad = Timeline(
        pattern="bad",
        block_names=BLOCKS,
        block_lanes=LANES,
        ranks=(
            RankTimeline(
                rank=0, starts_ns=rt.starts_ns, ends_ns=rt.ends_ns[:, :2], present=rt.present,
                clock="perf_counter",
            ),
        ),
    )  # fmt: skip
    outcomes = [PatternOutcome(blocks=outcome.blocks, pattern=outcome.pattern, timeline=bad)]
    with pytest.raises(ValueError, match="do not match"):
        build_rank_traces(outcomes)
