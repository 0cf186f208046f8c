"""Figures that cannot be are flagged in the table with their reason: a makespan below the
ideal (an overlap efficiency above 1 beyond noise, and measurable), a ``sleep`` or ``busy``
block far over the duration it asks for. A replay read efficiency 2.046 [0.972, 576] and a 19.5 µs ``busy``
240 µs, with no note."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from bench.aggregate_scale import simulate_ranks
from userbenchmark.maestro.blocks.registry import registered_ops
from userbenchmark.maestro.core.analysis.aggregate import local_summary
from userbenchmark.maestro.core.analysis.outcome import Isolated, below_ideal, build_outcome
from userbenchmark.maestro.core.analysis.stats import measurable, unmeasurable_note
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


def _two_gemms(together_us, alone_us, sigma_us):
    """Two GEMMs of normal latencies (30 iterations) around the means given, in µs."""
    rng = np.random.default_rng(4)
    together = [rng.normal(mean, sigma_us, 30) for mean in together_us]
    alone = [rng.normal(mean, sigma_us, 30) for mean in alone_us]
    return _outcome([GEMM, GEMM], together, alone)


def test_a_makespan_below_its_ideal_within_noise_is_not_flagged():
    out = _two_gemms((930, 700), (1000, 800), 150)
    p = out.pattern
    assert p.makespan_avg_us < p.ideal_us and p.overlap_efficiency > 1
    assert p.intervals["overlap_efficiency"][0] <= 1  # 1 is inside the interval: noise
    assert "below the ideal" not in p.notes and not below_ideal(p)
    assert "(!" not in format_pattern(out)


def test_a_makespan_below_its_ideal_beyond_noise_is_flagged():
    out = _two_gemms((700, 600), (1000, 800), 10)
    p = out.pattern
    assert p.intervals["overlap_efficiency"][0] > 1 and below_ideal(p)
    assert "below the ideal" in p.notes and "above 1 beyond noise: cannot be" in p.notes
    text = format_pattern(out)
    assert "(!: makespan below ideal, see note)" in text and "note: makespan" in text


@pytest.mark.parametrize(
    ("low", "high", "flagged"),
    [(1.2, 2.1, True), (1.2, 2.5, False), (0.9, 1.5, False), (math.nan, math.nan, False)],
)
def test_below_the_ideal_needs_an_efficiency_above_1_beyond_noise_and_measurable(
    low, high, flagged
):
    p = _outcome([GEMM, GEMM], [[700.0] * 8] * 2, [[1000.0] * 8, [800.0] * 8]).pattern
    p = dataclasses.replace(
        p, overlap_efficiency=1.7, intervals={"overlap_efficiency": (low, high, 9)}
    )
    assert below_ideal(p) is flagged


def test_a_makespan_below_its_ideal_is_flagged_without_an_efficiency():
    # serial - ideal is under 5 % of serial: no efficiency, the makespan alone says it.
    out = _outcome([GEMM, GEMM], [[900.0] * 8, [20.0] * 8], [[1000.0] * 8, [30.0] * 8])
    p = out.pattern
    assert math.isnan(p.overlap_efficiency) and p.makespan_avg_us < p.ideal_us
    assert "makespan 900.0 µs below the ideal 1000.0 µs: cannot be" in p.notes
    overlapping = {"makespan_avg_us": (850.0, 950.0, 9), "ideal_us": (940.0, 1060.0, 9)}
    assert not below_ideal(dataclasses.replace(p, intervals=overlapping))


def _faster_overlapped(sigma: float, seed: int):
    """b0 ran about 0.3x its time alone; b1 as fast either way."""
    rng = np.random.default_rng(seed)
    together = [rng.lognormal(np.log(300), sigma, 40), rng.lognormal(np.log(300), 0.01, 40)]
    alone = [rng.lognormal(np.log(1000), sigma, 40), rng.lognormal(np.log(300), 0.01, 40)]
    return _outcome([GEMM, GEMM], together, alone).blocks[0]


def test_faster_overlapped_is_noted_only_where_the_slowdown_is_measurable():
    steady = _faster_overlapped(0.6, 0)
    assert steady.intervals["slowdown"][1] < 1 and "< 1 beyond noise: faster" in steady.notes
    noisy = _faster_overlapped(0.8, 3)
    low, high, _ = noisy.intervals["slowdown"]
    assert high < 1 and not measurable("slowdown", noisy.slowdown, low, high)
    assert "faster overlapped" not in noisy.notes and "not measurable here" in noisy.notes


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


# ---- a figure whose interval is wider than its own range is "not measurable here" ----
def _noisy(iters: int, sigma: float = 1.2):
    rng = np.random.default_rng(1)
    together = [rng.lognormal(np.log(1000), sigma, iters), rng.lognormal(np.log(700), sigma, iters)]
    alone = [rng.lognormal(np.log(900), sigma, iters), rng.lognormal(np.log(600), sigma, iters)]
    return _outcome([GEMM, GEMM], together, alone)


def _renamed(outcome, pattern: str):
    blocks = tuple(dataclasses.replace(b, pattern=pattern) for b in outcome.blocks)
    pairs = tuple(dataclasses.replace(pair, pattern=pattern) for pair in outcome.pairs)
    head = dataclasses.replace(outcome.pattern, pattern=pattern)
    return dataclasses.replace(outcome, blocks=blocks, pairs=pairs, pattern=head)


def test_an_efficiency_and_slowdowns_wider_than_their_range_read_not_measurable_with_why():
    out = _noisy(12)
    p, b0 = out.pattern, out.blocks[0]
    low, high, _ = p.intervals["overlap_efficiency"]
    assert high - low > 1 and not measurable("overlap_efficiency", p.overlap_efficiency, low, high)
    assert (
        "overlap efficiency not measurable here" in p.notes and "too few iterations (12" in p.notes
    )
    assert (
        "slowdown not measurable here" in b0.notes and "wider than the slowdown itself" in b0.notes
    )
    text = format_pattern(out)
    assert "overlap efficiency not measurable (see note)" in text
    assert f"{p.overlap_efficiency:.3f} [" not in text.split("note:")[0]  # no noise as a figure
    assert text.count("not measurable (see note)") == 3, text  # efficiency and both slowdowns
    # Many iterations that vary as much: the host's noise, not their number, is named.
    assert "the iterations vary too much (a noisy host)" in _noisy(100, 2.0).blocks[0].notes


def test_the_rule_holds_each_figure_to_its_own_range():
    assert measurable("overlap_efficiency", 0.5, 0.0, 1.0)  # exactly the range: still read
    assert not measurable("overlap_efficiency", 0.5, -0.3, 0.71)
    assert measurable("slowdown", 1.2, 0.7, 1.9) and not measurable("slowdown", 1.2, 0.7, 1.91)
    assert measurable("latency_avg_us", 5.0, 0.0, 1e9)  # other figures: judged by compare
    assert measurable("slowdown", 1.2, math.nan, math.nan)  # no interval: nothing to say
    assert unmeasurable_note("slowdown", 1.2, (0.7, 1.9, 20), 100) == ""


def test_the_metrics_file_leaves_out_what_is_not_measurable_and_the_results_keep_it(tmp_path):
    import json

    from userbenchmark.maestro.core.output.writer import OutputWriter

    noisy, steady = _noisy(12), _outcome([GEMM, GEMM], [[900.0] * 8] * 2, [[800.0] * 8] * 2)
    writer = OutputWriter(output_dir=tmp_path, metrics_path=tmp_path / "m.json", environ={})
    writer.add(noisy)
    writer.add(_renamed(steady, "q"))
    metrics = json.loads((tmp_path / "m.json").read_text())["metrics"]
    assert not [
        k for k in metrics if k.startswith("s/p/") and ("slowdown" in k or "efficiency" in k)
    ]
    assert "s/q/b0/slowdown" in metrics and "s/q/b0/slowdown_ci_high" in metrics
    assert writer.num_metrics == len([k for k in metrics if "_ci_" not in k])
    rows = json.loads((tmp_path / "results.json").read_text())
    row = next(r for r in rows if r["pattern"] == "p" and r["block"] == "b0")
    assert row["slowdown"] == noisy.blocks[0].slowdown and "not measurable here" in row["notes"]
