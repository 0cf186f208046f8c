"""No thread spins while CPU lanes run, measured with per-thread CPU time. On a host with fewer
cores than threads a spinning thread takes a core from a lane for a scheduler tick: a 128³ GEMM
read 4-10 ms at 2 ranks on 2 cores where a hand loop took 50 µs. Bounds are generous (a loaded
2-core machine); the spinning code used two to four times what they allow."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from userbenchmark.maestro.blocks.base import BlockContext
from userbenchmark.maestro.blocks.compute import Sleep
from userbenchmark.maestro.core.measure.lanes import CpuLanes, Lane
from userbenchmark.maestro.core.profilers.profiler import HostProfiler, Profiler

from .test_runtime_pure import _block


class _Gemm:
    """A 128³ fp32 GEMM, as a CPU lane runs one."""

    def __init__(self) -> None:
        self.a, self.b, self.c = (torch.rand(128, 128) for _ in range(3))

    def launch(self) -> None:
        torch.matmul(self.a, self.b, out=self.c)


class _Nap:
    """A block that waits without a core (``time.sleep``)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def launch(self) -> None:
        time.sleep(self.seconds)


def _sleep_block(duration_us: float) -> Sleep:
    ctx = BlockContext(rank=0, device=torch.device("cpu"), dtype=torch.float32, team=(0,))
    block = Sleep(_block("s", "sleep", duration_us=duration_us), ctx)
    block.setup()
    return block


@pytest.fixture
def one_intra_op_thread():
    """The process's intra-op threads at 1, as a maestro rank sets them (restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_nothing_spins_between_a_lanes_gemms(one_intra_op_thread):
    # A lane thread's first GEMM started an OpenMP team as wide as the host (the count set by
    # torch.set_num_threads is per thread), whose worker spun between GEMMs: the process used
    # 90 % of a core while its lane mostly slept. Now: the GEMMs, the lane's wake-ups.
    lanes = [Lane(name="a", blocks=[(0, _Gemm()), (1, _Nap(0.002))])]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    CpuLanes(barrier=lambda: None, agree_start=None, timeout_s=60).run_window(
        lanes, 150, Profiler(), sync="none", block_names=["mm", "nap"]
    )
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    assert cpu < 0.25 * wall, f"the process used {cpu / wall:.0%} of a core"


def test_the_main_thread_sleeps_until_the_agreed_start():
    # Waiting for the agreed start instant spun its last 300 µs: half the main thread's time
    # with a 300 µs lead. Now it sleeps and spins only the last few tens of µs.
    executor = CpuLanes(barrier=lambda: None, agree_start=lambda proposal: proposal, timeout_s=60)
    lanes = [Lane(name="a", blocks=[(0, _Nap(100e-6))])]
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    executor.run_window(lanes, 300, Profiler(), sync="barrier", block_names=["nap"], lead_us=300.0)
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    assert cpu < 0.35 * wall, f"the main thread used {cpu / wall:.0%} of a core"


def test_a_cpu_sleep_takes_its_duration():
    # Short sleeps up to the deadline overshot by the timer's slack and wake-up: a 50 µs
    # sleep read 120-135 µs on a quiet 2-core VM (160-820 µs on a busy one).
    profiler = HostProfiler()
    profiler.begin_window(1, 1, 200, np.ones(1, dtype=bool))
    lanes = [Lane(name="a", blocks=[(0, _sleep_block(50.0))])]
    CpuLanes(barrier=lambda: None, agree_start=None, timeout_s=60).run_window(
        lanes, 200, profiler, sync="none", block_names=["s"]
    )
    timings = profiler.end_window()
    durations_us = (timings.ends_ns - timings.starts_ns)[0] / 1e3
    assert durations_us.min() >= 50.0  # a deadline: never shorter
    assert np.median(durations_us) < 90.0


def test_a_long_cpu_sleep_spins_only_its_last_microseconds():
    block = _sleep_block(20_000.0)
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    for _ in range(5):
        block.launch()
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    assert wall >= 0.1
    assert cpu < 0.05 * wall, f"five 20 ms sleeps used {cpu * 1e3:.1f} ms of CPU"
