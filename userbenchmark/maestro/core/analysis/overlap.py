"""Overlap metrics of ONE rank's block intervals: `starts`/`ends` (num_blocks, num_iters) in ns of
its own clock, blocks it does not run masked out by `present` (num_blocks,) bool (their rows may
hold anything), and the critical path that is a pattern's ideal. Inputs are never modified."""

from __future__ import annotations

import math
from collections.abc import Sequence
from graphlib import TopologicalSorter

import numpy as np
from numpy.typing import ArrayLike


def _intervals(
    starts: ArrayLike, ends: ArrayLike, present: ArrayLike | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s, e = np.asarray(starts), np.asarray(ends)
    if s.ndim != 2 or s.shape != e.shape:
        raise ValueError(
            f"starts and ends must be 2-D (num_blocks, num_iters) of equal shape, "
            f"got {s.shape} and {e.shape}"
        )
    if not (np.issubdtype(s.dtype, np.number) and np.issubdtype(e.dtype, np.number)):
        raise ValueError(f"starts and ends must be numeric, got {s.dtype} and {e.dtype}")
    mask = _block_mask(present, s.shape[0], "present")
    s_in, e_in = s[mask], e[mask]
    if not (np.all(np.isfinite(s_in)) and np.all(np.isfinite(e_in))):
        raise ValueError("interval bounds of present blocks must be finite")
    if np.any(e_in < s_in):
        raise ValueError("an interval ends before it starts")
    return s, e, mask


def _block_mask(mask: ArrayLike | None, num_blocks: int, what: str) -> np.ndarray:
    if mask is None:
        return np.ones(num_blocks, dtype=bool)
    m = np.asarray(mask)
    if m.dtype != bool or m.shape != (num_blocks,):
        raise ValueError(f"{what} must be a boolean mask of shape ({num_blocks},), got {m.shape}")
    return m


def _union_length(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    # Sort-and-sweep in every column at once: with intervals ordered by start, interval i adds
    # the part of it that lies beyond the furthest end seen so far.
    order = np.argsort(s, axis=0, kind="stable")
    s_sorted = np.take_along_axis(s, order, axis=0)
    e_sorted = np.take_along_axis(e, order, axis=0)
    reach = np.maximum.accumulate(e_sorted, axis=0)
    covered_to = np.concatenate([s_sorted[:1], reach[:-1]], axis=0)
    return np.maximum(e_sorted - np.maximum(s_sorted, covered_to), 0).sum(axis=0)


def union_length_ns(starts: ArrayLike, ends: ArrayLike) -> np.ndarray:
    """(num_iters,): length of the union of the blocks' intervals (0: no blocks)."""
    s, e, _ = _intervals(starts, ends)
    return _union_length(s, e)


def union_intersection_ns(
    starts_a: ArrayLike, ends_a: ArrayLike, starts_b: ArrayLike, ends_b: ArrayLike
) -> np.ndarray:
    """|union(A) ∩ union(B)| per iteration of two block sets (num_blocks_x, num_iters), as
    |U(A)| + |U(B)| - |U(A ∪ B)|. Pass only the rows of present blocks."""
    sa, ea, _ = _intervals(starts_a, ends_a)
    sb, eb, _ = _intervals(starts_b, ends_b)
    if sa.shape[1] != sb.shape[1]:
        raise ValueError(f"num_iters differ: {sa.shape[1]} vs {sb.shape[1]}")
    both = _union_length(np.concatenate([sa, sb]), np.concatenate([ea, eb]))
    return np.maximum(_union_length(sa, ea) + _union_length(sb, eb) - both, 0)  # float rounding


def pairwise_overlap_mean(
    starts: ArrayLike, ends: ArrayLike, present: ArrayLike | None = None
) -> np.ndarray:
    """Mean over iterations of |A∩B| / min(|A|, |B|) for every block pair: (blocks, blocks); 1 on
    the diagonal, 0 in an iteration where either has zero length, NaN for an absent block or no
    iterations. One row at a time: memory stays blocks x iterations, not blocks^2 x iterations."""
    s, e, mask = _intervals(starts, ends, present)
    # Rows of absent blocks may hold sentinels; zero them so the arithmetic stays tame.
    s, e = np.where(mask[:, None], s, 0), np.where(mask[:, None], e, 0)
    out = np.full((s.shape[0], s.shape[0]), np.nan)
    if not s.shape[1]:
        return out
    for i in np.flatnonzero(mask):
        inter = np.maximum(np.minimum(e[i], e) - np.maximum(s[i], s), 0)  # |A∩B|, at least 0
        shorter = np.minimum(e[i] - s[i], e - s)
        frac = np.zeros(shorter.shape, dtype=np.float64)
        np.divide(inter, shorter, out=frac, where=shorter > 0)
        frac[i] = 1.0
        out[i, mask] = frac[mask].mean(axis=1)  # the NaN columns are the absent blocks
    return out


def makespan_ns(starts: ArrayLike, ends: ArrayLike, present: ArrayLike | None = None) -> np.ndarray:
    """(num_iters,): last end minus first start over the present blocks (ValueError: none)."""
    s, e, mask = _intervals(starts, ends, present)
    if not mask.any():
        raise ValueError("makespan of an empty block set")
    return e[mask].max(axis=0) - s[mask].min(axis=0)


def comm_hidden_under_compute_ns(
    starts: ArrayLike, ends: ArrayLike, is_comm: ArrayLike, is_compute: ArrayLike
) -> tuple[float, float]:
    """(hidden, comm): |union(comm) ∩ union(compute)| and |union(comm)| over the whole window,
    across iterations as HolisticTraceAnalysis counts a trace: hidden / comm is its time-weighted
    comm/compute overlap. Both 0 without a comm block; hidden 0 without compute."""
    s, e, _ = _intervals(starts, ends)
    comm = _block_mask(is_comm, s.shape[0], "is_comm")
    compute = _block_mask(is_compute, s.shape[0], "is_compute")
    if np.any(comm & compute):
        raise ValueError("a block cannot be both comm and compute")
    if not comm.any():
        return 0.0, 0.0
    cs, ce = s[comm].reshape(-1, 1), e[comm].reshape(-1, 1)
    comm_len = float(_union_length(cs, ce)[0])
    if not compute.any():
        return 0.0, comm_len
    hidden = union_intersection_ns(cs, ce, s[compute].reshape(-1, 1), e[compute].reshape(-1, 1))
    return float(hidden[0]), comm_len


def divided(num: np.ndarray, den: np.ndarray, where: np.ndarray) -> float | np.ndarray:
    """num / den where ``where`` holds, NaN elsewhere; a float for scalars."""
    out = np.full(np.broadcast_shapes(num.shape, den.shape), np.nan)
    np.divide(num, den, out=out, where=where)
    return float(out) if out.ndim == 0 else out


MIN_HEADROOM_FRACTION = 0.05


def overlap_efficiency(
    serial_us: ArrayLike,
    makespan_us: ArrayLike,
    ideal_us: ArrayLike,
    *,
    min_headroom_fraction: float = MIN_HEADROOM_FRACTION,
) -> float | np.ndarray:
    """(serial - makespan) / (serial - ideal), README.md's overlap efficiency; NaN for a NaN input,
    or a headroom serial - ideal below ``min_headroom_fraction`` of serial (it would divide noise)."""
    serial = np.asarray(serial_us, dtype=np.float64)
    headroom = serial - np.asarray(ideal_us, dtype=np.float64)
    gained = serial - np.asarray(makespan_us, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        meaningful = (headroom > 0) & (headroom >= min_headroom_fraction * serial)
    return divided(gained, headroom, meaningful)


def slowdown(overlapped_avg_us: ArrayLike, isolated_avg_us: ArrayLike) -> float | np.ndarray:
    """overlapped / isolated latency (> 1: overlap slowed the block); NaN unless isolated > 0."""
    iso = np.asarray(isolated_avg_us, dtype=np.float64)
    return divided(np.asarray(overlapped_avg_us, dtype=np.float64), iso, iso > 0)


def shared_busbw_gbps(bus_bytes_total: ArrayLike, makespan_s: ArrayLike) -> float | np.ndarray:
    """Bus bytes of all blocks (size_bytes * the Block class's bus_factor each) over the
    pattern's makespan (not the longest block), in GB/s (1e9); NaN unless makespan_s > 0."""
    span = np.asarray(makespan_s, dtype=np.float64)
    return divided(np.asarray(bus_bytes_total, dtype=np.float64), span, span > 0) / 1e9


def critical_path(durations_us: ArrayLike, predecessors: Sequence[Sequence[int]]) -> float:
    """A pattern's ideal once blocks wait for each other (``predecessors[i]``: the blocks block
    ``i`` waits for): the length (µs) of the longest chain at isolated durations; NaN when a
    duration is not finite; ValueError on a cycle."""
    durations = np.asarray(durations_us, dtype=np.float64)
    num = durations.size
    if len(predecessors) != num:
        raise ValueError(f"{len(predecessors)} predecessor lists for {num} durations")
    if not num or not np.isfinite(durations).all():
        return math.nan
    finish = np.zeros(num)
    # A cycle raises graphlib's CycleError, a ValueError (the config loader refuses one first).
    for i in TopologicalSorter(dict(enumerate(predecessors))).static_order():
        finish[i] = durations[i] + max((finish[j] for j in predecessors[i]), default=0.0)
    return float(finish.max())
