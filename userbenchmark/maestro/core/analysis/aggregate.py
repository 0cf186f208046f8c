"""Cross-rank aggregation of one window's timings, with memory proportional to blocks x iters.

Each rank reduces its own intervals to fixed-size arrays (per block and iteration), then a few
element-wise all_reduces (max, min, sum) combine them; no rank ever holds another rank's raw
records. Overlap is computed per rank from that rank's own starts and ends (timestamps of
different hosts are never compared), then aggregated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import overlap
from .intervals import HostTimings, WindowTimings, host_late

Reducer = Callable[[np.ndarray, str], np.ndarray]
"""Element-wise reduction of a float64 array over all ranks: op is ``max``, ``min`` or ``sum``."""


@dataclass(frozen=True, kw_only=True)
class WindowAggregate:
    """One window after reduction over ranks (identical on every rank)."""

    latency_ns: np.ndarray
    """(blocks, iters): max over ranks of the rank-local duration (nccl-tests -I)."""
    rank_avg_max_ns: np.ndarray
    rank_avg_min_ns: np.ndarray
    slowest_rank: np.ndarray
    """(blocks,): rank whose average duration was the largest (-1 where unknown)."""
    makespan_ns: np.ndarray
    """(iters,): max over ranks of (last end - first start) on that rank."""
    pairwise_overlap: np.ndarray
    """(blocks, blocks): mean over ranks and iterations of |A∩B|/min(|A|,|B|); NaN: never met."""
    comm_compute_overlap: float
    lane_skew_ns: np.ndarray
    """(iters,): max over ranks of the spread of the lanes' first starts (NaN: < 2 lanes)."""
    gate_delay_ns: np.ndarray
    """(iters,): max over ranks and lanes of first start minus gate opening (NaN: unknown)."""
    activities_per_iter: np.ndarray
    """(blocks,): device activities per rank and iteration (NaN: not counted)."""
    launch_avg_ns: np.ndarray
    """(blocks,): host time in the block's ``launch``, mean over iterations, max over ranks
    (NaN: not measured, as on CPU lanes where launch runs the block)."""
    enqueue_ns: np.ndarray
    """(iters,): max over ranks of the host's time to enqueue the whole iteration (NaN: CPU)."""
    host_late: np.ndarray
    """(iters,) bool: on some rank the enqueue outlasted the gate spin (launch-bound)."""
    gate_spin_us: float
    """The gate kernel's spin in this window, max over ranks (NaN: no gate, CPU lanes)."""


def _neg_inf_to_nan(values: np.ndarray) -> np.ndarray:
    out = values.astype(np.float64, copy=True)
    out[np.isneginf(out) | np.isposinf(out)] = np.nan
    return out


def local_summary(
    timings: WindowTimings,
    *,
    lane_of_block: Sequence[int],
    is_comm: np.ndarray,
    is_compute: np.ndarray,
    host: HostTimings | None = None,
) -> dict[str, np.ndarray]:
    """This rank's fixed-size arrays (before any reduction); absent entries are +-inf/0.

    ``host`` is the executor's account of the window (enqueue times, gate spin); without it,
    or on CPU lanes, the host figures are unknown.
    """
    present = np.asarray(timings.present, dtype=bool)
    num_blocks, num_iters = timings.starts_ns.shape
    if present.any():
        origin = int(timings.starts_ns[present].min())
    else:
        origin = 0
    # Rebase in int64 first: CLOCK_REALTIME ns (~1.7e18) would lose precision as float64.
    starts = (timings.starts_ns - origin).astype(np.float64)
    ends = (timings.ends_ns - origin).astype(np.float64)
    starts[~present] = 0.0
    ends[~present] = 0.0
    dur = ends - starts
    dur_max = np.where(present[:, None], dur, -np.inf)
    avg = dur.mean(axis=1) if num_iters else np.zeros(num_blocks)
    avg_max = np.where(present, avg, -np.inf)
    avg_min = np.where(present, avg, np.inf)
    if present.any():
        makespan = overlap.makespan_ns(starts, ends, present)
        pair_mean = overlap.pairwise_overlap_mean(starts, ends, present)
        cc = overlap.comm_compute_overlap(
            starts, ends, is_comm & present, is_compute & present, present
        )
        cc_valid = ~np.isnan(cc)
        cc_sum = float(cc[cc_valid].sum())
        cc_count = float(cc_valid.sum())
    else:
        makespan = np.full(num_iters, -np.inf)
        pair_mean = np.full((num_blocks, num_blocks), np.nan)
        cc_sum = cc_count = 0.0
    lanes = sorted({lane_of_block[b] for b in range(num_blocks) if present[b]})
    first = np.full((len(lanes), num_iters), np.inf)
    for row, lane in enumerate(lanes):
        members = [b for b in range(num_blocks) if present[b] and lane_of_block[b] == lane]
        first[row] = starts[members].min(axis=0)
    if len(lanes) >= 2:
        skew = first.max(axis=0) - first.min(axis=0)
    else:
        skew = np.full(num_iters, -np.inf)
    if timings.gate_open_ns is not None and lanes:
        gate = (timings.gate_open_ns - origin).astype(np.float64)
        gate_delay = (first - gate[None, :]).max(axis=0)
    else:
        gate_delay = np.full(num_iters, -np.inf)
    counts = (
        timings.activity_counts.astype(np.float64)
        if timings.activity_counts is not None
        else np.zeros(num_blocks)
    )
    counted = np.where(present, 1.0 if timings.activity_counts is not None else 0.0, 0.0)
    launch_avg = np.full(num_blocks, -np.inf)
    enqueue = np.full(num_iters, -np.inf)
    late = np.zeros(num_iters)
    gate_spin = np.full(1, -np.inf)
    if host is not None and host.enqueue_ns.size == num_iters and num_iters:
        enqueue = host.enqueue_ns.astype(np.float64)
        late = host_late(host.enqueue_ns, host.gate_us).astype(np.float64)
        gate_spin[0] = host.gate_us
        if host.launch_ns.shape == (num_blocks, num_iters):
            launch_avg = np.where(present, host.launch_ns.mean(axis=1), -np.inf)
    return {
        "dur_max": dur_max,
        "avg_max": avg_max,
        "avg_min": avg_min,
        "makespan": makespan,
        "skew": skew,
        "gate_delay": gate_delay,
        "pair_sum": np.nan_to_num(pair_mean, nan=0.0),
        "pair_count": (~np.isnan(pair_mean)).astype(np.float64),
        "cc": np.array([cc_sum, cc_count]),
        "counts": counts,
        "counted_ranks": counted,
        "avg_local": np.where(present, avg, np.nan),
        "launch_avg": launch_avg,
        "enqueue": enqueue,
        "late": late,
        "gate_spin": gate_spin,
    }


_ROUND_ONE = (
    (
        (
            "dur_max",
            "avg_max",
            "makespan",
            "skew",
            "gate_delay",
            "launch_avg",
            "enqueue",
            "late",
            "gate_spin",
        ),
        "max",
    ),
    (("avg_min",), "min"),
    (("pair_sum", "pair_count", "cc", "counts", "counted_ranks"), "sum"),
)


def _pack(local: dict[str, np.ndarray], keys: Sequence[str]) -> np.ndarray:
    return np.concatenate([local[k].ravel() for k in keys]).astype(np.float64)


def _unpack(
    local: dict[str, np.ndarray], keys: Sequence[str], flat: np.ndarray, out: dict[str, np.ndarray]
) -> None:
    offset = 0
    for k in keys:
        size = local[k].size
        out[k] = flat[offset : offset + size].reshape(local[k].shape)
        offset += size


def _slowest_candidate(local: dict[str, np.ndarray], avg_max: np.ndarray, rank: int) -> np.ndarray:
    """-rank where this rank holds the maximum average (so a max picks the lowest rank)."""
    avg_local = local["avg_local"]
    is_max = np.isfinite(avg_local) & (avg_local == avg_max)
    return np.where(is_max, -float(rank), -np.inf)


def _finish(out: dict[str, np.ndarray], slowest_neg: np.ndarray) -> WindowAggregate:
    slowest = np.where(np.isfinite(slowest_neg), -slowest_neg, -1).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        pair = np.where(out["pair_count"] > 0, out["pair_sum"] / out["pair_count"], np.nan)
        cc_sum, cc_count = out["cc"]
        cc = float(cc_sum / cc_count) if cc_count > 0 else float("nan")
        activities = np.where(
            out["counted_ranks"] > 0, out["counts"] / out["counted_ranks"], np.nan
        )
    num_iters = out["dur_max"].shape[1]
    if num_iters:
        activities = activities / num_iters
    return WindowAggregate(
        latency_ns=_neg_inf_to_nan(out["dur_max"]),
        rank_avg_max_ns=_neg_inf_to_nan(out["avg_max"]),
        rank_avg_min_ns=_neg_inf_to_nan(out["avg_min"]),
        slowest_rank=slowest,
        makespan_ns=_neg_inf_to_nan(out["makespan"]),
        pairwise_overlap=pair,
        comm_compute_overlap=cc,
        lane_skew_ns=_neg_inf_to_nan(out["skew"]),
        gate_delay_ns=_neg_inf_to_nan(out["gate_delay"]),
        activities_per_iter=activities,
        launch_avg_ns=_neg_inf_to_nan(out["launch_avg"]),
        enqueue_ns=_neg_inf_to_nan(out["enqueue"]),
        host_late=out["late"] > 0,
        gate_spin_us=float(_neg_inf_to_nan(out["gate_spin"])[0]),
    )


def reduce_summaries(
    local: dict[str, np.ndarray], *, rank: int, reduce: Reducer
) -> WindowAggregate:
    """Combine every rank's :func:`local_summary` with four element-wise reductions."""
    out: dict[str, np.ndarray] = {}
    for keys, op in _ROUND_ONE:
        _unpack(local, keys, reduce(_pack(local, keys), op), out)
    slowest_neg = reduce(_slowest_candidate(local, out["avg_max"], rank), "max")
    return _finish(out, slowest_neg)


def simulate_ranks(summaries: Sequence[dict[str, np.ndarray]]) -> WindowAggregate:
    """The aggregate every rank would get, computed in one process (tests, scale benchmark)."""
    ops = {"max": np.max, "min": np.min, "sum": np.sum}
    out: dict[str, np.ndarray] = {}
    for keys, op in _ROUND_ONE:
        flat = ops[op](np.stack([_pack(s, keys) for s in summaries]), axis=0)
        _unpack(summaries[0], keys, flat, out)
    candidates = np.stack(
        [_slowest_candidate(s, out["avg_max"], r) for r, s in enumerate(summaries)]
    )
    return _finish(out, candidates.max(axis=0))
