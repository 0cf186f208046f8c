"""The terminal table rank 0 prints for each finished pattern."""

from __future__ import annotations

import math

from tabulate import tabulate

from ..analysis.records import PatternOutcome
from ..config.sizes import format_size
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


def format_pattern(outcome: PatternOutcome, *, precision: int = 2, unit: str | None = None) -> str:
    """A table of the pattern's blocks, then its pattern-level lines."""
    blocks = outcome.blocks
    lat_cols = (
        "latency_avg_us",
        "latency_min_us",
        "latency_max_us",
        "latency_p99_us",
        "isolated_latency_avg_us",
    )
    values = [getattr(b, c) for b in blocks for c in lat_cols]
    unit = unit or choose_latency_unit(values)
    u = UNIT_LABEL[unit]
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
        f"p99 ({u})",
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
            fmt(b.latency_p99_us),
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
        f"== {p.suite} / {p.pattern}  ({p.iters} iterations, profiler {p.profiler})",
        tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True),
    ]
    ms_unit = choose_latency_unit([p.makespan_avg_us, p.makespan_p99_us])
    fmt_ms = lambda v: format_in_unit(v, ms_unit, precision)  # noqa: E731
    summary = [
        f"makespan avg {fmt_ms(p.makespan_avg_us)} {UNIT_LABEL[ms_unit]}, "
        f"p99 {fmt_ms(p.makespan_p99_us)} {UNIT_LABEL[ms_unit]}"
    ]
    if not math.isnan(p.serial_us):
        summary.append(
            f"serial {fmt_ms(p.serial_us)}, ideal {fmt_ms(p.ideal_us)} "
            f"{UNIT_LABEL[ms_unit]}, overlap efficiency "
            f"{_num(p.overlap_efficiency, 3)} (1 = perfect, 0 = serialized)"
        )
    if not math.isnan(p.shared_busbw_gbps):
        summary.append(f"shared busbw {_num(p.shared_busbw_gbps)} GB/s over the makespan")
    if not math.isnan(p.comm_compute_overlap):
        summary.append(f"comm/compute overlap {_num(p.comm_compute_overlap, 3)}")
    if not math.isnan(p.lane_skew_p50_us):
        summary.append(
            f"lane start skew p50 {_num(p.lane_skew_p50_us)} µs, p99 {_num(p.lane_skew_p99_us)} µs, "
            f"max {_num(p.lane_skew_max_us)} µs"
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
    if p.pairwise_overlap:
        pairs = ", ".join(
            f"{k.replace('|', '∩')} {_num(v, 2)}" for k, v in p.pairwise_overlap.items()
        )
        summary.append(f"pairwise overlap |A∩B|/min(|A|,|B|): {pairs}")
    lines.extend("  " + s for s in summary)
    lines.extend(f"  note: {b.block}: {b.notes}" for b in blocks if b.notes)
    lines.extend(f"  WARNING: {w}" for w in outcome.warnings)
    return "\n".join(lines)
