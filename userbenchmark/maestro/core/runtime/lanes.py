"""Lanes and the start gate: how one window of iterations is issued.

CPU: one worker thread per lane; a ``threading.Barrier`` releases all lanes at once each
iteration. CUDA: one stream per lane; a spin kernel on a gate stream, an event recorded after
it, every lane waits on that event, and only then does the host enqueue the blocks, so every
lane starts when the spin ends, not when the host got to it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import RunError
from ..analysis.intervals import HostTimings
from ..profilers.base import Profiler

log = logging.getLogger("maestro.executor")


@dataclass(kw_only=True)
class Lane:
    """An in-order queue of (block index, block) pairs; ``stream`` on CUDA."""

    name: str
    blocks: list[tuple[int, Any]]
    priority: str = "normal"
    stream: Any = None


DEFAULT_GATE_US = 200.0
"""Gate spin of a pattern's first warmup iterations, before calibration."""
MIN_GATE_US = 50.0
MAX_GATE_US = 100_000.0
"""Longest calibrated gate spin; a host slower than this is reported as launch-bound."""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a window, as ``timeit`` does.

    A collection pauses every thread of the process for up to tens of ms (with torch and
    pandas loaded); inside a window it would land in a host enqueue or a CPU lane's block.
    Reference counting still frees what a window drops.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def calibrated_gate_us(enqueue_ns: np.ndarray) -> float:
    """Gate spin that outlasts the host's enqueue: 2x the slowest warmup iteration + 20 µs.

    The first iteration is left out when there are others: it pays one-time costs. On an
    H200 the first launch of a GEMM new to the process blocked the host until the device was
    idle, i.e. for the whole gate spin, with CUDA_MODULE_LOADING=LAZY and EAGER alike
    (``bench/fidelity_gpu.py --first-launch-probe``); counting it made every pattern's gate
    twice the previous one's. Clamped to [MIN_GATE_US, MAX_GATE_US]; a slower host shows up as
    launch-bound iterations.
    """
    samples = np.asarray(enqueue_ns, dtype=np.float64)
    if samples.size > 1:
        samples = samples[1:]
    if not samples.size:
        return DEFAULT_GATE_US
    return float(np.clip(2.0 * samples.max() / 1e3 + 20.0, MIN_GATE_US, MAX_GATE_US))


class CpuExecutor:
    """Runs each lane on its own thread; a barrier is the gate."""

    def __init__(self, *, barrier: Callable[[], None]) -> None:
        self._barrier = barrier  # cross-rank barrier between iterations (control group)

    def run_window(
        self,
        lanes: Sequence[Lane],
        num_iters: int,
        profiler: Profiler,
        *,
        sync: str,
        block_names: Sequence[str],
    ) -> HostTimings:
        if not lanes:
            for _ in range(num_iters):
                if sync == "barrier":
                    self._barrier()
            return HostTimings()
        gate = threading.Barrier(len(lanes) + 1)
        done = threading.Barrier(len(lanes) + 1)
        errors: list[tuple[str, BaseException]] = []

        def lane_main(lane: Lane) -> None:
            current = ""
            try:
                for it in range(num_iters):
                    gate.wait()
                    for index, block in lane.blocks:
                        current = block_names[index]
                        profiler.before(index, it)
                        block.launch()
                        profiler.after(index, it)
                    done.wait()
            except threading.BrokenBarrierError:
                return  # another lane failed; it reports
            except BaseException as exc:  # reported by the main thread with the block name
                errors.append((current, exc))
                gate.abort()
                done.abort()

        threads = [
            threading.Thread(
                target=lane_main, args=(lane,), daemon=True, name=f"maestro-lane-{lane.name}"
            )
            for lane in lanes
        ]
        for t in threads:
            t.start()
        main_error: BaseException | None = None
        try:
            for _ in range(num_iters):
                if sync == "barrier":
                    self._barrier()
                gate.wait()
                done.wait()
        except threading.BrokenBarrierError:
            pass  # a lane failed: it recorded its error
        except BaseException as exc:  # the iteration barrier failed (a peer rank is gone)
            main_error = exc
        finally:
            # Release every lane before joining, whatever ended the loop.
            if errors or main_error is not None:
                gate.abort()
                done.abort()
            for t in threads:
                t.join()
        if errors:
            block, exc = errors[0]
            raise RunError(f"{type(exc).__name__}: {exc}", block=block) from exc
        if main_error is not None:
            if isinstance(main_error, KeyboardInterrupt):
                raise main_error
            raise RunError(
                f"iteration barrier failed ({type(main_error).__name__}: "
                f"{main_error}); another rank stopped"
            ) from main_error
        return HostTimings()


class CudaExecutor:
    """Issues lanes on CUDA streams behind a GPU-side start gate."""

    def __init__(
        self, *, barrier: Callable[[], None], device: Any, sleep_cycles_per_us: float
    ) -> None:
        import torch

        self._barrier = barrier
        self._device = device
        self._cycles_per_us = sleep_cycles_per_us
        self._gate_stream = torch.cuda.Stream(device=device, priority=0)
        self.gate_us = DEFAULT_GATE_US
        """Spin length; set per pattern from its warmup (:func:`calibrated_gate_us`)."""

    def make_stream(self, priority: str) -> Any:
        import torch

        # Stream priorities: 0 is normal, negative is higher (down to -3 on H200).
        low, high = torch.cuda.Stream.priority_range()
        return torch.cuda.Stream(device=self._device, priority=high if priority == "high" else 0)

    def run_window(
        self,
        lanes: Sequence[Lane],
        num_iters: int,
        profiler: Profiler,
        *,
        sync: str,
        block_names: Sequence[str],
    ) -> HostTimings:
        import torch

        enqueue = np.zeros(num_iters, dtype=np.int64)
        launch = np.zeros((len(block_names), num_iters), dtype=np.int64)
        gate_event = torch.cuda.Event()
        lane_done = [torch.cuda.Event() for _ in lanes]
        current = ""
        try:
            for it in range(num_iters):
                if sync == "barrier":
                    torch.cuda.synchronize(self._device)
                    self._barrier()
                else:
                    # Device-side fence: the next gate waits for every lane's last block.
                    for ev in lane_done:
                        self._gate_stream.wait_event(ev)
                t0 = time.perf_counter_ns()
                with torch.cuda.stream(self._gate_stream):
                    profiler.gate_begin(it)
                    torch.cuda._sleep(max(1, round(self.gate_us * self._cycles_per_us)))
                    profiler.gate_end(it)
                    gate_event.record(self._gate_stream)
                for lane in lanes:
                    lane.stream.wait_event(gate_event)
                for lane, done in zip(lanes, lane_done, strict=True):
                    with torch.cuda.stream(lane.stream):
                        for index, block in lane.blocks:
                            current = block_names[index]
                            profiler.before(index, it)
                            t_launch = time.perf_counter_ns()
                            block.launch()
                            launch[index, it] = time.perf_counter_ns() - t_launch
                            profiler.after(index, it)
                        done.record(lane.stream)
                enqueue[it] = time.perf_counter_ns() - t0
            torch.cuda.synchronize(self._device)
        except RunError:
            raise
        except Exception as exc:
            raise RunError(f"{type(exc).__name__}: {exc}", block=current) from exc
        return HostTimings(enqueue_ns=enqueue, launch_ns=launch, gate_us=self.gate_us)


def calibrate_sleep_cycles_per_us(device: Any) -> float:
    """Cycles of ``torch.cuda._sleep`` per µs, measured with events once the clocks are up.

    The first spin on an idle GPU runs far slower than later ones (clock ramp-up), so spin
    ~50 ms first, then fit the slope between two lengths (removing launch offsets).
    """
    import torch

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
