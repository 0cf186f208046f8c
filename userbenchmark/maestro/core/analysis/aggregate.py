"""Cross-rank aggregation of one window's timings, with memory proportional to blocks x iters.

Each rank reduces its own intervals to fixed-size arrays (per block and iteration), then a few
element-wise all_reduces (max, min, sum) combine them; no rank ever holds another rank's raw
records. Durations and overlap are computed per rank from that rank's own starts and ends,
then aggregated. Instants of different ranks (a block's start, a gate's opening) are compared
only when the ranks share a clock (one host, and a profiler whose timestamps are that host's
clock); those reductions run on exact int64 nanoseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import overlap
from .intervals import HostTimings, WindowTimings, host_late

Reducer = Callable[[np.ndarray, str], np.ndarray]
"""Element-wise reduction of an array over all ranks: op is ``max``, ``min`` or ``sum``; the
dtype (float64 or int64) is kept."""

_I64_MIN = np.iinfo(np.int64).min
_I64_MAX = np.iinfo(np.int64).max
SHARED_CLOCKS = ("cupti", "perf_counter")
"""Profiler clocks that are the host's own (CLOCK_REALTIME, CLOCK_MONOTONIC): every process of
one host reads the same one. CUDA events are offsets from each rank's own reference event."""


@dataclass(frozen=True, kw_only=True)
class WindowAggregate:
    """One window after reduction over ranks (identical on every rank)."""

    latency_ns: np.ndarray
    """(blocks, iters): max over ranks of the rank-local duration (nccl-tests -I)."""
    duration_spread_ns: np.ndarray
    """(blocks,): largest minus smallest per-rank mean duration (NaN: fewer than 2 ranks)."""
    start_skew_ns: np.ndarray
    """(blocks, iters): latest minus earliest start of the block over the ranks running it
    (NaN: no shared clock, or fewer than 2 ranks)."""
    last_to_start_rank: np.ndarray
    """(blocks,): the rank whose start was the latest in the most iterations (ties: the lowest
    rank); -1 where unknown (no shared clock, fewer than 2 ranks)."""
    gate_skew_ns: np.ndarray
    """(iters,): latest minus earliest gate opening over ranks (NaN: unknown, or one rank)."""
    makespan_ns: np.ndarray
    """(iters,): max over ranks of (last end - first start) on that rank."""
    pairwise_overlap: np.ndarray
    """(blocks, blocks): mean over ranks and iterations of |A∩B|/min(|A|,|B|); NaN: never met."""
    comm_compute_overlap: float
    """Σ over ranks of the communication time hidden under compute / Σ of communication time
    (time-weighted over the whole window, as HolisticTraceAnalysis defines it per rank)."""
    comm_compute_overlap_by_rank: np.ndarray
    """(world,): the same per rank (NaN where a rank has no communication or no compute)."""
    comm_compute_by_iter: np.ndarray
    """(2, iters): communication time hidden under compute, and communication time, per
    iteration summed over ranks (within each iteration only: what the interval resamples)."""
    lane_skew_ns: np.ndarray
    """(iters,): max over ranks of the spread of the lanes' first starts (NaN: < 2 lanes)."""
    gate_delay_ns: np.ndarray
    """(iters,): max over ranks and lanes of first start minus gate opening (NaN: unknown)."""
    activities_per_iter: np.ndarray
    """(blocks,): device activities per rank and iteration (NaN: not counted)."""
    launch_avg_ns: np.ndarray
    """(blocks,): host time in the block's ``launch``, mean over iterations, max over ranks
    (NaN: not measured, as on CPU lanes where launch runs the block)."""
    kernel_ctas_max: np.ndarray
    """(blocks,): largest kernel grid (CTAs) of the block over ranks (NaN: not known)."""
    enqueue_ns: np.ndarray
    """(iters,): max over ranks of the host's time to enqueue the whole iteration (NaN: CPU)."""
    host_late: np.ndarray
    """(iters,) bool: on some rank the start was not protected: the CUDA enqueue outlasted the
    gate spin, or the agreed CPU start instant had passed when the rank learned it."""
    host_late_known: bool
    """Whether ``host_late`` was measured (CUDA gates; CPU starts agreed on an instant)."""
    gate_spin_us: float
    """The gate kernel's spin in this window, max over ranks (NaN: no gate, CPU lanes)."""


def _inf_to_nan(values: np.ndarray) -> np.ndarray:
    out = values.astype(np.float64, copy=True)
    out[np.isinf(out)] = np.nan
    return out


def local_summary(
    timings: WindowTimings,
    *,
    lane_of_block: Sequence[int],
    is_comm: np.ndarray,
    is_compute: np.ndarray,
    rank: int = 0,
    world_size: int = 1,
    shared_clock: bool = False,
    host: HostTimings | None = None,
) -> dict[str, np.ndarray]:
    """This rank's fixed-size arrays (before any reduction); absent entries are +-inf/0.

    ``host`` is the lanes' account of the window (enqueue times, gate spin, CPU gate
    openings). ``shared_clock``: every rank's timestamps are one host's clock (the caller
    knows the hosts), so instants of different ranks may be compared. ``lane_of_block`` -1:
    a lane that waits for another (``after:``), left out of the lanes' first starts.
    """
    present = np.asarray(timings.present, dtype=bool)
    num_blocks, num_iters = timings.starts_ns.shape
    raw_starts = np.asarray(timings.starts_ns, dtype=np.int64)
    origin = int(raw_starts[present].min()) if present.any() else 0
    # Rebase in int64 first: CLOCK_REALTIME ns (~1.7e18) would lose precision as float64.
    runs = present[:, None]
    starts = np.where(runs, raw_starts - origin, 0).astype(np.float64)
    ends = np.where(runs, np.asarray(timings.ends_ns, np.int64) - origin, 0).astype(np.float64)
    dur = ends - starts
    avg = dur.mean(axis=1) if num_iters else np.zeros(num_blocks)
    out = {
        "dur_max": np.where(present[:, None], dur, -np.inf),
        "avg_max": np.where(present, avg, -np.inf),
        "avg_min": np.where(present, avg, np.inf),
        **_overlap_arrays(starts, ends, present, is_comm & present, is_compute & present),
    }
    cc_by_rank = np.zeros((2, max(world_size, 1)))
    cc_by_rank[:, rank] = out.pop("cc_window")
    out["cc_by_rank"] = cc_by_rank
    gate_open = timings.gate_open_ns
    if gate_open is None and host is not None and host.gate_open_ns.size == num_iters:
        gate_open = host.gate_open_ns
    out.update(_lane_arrays(starts, present, lane_of_block, gate_open, origin))
    counted = timings.activity_counts is not None
    out["counts"] = timings.activity_counts.astype(np.float64) if counted else np.zeros(num_blocks)
    out["counted_ranks"] = (present & counted).astype(np.float64)
    out["present_ranks"] = present.astype(np.float64)
    ctas = timings.kernel_ctas_max
    out["ctas"] = np.full(num_blocks, -np.inf) if ctas is None else np.where(present, ctas, -np.inf)
    out.update(_host_arrays(host, present, num_blocks, num_iters))
    out.update(_instant_arrays(timings, raw_starts, present, gate_open, shared_clock))
    return out


def _overlap_arrays(
    starts: np.ndarray, ends: np.ndarray, present: np.ndarray, comm: np.ndarray, compute: np.ndarray
) -> dict[str, np.ndarray]:
    """Makespan, pairwise overlap, and communication hidden under compute: over the whole
    window (``cc_window``: hidden, comm) and per iteration (``cc_iter``, for its interval)."""
    num_iters = starts.shape[1]
    cc_window = np.zeros(2)
    cc_iter = np.zeros((2, num_iters))
    pair_mean = overlap.pairwise_overlap_mean(starts, ends, present)  # NaN: absent blocks
    if compute.any() and comm.any():  # a rank without compute has no such overlap
        cc_window[:] = overlap.comm_hidden_under_compute_ns(starts, ends, comm, compute)
        cc_iter[0] = overlap.union_intersection_ns(
            starts[comm], ends[comm], starts[compute], ends[compute]
        )
        cc_iter[1] = overlap.union_length_ns(starts[comm], ends[comm])
    makespan = np.full(num_iters, -np.inf)
    if present.any():
        makespan = overlap.makespan_ns(starts, ends, present)
    return {
        "makespan": makespan,
        "pair_sum": np.nan_to_num(pair_mean, nan=0.0),
        "pair_count": (~np.isnan(pair_mean)).astype(np.float64),
        "cc_window": cc_window,
        "cc_iter": cc_iter,
    }


def _lane_arrays(
    starts: np.ndarray,
    present: np.ndarray,
    lane_of_block: Sequence[int],
    gate_open: np.ndarray | None,
    origin: int,
) -> dict[str, np.ndarray]:
    """Spread of the lanes' first starts, and the longest wait from gate to a first start."""
    num_blocks, num_iters = starts.shape
    lanes = sorted({lane_of_block[b] for b in range(num_blocks) if present[b]} - {-1})
    first = np.full((len(lanes), num_iters), np.inf)
    for row, lane in enumerate(lanes):
        members = [b for b in range(num_blocks) if present[b] and lane_of_block[b] == lane]
        first[row] = starts[members].min(axis=0)
    skew = first.max(axis=0) - first.min(axis=0) if len(lanes) >= 2 else np.full(num_iters, -np.inf)
    gate_delay = np.full(num_iters, -np.inf)
    if gate_open is not None and lanes:
        gate = (np.asarray(gate_open, dtype=np.int64) - origin).astype(np.float64)
        gate_delay = (first - gate[None, :]).max(axis=0)
    return {"skew": skew, "gate_delay": gate_delay}


def _host_arrays(
    host: HostTimings | None, present: np.ndarray, num_blocks: int, num_iters: int
) -> dict[str, np.ndarray]:
    """The host's side: enqueue times, launch-bound or late-start iterations, gate spin."""
    out = {
        "launch_avg": np.full(num_blocks, -np.inf),
        "enqueue": np.full(num_iters, -np.inf),
        "late": np.zeros(num_iters),
        "late_known": np.zeros(1),
        "gate_spin": np.full(1, -np.inf),
    }
    if host is not None and host.enqueue_ns.size == num_iters and num_iters:
        out["enqueue"] = host.enqueue_ns.astype(np.float64)
        out["late"] = host_late(host.enqueue_ns, host.gate_us).astype(np.float64)
        out["late_known"][0] = 1.0
        out["gate_spin"][0] = host.gate_us
        if host.launch_ns.shape == (num_blocks, num_iters):
            out["launch_avg"] = np.where(present, host.launch_ns.mean(axis=1), -np.inf)
    elif host is not None and host.start_late.size == num_iters and host.agree_ns.any():
        out["late"] = host.start_late.astype(np.float64)  # only where the ranks agreed a start
        out["late_known"][0] = 1.0
    return out


def _instant_arrays(
    timings: WindowTimings,
    raw_starts: np.ndarray,
    present: np.ndarray,
    gate_open: np.ndarray | None,
    shared_clock: bool,
) -> dict[str, np.ndarray]:
    """Instants for cross-rank comparison, exact in int64 (sentinels where unknown)."""
    known = shared_clock and timings.clock in SHARED_CLOCKS
    start = present[:, None] & known
    gate_known = known and gate_open is not None
    gate = np.zeros(raw_starts.shape[1], dtype=np.int64)
    if gate_known:
        gate = np.asarray(gate_open, dtype=np.int64)
    return {
        "start_hi": np.where(start, raw_starts, _I64_MIN),
        "start_lo": np.where(start, raw_starts, _I64_MAX),
        "gate_hi": np.where(gate_known, gate, _I64_MIN),
        "gate_lo": np.where(gate_known, gate, _I64_MAX),
    }


_FLOAT_ROUNDS = (
    (
        "dur_max avg_max makespan skew gate_delay launch_avg ctas enqueue late late_known "
        "gate_spin",
        "max",
    ),
    ("avg_min", "min"),
    ("pair_sum pair_count cc_by_rank cc_iter counts counted_ranks present_ranks", "sum"),
)
_INT_ROUNDS = (("start_hi gate_hi", "max"), ("start_lo gate_lo", "min"))


def _pack(local: dict[str, np.ndarray], keys: Sequence[str], dtype: type) -> np.ndarray:
    return np.concatenate([local[k].ravel() for k in keys]).astype(dtype)


def _unpack(
    local: dict[str, np.ndarray], keys: Sequence[str], flat: np.ndarray, out: dict[str, np.ndarray]
) -> None:
    offset = 0
    for k in keys:
        size = local[k].size
        out[k] = flat[offset : offset + size].reshape(local[k].shape)
        offset += size


_ROUNDS = [(k.split(), op, np.float64) for k, op in _FLOAT_ROUNDS] + [
    (k.split(), op, np.int64) for k, op in _INT_ROUNDS
]


def _last_to_start_candidate(
    local: dict[str, np.ndarray], start_hi: np.ndarray, rank: int, world_size: int
) -> np.ndarray:
    """Per block: (iterations in which this rank started last) x world + (world - 1 - rank),
    so that a max over ranks picks the most frequent last rank, ties to the lowest."""
    known = start_hi != _I64_MIN
    mine = (local["start_hi"] == start_hi) & known
    return mine.sum(axis=1).astype(np.int64) * world_size + (world_size - 1 - rank)


def _finish(
    out: dict[str, np.ndarray], last_candidate: np.ndarray, world_size: int
) -> WindowAggregate:
    with np.errstate(invalid="ignore", divide="ignore"):
        pair = np.where(out["pair_count"] > 0, out["pair_sum"] / out["pair_count"], np.nan)
        hidden, comm = out["cc_by_rank"]
        cc = float(hidden.sum() / comm.sum()) if comm.sum() > 0 else float("nan")
        cc_by_rank = np.where(comm > 0, hidden / comm, np.nan)
        activities = np.where(
            out["counted_ranks"] > 0, out["counts"] / out["counted_ranks"], np.nan
        )
    num_iters = out["dur_max"].shape[1]
    if num_iters:
        activities = activities / num_iters
    several = out["present_ranks"] >= 2
    spread = np.where(several, out["avg_max"] - out["avg_min"], np.nan)
    known = (out["start_hi"] != _I64_MIN) & several[:, None]
    # Unknown entries are sentinels (their difference wraps); only known ones are read.
    start_skew = np.where(known, out["start_hi"] - out["start_lo"], np.nan)
    last_count = last_candidate // world_size
    last_rank = np.where(
        known.any(axis=1) & (last_count > 0), world_size - 1 - last_candidate % world_size, -1
    )
    gate_known = (out["gate_hi"] != _I64_MIN) & (world_size >= 2)
    gate_skew = np.where(gate_known, out["gate_hi"] - out["gate_lo"], np.nan)
    return WindowAggregate(
        latency_ns=_inf_to_nan(out["dur_max"]),
        duration_spread_ns=_inf_to_nan(spread),
        start_skew_ns=start_skew,
        last_to_start_rank=last_rank.astype(np.int64),
        gate_skew_ns=gate_skew,
        makespan_ns=_inf_to_nan(out["makespan"]),
        pairwise_overlap=pair,
        comm_compute_overlap=cc,
        comm_compute_overlap_by_rank=cc_by_rank,
        comm_compute_by_iter=out["cc_iter"],
        lane_skew_ns=_inf_to_nan(out["skew"]),
        gate_delay_ns=_inf_to_nan(out["gate_delay"]),
        activities_per_iter=activities,
        launch_avg_ns=_inf_to_nan(out["launch_avg"]),
        kernel_ctas_max=_inf_to_nan(out["ctas"]),
        enqueue_ns=_inf_to_nan(out["enqueue"]),
        host_late=out["late"] > 0,
        host_late_known=bool(out["late_known"][0] > 0),
        gate_spin_us=float(_inf_to_nan(out["gate_spin"])[0]),
    )


def reduce_summaries(
    local: dict[str, np.ndarray], *, rank: int, world_size: int, reduce: Reducer
) -> WindowAggregate:
    """Combine every rank's :func:`local_summary` with six element-wise reductions."""
    out: dict[str, np.ndarray] = {}
    for keys, op, dtype in _ROUNDS:
        _unpack(local, keys, reduce(_pack(local, keys, dtype), op), out)
    candidate = _last_to_start_candidate(local, out["start_hi"], rank, world_size)
    return _finish(out, reduce(candidate, "max"), world_size)


def simulate_ranks(summaries: Sequence[dict[str, np.ndarray]]) -> WindowAggregate:
    """The aggregate every rank would get, computed in one process (tests, scale benchmark):
    ``summaries[r]`` is rank r's :func:`local_summary` (``rank=r``, world ``len(summaries)``)."""
    ops = {"max": np.max, "min": np.min, "sum": np.sum}
    world = len(summaries)
    out: dict[str, np.ndarray] = {}
    for keys, op, dtype in _ROUNDS:
        flat = ops[op](np.stack([_pack(s, keys, dtype) for s in summaries]), axis=0)
        _unpack(summaries[0], keys, flat, out)
    candidates = np.stack(
        [_last_to_start_candidate(s, out["start_hi"], r, world) for r, s in enumerate(summaries)]
    )
    return _finish(out, candidates.max(axis=0), world)
