"""The terminal tables rank 0 prints: one per finished pattern, one per sweep at the end.

One latency unit per table, and per sweep (every point of a sweep uses its first point's
unit); p99 is shown only when the iteration count makes it differ from the max.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from ..analysis.records import PatternOutcome
from ..config.sizes import format_size
from ..config.spec import PatternSpec
from .units import choose_latency_unit, format_in_unit

UNIT_LABEL = {"us": "µs", "ms": "ms", "s": "s"}


def _num(value: float | int | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int):
        return str(value)
    if value != 0 and abs(value) < 10**-digits:
        return f"{value:.{digits}g}"
    return f"{value:.{digits}f}"


LATENCY_COLUMNS = (
    "latency_avg_us",
    "latency_min_us",
    "latency_max_us",
    "latency_p99_us",
    "isolated_latency_avg_us",
)
MIN_ITERS_FOR_P99 = 100
"""Below this many iterations the nearest-rank p99 (the ceil(0.99 N)-th value) is the max."""


def pattern_unit(outcome: PatternOutcome) -> str:
    """The one latency unit that suits every latency of the pattern's table."""
    return choose_latency_unit([getattr(b, c) for b in outcome.blocks for c in LATENCY_COLUMNS])


def format_pattern(outcome: PatternOutcome, *, precision: int = 2, unit: str | None = None) -> str:
    """A table of the pattern's blocks, then its pattern-level lines (``unit``: the sweep's)."""
    blocks = outcome.blocks
    unit = unit or pattern_unit(outcome)
    u = UNIT_LABEL[unit]
    show_p99 = outcome.pattern.iters >= MIN_ITERS_FOR_P99
    show_iso = any(not math.isnan(b.isolated_latency_avg_us) for b in blocks)
    show_check = any(b.wrong_elements is not None for b in blocks)
    headers = [
        "block",
        "op",
        "axis",
        "size",
        f"avg ({u})",
        f"min ({u})",
        f"max ({u})",
        *([f"p99 ({u})"] if show_p99 else []),
        "algbw GB/s",
        "busbw GB/s",
        "TFLOP/s",
    ]
    if show_iso:
        headers += [f"alone ({u})", "slowdown"]
    if show_check:
        headers += ["#wrong"]
    rows = []
    for b in blocks:
        fmt = lambda v: format_in_unit(v, unit, precision)  # noqa: E731
        row = [
            b.block,
            b.op,
            f"{b.axis}({b.team_size})",
            format_size(b.size_bytes) if b.size_bytes else "-",
            fmt(b.latency_avg_us),
            fmt(b.latency_min_us),
            fmt(b.latency_max_us),
            *([fmt(b.latency_p99_us)] if show_p99 else []),
            _num(b.algbw_gbps),
            _num(b.busbw_gbps),
            _num(b.tflops),
        ]
        if show_iso:
            row += [fmt(b.isolated_latency_avg_us), _num(b.slowdown, 3)]
        if show_check:
            row += ["-" if b.wrong_elements is None else str(b.wrong_elements)]
        rows.append(row)
    p = outcome.pattern
    lines = [
        f"== {p.suite} / {p.pattern}  ({p.iters} iterations, profiler {p.profiler}"
        + (f", ranks per GPU: {p.ranks_per_gpu}" if p.ranks_per_gpu else "")
        + ")",
        tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True),
    ]
    fmt_u = lambda v: format_in_unit(v, unit, precision)  # noqa: E731
    makespan = f"makespan avg {fmt_u(p.makespan_avg_us)} {u}"
    if show_p99:
        makespan += f", p99 {fmt_u(p.makespan_p99_us)} {u}"
    summary = [makespan]
    if not math.isnan(p.serial_us):
        summary.append(
            f"serial {fmt_u(p.serial_us)}, ideal {fmt_u(p.ideal_us)} {u}, overlap efficiency "
            f"{_num(p.overlap_efficiency, 3)} (1 = perfect, 0 = serialized)"
        )
    if not math.isnan(p.shared_busbw_gbps):
        summary.append(f"shared busbw {_num(p.shared_busbw_gbps)} GB/s over the makespan")
    if not math.isnan(p.comm_compute_overlap):
        summary.append(f"comm/compute overlap {_num(p.comm_compute_overlap, 3)}")
    if not math.isnan(p.lane_skew_p50_us):
        p99 = f"p99 {_num(p.lane_skew_p99_us)} µs, " if show_p99 else ""
        summary.append(
            f"lane start skew p50 {_num(p.lane_skew_p50_us)} µs, {p99}"
            f"max {_num(p.lane_skew_max_us)} µs"
        )
    if not math.isnan(p.gate_skew_p50_us):
        summary.append(
            f"ranks' gate opening skew p50 {_num(p.gate_skew_p50_us)} µs, "
            f"max {_num(p.gate_skew_max_us)} µs"
        )
    if not math.isnan(p.gate_spin_us):
        gate = (
            f"gate spin {_num(p.gate_spin_us, 1)} µs, host enqueue up to "
            f"{_num(p.enqueue_max_us, 1)} µs per iteration"
        )
        if p.host_late_iters:
            gate += f" ({p.host_late_iters} iterations launch-bound)"
        if not math.isnan(p.gate_delay_max_us):
            gate += f", first start up to {_num(p.gate_delay_max_us)} µs after the gate opened"
        summary.append(gate)
    if outcome.pairs:
        pairs = ", ".join(
            f"{'∩'.join(pair.blocks)} {_num(pair.pairwise_overlap, 2)}" for pair in outcome.pairs
        )
        summary.append(f"pairwise overlap |A∩B|/min(|A|,|B|): {pairs}")
    if not show_p99:
        summary.append(
            f"p99 not shown: with {p.iters} iterations (< {MIN_ITERS_FOR_P99}) the nearest-rank "
            "p99 is the max (the files hold it)"
        )
    lines.extend("  " + s for s in summary)
    lines.extend(f"  note: {note}" for note in p.notes.split("; ") if p.notes)
    lines.extend(f"  note: {b.block}: {b.notes}" for b in blocks if b.notes)
    lines.extend(f"  WARNING: {w}" for w in outcome.warnings)
    return "\n".join(lines)


def _replay_row(name: str, op: str, *figures: Any) -> list[str]:
    traced, replayed, ratio, low, high = figures
    bounds = (
        f" [{_num(low, 3)}, {_num(high, 3)}]" if low is not None and not math.isnan(low) else ""
    )
    return [name, op, _num(traced, 1), _num(replayed, 1), _num(ratio, 3) + bounds]


def format_fidelity(outcome: PatternOutcome) -> str:
    """An imported pattern against its trace: each block, the step and each rank's step,
    replayed / traced (empty for a pattern without traced durations)."""
    p = outcome.pattern
    ci = lambda r: (r.replay_ratio, r.replay_ratio_ci_low, r.replay_ratio_ci_high)  # noqa: E731
    rows = [
        _replay_row(b.block, b.op, b.traced_us, b.latency_avg_us, *ci(b))
        for b in outcome.blocks
        if not math.isnan(b.traced_us)
    ]
    if not math.isnan(p.traced_us):
        rows.append(_replay_row("step (makespan)", "", p.traced_us, p.makespan_avg_us, *ci(p)))
    for r in json.loads(p.replay_by_rank or "[]"):
        keys = ("traced_us", "replayed_us", "ratio", "ci_low", "ci_high")
        rows.append(_replay_row(f"step, rank {r['rank']}", "", *(r[k] for k in keys)))
    headers = ["replayed against the trace", "op", "traced µs", "replayed µs"]
    headers.append("replayed / traced [95 % interval; the trace is one sample]")
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True) if rows else ""


def format_sweep_summary(
    points: Sequence[tuple[str, PatternOutcome]], *, precision: int = 2, unit: str
) -> str:
    """One table for every point of a sweep: (point label, outcome) pairs in run order."""
    u = UNIT_LABEL[unit]
    rows = []
    for label, outcome in points:
        for b in outcome.blocks:
            rows.append(
                [
                    label,
                    b.block,
                    format_size(b.size_bytes) if b.size_bytes else "-",
                    format_in_unit(b.latency_avg_us, unit, precision),
                    _num(b.algbw_gbps),
                    _num(b.busbw_gbps),
                    _num(b.tflops),
                    _num(b.slowdown, 3),
                ]
            )
    headers = ["point", "block", "size", f"avg ({u})", "algbw GB/s", "busbw GB/s"]
    headers += ["TFLOP/s", "slowdown"]
    first = points[0][1].pattern
    base = first.pattern.split("[", 1)[0]
    title = f"== {first.suite} / {base}: sweep of {len(points)} points"
    return title + "\n" + tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


class Tables:
    """Rank 0's terminal output for a run: each pattern's table in its sweep's unit as it
    finishes, and one summary table per sweep at the end."""

    def __init__(self, *, precision: int = 2) -> None:
        self.precision = precision
        self._units: dict[str, str] = {}
        self._points: dict[str, list[tuple[str, PatternOutcome]]] = {}

    def pattern(self, spec: PatternSpec, outcome: PatternOutcome) -> str:
        """The table of one finished pattern (a sweep's points share the first one's unit)."""
        unit = self._units.setdefault(spec.base_name, pattern_unit(outcome))
        label = ",".join(f"{name}={value}" for name, value in spec.sweep_point) or spec.name
        self._points.setdefault(spec.base_name, []).append((label, outcome))
        text = format_pattern(outcome, precision=self.precision, unit=unit)
        return "\n".join(filter(None, (text, format_fidelity(outcome))))

    def sweep_summaries(self) -> list[str]:
        """One table per sweep that finished at least two points."""
        return [
            format_sweep_summary(points, precision=self.precision, unit=self._units[base])
            for base, points in self._points.items()
            if len(points) >= 2
        ]
