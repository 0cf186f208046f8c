"""A pattern's teardown after a failure: bounded wait for the device, nothing freed while
collective kernels still hold the buffers."""

from __future__ import annotations

from types import SimpleNamespace

from userbenchmark.maestro.core.measure.prepare import Allocated
from userbenchmark.maestro.core.runtime.agreement import grace_s


class _Block:
    def __init__(self):
        self.torn_down = 0

    def teardown(self):
        self.torn_down += 1


class _Backend:
    def __init__(self):
        self.deregistered = []

    def deregister_mem_pool(self, pool):
        self.deregistered.append(pool)


def _run(drains: bool, *, wedged: bool = False):
    waits = []

    def drained(timeout_s):
        waits.append(timeout_s)
        return drains

    rig = SimpleNamespace(
        wedged=wedged,
        place=SimpleNamespace(is_cuda=True, rank=0, device=None),
        lanes=SimpleNamespace(drained=drained),
    )
    run = Allocated(rig, "p")
    run.blocks = [_Block()]
    backend = _Backend()
    run.pools = {"x": (backend, "pool")}
    run.registered = [(backend, "pool")]
    run.graphs = ["graph"]
    return run, waits


def test_device_still_busy_after_a_failure_frees_nothing_and_marks_wedged():
    run, waits = _run(drains=False)
    block, backend = run.blocks[0], run.registered[0][0]
    run.teardown(failed=True, drain_s=grace_s(40.0))
    assert waits == [grace_s(40.0)]  # short: an aborted collective ends at once
    assert run.rig.wedged
    assert block.torn_down == 0 and backend.deregistered == [] and run.graphs and run.pools


def test_a_wedged_runtime_skips_the_wait_entirely():
    run, waits = _run(drains=True, wedged=True)
    run.teardown(failed=True, drain_s=grace_s(40.0))
    assert waits == [] and run.blocks[0].torn_down == 0


def test_after_a_failure_a_drained_device_is_freed_without_a_synchronize(monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    run, waits = _run(drains=True)
    block, backend = run.blocks[0], run.registered[0][0]
    run.teardown(failed=True, drain_s=grace_s(40.0))
    assert waits == [grace_s(40.0)] and not run.rig.wedged
    assert block.torn_down == 1 and backend.deregistered == ["pool"] and run.graphs == []
    assert run.pools == {} and run.registered == []
    assert calls == ["empty"]
    run, waits = _run(drains=True)
    run.teardown(
        failed=False, drain_s=grace_s(40.0)
    )  # success: the windows waited already; a full synchronize
    assert waits == [] and calls == ["empty", "sync", "empty"]
