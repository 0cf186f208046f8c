"""Lanes and the start gate, its lead sized by each pattern's warmup. CPU: a thread per lane, all
released at an agreed instant (or by a barrier). CUDA: a stream per lane behind a spin kernel's
event: every lane starts when the spin ends, not when the host got to it."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...blocks.compute import fine_timer_slack, sleep_until_ns
from ...errors import RunError
from ..analysis.intervals import HostTimings
from ..profilers.profiler import Profiler

log = logging.getLogger("maestro.lanes")

DEFAULT_GATE_US = 200.0
"""Gate spin of a pattern's first warmup iterations, before calibration."""
MIN_GATE_US = 50.0
MAX_GATE_US = 100_000.0
"""Longest calibrated gate spin; a host slower than this is reported as launch-bound."""
DEFAULT_START_MARGIN_US = 2_000.0
"""Lead of a CPU pattern's agreed start instant over the agreement, before calibration."""
MIN_START_MARGIN_US = 2_000.0
"""Agreeing on a start has a tail of milliseconds on a loaded host, which a few warmup
iterations miss."""
MAX_START_MARGIN_US = 200_000.0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a window, as ``timeit`` does: a collection pauses
    every thread for up to tens of ms (torch and pandas loaded), landing in a block's timing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def default_lead_us(*, cuda: bool) -> float:
    """The gate's lead before a pattern's warmup calibrated it: no pattern inherits another's."""
    return DEFAULT_GATE_US if cuda else DEFAULT_START_MARGIN_US


def calibrated_lead_us(host: HostTimings, *, cuda: bool) -> float:
    """This rank's proposal for the gate's lead from a warmup's host timings: 2x its slowest
    iteration plus a pad, within bounds. CUDA: the gate spin that outlasts the host's enqueue
    (+20 µs; a slower host shows up as launch-bound iterations); CPU: the agreed start's margin
    over agreeing on it (+100 µs: the instant is still ahead when the last rank learns it)."""
    if cuda:
        samples, pad_us, low_us, high_us = host.enqueue_ns, 20.0, MIN_GATE_US, MAX_GATE_US
    else:
        samples, pad_us = host.agree_ns, 100.0
        low_us, high_us = MIN_START_MARGIN_US, MAX_START_MARGIN_US
    # The first sample pays one-time costs (a GEMM's first launch can block the host for the
    # whole gate spin: bench/fidelity_gpu.py --first-launch-probe); left out.
    samples = np.asarray(samples, dtype=np.float64)
    if samples.size > 1:
        samples = samples[1:]
    if not samples.size:
        return default_lead_us(cuda=cuda)
    return float(np.clip(2.0 * samples.max() / 1e3 + pad_us, low_us, high_us))


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


@dataclass(kw_only=True)
class Lane:
    """An in-order queue of (block index, block) pairs; ``stream`` on CUDA."""

    name: str
    blocks: list[tuple[int, Any]]
    stream: Any = None
    # {block index: blocks of other lanes of this window it waits for in each iteration}
    after: dict[int, tuple[int, ...]] = field(default_factory=dict)


def issue_runs(
    lanes: Sequence[Lane], order: Sequence[int]
) -> list[tuple[int, list[tuple[int, Any]]]]:
    """Runs of (lane position, its next blocks) following ``order`` (block indices; blocks not
    in ``lanes`` left out), consecutive blocks of one lane in one run; lane by lane without
    ``order``. The CUDA host enqueues in this order (``PatternSpec.issue_order``)."""
    where = {index: (li, block) for li, lane in enumerate(lanes) for index, block in lane.blocks}
    runs: list[tuple[int, list[tuple[int, Any]]]] = []
    for index in order or list(where):
        if index not in where:
            continue
        li, block = where[index]
        if runs and runs[-1][0] == li:
            runs[-1][1].append((index, block))
        else:
            runs.append((li, [(index, block)]))
    return runs


class _CpuWindow:
    """The lane threads' shared state in one CPU window. Past ``timeout_s`` the barriers and
    waits break: a lane stuck in a block or a wait cannot hold the rank forever."""

    def __init__(self, lanes: Sequence[Lane], num_blocks: int, timeout_s: float) -> None:
        self.gate = threading.Barrier(len(lanes) + 1, timeout=timeout_s)
        self.done = threading.Barrier(len(lanes) + 1, timeout=timeout_s)
        self.errors: list[tuple[str, BaseException]] = []
        self.running = [""] * len(lanes)  # the block each lane is in ("" between blocks)
        self._count = [0] * num_blocks  # iterations each block finished (what after waits on)
        self._changed = threading.Condition()
        self._aborted = False
        self._timeout_s = timeout_s

    def release(self) -> None:  # break every barrier and wait: the lanes return
        self.gate.abort()
        self.done.abort()
        with self._changed:
            self._aborted = True
            self._changed.notify_all()

    def _wait_for(self, indices: Sequence[int], it: int) -> None:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: self._aborted or all(self._count[j] > it for j in indices), self._timeout_s
            )
        if self._aborted or not ok:
            raise threading.BrokenBarrierError

    def lane_main(
        self, li: int, lane: Lane, num_iters: int, profiler: Profiler, names: Sequence[str]
    ) -> None:
        # The process's intra-op thread count for this thread too: OpenMP keeps it per thread,
        # and a new thread's first GEMM would start a team as wide as the host, which spins.
        torch.get_num_threads()  # torch's lazy per-thread set-up: applies set_num_threads here
        fine_timer_slack()  # a CPU sleep block's wait
        try:
            for it in range(num_iters):
                self.gate.wait()
                for index, block in lane.blocks:
                    if index in lane.after:
                        self.running[li] = ""  # a wait that times out blames the awaited block
                        self._wait_for(lane.after[index], it)
                    self.running[li] = names[index]
                    profiler.before(index, it)
                    block.launch()
                    profiler.after(index, it)
                    with self._changed:
                        self._count[index] = it + 1
                        self._changed.notify_all()
                self.running[li] = ""
                self.done.wait()
        except threading.BrokenBarrierError:
            return  # another lane failed, or the main thread gave up: it reports
        except BaseException as exc:  # reported by the main thread with the block name
            self.errors.append((self.running[li], exc))
            self.release()


@dataclass(frozen=True, kw_only=True)
class CpuLanes:
    """Each lane on its own thread. ``sync: barrier``: every rank proposes ``now + margin`` on
    CLOCK_MONOTONIC, an all_reduce MAX picks the latest and every gate opens then; without a
    shared clock (several hosts) or with ``barrier-only`` a rank opens it leaving the barrier."""

    barrier: Callable[[], None]  # cross-rank barrier between iterations (sync group)
    # The latest proposed start (ns); None: the ranks share no clock.
    agree_start: Callable[[int], int] | None
    timeout_s: float

    def _open_gate(self, sync: str, it: int, out: HostTimings, lead_us: float) -> None:
        if sync == "barrier" and self.agree_start is not None:
            t0 = time.perf_counter_ns()
            target = self.agree_start(t0 + round(lead_us * 1e3))
            t1 = time.perf_counter_ns()
            out.agree_ns[it] = t1 - t0  # how long agreeing took: calibrates the margin
            out.start_late[it] = t1 > target
            sleep_until_ns(target)
        elif sync in ("barrier", "barrier-only"):
            self.barrier()
        out.gate_open_ns[it] = time.perf_counter_ns()

    def run_window(
        self,
        lanes: Sequence[Lane],
        num_iters: int,
        profiler: Profiler,
        *,
        sync: str,
        block_names: Sequence[str],
        order: Sequence[int] = (),
        lead_us: float = DEFAULT_START_MARGIN_US,
    ) -> HostTimings:
        """Run the window, each start agreed ``lead_us`` ahead; ``order`` (CUDA's issue order)
        is not needed: a lane is a thread."""
        out = HostTimings(
            gate_open_ns=np.zeros(num_iters, dtype=np.int64),
            agree_ns=np.zeros(num_iters, dtype=np.int64),
            start_late=np.zeros(num_iters, dtype=bool),
        )
        window = _CpuWindow(lanes, len(block_names), self.timeout_s)
        threads = [
            threading.Thread(
                target=window.lane_main,
                args=(li, lane, num_iters, profiler, block_names),
                daemon=True,
                name=f"maestro-lane-{lane.name}",
            )
            for li, lane in enumerate(lanes)
        ]
        for t in threads:
            t.start()
        main_error: BaseException | None = None
        stuck: list[str] = []
        fine_timer_slack()  # the wait for the agreed start
        try:
            for it in range(num_iters):
                self._open_gate(sync, it, out, lead_us)
                window.gate.wait()
                window.done.wait()
        except threading.BrokenBarrierError:
            stuck = [name for name in window.running if name]
        except BaseException as exc:  # the iteration barrier failed (a peer rank is gone)
            main_error = exc
        finally:
            # Release every lane, whatever ended the loop; a lane still inside a block is a
            # daemon thread and is left behind (it cannot be stopped from outside).
            if window.errors or main_error is not None or stuck:
                window.release()
            for t in threads:
                t.join(timeout=0 if stuck else None)
        if window.errors:
            block, exc = window.errors[0]
            raise RunError(f"{type(exc).__name__}: {exc}", block=block) from exc
        if stuck:
            raise RunError(
                f"block did not return within timeout_s {self.timeout_s:g} s", block=stuck[0]
            )
        if isinstance(main_error, KeyboardInterrupt):
            raise main_error
        if main_error is not None:
            raise RunError(
                f"iteration barrier failed ({type(main_error).__name__}: "
                f"{main_error}); another rank stopped"
            ) from main_error
        return out


# A device wait sleeps between event queries, doubling: polling without sleeping takes a core
# from the host's ranks and lanes.
POLL_FIRST_S = 20e-6
POLL_MAX_S = 500e-6  # a wait ends at most this long after the work did


def wait_for_events(events: Sequence[Any], timeout_s: float) -> None:
    """Return once every CUDA event (one never recorded counts) completed; RunError past
    ``timeout_s``. ``torch.cuda.synchronize`` would wait forever for a collective whose peer
    died: this lets the rank reach the agreement step (and abort its communicators) in time."""
    deadline = time.monotonic() + timeout_s
    pending = list(events)
    pause_s = POLL_FIRST_S
    while True:
        pending = [event for event in pending if not event.query()]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise RunError(
                f"device work did not finish within timeout_s {timeout_s:g} s: a collective "
                "waits for a rank that stopped, or a block never ends"
            )
        time.sleep(pause_s)
        pause_s = min(2 * pause_s, POLL_MAX_S)


@dataclass(kw_only=True)
class CudaLanes:
    """Lanes on CUDA streams behind a GPU-side start gate. ``sync: barrier``: after the host
    barrier a one-element all_reduce on its own communicator precedes the spin on the gate
    stream, so every spin starts when the last rank joined (``barrier-only`` skips it)."""

    barrier: Callable[[], None]
    device: Any
    sleep_cycles_per_us: float
    timeout_s: float
    align: Callable[[], None] | None = None  # enqueues the cross-rank alignment; None: 1 rank
    _streams: dict[str, Any] = field(default_factory=dict, init=False)  # each lane's, per run

    def __post_init__(self) -> None:
        self._gate_stream = torch.cuda.Stream(device=self.device, priority=0)

    def stream(self, lane: str, priority: str) -> Any:
        key = f"{lane}:{priority}"
        if key not in self._streams:
            # Stream priorities: 0 is normal, negative is higher.
            low, high = torch.cuda.Stream.priority_range()
            level = high if priority == "high" else 0
            self._streams[key] = torch.cuda.Stream(device=self.device, priority=level)
        return self._streams[key]

    def run_window(
        self,
        lanes: Sequence[Lane],
        num_iters: int,
        profiler: Profiler,
        *,
        sync: str,
        block_names: Sequence[str],
        order: Sequence[int] = (),
        lead_us: float = DEFAULT_GATE_US,
    ) -> HostTimings:
        """Enqueue the window behind a gate spin of ``lead_us``; ``order``: the blocks' issue
        order (lane by lane when empty)."""
        enqueue = np.zeros(num_iters, dtype=np.int64)
        launch = np.zeros((len(block_names), num_iters), dtype=np.int64)
        gate_event = torch.cuda.Event()
        lane_done = [torch.cuda.Event() for _ in lanes]
        runs = issue_runs(lanes, order)
        # One event per awaited block, recorded on its lane after it each iteration; a lane
        # waits for it on the device (the host never blocks, the gate still opens every lane).
        marks = {j: torch.cuda.Event() for lane in lanes for w in lane.after.values() for j in w}
        fence = [gate_event, *lane_done]
        host_barrier = sync in ("barrier", "barrier-only")
        align = self.align if sync == "barrier" else None
        gate_cycles = max(1, round(lead_us * self.sleep_cycles_per_us))
        current = ""
        try:
            for it in range(num_iters):
                if host_barrier:
                    wait_for_events(fence, self.timeout_s)
                    self.barrier()
                else:
                    # Device-side fence: the next gate waits for every lane's last block.
                    for ev in lane_done:
                        self._gate_stream.wait_event(ev)
                t0 = time.perf_counter_ns()
                with torch.cuda.stream(self._gate_stream):
                    profiler.gate_begin(it)
                    if align is not None:
                        align()  # harness work of the gate: counted, in no block
                    torch.cuda._sleep(gate_cycles)
                    profiler.gate_end(it)
                    gate_event.record(self._gate_stream)
                for lane in lanes:
                    lane.stream.wait_event(gate_event)
                for li, run in runs:
                    lane = lanes[li]
                    with torch.cuda.stream(lane.stream):
                        for index, block in run:
                            for j in lane.after.get(index, ()):
                                lane.stream.wait_event(marks[j])
                            current = block_names[index]
                            profiler.before(index, it)
                            t_launch = time.perf_counter_ns()
                            block.launch()
                            launch[index, it] = time.perf_counter_ns() - t_launch
                            profiler.after(index, it)
                            if index in marks:
                                marks[index].record(lane.stream)
                for lane, done in zip(lanes, lane_done, strict=True):
                    done.record(lane.stream)
                enqueue[it] = time.perf_counter_ns() - t0
            wait_for_events(fence, self.timeout_s)
            torch.cuda.synchronize(self.device)
        except RunError:
            raise
        except Exception as exc:
            raise RunError(f"{type(exc).__name__}: {exc}", block=current) from exc
        return HostTimings(enqueue_ns=enqueue, launch_ns=launch, gate_us=lead_us)

    def drained(self, timeout_s: float) -> bool:
        """Whether the gate stream, the lanes' and the current stream finished within
        ``timeout_s``: a bounded ``torch.cuda.synchronize`` (a collective may never end)."""
        current = torch.cuda.current_stream(self.device)
        every = (self._gate_stream, *self._streams.values(), current)
        events = [stream.record_event() for stream in every]
        try:
            wait_for_events(events, timeout_s)
        except RunError:
            return False
        return True
