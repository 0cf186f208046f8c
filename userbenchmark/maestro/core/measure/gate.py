"""The start gate's sizes: how long the CUDA gate spins and how far ahead the CPU ranks agree on
their start, each calibrated from a pattern's warmup; the spin kernel's clock rate."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator

import numpy as np
import torch

log = logging.getLogger("maestro.lanes")

DEFAULT_GATE_US = 200.0
"""Gate spin of a pattern's first warmup iterations, before calibration."""
MIN_GATE_US = 50.0
MAX_GATE_US = 100_000.0
"""Longest calibrated gate spin; a host slower than this is reported as launch-bound."""
DEFAULT_START_MARGIN_US = 2_000.0
"""Lead of a CPU pattern's agreed start instant over the agreement, before calibration."""
MIN_START_MARGIN_US = 2_000.0
"""Agreeing on a start took 0.46 ms at the median, 2.9 ms at p90 and 5.1 ms at p99 on a
2-core CPU host (two ranks, others' work running); 2x the slowest of a few warmup
iterations missed that tail, so the start was late in 2 to 11 of 20 iterations."""
MAX_START_MARGIN_US = 200_000.0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a window, as ``timeit`` does: a collection
    pauses every thread for up to tens of ms (torch and pandas loaded), which would land in an
    enqueue or a CPU lane's block. Reference counting still frees what a window drops."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _twice_the_slowest_us(
    samples_ns: np.ndarray, *, pad_us: float, low_us: float, high_us: float, default_us: float
) -> float:
    """2x the slowest warmup sample + ``pad_us``, clamped to [low_us, high_us]; ``default_us``
    without samples. The first sample is left out when there are others: it pays one-time
    costs (on an H200 the first launch of a GEMM new to the process blocked the host for the
    whole gate spin, with lazy and eager module loading alike: ``bench/fidelity_gpu.py
    --first-launch-probe``; counted, every pattern's gate was twice the previous one's)."""
    samples = np.asarray(samples_ns, dtype=np.float64)
    if samples.size > 1:
        samples = samples[1:]
    if not samples.size:
        return default_us
    return float(np.clip(2.0 * samples.max() / 1e3 + pad_us, low_us, high_us))


def calibrated_gate_us(enqueue_ns: np.ndarray) -> float:
    """Gate spin that outlasts the host's enqueue: 2x the slowest warmup iteration + 20 µs, in
    [MIN_GATE_US, MAX_GATE_US] (a slower host shows up as launch-bound iterations)."""
    return _twice_the_slowest_us(
        enqueue_ns, pad_us=20.0, low_us=MIN_GATE_US, high_us=MAX_GATE_US, default_us=DEFAULT_GATE_US
    )


def calibrated_start_margin_us(agree_ns: np.ndarray) -> float:
    """Lead of the agreed start over the agreement that proposes it: 2x the slowest warmup
    agreement + 100 µs, so the instant is still ahead when the last rank learns it."""
    return _twice_the_slowest_us(
        agree_ns,
        pad_us=100.0,
        low_us=MIN_START_MARGIN_US,
        high_us=MAX_START_MARGIN_US,
        default_us=DEFAULT_START_MARGIN_US,
    )


def calibrate_sleep_cycles_per_us(device: object) -> float:
    """Cycles of ``torch.cuda._sleep`` per µs, measured with events: a ~50 ms spin first (the
    first spin on an idle GPU runs far slower: clock ramp-up), then the slope between two
    lengths (removing launch offsets)."""
    with torch.cuda.device(device):
        torch.cuda._sleep(100_000_000)
        torch.cuda.synchronize()

        def timed(cycles: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) * 1e3  # µs

        small, large = 1_000_000, 10_000_000
        samples = []
        for _ in range(3):
            t_small, t_large = timed(small), timed(large)
            samples.append((large - small) / max(t_large - t_small, 1e-3))
    rate = float(np.median(samples))
    log.debug("torch.cuda._sleep: %.1f cycles/µs", rate)
    return rate
