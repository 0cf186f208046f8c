"""An imported pattern's replay against its trace: replayed / traced ratios with intervals, per
rank too, whether each replay falls inside the traced range, errors by group."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..analysis import overlap
from ..analysis.aggregate import WindowAggregate
from ..analysis.intervals import WindowTimings
from ..analysis.records import BlockResult, PatternOutcome, PatternResult
from ..analysis.stats import Phase, degrees_of_freedom, interval
from ..config.spec import PatternSpec

R = TypeVar("R", BlockResult, PatternResult)


def ratio(durations_ns: np.ndarray, traced_us: float | None) -> tuple[float, float, float]:
    """(replayed mean / traced, low, high): the finite durations' (ns) mean over ``traced_us``,
    with the mean's 95 % interval from the same bootstrap as every other figure; NaN: unknown."""
    x = np.asarray(durations_ns, dtype=np.float64) / 1e3
    x = x[np.isfinite(x)]
    if traced_us is None or not traced_us > 0 or not x.size:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    low, high = interval(mean, Phase().resample(x), degrees_of_freedom(x))
    return mean / traced_us, low / traced_us, high / traced_us


def rank_steps(timings: WindowTimings, rank: int, world_size: int) -> np.ndarray:
    """(world, iters): this rank's makespan per iteration (ns; NaN: it ran nothing) in its own
    row, zeros elsewhere, so that a sum over ranks gives every rank's."""
    present = np.asarray(timings.present, dtype=bool)
    starts = np.asarray(timings.starts_ns, dtype=np.int64)
    out = np.zeros((world_size, starts.shape[1]))
    out[rank] = math.nan
    if present.any():  # in int64: CLOCK_REALTIME ns would lose precision as float64
        out[rank] = overlap.makespan_ns(starts, np.asarray(timings.ends_ns, np.int64), present)
    return out


@dataclass(frozen=True, kw_only=True)
class ErrorGroup:
    """Per-kernel replay error of a group of blocks (error = |replayed / traced - 1|)."""

    name: str
    count: int
    mean_error: float
    max_error: float
    within: int  # blocks within the target


def error_groups(
    ratios: Sequence[float], overlaps: Sequence[float | None], *, target: float = 0.03
) -> tuple[ErrorGroup, ErrorGroup]:
    """The errors of blocks a collective ran beside in the trace (``traced_overlap`` > 0)
    and of the others, apart: overlap slows a kernel, so the two groups' errors differ."""
    groups: dict[str, list[float]] = {"overlapped a collective": [], "ran alone": []}
    for ratio_, overlap_ in zip(ratios, overlaps, strict=True):
        if math.isfinite(ratio_):
            groups["overlapped a collective" if overlap_ else "ran alone"].append(abs(ratio_ - 1))
    out = [
        ErrorGroup(
            name=name,
            count=len(errors),
            mean_error=float(np.mean(errors)) if errors else math.nan,
            max_error=max(errors, default=math.nan),
            within=sum(e <= target + 1e-12 for e in errors),
        )
        for name, errors in groups.items()
    ]
    return out[0], out[1]


def with_fidelity(
    outcome: PatternOutcome,
    pattern: PatternSpec,
    agg: WindowAggregate,
    steps_ns: np.ndarray,
    kernels: Sequence[str] = (),
) -> PatternOutcome:
    """The outcome with replayed / traced ratios and intervals, every rank's step (``steps_ns``:
    :func:`rank_steps` summed over ranks), and ``kernels[b]`` (the replayed) beside the traced."""
    blocks = [
        dataclasses.replace(
            _with_ratio(record, spec.traced_us, agg.latency_ns[b]),
            kernel=kernels[b] if kernels else "",
            traced_kernel=spec.traced_kernel or "",
            traced_overlap=math.nan if spec.traced_overlap is None else spec.traced_overlap,
        )
        for b, (record, spec) in enumerate(zip(outcome.blocks, pattern.blocks, strict=True))
    ]
    traced = dict(enumerate(pattern.traced_by_rank_us))
    rows = [_rank_row(rank, traced.get(rank), row) for rank, row in enumerate(steps_ns)]
    result = _with_ratio(outcome.pattern, pattern.traced_us, agg.makespan_ns)
    result = dataclasses.replace(result, replay_by_rank=json.dumps(rows))
    return dataclasses.replace(outcome, blocks=tuple(blocks), pattern=result)


def _rank_row(rank: int, traced_us: float | None, steps_ns: np.ndarray) -> dict[str, Any]:
    replayed = float(np.nanmean(steps_ns)) / 1e3 if np.isfinite(steps_ns).any() else math.nan
    names = ("traced_us", "replayed_us", "ratio", "ci_low", "ci_high")
    values = (traced_us, replayed, *ratio(steps_ns, traced_us))
    return {"rank": rank} | {
        k: round(v, 4) if v is not None and math.isfinite(v) else None
        for k, v in zip(names, values, strict=True)
    }


def _with_ratio(record: R, traced_us: float | None, durations_ns: np.ndarray) -> R:
    value, low, high = ratio(durations_ns, traced_us)
    return dataclasses.replace(
        record,
        traced_us=math.nan if traced_us is None else float(traced_us),
        replay_ratio=value,
        replay_ratio_ci_low=low,
        replay_ratio_ci_high=high,
    )
