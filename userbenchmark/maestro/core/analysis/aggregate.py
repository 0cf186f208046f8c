"""The cross-rank summary of one window (docs/architecture.md's "Cross-rank figures"): no rank
holds another's records, and instants of ranks are compared only on a shared clock, in int64."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from . import overlap
from .intervals import HostTimings, WindowTimings

Reducer = Callable[[np.ndarray, str], np.ndarray]
"""Element-wise reduction of an array over all ranks: op is ``max``, ``min`` or ``sum``; the
dtype (float64 or int64) is kept."""

_I64 = np.iinfo(np.int64)

MAX_PAIR_BLOCKS = 100
"""Pairs of blocks are figured and recorded for patterns of at most this many blocks (README.md's
"ran together" says why)."""


def reduced(op: str, *, exact: bool = False) -> Any:
    """A field the ranks combine with ``op``; ``exact``: int64 instants (else float64, where
    an unknown max or min reads NaN once reduced)."""
    return field(metadata={"reduce": op, "dtype": np.int64 if exact else np.float64})


@dataclass(frozen=True, kw_only=True)
class WindowAggregate:
    """One window's summary: a rank's own (:func:`local_summary`), then combined over ranks
    (identical on every rank). Derived figures are properties of the combined fields."""

    world_size: int
    latency_ns: np.ndarray = reduced("max")
    """(blocks, iters): max over ranks of the rank-local duration (nccl-tests -I)."""
    avg_max_ns: np.ndarray = reduced("max")
    """(blocks,): largest per-rank mean duration."""
    avg_min_ns: np.ndarray = reduced("min")
    present_ranks: np.ndarray = reduced("sum")
    """(blocks,): ranks that run the block."""
    makespan_ns: np.ndarray = reduced("max")
    """(iters,): max over ranks of (last end - first start) on that rank."""
    pair_sum: np.ndarray = reduced("sum")
    """(blocks, blocks): per-rank mean of |A∩B|/min(|A|,|B|), summed over ``pair_count`` ranks;
    (0, 0) past MAX_PAIR_BLOCKS."""
    pair_count: np.ndarray = reduced("sum")
    comm_hidden_by_rank_ns: np.ndarray = reduced("sum")
    """(2, world): each rank's comm time hidden under compute, and its comm time, in the window."""
    comm_compute_by_iter: np.ndarray = reduced("sum")
    """(2, iters): the same per iteration, summed over ranks (what the interval resamples)."""
    lane_skew_ns: np.ndarray = reduced("max")
    """(iters,): max over ranks of the spread of the lanes' first starts (NaN: < 2 lanes)."""
    gate_delay_ns: np.ndarray = reduced("max")
    """(iters,): max over ranks and lanes of first start minus gate opening (NaN: unknown)."""
    activity_sum: np.ndarray = reduced("sum")
    """(blocks,): device activities summed over the ranks that counted them (``counted_ranks``)."""
    counted_ranks: np.ndarray = reduced("sum")
    kernel_ctas_max: np.ndarray = reduced("max")
    """(blocks,): largest kernel grid (CTAs) of the block over ranks (NaN: not known)."""
    launch_avg_ns: np.ndarray = reduced("max")
    """(blocks,): host time in the block's ``launch``, mean over iterations (NaN: CPU lanes)."""
    enqueue_ns: np.ndarray = reduced("max")
    """(iters,): max over ranks of the host's time to enqueue the whole iteration (NaN: CPU)."""
    late: np.ndarray = reduced("max")
    """(iters,) 1 where on some rank the CUDA enqueue outlasted the gate spin, or the agreed CPU
    start instant had passed when the rank learned it."""
    late_known: np.ndarray = reduced("max")
    """(1,) 1 where ``late`` was measured (CUDA gates; CPU starts agreed on an instant)."""
    gate_spin: np.ndarray = reduced("max")
    """(1,) µs: the gate kernel's spin in this window (NaN: no gate, CPU lanes)."""
    start_hi: np.ndarray = reduced("max", exact=True)
    """(blocks, iters) ns: the latest start over the ranks that share a clock (else unknown)."""
    start_lo: np.ndarray = reduced("min", exact=True)
    gate_hi: np.ndarray = reduced("max", exact=True)
    """(iters,) ns: the latest gate opening over the ranks (unknown: no shared clock)."""
    gate_lo: np.ndarray = reduced("min", exact=True)
    last_start_vote: np.ndarray = reduced("max", exact=True)
    """(blocks,): (iterations a rank started last) x world + (world - 1 - rank), combined in a
    second round (it needs the combined ``start_hi``)."""

    @property
    def duration_spread_ns(self) -> np.ndarray:
        """(blocks,): largest minus smallest per-rank mean duration (NaN: fewer than 2 ranks)."""
        return np.where(self.present_ranks >= 2, self.avg_max_ns - self.avg_min_ns, np.nan)

    @property
    def start_skew_ns(self) -> np.ndarray:
        """(blocks, iters): latest minus earliest start over the ranks (NaN: no shared clock, or
        fewer than 2 ranks)."""
        known = (self.start_hi != _I64.min) & (self.present_ranks >= 2)[:, None]
        # Unknown entries are sentinels (their difference wraps); only known ones are read.
        return np.where(known, self.start_hi - self.start_lo, np.nan)

    @property
    def last_to_start_rank(self) -> np.ndarray:
        """(blocks,): the rank whose start was the latest in the most iterations (ties: the
        lowest rank); -1 where unknown (no shared clock, fewer than 2 ranks)."""
        world, vote = self.world_size, self.last_start_vote
        known = np.isfinite(self.start_skew_ns).any(axis=1)
        return np.where(known & (vote // world > 0), world - 1 - vote % world, -1).astype(np.int64)

    @property
    def gate_skew_ns(self) -> np.ndarray:
        """(iters,): latest minus earliest gate opening over ranks (NaN: unknown, or one rank)."""
        known = (self.gate_hi != _I64.min) & (self.world_size >= 2)
        return np.where(known, self.gate_hi - self.gate_lo, np.nan)

    @property
    def pairwise_overlap(self) -> np.ndarray:
        """(blocks, blocks): mean over ranks and iterations of |A∩B|/min(|A|,|B|) (NaN: never);
        (0, 0) past MAX_PAIR_BLOCKS. Each read divides anew: read it once."""
        return overlap.divided(self.pair_sum, self.pair_count, self.pair_count > 0)

    @property
    def comm_compute_overlap(self) -> float:
        """Σ over ranks of the communication time hidden under compute / Σ of communication
        time (time-weighted over the whole window, as HolisticTraceAnalysis defines it)."""
        hidden, comm = self.comm_hidden_by_rank_ns
        return float(hidden.sum() / comm.sum()) if comm.sum() > 0 else float("nan")

    @property
    def comm_compute_overlap_by_rank(self) -> np.ndarray:
        """(world,): the same per rank (NaN where a rank has no communication or no compute)."""
        hidden, comm = self.comm_hidden_by_rank_ns
        return overlap.divided(hidden, comm, comm > 0)

    @property
    def activities_per_iter(self) -> np.ndarray:
        """(blocks,): device activities per rank and iteration (NaN: not counted)."""
        per_rank = overlap.divided(self.activity_sum, self.counted_ranks, self.counted_ranks > 0)
        num_iters = self.latency_ns.shape[1]
        return per_rank / num_iters if num_iters else per_rank


@functools.cache
def _rounds() -> tuple[tuple[str, Any, tuple[str, ...]], ...]:
    groups: dict[tuple[str, Any], list[str]] = {}
    for f in fields(WindowAggregate):
        if "reduce" in f.metadata and f.name != "last_start_vote":
            groups.setdefault((f.metadata["reduce"], f.metadata["dtype"]), []).append(f.name)
    return tuple((op, dtype, tuple(names)) for (op, dtype), names in groups.items())


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
) -> WindowAggregate:
    """This rank's summary before any reduction (unknown: the reduction's identity); ``host``: the
    lanes' account of the window. ``shared_clock``: every rank runs on this host; ``lane_of_block`` -1:
    a lane that waits for another (``after:``), left out of the lanes' first starts."""
    present = np.asarray(timings.present, dtype=bool)
    num_blocks, num_iters = timings.starts_ns.shape
    raw_starts = np.asarray(timings.starts_ns, dtype=np.int64)
    origin = int(raw_starts[present].min()) if present.any() else 0
    # Rebase in int64 first: CLOCK_REALTIME ns (~1.7e18) would lose precision as float64.
    runs = present[:, None]
    starts = np.where(runs, raw_starts - origin, 0).astype(np.float64)
    ends = np.where(runs, np.asarray(timings.ends_ns, np.int64) - origin, 0).astype(np.float64)
    avg = (ends - starts).mean(axis=1) if num_iters else np.zeros(num_blocks)
    counted = timings.activity_counts is not None
    gate_open = timings.gate_open_ns
    if gate_open is None and host is not None and host.gate_open_ns.size == num_iters:
        gate_open = host.gate_open_ns
    out: dict[str, Any] = {
        "latency_ns": np.where(runs, ends - starts, -np.inf),
        "avg_max_ns": np.where(present, avg, -np.inf),
        "avg_min_ns": np.where(present, avg, np.inf),
        "present_ranks": present.astype(np.float64),
        "activity_sum": timings.activity_counts.astype(np.float64)
        if counted
        else np.zeros(num_blocks),
        "counted_ranks": (present & counted).astype(np.float64),
        "kernel_ctas_max": np.full(num_blocks, -np.inf)
        if timings.kernel_ctas_max is None
        else np.where(present, timings.kernel_ctas_max, -np.inf),
        **_overlap_arrays(starts, ends, present, is_comm & present, is_compute & present),
        **_lane_arrays(starts, present, lane_of_block, gate_open, origin),
        **_host_arrays(host, present, num_blocks, num_iters),
        **_instant_arrays(raw_starts, present, gate_open, shared_clock and timings.host_clock),
        "last_start_vote": np.zeros(num_blocks, dtype=np.int64),
    }
    out["comm_hidden_by_rank_ns"] = np.zeros((2, max(world_size, 1)))
    out["comm_hidden_by_rank_ns"][:, rank] = out.pop("cc_window")
    return WindowAggregate(world_size=world_size, **out)


def _overlap_arrays(
    starts: np.ndarray, ends: np.ndarray, present: np.ndarray, comm: np.ndarray, compute: np.ndarray
) -> dict[str, np.ndarray]:
    """``cc_window``: (hidden, comm) over the whole window."""
    num_iters = starts.shape[1]
    cc_window = np.zeros(2)
    cc_iter = np.zeros((2, num_iters))
    pair_mean = np.zeros((0, 0))
    if starts.shape[0] <= MAX_PAIR_BLOCKS:
        pair_mean = overlap.pairwise_overlap_mean(starts, ends, present)  # NaN: absent blocks
    if compute.any() and comm.any():  # a rank without compute has no such overlap
        cc_window[:] = overlap.comm_hidden_under_compute_ns(starts, ends, comm, compute)
        cc_iter[0] = overlap.union_intersection_ns(
            starts[comm], ends[comm], starts[compute], ends[compute]
        )
        cc_iter[1] = overlap.union_length_ns(starts[comm], ends[comm])
    return {
        "makespan_ns": overlap.makespan_ns(starts, ends, present)
        if present.any()
        else np.full(num_iters, -np.inf),
        "pair_sum": np.nan_to_num(pair_mean, nan=0.0),
        "pair_count": (~np.isnan(pair_mean)).astype(np.float64),
        "cc_window": cc_window,
        "comm_compute_by_iter": cc_iter,
    }


def _lane_arrays(
    starts: np.ndarray,
    present: np.ndarray,
    lane_of_block: Sequence[int],
    gate_open: np.ndarray | None,
    origin: int,
) -> dict[str, np.ndarray]:
    num_iters = starts.shape[1]
    lane = np.asarray(lane_of_block, dtype=np.int64)
    counted = np.flatnonzero(present & (lane >= 0))
    lanes = np.unique(lane[counted])
    first = np.full((len(lanes), num_iters), np.inf)  # each lane's first start
    np.minimum.at(first, np.searchsorted(lanes, lane[counted]), starts[counted])
    skew = first.max(axis=0) - first.min(axis=0) if len(lanes) >= 2 else np.full(num_iters, -np.inf)
    gate_delay = np.full(num_iters, -np.inf)
    if gate_open is not None and lanes.size:
        gate = (np.asarray(gate_open, dtype=np.int64) - origin).astype(np.float64)
        gate_delay = (first - gate[None, :]).max(axis=0)
    return {"lane_skew_ns": skew, "gate_delay_ns": gate_delay}


def _host_arrays(
    host: HostTimings | None, present: np.ndarray, num_blocks: int, num_iters: int
) -> dict[str, np.ndarray]:
    out = {
        "launch_avg_ns": np.full(num_blocks, -np.inf),
        "enqueue_ns": np.full(num_iters, -np.inf),
        "late": np.zeros(num_iters),
        "late_known": np.zeros(1),
        "gate_spin": np.full(1, -np.inf),
    }
    if host is not None and host.enqueue_ns.size == num_iters and num_iters:
        out["enqueue_ns"] = host.enqueue_ns.astype(np.float64)
        # Still enqueueing when the gate (launched first) could open: lanes may have started
        # before every block was issued.
        out["late"] = (host.enqueue_ns > host.gate_us * 1e3).astype(np.float64)
        out["late_known"][0] = 1.0
        out["gate_spin"][0] = host.gate_us
        if host.launch_ns.shape == (num_blocks, num_iters):
            out["launch_avg_ns"] = np.where(present, host.launch_ns.mean(axis=1), -np.inf)
    elif host is not None and host.start_late.size == num_iters and host.agree_ns.any():
        out["late"] = host.start_late.astype(np.float64)  # only where the ranks agreed a start
        out["late_known"][0] = 1.0
    return out


def _instant_arrays(
    raw_starts: np.ndarray, present: np.ndarray, gate_open: np.ndarray | None, known: bool
) -> dict[str, np.ndarray]:
    start = present[:, None] & known
    gate_known = known and gate_open is not None
    gate = np.asarray(gate_open if gate_known else np.zeros(raw_starts.shape[1]), dtype=np.int64)
    return {
        "start_hi": np.where(start, raw_starts, _I64.min),
        "start_lo": np.where(start, raw_starts, _I64.max),
        "gate_hi": np.where(gate_known, gate, _I64.min),
        "gate_lo": np.where(gate_known, gate, _I64.max),
    }


def _vote(local: WindowAggregate, start_hi: np.ndarray, rank: int) -> np.ndarray:
    """This rank's :attr:`WindowAggregate.last_start_vote`: a max over ranks picks the most
    frequent last rank, ties to the lowest."""
    world = local.world_size
    mine = (local.start_hi == start_hi) & (start_hi != _I64.min)
    return mine.sum(axis=1).astype(np.int64) * world + (world - 1 - rank)


def _combined(
    local: WindowAggregate, combine: Callable[[str, Any, tuple[str, ...]], list[np.ndarray]]
) -> WindowAggregate:
    out: dict[str, np.ndarray] = {}
    for op, dtype, names in _rounds():
        for name, value in zip(names, combine(op, dtype, names), strict=True):
            if dtype is np.float64 and op != "sum":
                value = np.where(np.isinf(value), np.nan, value)
            out[name] = value
    return replace(local, **out)


def reduce_summaries(
    local: WindowAggregate, *, rank: int, world_size: int, reduce: Reducer
) -> WindowAggregate:
    """Combine every rank's :func:`local_summary` with one ``reduce`` per (op, dtype) of the
    fields' metadata, then the last-to-start vote."""

    def combine(op: str, dtype: Any, names: tuple[str, ...]) -> list[np.ndarray]:
        parts = [getattr(local, n) for n in names]
        flat = reduce(np.concatenate([p.ravel() for p in parts]).astype(dtype), op)
        split = np.split(flat, np.cumsum([p.size for p in parts])[:-1])
        return [part.reshape(p.shape) for part, p in zip(split, parts, strict=True)]

    out = _combined(local, combine)
    vote = reduce(_vote(local, out.start_hi, rank), "max")
    return replace(out, world_size=world_size, last_start_vote=vote)
