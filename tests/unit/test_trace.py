"""Unit tests for the Chrome/Perfetto trace built from pattern timelines."""

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
    PATTERN_GAP_MIN_US,
    PATTERN_TRACK_TID,
    PROCESS_ID_OFFSET,
    build_trace,
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


def check_schema(trace: dict) -> None:
    """Strict Trace Event Format checks for the event kinds maestro writes."""
    # No displayTimeUnit: "ts" and "dur" are µs as the format defines, and a "ns" display unit
    # made some trace processors read them as nanoseconds.
    assert set(trace) == {"traceEvents", "metadata"}
    assert isinstance(trace["metadata"], dict)
    named_threads = set()
    used_threads = set()
    named_pids = set()
    for ev in trace["traceEvents"]:
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
    json.dumps(trace, allow_nan=False)


def block_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "pattern"]


def test_schema_and_counts():
    trace = build_trace([make_outcome()])
    check_schema(trace)
    evs = block_events(trace)
    # rank 0 runs 3 blocks, rank 1 runs 2 (gemm absent), 4 iterations each.
    assert len(evs) == (3 + 2) * NUM_ITERS
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    names = [e["name"] for e in meta]
    assert names.count("process_name") == 2
    # rank 0: pattern, dp, tp tracks; rank 1: pattern, dp.
    assert names.count("thread_name") == 5
    pattern_spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "pattern"]
    assert [e["name"] for e in pattern_spans] == ["ag_rs@4M", "ag_rs@4M"]
    assert {e["tid"] for e in pattern_spans} == {PATTERN_TRACK_TID}


def test_process_and_thread_names():
    trace = build_trace([make_outcome()])
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {0 + PROCESS_ID_OFFSET: "rank 0", 1 + PROCESS_ID_OFFSET: "rank 1"}
    threads = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"}
    assert threads == {(1, "pattern"), (1, "dp"), (1, "tp"), (2, "pattern"), (2, "dp")}
    # One tid per lane, the same on every rank.
    tids = {}
    for e in meta:
        if e["name"] == "thread_name":
            tids.setdefault(e["args"]["name"], set()).add(e["tid"])
    assert all(len(v) == 1 for v in tids.values())
    assert len({next(iter(v)) for v in tids.values()}) == 3
    # Events sit on their lane's track.
    lane_tid = {name: next(iter(v)) for name, v in tids.items()}
    for e in block_events(trace):
        assert e["tid"] == lane_tid[e["args"]["lane"]]


def test_times_durations_and_rebase():
    outcome = make_outcome()
    trace = build_trace([outcome])
    timeline = outcome.timeline
    origin = min(
        int(rt.starts_ns[np.asarray(rt.present)].min()) for rt in timeline.ranks
    )  # fmt: skip
    seen = set()
    for e in block_events(trace):
        rank = e["pid"] - PROCESS_ID_OFFSET
        rt = timeline.ranks[rank]
        b = timeline.block_names.index(e["name"])
        it = e["args"]["iteration"]
        start, end = int(rt.starts_ns[b, it]), int(rt.ends_ns[b, it])
        assert e["dur"] == (end - start) / 1000.0
        assert e["ts"] == (start - origin) / 1000.0
        seen.add((rank, b, it))
    assert len(seen) == 20
    assert min(e["ts"] for e in block_events(trace)) == 0.0
    # Rank 1 started 3 µs after rank 0 on the shared clock: its first slice keeps that offset.
    r1 = [e for e in block_events(trace) if e["pid"] == 1 + PROCESS_ID_OFFSET]
    assert min(e["ts"] for e in r1) == 3.0


def test_absent_block_has_no_events_on_that_rank():
    trace = build_trace([make_outcome()])
    evs = block_events(trace)
    assert not [e for e in evs if e["name"] == "gemm" and e["pid"] == 1 + PROCESS_ID_OFFSET]
    assert len([e for e in evs if e["name"] == "gemm"]) == NUM_ITERS


def test_args_finite_and_complete():
    trace = build_trace([make_outcome()])
    for e in block_events(trace):
        a = e["args"]
        assert a["pattern"] == "ag_rs@4M" and a["block"] == e["name"]
        assert a["op"] == e["cat"] == OPS[BLOCKS.index(e["name"])]
        assert isinstance(a["iteration"], int) and 0 <= a["iteration"] < NUM_ITERS
        assert a["latency_avg_us"] == 10.0
        for v in a.values():
            assert not (isinstance(v, float) and not math.isfinite(v))
    by_block = {e["name"]: e["args"] for e in block_events(trace)}
    assert by_block["allgather"]["size_bytes"] == 4 << 20
    assert by_block["allgather"]["busbw_gbps"] == 20.0
    assert by_block["allgather"]["algbw_gbps"] == 40.0
    assert "tflops" not in by_block["allgather"]
    assert by_block["gemm"]["tflops"] == 300.0
    assert "size_bytes" not in by_block["gemm"] and "busbw_gbps" not in by_block["gemm"]
    assert "busbw_gbps" not in by_block["reduce_scatter"]


def test_several_patterns_are_sequential():
    first = make_outcome("p1")
    second = make_outcome("p2", base_ns=5)  # its own clock origin, far from p1's
    trace = build_trace([first, second])
    check_schema(trace)
    evs = block_events(trace)
    p1 = [e for e in evs if e["args"]["pattern"] == "p1"]
    p2 = [e for e in evs if e["args"]["pattern"] == "p2"]
    assert len(p1) == len(p2) == 20
    end1 = max(e["ts"] + e["dur"] for e in p1)
    start2 = min(e["ts"] for e in p2)
    assert start2 >= end1 + PATTERN_GAP_MIN_US
    meta = trace["metadata"]["patterns"]
    assert [m["pattern"] for m in meta] == ["p1", "p2"]
    assert meta[0]["start_us"] == 0.0 and meta[1]["start_us"] == start2
    assert meta[0]["span_us"] == pytest.approx(end1)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "pattern"]
    assert sorted(e["name"] for e in spans) == ["p1", "p1", "p2", "p2"]
    # A pattern's span on a rank covers that rank's slices of the pattern.
    for s in spans:
        mine = [e for e in evs if e["pid"] == s["pid"] and e["args"]["pattern"] == s["name"]]
        assert min(e["ts"] for e in mine) == s["ts"]
        assert max(e["ts"] + e["dur"] for e in mine) == pytest.approx(s["ts"] + s["dur"])


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
        trace = build_trace(outcomes)
        check_schema(trace)
        assert trace["traceEvents"] == []
        assert json.loads(json.dumps(trace, allow_nan=False)) == trace
    # Skipped outcomes leave no hole before the next pattern.
    trace = build_trace([no_timeline, absent_outcome, make_outcome()])
    assert min(e["ts"] for e in block_events(trace)) == 0.0


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
    with pytest.raises(ValueError, match="do not match"):
        build_trace([PatternOutcome(blocks=outcome.blocks, pattern=outcome.pattern, timeline=bad)])


def test_ranks_without_a_shared_clock_are_each_rebased_and_marked():
    outcome = make_outcome(shared_clock=False)
    trace = build_trace([outcome])
    assert trace["metadata"]["patterns"][0]["ranks_share_a_clock"] is False
    for rank, rt in enumerate(outcome.timeline.ranks):
        own_origin = int(rt.starts_ns[np.asarray(rt.present)].min())
        events = [e for e in block_events(trace) if e["pid"] - PROCESS_ID_OFFSET == rank]
        b0 = min(events, key=lambda e: e["ts"])
        assert b0["ts"] == 0.0  # every rank starts at its own first start
        for e in events:
            b = outcome.timeline.block_names.index(e["name"])
            start = int(rt.starts_ns[b, e["args"]["iteration"]])
            assert e["ts"] == (start - own_origin) / 1000.0
