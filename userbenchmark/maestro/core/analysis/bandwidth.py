"""Bandwidth and FLOP-rate formulas, defined once as in nccl-tests' PERFORMANCE.md.

algbw = S / t and busbw = algbw * factor(op, n), with GB = 1e9 bytes; TFLOP/s = FLOPs / t / 1e12.
"""

from __future__ import annotations

import operator
from typing import Final

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "COMM_OPS",
    "algbw_gbps",
    "bus_bytes",
    "bus_factor",
    "busbw_gbps",
    "gemm_flops",
    "rate_per_second",
    "tflops",
]

# Ops whose bus factor is 2(n-1)/n, (n-1)/n or 1 respectively (nccl-tests definitions).
_TWO_N_MINUS_ONE_OVER_N: Final = frozenset({"all_reduce"})
_N_MINUS_ONE_OVER_N: Final = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
_ONE: Final = frozenset({"broadcast", "reduce", "send_recv"})

COMM_OPS: Final[frozenset[str]] = _TWO_N_MINUS_ONE_OVER_N | _N_MINUS_ONE_OVER_N | _ONE
"""Collective op names that have a bus bandwidth factor."""


def bus_factor(op: str, team_size: int) -> float:
    """Factor turning algbw into busbw for `op` on a team of `team_size` ranks.

    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce,
    send_recv 1. A team of one gives 0 for the (n-1)/n ops, as nccl-tests reports.
    """
    if op not in COMM_OPS:
        raise ValueError(f"unknown collective op {op!r}; valid: {sorted(COMM_OPS)}")
    if isinstance(team_size, bool):
        raise TypeError(f"team_size must be an int, got {team_size!r}")
    n = operator.index(team_size)  # accepts numpy ints, rejects floats with TypeError
    if n < 1:
        raise ValueError(f"team_size must be >= 1, got {n}")
    if op in _TWO_N_MINUS_ONE_OVER_N:
        return 2.0 * (n - 1) / n
    if op in _N_MINUS_ONE_OVER_N:
        return (n - 1) / n
    return 1.0


def bus_bytes(op: str, size_bytes: ArrayLike, team_size: int) -> float | np.ndarray:
    """Bytes a block moves "on the bus": size_bytes * bus_factor(op, team_size)."""
    result = np.asarray(size_bytes, dtype=np.float64) * bus_factor(op, team_size)
    return float(result) if result.ndim == 0 else result


def rate_per_second(amount: ArrayLike, seconds: ArrayLike, scale: float) -> float | np.ndarray:
    """amount / seconds / scale elementwise; NaN (never inf) where seconds <= 0 or is NaN.

    Returns a float when both inputs are scalars, else an ndarray (inputs broadcast).
    """
    num = np.asarray(amount, dtype=np.float64)
    den = np.asarray(seconds, dtype=np.float64)
    valid = den > 0  # False for NaN too
    out = np.full(np.broadcast_shapes(num.shape, den.shape), np.nan)
    np.divide(num, den, out=out, where=valid)
    out /= scale
    return float(out) if out.ndim == 0 else out


def algbw_gbps(size_bytes: ArrayLike, seconds: ArrayLike) -> float | np.ndarray:
    """Algorithm bandwidth S / t in GB/s (GB = 1e9 bytes); NaN where t <= 0."""
    return rate_per_second(size_bytes, seconds, 1e9)


def busbw_gbps(
    op: str, size_bytes: ArrayLike, team_size: int, seconds: ArrayLike
) -> float | np.ndarray:
    """Bus bandwidth algbw * bus_factor(op, team_size) in GB/s; NaN where t <= 0."""
    factor = bus_factor(op, team_size)
    return algbw_gbps(size_bytes, seconds) * factor


def gemm_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) GEMM: 2*m*n*k as an exact Python int (no overflow)."""
    dims = []
    for name, value in (("m", m), ("n", n), ("k", k)):
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            # Dimensions are element counts; a float here is a config bug, not something to round.
            raise TypeError(f"GEMM dimension {name} must be an int, got {value!r}")
        dim = operator.index(value)
        if dim < 0:
            raise ValueError(f"GEMM dimension {name} must be >= 0, got {dim}")
        dims.append(int(dim))
    return 2 * dims[0] * dims[1] * dims[2]


def tflops(flops: ArrayLike, seconds: ArrayLike) -> float | np.ndarray:
    """Compute rate in TFLOP/s (1e12 FLOP/s); NaN where seconds <= 0."""
    if isinstance(flops, int):
        flops = float(flops)  # a Python int may exceed int64
    return rate_per_second(flops, seconds, 1e12)
