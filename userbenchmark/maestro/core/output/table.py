"""The terminal tables rank 0 prints: one per finished pattern, one per sweep at the end, in
one latency unit per table and per sweep; p99 only where it differs from the max; derived
figures with their 95 % interval."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike
from tabulate import tabulate

from ..analysis.outcome import MIN_ITERS_FOR_P99, below_ideal
from ..analysis.records import BlockResult, PatternOutcome, PatternResult
from ..analysis.stats import measurable
from ..analysis.whatif import WHATIF_FLOOR, WhatIfResult
from ..config.sizes import counted, format_size
from ..config.spec import PatternSpec
from ..replay.fidelity import error_groups

UNIT_LABEL = {"us": "µs", "ms": "ms", "s": "s"}

# Microseconds per unit. Units are spelled in ASCII so tables and CSV stay plain text.
LATENCY_UNIT_SCALE_US: Final[dict[str, float]] = {"us": 1.0, "ms": 1e3, "s": 1e6}


def choose_latency_unit(values_us: ArrayLike) -> str:
    """One display unit for a column of latencies in microseconds: the largest unit that the
    smallest positive finite value fills at least once ("us" when there is none)."""
    arr = np.asarray(values_us, dtype=np.float64).ravel()
    positive = arr[np.isfinite(arr) & (arr > 0)]
    smallest = float(positive.min()) if positive.size else 0.0
    return next((u for u in ("s", "ms") if smallest >= LATENCY_UNIT_SCALE_US[u]), "us")


def format_in_unit(value_us: float, unit: str, precision: int = 2) -> str:
    """A latency in microseconds, in ``unit``, with ``precision`` decimals, or the fewest that
    show a non-zero value (0.0004 ms at precision 2: "0.0004"); NaN "n/a"; never scientific."""
    value_us = float(value_us)
    if math.isnan(value_us):
        return "n/a"
    value = value_us / LATENCY_UNIT_SCALE_US[unit]  # infinite: prints as inf or -inf below
    text = f"{value:.{precision}f}"
    if value == 0.0 or float(text) != 0.0:
        return text
    # Start one short of the first significant digit (0.00096 rounds to 0.001) and step up.
    decimals = max(precision + 1, -math.floor(math.log10(abs(value))) - 1)
    text = f"{value:.{decimals}f}"
    while float(text) == 0.0:
        decimals += 1
        text = f"{value:.{decimals}f}"
    return text


def _num(value: float | int | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int):
        return str(value)
    if value != 0 and abs(value) < 10**-digits:
        return f"{value:.{digits}g}"
    if abs(value) >= 1e6:  # an interval bound of a few iterations: 1.76e+08, not 176042000.904
        return f"{value:.3g}"
    return f"{value:.{digits}f}"


def _with_interval(
    record: BlockResult | PatternResult, name: str, digits: int, *, bounds: bool = True
) -> str:
    """The figure ``name`` and its interval; "not measurable" where the interval is wider than
    the figure's range (the note under the table says why, with the value)."""
    value = getattr(record, name)
    low, high, _ = record.intervals.get(name, (math.nan, math.nan, 0))
    if not measurable(name, value, low, high):
        return "not measurable (see note)" if bounds else "not measurable"
    if math.isnan(low) or math.isnan(value) or not bounds:
        return _num(value, digits)
    return f"{_num(value, digits)} [{_num(low, digits)}, {_num(high, digits)}]"


def _size(size_bytes: int | None) -> str:
    return format_size(size_bytes) if size_bytes else "-"


LATENCY_COLUMNS = ("latency_avg_us", "latency_min_us", "latency_max_us", "latency_p99_us",
                   "isolated_latency_avg_us")  # fmt: skip


def pattern_unit(outcome: PatternOutcome) -> str:
    """The one latency unit that suits every latency of the pattern's table."""
    return choose_latency_unit([getattr(b, c) for b in outcome.blocks for c in LATENCY_COLUMNS])


def _block_table(outcome: PatternOutcome, unit: str, precision: int) -> str:
    u = UNIT_LABEL[unit]
    show_p99 = outcome.pattern.iters >= MIN_ITERS_FOR_P99
    show_iso = any(not math.isnan(b.isolated_latency_avg_us) for b in outcome.blocks)
    show_check = any(b.wrong_elements is not None for b in outcome.blocks)
    headers = ["block", "op", "axis", "size", f"avg ({u})", f"min ({u})", f"max ({u})"]
    headers += [f"p99 ({u})"] if show_p99 else []
    headers += ["algbw GB/s", "busbw GB/s", "TFLOP/s"]
    headers += [f"alone ({u})", "slowdown [95 % interval]"] if show_iso else []
    headers += ["#wrong"] if show_check else []
    latencies = LATENCY_COLUMNS[:4] if show_p99 else LATENCY_COLUMNS[:3]
    fmt = lambda v: format_in_unit(v, unit, precision)  # noqa: E731
    rows = []
    for b in outcome.blocks:
        row = [b.block, b.op, f"{b.axis}({b.team_size})", _size(b.size_bytes)]
        row += [fmt(getattr(b, c)) for c in latencies]
        row += [_num(b.algbw_gbps), _num(b.busbw_gbps), _num(b.tflops)]
        if show_iso:
            row += [fmt(b.isolated_latency_avg_us), _with_interval(b, "slowdown", 3)]
        row += [_num(b.wrong_elements)] if show_check else []  # an int, or "-" for None
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


MAX_PAIRS_SHOWN = 12  # under a pattern's table, those that ran together most; pairs.* has all


def _overlap_lines(outcome: PatternOutcome, unit: str, precision: int) -> list[str]:
    p = outcome.pattern
    u = UNIT_LABEL[unit]
    fmt = lambda v: format_in_unit(v, unit, precision)  # noqa: E731
    lines = []
    if not math.isnan(p.makespan_avg_us):
        p99 = "" if math.isnan(p.makespan_p99_us) else f", p99 {fmt(p.makespan_p99_us)} {u}"
        lines.append(f"makespan avg {fmt(p.makespan_avg_us)} {u}{p99}")
    if not math.isnan(p.serial_us):
        # Below the ideal cannot be (outcome.py's note says why): marked where it is read.
        flag = " (!: makespan below ideal, see note)" if below_ideal(p) else ""
        lines.append(
            f"serial {fmt(p.serial_us)}, ideal {fmt(p.ideal_us)} {u}, overlap efficiency "
            f"{_with_interval(p, 'overlap_efficiency', 3)}{flag} (1 = perfect, 0 = serialized)"
        )
    if not math.isnan(p.shared_busbw_gbps):
        lines.append(
            f"shared busbw {_with_interval(p, 'shared_busbw_gbps', 2)} GB/s over the makespan"
        )
    if not math.isnan(p.comm_compute_overlap):
        lines.append(f"comm/compute overlap {_with_interval(p, 'comm_compute_overlap', 3)}")
    # Blocks of one lane run in turn: only pairs of different lanes can run together.
    lane = {b.block: b.lane for b in outcome.blocks}
    pairs = [pair for pair in outcome.pairs if lane[pair.blocks[0]] != lane[pair.blocks[1]]]
    if pairs:
        # Running at the same time is not sharing nothing: the slowdowns beside each pair say
        # whether the two took turns (two GEMMs on all SMs overlap 1.0 and slow down 2x).
        slowdown = {b.block: _with_interval(b, "slowdown", 2, bounds=False) for b in outcome.blocks}
        shown, more = pairs, ""  # in block order; when too many, those that ran together most
        if len(pairs) > MAX_PAIRS_SHOWN:
            shown = sorted(pairs, key=lambda pair: -np.nan_to_num(pair.pairwise_overlap))
            more = f"; {len(pairs) - MAX_PAIRS_SHOWN} more pairs in pairs.json"
        text = ", ".join(
            f"{'∩'.join(pair.blocks)} {_num(pair.pairwise_overlap, 2)} "
            f"({', '.join(slowdown[name] for name in pair.blocks)})"
            for pair in shown[:MAX_PAIRS_SHOWN]
        )
        lines.append(f"ran together (both running / shorter block; their slowdowns): {text}{more}")
    return lines


def _timing_lines(p: PatternResult) -> list[str]:
    lines = []
    if not math.isnan(p.lane_skew_p50_us):
        p99 = "" if math.isnan(p.lane_skew_p99_us) else f"p99 {_num(p.lane_skew_p99_us)} µs, "
        lines.append(
            f"lane start skew p50 {_num(p.lane_skew_p50_us)} µs, {p99}"
            f"max {_num(p.lane_skew_max_us)} µs"
        )
    if not math.isnan(p.gate_skew_p50_us):
        lines.append(
            f"ranks' gate opening skew p50 {_num(p.gate_skew_p50_us)} µs, "
            f"max {_num(p.gate_skew_max_us)} µs"
        )
    if not math.isnan(p.gate_spin_us):
        gate = (
            f"gate spin {_num(p.gate_spin_us, 1)} µs, host enqueue up to "
            f"{_num(p.enqueue_max_us, 1)} µs per iteration"
        )
        if p.host_late_iters:
            gate += f" ({counted(p.host_late_iters, 'iteration')} launch-bound)"
        if not math.isnan(p.gate_delay_max_us):
            gate += f", first start up to {_num(p.gate_delay_max_us)} µs after the gate opened"
        lines.append(gate)
    elif p.host_late_iters:
        lines.append(f"ranks started apart in {p.host_late_iters} of {p.iters} iterations")
    if p.iters < MIN_ITERS_FOR_P99:
        lines.append(
            f"p99 left out: with {counted(p.iters, 'iteration')} (< {MIN_ITERS_FOR_P99}) the "
            "nearest-rank p99 is the max"
        )
    return lines


def format_pattern(outcome: PatternOutcome, *, precision: int = 2, unit: str | None = None) -> str:
    """A table of the pattern's blocks, then its pattern-level lines (``unit``: the sweep's);
    not its warnings: the caller logs them."""
    unit = unit or pattern_unit(outcome)
    p = outcome.pattern
    gpu = f", ranks per GPU: {p.ranks_per_gpu}" if p.ranks_per_gpu else ""
    title = (
        f"== {p.suite} / {p.pattern}  ({counted(p.iters, 'iteration')}, profiler {p.profiler}{gpu})"
    )
    lines = [title, _block_table(outcome, unit, precision)]
    lines += ["  " + s for s in _overlap_lines(outcome, unit, precision) + _timing_lines(p)]
    lines += [f"  note: {note}" for note in p.notes.split("; ") if p.notes]
    lines += [f"  note: {b.block}: {b.notes}" for b in outcome.blocks if b.notes]
    return "\n".join(lines)


def _replay_row(name: str, op: str, *figures: Any, kernel: str = "") -> list[str]:
    traced, replayed, ratio, low, high = figures
    bounds = "" if low is None or math.isnan(low) else f" [{_num(low, 3)}, {_num(high, 3)}]"
    return [name, op, _num(traced, 1), _num(replayed, 1), _num(ratio, 3) + bounds, kernel]


def _kernels(b: BlockResult) -> str:
    if b.traced_kernel and b.kernel and b.traced_kernel != b.kernel:
        return f"{b.kernel} (traced: {b.traced_kernel})"
    return b.kernel or b.traced_kernel


def _gemm_error_lines(outcome: PatternOutcome) -> list[str]:
    gemms = [b for b in outcome.blocks if b.op == "gemm" and not math.isnan(b.traced_us)]
    if not gemms:
        return []
    groups = error_groups(
        [b.replay_ratio for b in gemms],
        [0.0 if math.isnan(b.traced_overlap) else b.traced_overlap for b in gemms],
    )
    return [
        f"  GEMMs that {g.name}: {g.count}, |replayed / traced - 1| mean {g.mean_error:.1%}, "
        f"max {g.max_error:.1%}, within 3 %: {g.within}"
        for g in groups
        if g.count
    ]


def format_fidelity(outcome: PatternOutcome, pattern: PatternSpec | None = None) -> str:
    """An imported pattern against its trace: each block, the step and each rank's step,
    replayed / traced, and whether each block's replay falls inside the range it had over the
    traced steps (``pattern``'s ``traced_min_us``/``traced_max_us``); empty without traced
    durations."""
    p = outcome.pattern
    ci = lambda r: (r.replay_ratio, r.replay_ratio_ci_low, r.replay_ratio_ci_high)  # noqa: E731
    spread = {
        b.name: (b.traced_min_us, b.traced_max_us)
        for b in (pattern.blocks if pattern else ())
        if b.traced_min_us is not None and b.traced_max_us is not None
    }
    inside = {
        b.block: spread[b.block][0] <= b.latency_avg_us <= spread[b.block][1]
        for b in outcome.blocks
        if b.block in spread
    }
    rows = [
        _replay_row(b.block, b.op, b.traced_us, b.latency_avg_us, *ci(b), kernel=_kernels(b))
        + [{True: "yes", False: "no"}.get(inside.get(b.block), "-")] * bool(spread)
        for b in outcome.blocks
        if not math.isnan(b.traced_us)
    ]
    if not math.isnan(p.traced_us):
        rows.append(_replay_row("step (makespan)", "", p.traced_us, p.makespan_avg_us, *ci(p)))
    for r in json.loads(p.replay_by_rank or "[]"):
        keys = ("traced_us", "replayed_us", "ratio", "ci_low", "ci_high")
        rows.append(_replay_row(f"step, rank {r['rank']}", "", *(r[k] for k in keys)))
    headers = ["replayed against the trace", "op", "traced µs", "replayed µs"]
    headers += ["replayed / traced [95 % interval of the replay]", "kernel"]
    headers += ["inside the traced range"] * bool(spread)
    if not rows:
        return ""
    table = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
    count = [
        f"  inside their traced range (min to max over the traced steps): {sum(inside.values())} "
        f"of {len(inside)} blocks"
    ] * bool(inside)
    return "\n".join([table, *count, *_gemm_error_lines(outcome)])


def format_sweep_summary(
    points: Sequence[tuple[str, PatternOutcome]], *, precision: int = 2, unit: str
) -> str:
    """One table for every point of a sweep: (point label, outcome) pairs in run order."""
    u = UNIT_LABEL[unit]
    rows = [
        [label, b.block, _size(b.size_bytes)]
        + [format_in_unit(b.latency_avg_us, unit, precision), _num(b.algbw_gbps)]
        + [_num(b.busbw_gbps), _num(b.tflops), _with_interval(b, "slowdown", 3, bounds=False)]
        for label, outcome in points
        for b in outcome.blocks
    ]
    headers = ["point", "block", "size", f"avg ({u})", "algbw GB/s", "busbw GB/s"]
    headers += ["TFLOP/s", "slowdown"]
    first = points[0][1].pattern
    title = f"== {first.suite} / {first.pattern.split('[', 1)[0]}: sweep of {len(points)} points"
    return title + "\n" + tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def format_whatif(results: Sequence[WhatIfResult], *, precision: int = 2) -> str:
    """One row per variant of one pattern: its makespan, the change against the pattern's with
    its 95 % interval, paired by round, the verdict, and the block whose latency changed most."""
    unit = choose_latency_unit([r.base_makespan_avg_us for r in results])
    fmt = lambda v: format_in_unit(v, unit, precision)  # noqa: E731
    rows = [
        [r.variant, str(r.rounds), fmt(r.makespan_avg_us), fmt(r.base_makespan_avg_us)]
        + [f"{r.change_pct:+.2f} % [{r.change_ci_low_pct:+.2f}, {r.change_ci_high_pct:+.2f}]"]
        + [r.verdict, f"{r.block} {r.block_change_pct:+.2f} %" if r.block else "-"]
        for r in results
    ]
    u = UNIT_LABEL[unit]
    headers = ["variant", "rounds", f"makespan ({u})", f"pattern ({u})"]
    headers += ["change [95 % interval]", "verdict", "block latency changed most"]
    title = (
        f"== what if: {results[0].suite} / {results[0].pattern}  (paired by round; slower or "
        f"faster: the interval excludes 0 and the change is past {WHATIF_FLOOR * 100:g} %)"
    )
    return title + "\n" + tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def late_start_note(patterns: Sequence[PatternResult]) -> str:
    """One line for every CPU pattern whose ranks did not all start an iteration together
    (the agreed start instant had passed when a rank learned it); empty when none."""
    late = [p for p in patterns if p.host_late_iters and math.isnan(p.gate_spin_us)]
    if not late:
        return ""
    iters = sum(p.host_late_iters or 0 for p in late)
    which = ", ".join(f"{p.pattern} {p.host_late_iters}/{p.iters}" for p in late[:5])
    return (
        f"note: in {counted(iters, 'iteration')} of {len(late)} of {len(patterns)} patterns ({which}"
        f"{', ...' if len(late) > 5 else ''}) a rank learned the agreed start instant after "
        "it had passed, so the ranks did not start together and a collective's latency there "
        "includes waiting for the late rank (a busy host; more warmup_iters calibrate the "
        "start margin on more iterations)"
    )


class Tables:
    """Rank 0's terminal output for a run: each pattern's table in its sweep's unit as it
    finishes, and at the end one summary table per sweep and the run's notes."""

    def __init__(self, *, precision: int = 2) -> None:
        self.precision = precision
        self._units: dict[str, str] = {}
        self._points: dict[str, list[tuple[str, PatternOutcome]]] = {}

    def pattern(self, spec: PatternSpec, outcome: PatternOutcome) -> str:
        """The table of one finished pattern (a sweep's points share the first one's unit)."""
        unit = self._units.setdefault(spec.base_name, pattern_unit(outcome))
        label = ",".join(f"{name}={value}" for name, value in spec.sweep_point) or spec.name
        if spec.variant is None:  # a sweep's summary holds its points, not their variants
            self._points.setdefault(spec.base_name, []).append((label, outcome))
        text = format_pattern(outcome, precision=self.precision, unit=unit)
        return "\n".join(filter(None, (text, format_fidelity(outcome, spec))))

    def closing(self) -> list[str]:
        """What to print after the last pattern: one table per sweep that finished at least
        two points, then notes about the whole run (repeats summed up once)."""
        texts = [
            format_sweep_summary(points, precision=self.precision, unit=self._units[base])
            for base, points in self._points.items()
            if len(points) >= 2
        ]
        note = late_start_note([o.pattern for pts in self._points.values() for _, o in pts])
        return texts + ([note] if note else [])
