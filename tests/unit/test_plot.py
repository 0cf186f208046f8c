"""Unit tests for the per-pattern PNG (timeline of one iteration, latency alone vs overlapped)."""

from __future__ import annotations

import math
import struct
import sys
from dataclasses import replace

import numpy as np
import pytest

from userbenchmark.maestro.core.analysis.records import (
    BlockResult,
    PatternOutcome,
    PatternResult,
    RankTimeline,
    Timeline,
)
from userbenchmark.maestro.core.output.writer import (
    MISSING_MATPLOTLIB,
    median_makespan_iteration,
    plot_pattern,
    unique_plot_name,
)
from userbenchmark.maestro.errors import RunError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def block(name: str, op: str, lane: str, latency_us: float, isolated_us: float) -> BlockResult:
    slowdown = latency_us / isolated_us if math.isfinite(isolated_us) else math.nan
    return BlockResult(
        suite="s", pattern="p", block=name, op=op, axis=lane, lane=lane, team_size=2,
        dtype="bf16", size_bytes=1 << 20, iters=4, latency_avg_us=latency_us,
        latency_min_us=latency_us, latency_max_us=latency_us, latency_p50_us=latency_us,
        latency_p99_us=latency_us, latency_stdev_us=0.0, isolated_latency_avg_us=isolated_us,
        slowdown=slowdown,
    )  # fmt: skip


def rank_timeline(rank: int, makespans_ns: list[int], base_ns: int, present) -> RankTimeline:
    """Three blocks: 0 and 2 one after another on lane dp, 1 on lane tp; per-iteration makespan."""
    n = len(makespans_ns)
    starts = np.zeros((3, n), dtype=np.int64)
    ends = np.zeros((3, n), dtype=np.int64)
    for it, m in enumerate(makespans_ns):
        t0 = base_ns + it * 10_000_000
        starts[0, it], ends[0, it] = t0, t0 + m // 2
        starts[2, it], ends[2, it] = t0 + m // 2, t0 + m
        starts[1, it], ends[1, it] = t0 + 1_000, t0 + m // 3
    return RankTimeline(
        rank=rank, starts_ns=starts, ends_ns=ends, present=np.array(present), clock="perf_counter"
    )


def make_outcome(
    pattern: str = "ag_rs[size=4M]", isolated=(30.0, 50.0, math.nan)
) -> PatternOutcome:
    blocks = (
        block("allgather", "all_gather", "dp", 45.0, isolated[0]),
        block("gemm", "gemm", "tp", 80.0, isolated[1]),
        block("reduce_scatter", "reduce_scatter", "dp", 47.0, isolated[2]),
    )
    ranks = (
        rank_timeline(0, [100_000, 90_000, 120_000, 95_000], 1_000_000, [True, True, True]),
        # Another host's clock, far away: only durations on it may be used.
        rank_timeline(1, [98_000, 91_000, 119_000, 97_000], 9 * 10**15, [True, False, True]),
    )
    timeline = Timeline(
        pattern=pattern,
        block_names=("allgather", "gemm", "reduce_scatter"),
        block_lanes=("dp", "tp", "dp"),
        ranks=ranks,
    )
    result = PatternResult(
        suite="s", pattern=pattern, iters=4, num_blocks=3, makespan_avg_us=100.0,
        makespan_p99_us=120.0,
    )  # fmt: skip
    return PatternOutcome(blocks=blocks, pattern=result, timeline=timeline)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# --- pure parts (no matplotlib needed) ------------------------------------------------------


def test_median_makespan_iteration_uses_max_over_ranks():
    # Per-iteration max over ranks: [100, 91, 120, 97] µs -> sorted 91, 97, 100, 120 -> lower
    # median 97 -> iteration 3 (rank 0 alone would give 95 -> also 3; see the next test).
    assert median_makespan_iteration(make_outcome().timeline) == 3


def test_median_makespan_iteration_follows_slowest_rank():
    r0 = rank_timeline(0, [10, 20, 30], 0, [True, True, True])
    r1 = rank_timeline(1, [50, 5, 5], 123_456_789, [True, True, True])
    # max over ranks: [50, 20, 30] -> sorted 20, 30, 50 -> median 30 -> iteration 2
    tl = Timeline(
        pattern="p", block_names=("a", "b", "c"), block_lanes=("x", "y", "x"), ranks=(r0, r1)
    )
    assert median_makespan_iteration(tl) == 2
    tl0 = replace(tl, ranks=(r0,))
    assert median_makespan_iteration(tl0) == 1


def test_median_makespan_iteration_ties_and_empty():
    r0 = rank_timeline(0, [40, 40, 40, 40], 0, [True, True, True])
    tl = Timeline(
        pattern="p", block_names=("a", "b", "c"), block_lanes=("x", "y", "x"), ranks=(r0,)
    )
    assert median_makespan_iteration(tl) == 1  # lower median of four equal values, stable order
    none = replace(r0, present=np.zeros(3, dtype=bool))
    assert median_makespan_iteration(replace(tl, ranks=(none,))) is None
    assert median_makespan_iteration(replace(tl, ranks=())) is None


def test_plot_file_name():
    def plot_file_name(pattern: str) -> str:
        return unique_plot_name(pattern, set())

    assert plot_file_name("ar_sweep[size=4M]") == "plot-ar_sweep_size_4M.png"  # docs' example
    assert plot_file_name("ag_rs@4M") == "plot-ag_rs_4M.png"  # any text, legal name or not
    assert plot_file_name("a/b c") == "plot-a_b_c.png"
    assert plot_file_name("../..") == "plot-pattern.png"
    assert plot_file_name("sweep-1.5K") == "plot-sweep-1.5K.png"


def test_missing_matplotlib_is_a_run_error(monkeypatch, tmp_path):
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(RunError) as err:
        plot_pattern(make_outcome(), tmp_path / "x.png")
    assert str(err.value) == MISSING_MATPLOTLIB
    assert list(tmp_path.iterdir()) == []


# --- drawing (needs matplotlib) -------------------------------------------------------------


@pytest.fixture
def mpl():
    return pytest.importorskip("matplotlib")


def test_plot_pattern_writes_png(mpl, tmp_path):
    (tmp_path / "out").mkdir()  # the writer creates its folder once, before any plot
    path = plot_pattern(make_outcome(), tmp_path / "out" / "p.png")
    assert path == tmp_path / "out" / "p.png"
    data = path.read_bytes()
    width, height = png_size(data)
    assert 800 <= width <= 2000 and 400 <= height <= 2000
    assert len(data) > 20_000  # two panels of bars, text and a legend, not a blank canvas
    assert [p.name for p in path.parent.iterdir()] == ["p.png"]  # no temp file left


def test_timeline_panel_bars(mpl):
    from matplotlib.figure import Figure

    from userbenchmark.maestro.core.output.writer import _block_colors, _draw_timeline

    outcome = make_outcome()
    ax = Figure().subplots()
    colors = _block_colors(["allgather", "gemm", "reduce_scatter"])
    _draw_timeline(ax, outcome.timeline, colors)
    bars = ax.patches
    assert len(bars) == 3 + 2  # rank 1 does not run gemm
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["rank 0 · dp", "rank 0 · tp", "rank 1 · dp"]
    # Iteration 3, each rank relative to its own first start: rank 0's dp lane spans 0..95 µs,
    # rank 1's 0..97 µs even though the two clocks are 9e15 ns apart.
    by_row = {}
    for bar in bars:
        row = round(bar.get_y() + bar.get_height() / 2)
        by_row.setdefault(row, []).append((bar.get_x(), bar.get_x() + bar.get_width()))
    assert min(x for x, _ in by_row[0]) == 0.0 and max(x for _, x in by_row[0]) == 95.0
    assert min(x for x, _ in by_row[2]) == 0.0 and max(x for _, x in by_row[2]) == 97.0
    assert by_row[1] == [(1.0, 95_000 // 3 / 1000.0)]
    assert "Iteration 3" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["allgather", "gemm", "reduce_scatter"]


def test_latency_panel_skips_missing_baseline(mpl):
    from matplotlib.figure import Figure

    from userbenchmark.maestro.core.output.writer import _block_colors, _draw_latency

    colors = _block_colors(["allgather", "gemm", "reduce_scatter"])
    ax = Figure().subplots()
    _draw_latency(ax, make_outcome(), colors)
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights == [30.0, 45.0, 47.0, 50.0, 80.0]  # 3 overlapped + 2 isolated (one NaN)
    assert ax.get_title().endswith("(no baseline: reduce_scatter)")
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["×1.50", "×1.60", ""]  # slowdown over the overlapped bars
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "×1.23: slowdown, overlapped / isolated" in legend  # what the labels are

    wide = make_outcome()  # a slowdown whose interval is wider than itself: no figure drawn
    first = replace(wide.blocks[0], intervals={"slowdown": (0.2, 9.0, 3)})
    ax = Figure().subplots()
    _draw_latency(ax, replace(wide, blocks=(first, *wide.blocks[1:])), colors)
    assert [t.get_text() for t in ax.texts] == ["×?", "×1.60", ""]

    ax = Figure().subplots()
    _draw_latency(ax, make_outcome(isolated=(math.nan,) * 3), colors)
    assert len(ax.patches) == 3
    assert ax.get_title().endswith("(no baseline)")

    ax = Figure().subplots()
    _draw_latency(ax, make_outcome(isolated=(1.0, 2.0, 3.0)), colors)
    assert len(ax.patches) == 6 and "no baseline" not in ax.get_title()


def test_plot_without_timeline_still_draws_latency(mpl, tmp_path):
    outcome = replace(make_outcome(), timeline=None)
    data = plot_pattern(outcome, tmp_path / "p.png").read_bytes()
    assert png_size(data)[0] >= 800


def test_plot_names_that_sanitise_alike_never_overwrite():
    used: set[str] = set()
    assert unique_plot_name("ag_rs[size=4M]", used) == "plot-ag_rs_size_4M.png"
    assert unique_plot_name("ag_rs_size_4M", used) == "plot-ag_rs_size_4M-2.png"
    assert unique_plot_name("ag_rs[size=4M]", used) == "plot-ag_rs_size_4M-3.png"


def test_compare_plot_draws_each_block_of_both_runs(mpl, tmp_path, capsys):
    from tests.unit.test_golden_outputs import _outcomes
    from userbenchmark.maestro.cli import main
    from userbenchmark.maestro.core.output.writer import OutputWriter

    for name in ("a", "b"):
        writer = OutputWriter(output_dir=tmp_path / name, metrics_path=None, environ={})
        for _, outcome, _ in _outcomes():
            writer.add(outcome)
    png = tmp_path / "cmp.png"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--plot", str(png)]) == 0
    width, height = png_size(png.read_bytes())
    assert width >= 800 and height >= 1.5 * 100 + 8 * 45  # a row per block (8 blocks)
    capsys.readouterr()
    (tmp_path / "file").write_text("")
    unwritable = str(tmp_path / "file" / "x.png")  # under a file: no folder can be made
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--plot", unwritable]) == 2
    assert "maestro:" in capsys.readouterr().err
