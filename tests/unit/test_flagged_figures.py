"""Figures that cannot be are flagged in the table with their reason: a makespan below the
ideal (an overlap efficiency above 1, noise or not), a ``sleep`` or ``busy`` block far over
the duration it asks for. A replay read efficiency 2.046 [0.972, 576] and a 19.5 µs ``busy``
240 µs, with no note."""

from __future__ import annotations

import math

import numpy as np

from bench.aggregate_scale import simulate_ranks
from userbenchmark.maestro.blocks.registry import registered_ops
from userbenchmark.maestro.core.analysis.aggregate import local_summary
from userbenchmark.maestro.core.analysis.outcome import Isolated, build_outcome
from userbenchmark.maestro.core.config.spec import SuiteSpec
from userbenchmark.maestro.core.output.table import format_pattern

from .test_runtime_pure import _block, _pattern, _timings

GEMM = ("gemm", {"m": 8, "n": 8, "k": 8})


def _outcome(blocks, together_us, alone_us, *, profiler="host"):
    """The outcome of blocks (``(op, params)``, each on its own lane, all starting at 0) that
    took ``together_us`` overlapped and ``alone_us`` alone (blocks x iterations, µs)."""
    specs = [_block(f"b{i}", op, **params) for i, (op, params) in enumerate(blocks)]
    together = np.asarray(together_us, dtype=np.float64)
    pattern = _pattern(specs, iters=together.shape[1])
    suite = SuiteSpec(name="s", source="x", world_size=1, patterns=(pattern,))
    none = np.zeros(len(specs), dtype=bool)
    summary = local_summary(
        _timings(np.zeros(together.shape), (together * 1e3).round()),
        lane_of_block=list(range(len(specs))),
        is_comm=none,
        is_compute=none,
    )
    classes = [registered_ops()[op] for op, _ in blocks]
    return build_outcome(
        suite,
        pattern,
        classes,
        simulate_ranks([summary]),
        Isolated(latency_ns=np.asarray(alone_us, dtype=np.float64) * 1e3),
        None,
        None,
        profiler=profiler,
        team_sizes=[1] * len(specs),
    )


def test_a_makespan_below_its_ideal_is_flagged_even_within_noise():
    rng = np.random.default_rng(4)
    together = [rng.normal(930, 150, 30), rng.normal(700, 150, 30)]
    alone = [rng.normal(1000, 150, 30), rng.normal(800, 150, 30)]
    out = _outcome([GEMM, GEMM], together, alone)
    p = out.pattern
    assert p.makespan_avg_us < p.ideal_us and p.overlap_efficiency > 1
    assert p.intervals["overlap_efficiency"][0] <= 1  # 1 is inside the interval: noise
    assert "below the ideal" in p.notes and "within noise of 1" in p.notes
    text = format_pattern(out)
    assert "(!: makespan below ideal, see note)" in text
    assert "note: makespan" in text


def test_a_makespan_below_its_ideal_is_flagged_without_an_efficiency():
    # serial - ideal is under 5 % of serial: no efficiency, the makespan alone says it.
    out = _outcome([GEMM, GEMM], [[900.0] * 8, [20.0] * 8], [[1000.0] * 8, [30.0] * 8])
    p = out.pattern
    assert math.isnan(p.overlap_efficiency) and p.makespan_avg_us < p.ideal_us
    assert "makespan 900.0 µs below the ideal 1000.0 µs: cannot be" in p.notes


def test_figures_that_can_be_are_not_flagged():
    out = _outcome(
        [("sleep", {"duration_us": 1000.0}), ("busy", {"duration_us": 800.0})],
        [[1030.0] * 8, [830.0] * 8],
        [[1010.0] * 8, [805.0] * 8],
    )
    assert out.pattern.notes == "" and all(b.notes == "" for b in out.blocks)
    assert "(!" not in format_pattern(out)


def test_a_cpu_sleep_or_busy_far_over_its_duration_is_flagged():
    out = _outcome(
        [("busy", {"duration_us": 19.5}), ("sleep", {"duration_us": 50.0})],
        [[240.0] * 8, [160.0] * 8],
        [[25.0] * 8, [820.0] * 8],
    )
    busy, sleep = out.blocks
    assert busy.notes.startswith("average latency overlapped 240.0 µs: far over the 19.5 µs")
    assert "alone" not in busy.notes  # 25 µs alone is within reach of 19.5
    assert "overlapped 160.0 µs and alone 820.0 µs: far over the 50 µs" in sleep.notes
    assert "its lane thread was kept from running" in sleep.notes
    assert "note: b0: average latency overlapped 240.0 µs" in format_pattern(out)


def test_on_a_gpu_only_busy_alone_is_judged():
    # Overlapped, a GPU busy block shares SMs and memory with the others: slower is real.
    out = _outcome(
        [("busy", {"duration_us": 19.5}), ("busy", {"duration_us": 19.5})],
        [[240.0] * 8, [240.0] * 8],
        [[20.0] * 8, [90.0] * 8],
        profiler="cupti",
    )
    fine, slow_alone = out.blocks
    assert fine.notes == ""
    assert slow_alone.notes.startswith("average latency alone 90.0 µs: far over the 19.5 µs")
    assert slow_alone.notes.endswith("its lane waited")
