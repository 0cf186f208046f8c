"""The agreed error every rank raises: who failed, and what the failure leaves usable."""

from __future__ import annotations

import pytest

from userbenchmark.maestro.core.runtime.agreement import (
    RankStatus,
    _agreed_error,
    agreement_timeout_s,
    status_of,
    watchdog_timeout_s,
)
from userbenchmark.maestro.core.runtime.communicators import Communicators
from userbenchmark.maestro.errors import RunError


def _agree(failed, missing=()):
    return _agreed_error(list(failed), list(missing), phase="measure", pattern="p", world_size=4)


def test_every_rank_failing_at_one_block_is_contained():
    failed = [
        RankStatus(rank=r, ok=False, message="boom", block="ar", contained=False) for r in range(4)
    ]
    err = _agree(failed)
    assert isinstance(err, RunError)
    assert (err.rank, err.block, err.contained, err.missing, err.interrupted) == (
        0, "ar", True, (), False
    )  # fmt: skip
    assert err.everyone_answered


def test_a_missing_rank_is_named_and_nothing_is_contained():
    failed = [status_of(0, RuntimeError("Timed out waiting for rank 2"))]
    err = _agree(failed, missing=[2])
    assert err.rank == 2 and "died or hung" in str(err)
    assert not err.contained and err.missing == (2,) and not err.everyone_answered


def test_an_interrupt_stops_the_run():
    err = _agree([status_of(1, KeyboardInterrupt())])
    assert err.interrupted and not err.contained and "interrupted" in str(err)


def test_a_run_error_made_outside_the_agreement_knows_nobody_answered():
    err = RunError("x")
    assert err.missing is None and not err.everyone_answered and not err.contained


@pytest.mark.parametrize("timeout_s", [1.0, 45.0, 300.0, 3600.0])
def test_torch_watchdog_acts_only_after_maestro_reported(timeout_s):
    # maestro: device deadline, then the agreement (which may wait for a missing rank), then
    # its own abort. torch's watchdog ends the process when it fires, so it must come last.
    maestro_done_s = timeout_s + agreement_timeout_s(timeout_s)
    assert watchdog_timeout_s(timeout_s) > maestro_done_s + 1.0
    assert agreement_timeout_s(timeout_s) > timeout_s


def test_nccl_abort_takes_every_process_group_at_once(monkeypatch):
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(
        dist.distributed_c10d, "_abort_process_group", lambda: calls.append("all"), raising=False
    )
    one = _FakeGroup()
    comms = _communicators("nccl", {"tp": one, "dp": None})
    comms.abort()
    assert calls == ["all"] and one.aborted == 0  # not one by one
    assert comms.group("tp") is None and comms.group("dp") is None


def test_nccl_abort_falls_back_to_each_group(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.delattr(dist.distributed_c10d, "_abort_process_group", raising=False)
    tp, dp = _FakeGroup(), _FakeGroup()
    comms = _communicators("nccl", {"tp": tp, "dp": dp})
    comms.abort()
    assert (tp.aborted, dp.aborted) == (1, 1)
    assert comms.group("tp") is None


def test_gloo_groups_are_left_for_destroy(monkeypatch):
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(
        dist.distributed_c10d, "_abort_process_group", lambda: calls.append("all"), raising=False
    )
    tp = _FakeGroup()
    _communicators("gloo", {"tp": tp}).abort()
    assert calls == [] and tp.aborted == 0


class _FakeGroup:
    def __init__(self):
        self.aborted = 0

    def abort(self):
        self.aborted += 1


def _communicators(backend, groups):
    comms = Communicators({}, rank=0, backend=backend, timeout_s=10.0)
    comms._groups = dict(groups)
    return comms
