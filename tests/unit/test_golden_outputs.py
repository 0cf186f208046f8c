"""Result files of a fixed pattern with deterministic fake timings, against golden copies.

Everything after the profiler (aggregation over ranks, per-block and per-pattern figures,
tables, results/patterns/metrics files, trace) runs on timings made up here, so a change in
any golden file is a change in what maestro computes or writes. Regenerate the golden files
only for an intended change: ``MAESTRO_WRITE_GOLDEN=1 python -m pytest tests/unit/test_golden_outputs.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from bench.aggregate_scale import simulate_ranks
from userbenchmark.maestro.blocks.registry import resolve_op
from userbenchmark.maestro.core.analysis.aggregate import local_summary
from userbenchmark.maestro.core.analysis.intervals import HostTimings, WindowTimings
from userbenchmark.maestro.core.analysis.outcome import Isolated, build_outcome
from userbenchmark.maestro.core.analysis.records import RankTimeline, Timeline
from userbenchmark.maestro.core.config.loader import load_suite
from userbenchmark.maestro.core.output.table import Tables
from userbenchmark.maestro.core.output.writer import OutputWriter

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"
FILES = (
    "results.json",
    "results.csv",
    "patterns.json",
    "patterns.csv",
    "pairs.json",
    "pairs.csv",
    "metrics.json",
    "traces/rank0.json",
    "traces/rank1.json",
    "tables.txt",
)


def _fake_window(rank: int, pattern_index: int, num_blocks: int, num_iters: int, lanes):
    """Deterministic intervals: per block a base duration, per rank and iteration a wobble."""
    rng = np.random.default_rng(1000 * pattern_index + rank)
    base_ns = 1_000_000 + 10**12 * rank  # every rank on its own clock
    starts = np.zeros((num_blocks, num_iters), dtype=np.int64)
    ends = np.zeros_like(starts)
    lane_free = {}
    for it in range(num_iters):
        t0 = base_ns + it * 5_000_000
        for b in range(num_blocks):
            lane = lanes[b]
            start = max(t0 + int(rng.integers(0, 4_000)), lane_free.get((lane, it), 0))
            dur = 100_000 * (b + 1) + int(rng.integers(0, 50_000)) + 7_000 * rank
            starts[b, it], ends[b, it] = start, start + dur
            lane_free[(lane, it)] = start + dur
    gate = starts.min(axis=0) - 1_500
    host = HostTimings(
        enqueue_ns=np.full(num_iters, 40_000 + 1_000 * rank, dtype=np.int64),
        launch_ns=np.full((num_blocks, num_iters), 9_000, dtype=np.int64),
        gate_us=60.0,
    )
    timings = WindowTimings(
        starts_ns=starts,
        ends_ns=ends,
        present=np.ones(num_blocks, dtype=bool),
        clock="test",
        gate_open_ns=gate,
        activity_counts=np.full(num_blocks, num_iters, dtype=np.int64),
    )
    return timings, host


def _outcomes():
    suite = load_suite(GOLDEN / "pattern.yaml")
    outcomes = []
    for index, pattern in enumerate(suite.patterns):
        classes = [resolve_op(b.op) for b in pattern.blocks]
        lane_names = list(pattern.lanes)
        lane_of_block = [lane_names.index(b.lane) for b in pattern.blocks]
        is_comm = np.array([c.category == "comm" for c in classes])
        is_compute = np.array([c.category == "compute" for c in classes])
        summaries, timelines = [], []
        for rank in range(suite.world_size):
            timings, host = _fake_window(
                rank, index, len(pattern.blocks), pattern.num_iters, lane_of_block
            )
            summaries.append(
                local_summary(
                    timings,
                    lane_of_block=lane_of_block,
                    is_comm=is_comm,
                    is_compute=is_compute,
                    rank=rank,
                    world_size=suite.world_size,
                    shared_clock=False,  # the fake ranks' clocks are 1e12 ns apart
                    host=host,
                )
            )
            timelines.append(
                RankTimeline(
                    rank=rank,
                    starts_ns=timings.starts_ns,
                    ends_ns=timings.ends_ns,
                    present=timings.present,
                    clock=timings.clock,
                )
            )
        agg = simulate_ranks(summaries)
        scale = np.arange(1, len(pattern.blocks) + 1)[:, None]
        alone = np.random.default_rng(77 + index).normal(size=(scale.size, pattern.num_iters))
        alone = (alone - alone.mean(axis=1, keepdims=True)) / alone.std(axis=1, keepdims=True)
        isolated = Isolated(latency_ns=(90_000 + 1_500 * alone) * scale)  # mean 90 µs x (b + 1)
        outcome = build_outcome(
            suite,
            pattern,
            classes,
            agg,
            isolated,
            np.zeros(len(pattern.blocks)),
            123_456_789,
            profiler="host",
            team_sizes=[suite.axes[b.axis].team_size for b in pattern.blocks],
            notes=[() for _ in pattern.blocks],
        )
        timeline = Timeline(
            pattern=pattern.name,
            block_names=tuple(b.name for b in pattern.blocks),
            block_lanes=tuple(b.lane for b in pattern.blocks),
            ranks=tuple(timelines),
        )
        outcomes.append((pattern, outcome, timeline))
    return outcomes


def _write(folder: Path) -> dict[str, str]:
    import dataclasses

    writer = OutputWriter(
        output_dir=folder,
        metrics_path=folder / "metrics.json",
        environ={"golden": "1"},
        trace=True,
    )
    printer = Tables(precision=2)
    tables = []
    for spec, outcome, timeline in _outcomes():
        outcome = dataclasses.replace(outcome, timeline=timeline)
        writer.add(outcome)
        tables.append(printer.pattern(spec, outcome))
    tables += printer.closing()
    (folder / "tables.txt").write_text("\n\n".join(tables) + "\n", encoding="utf-8")
    return {name: (folder / name).read_text(encoding="utf-8") for name in FILES}


def test_result_files_match_the_golden_copies(tmp_path):
    produced = _write(tmp_path)
    if os.environ.get("MAESTRO_WRITE_GOLDEN") == "1":
        for name, text in produced.items():
            (GOLDEN / name).write_text(text, encoding="utf-8")
        pytest.skip("golden files rewritten")
    for name, text in produced.items():
        expected = (GOLDEN / name).read_text(encoding="utf-8")
        assert text == expected, f"{name} differs from tests/data/golden/{name}"
