"""Files rank 0 writes: results/patterns/pairs JSON+CSV and TorchBench's metrics JSON, rewritten
after each finished pattern, together and atomically (locations.py) with SIGINT/SIGTERM held
meanwhile, and the plots (matplotlib, optional, imported only to draw on an Agg canvas)."""

from __future__ import annotations

import importlib.util
import io
import math
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import RunError
from ..analysis.records import PatternOutcome, Timeline
from ..analysis.stats import measurable
from ..analysis.whatif import WhatIfResult
from .locations import atomic_write_bytes, atomic_write_files
from .metric_keys import Judgement, split_bound
from .trace import TRACES_DIR, rank_trace_texts, stale_rank_files


class OutputWriter:
    """Collects finished patterns on rank 0 and rewrites every output file after each one."""

    def __init__(
        self,
        *,
        output_dir: Path | None,
        metrics_path: Path | None,
        environ: Mapping[str, str],
        trace: bool = False,
        plot: bool = False,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        """``guard()`` wraps every update: the runtime passes one that holds SIGINT/SIGTERM
        until the files of the update agree again."""
        self.output_dir = output_dir
        self.metrics_path = metrics_path
        for folder in (output_dir, metrics_path and metrics_path.parent):
            if folder is not None:  # now, never again: a folder removed mid-run stops the run
                folder.mkdir(parents=True, exist_ok=True)
        self.environ = dict(environ)
        self.trace = trace and output_dir is not None
        self.plot = plot and output_dir is not None
        self.outcomes: list[PatternOutcome] = []
        self.whatif: list[WhatIfResult] = []
        self.failures: list[dict[str, str]] = []
        self._plot_names: set[str] = set()
        self._guard = guard
        self.num_metrics = 0  # in the metrics file as last written

    def add(self, outcome: PatternOutcome) -> None:
        with self._guard():  # the plot too: a signal waits until this pattern is saved
            self.outcomes.append(outcome)
            self.flush()
            if self.plot and outcome.timeline is not None:
                name = unique_plot_name(outcome.pattern.pattern, self._plot_names)
                plot_pattern(outcome, self.output_dir / name)

    def add_whatif(self, label: str, results: Sequence[WhatIfResult]) -> None:
        """A pattern's variants against it (``label`` names it in the plot)."""
        with self._guard():
            self.whatif.extend(results)
            self.flush()
            if self.plot and results:
                name = unique_plot_name(f"whatif-{label}", self._plot_names)
                plot_whatif(results, self.output_dir / name, title=f"what if: {label}")

    def add_failure(self, pattern: str, message: str) -> None:
        self.failures.append({"pattern": pattern, "error": message})
        self.flush()

    def flush(self) -> None:
        """Rewrite every output file from what was collected, all together."""
        from .results import metrics_from_results, results_of, run_texts

        with self._guard():
            results = results_of(self.outcomes, self.whatif)
            metrics = metrics_from_results(results) if self.metrics_path is not None else {}
            self.num_metrics = sum(split_bound(key)[1] is None for key in metrics)
            out = self.output_dir
            texts = run_texts(results, self.environ, self.failures, out, self.metrics_path, metrics)
            if self.trace:
                # Never the output folder itself: one removed during the run stays gone.
                (out / TRACES_DIR).mkdir(exist_ok=True)
                for name, text in rank_trace_texts(self.outcomes).items():
                    texts[out / TRACES_DIR / name] = text  # one per rank, for HTA
            atomic_write_files({path: text.encode("utf-8") for path, text in texts.items()})
            if self.trace:
                for path in stale_rank_files(out / TRACES_DIR, (p.name for p in texts)):
                    path.unlink()  # an earlier, larger run's rank: HTA would read it as ours


# ---- plots: per pattern, one iteration's timeline per rank and lane and latency alone vs
# overlapped; compare --plot's latency of each block in two runs ----
MISSING_MATPLOTLIB = "--plot needs matplotlib: pip install matplotlib"
PLOT_SUFFIXES = (".png", ".pdf", ".svg")
"""What ``compare --plot FILE`` writes: the format its suffix names (matplotlib's own)."""


def matplotlib_available() -> bool:
    """Whether ``--plot`` can work (checked before a run starts)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # a broken or None entry in sys.modules
        return False


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RunError(MISSING_MATPLOTLIB) from None
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def median_makespan_iteration(timeline: Timeline) -> int | None:
    """Iteration of the (lower) median makespan, ties to the earliest; an iteration's makespan
    is the max over ranks of each rank's own (last end - first start on its clock, never
    compared across ranks). None when no rank has an interval."""
    rows = timeline.rank_arrays()
    per_rank = [ends[p].max(axis=0) - starts[p].min(axis=0) for _, starts, ends, p in rows]
    if not per_rank:
        return None
    num_iters = min(len(m) for m in per_rank)
    makespans = np.max(np.stack([m[:num_iters] for m in per_rank]), axis=0)
    return int(np.argsort(makespans, kind="stable")[(num_iters - 1) // 2])


def _block_colors(names: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


_BAR_STYLE = {"height": 0.7, "edgecolor": "black", "linewidth": 0.5}


def _draw_timeline(ax: Any, timeline: Timeline | None, colors: dict[str, Any]) -> None:
    it = median_makespan_iteration(timeline) if timeline is not None else None
    if timeline is None or it is None:
        ax.set_title("Timeline: no intervals recorded")
        ax.set_axis_off()
        return
    rows = _timeline_rows(timeline)
    drawn = {timeline.block_names[b] for *_, blocks in rows for b in blocks}
    for y, ((_, starts, ends, present), _, blocks) in enumerate(rows):
        origin_ns = int(starts[present, it].min())
        for b in blocks:
            left_us = (int(starts[b, it]) - origin_ns) / 1000.0
            width_us = (int(ends[b, it]) - int(starts[b, it])) / 1000.0
            ax.barh(y, width_us, left=left_us, color=colors[timeline.block_names[b]], **_BAR_STYLE)
    ax.set_yticks(range(len(rows)), [f"rank {arrays[0].rank} · {lane}" for arrays, lane, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time since the rank's first start in this iteration (µs)")
    ax.set_title(f"Iteration {it} (median makespan), each rank on its own clock")
    ax.grid(axis="x", alpha=0.3)
    if drawn:
        # Legend in the pattern's block order, not in drawing (rank, lane) order.
        _legend(ax, [(colors[n], n) for n in dict.fromkeys(timeline.block_names) if n in drawn])


def _legend(ax: Any, entries: Sequence[tuple[Any, str]]) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=color, edgecolor="black", label=label) for color, label in entries]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")


def _draw_latency(ax: Any, outcome: PatternOutcome, colors: dict[str, Any]) -> None:
    names = [b.block for b in outcome.blocks]
    x = np.arange(len(names), dtype=float)
    width = 0.4
    overlapped = [b.latency_avg_us for b in outcome.blocks]
    isolated = np.array([b.isolated_latency_avg_us for b in outcome.blocks], dtype=float)
    has_iso = np.isfinite(isolated)
    if has_iso.any():
        ax.bar(
            x[has_iso] - width / 2, isolated[has_iso], width, color="lightgray", edgecolor="black"
        )
    colored = [colors.get(n, "tab:blue") for n in names]
    bars = ax.bar(x + width / 2, overlapped, width, color=colored, edgecolor="black")
    # The slowdown the run computed (overlapped / isolated), where a baseline exists.
    labels = ["" if math.isnan(b.slowdown) else _slowdown_label(b) for b in outcome.blocks]
    ax.bar_label(bars, labels, padding=2, fontsize="small")
    ax.margins(y=0.15)
    ax.set_xticks(x, names, rotation=20 if len(names) > 4 else 0)
    ax.set_ylabel("average latency (µs)")
    title = "Average latency per block: isolated vs overlapped"
    missing = [n for n, ok in zip(names, has_iso.tolist(), strict=True) if not ok]
    if missing and len(missing) == len(names):
        title += " (no baseline)"
    elif missing:
        title += f" (no baseline: {', '.join(missing)})"
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    if names:
        entries = [("lightgray", "isolated (alone)"), ("white", "overlapped (block colour)")]
        _legend(ax, [*entries, ("white", "×1.23: slowdown, overlapped / isolated")])


def _slowdown_label(block: Any) -> str:
    low, high, _ = block.intervals.get("slowdown", (math.nan,) * 3)
    return f"×{block.slowdown:.2f}" if measurable("slowdown", block.slowdown, low, high) else "×?"


def _timeline_rows(timeline: Timeline) -> list[tuple[Any, str, list[int]]]:
    rows = []
    for arrays in sorted(timeline.rank_arrays(), key=lambda r: r[0].rank):
        present = np.flatnonzero(arrays[3]).tolist()
        for lane in dict.fromkeys(timeline.block_lanes):
            blocks = [b for b in present if timeline.block_lanes[b] == lane]
            if blocks:
                rows.append((arrays, lane, blocks))
    return rows


def plot_pattern(outcome: PatternOutcome, path: str | Path) -> Path:
    """Draw ``outcome`` as a two-panel PNG at ``path`` (RunError without matplotlib)."""
    timeline = outcome.timeline
    timeline_names = list(timeline.block_names) if timeline is not None else []
    names = list(dict.fromkeys([b.block for b in outcome.blocks] + timeline_names))
    num_rows = max(1, len(_timeline_rows(timeline)) if timeline is not None else 0)
    fig = _figure(11, 3.5 + 0.35 * min(num_rows, 40))
    colors = _block_colors(names)
    top, bottom = fig.subplots(2, 1, height_ratios=[max(1.0, 0.25 * num_rows), 1.0])
    _draw_timeline(top, timeline, colors)
    _draw_latency(bottom, outcome, colors)
    fig.suptitle(f"{outcome.pattern.suite} / {outcome.pattern.pattern}")
    return _save(fig, Path(path))


def _save(fig: Any, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix[1:].lower() or "png")
    atomic_write_bytes(path, buf.getvalue())
    return path


def unique_plot_name(pattern: str, used: set[str]) -> str:
    """``plot-<pattern>.png`` with unsafe characters as ``_``, suffixed ``-2``, ``-3``... when
    taken in ``used`` (a@b and a_b sanitise alike), and recorded there."""
    stem = "plot-" + (re.sub(r"[^A-Za-z0-9._-]+", "_", pattern).strip("._") or "pattern")
    name, n = f"{stem}.png", 2
    while name in used:
        name, n = f"{stem}-{n}.png", n + 1
    used.add(name)
    return name


_VERDICT_COLORS = {"regressed": "tab:red", "improved": "tab:green"}


def plot_compare(judgements: Sequence[Judgement], path: str | Path, *, title: str) -> Path:
    """A plot of every block's average latency, A against B, each with its 95 % interval (B in
    red where it regressed beyond noise, green where it improved); RunError without
    matplotlib, ValueError when no block has an average latency on both sides."""
    rows = [j for j in judgements if j.key.endswith("/latency_avg_us") and j.key.count("/") == 3]
    if not rows:
        raise ValueError("no block has an average latency in both files: nothing to plot")
    ax = _figure(10, 1.5 + 0.45 * len(rows)).subplots()
    y = np.arange(len(rows), dtype=float)
    for offset, side, label in ((-0.15, "control", "A"), (0.15, "treatment", "B")):
        for yi, j in zip(y, rows, strict=True):
            r = getattr(j, side)
            color = "tab:blue" if side == "control" else _VERDICT_COLORS.get(j.verdict, "gray")
            err = [[r.value - r.low], [r.high - r.value]] if r.has_interval else None
            ax.errorbar(r.value, yi + offset, xerr=err, fmt="o", color=color, capsize=3)
        ax.plot([], [], "o", color="tab:blue" if label == "A" else "gray", label=label)
    ax.set_yticks(y, [j.key.rsplit("/", 1)[0] for j in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("average latency (µs), 95 % interval")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    ax.set_title(title + "\nB in red: regressed beyond noise; green: improved")
    return _save(ax.figure, Path(path))


_WHATIF_COLORS = {"slower": "tab:red", "faster": "tab:green"}


def plot_whatif(results: Sequence[WhatIfResult], path: str | Path, *, title: str) -> Path:
    """Each variant's change of the makespan against its pattern with its 95 % interval, red
    where slower beyond noise, green where faster (RunError without matplotlib)."""
    ax = _figure(9, 1.5 + 0.45 * len(results)).subplots()
    y = np.arange(len(results), dtype=float)
    for yi, r in zip(y, results, strict=True):
        err = [[r.change_pct - r.change_ci_low_pct], [r.change_ci_high_pct - r.change_pct]]
        color = _WHATIF_COLORS.get(r.verdict, "gray")
        ax.errorbar(r.change_pct, yi, xerr=err, fmt="o", color=color, capsize=3)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(y, [f"{r.variant} ({r.verdict})" for r in results])
    ax.invert_yaxis()
    ax.set_xlabel("makespan against the pattern (%), 95 % interval, paired by round")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title + "\nred: slower beyond noise; green: faster; gray: within noise")
    return _save(ax.figure, Path(path))
