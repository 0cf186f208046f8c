"""The agreed error every rank raises: who failed, and what the failure leaves usable."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from userbenchmark.maestro.blocks.base import Block
from userbenchmark.maestro.core.config.spec import BlockSpec
from userbenchmark.maestro.core.runtime.agreement import (
    RankStatus,
    _agreed_error,
    agreement_timeout_s,
    grace_s,
    group_timeout,
    status_of,
)
from userbenchmark.maestro.core.runtime.phases import Communicators
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


def test_a_stopped_rank_is_named_before_the_blocks_stuck_waiting_on_it():
    """Rank 1 stopped mid-collective: rank 0's all_reduce did not return, and waits only the
    grace for rank 1 (it already waited timeout_s), which is named as the cause."""
    stuck = status_of(0, RunError("block did not return within timeout_s 3 s", block="ar"))
    assert stuck.secondary and stuck.block == "ar"
    err = _agree([stuck], missing=[1])
    assert err.rank == 1 and "died or hung" in str(err) and "also failed" in str(err)


def test_a_stuck_block_is_named_before_the_timeouts_it_caused():
    timed_out = status_of(0, RunError("iteration barrier failed (Timed out); another rank"))
    stuck = status_of(3, RunError("block did not return within timeout_s 3 s", block="bad"))
    err = _agree([timed_out, stuck])
    assert (err.rank, err.block) == (3, "bad")


class _Exiting(Block):
    category = "other"
    params = ()

    def setup(self) -> None:
        raise SystemExit(0)


def test_a_block_leaving_with_sys_exit_is_named():
    spec = BlockSpec(name="quitter", op="x:Y", axis="world", lane="world", dtype="fp32")
    block = _Exiting.__new__(_Exiting)
    block.spec = spec
    try:
        block.setup()
    except SystemExit as exc:
        status = status_of(2, exc)
    assert (status.block, status.message, status.secondary) == ("quitter", "sys.exit(0)", False)


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
    maestro_done_s = timeout_s + agreement_timeout_s(timeout_s) + 2 * grace_s(timeout_s)
    assert group_timeout("nccl", timeout_s).total_seconds() > maestro_done_s + 1.0
    assert group_timeout("gloo", timeout_s).total_seconds() == timeout_s
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


def test_the_gate_group_is_aborted_with_the_axes_groups(monkeypatch):
    import torch.distributed as dist

    gate = _FakeGroup()
    monkeypatch.setattr(dist, "new_group", lambda **kwargs: gate)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.delattr(dist.distributed_c10d, "_abort_process_group", raising=False)
    tp = _FakeGroup()
    comms = _communicators("nccl", {"tp": tp})
    assert comms.gate_group() is gate
    assert comms.abort() is True
    assert (tp.aborted, gate.aborted) == (1, 1)


def test_an_nccl_abort_that_hangs_is_left_behind(monkeypatch):
    # Seen with ranks sharing a GPU: ncclCommAbort never returned while collective kernels
    # held the device, until torch's watchdog killed the process with its own dump.
    import torch.distributed as dist

    from userbenchmark.maestro.core.runtime import phases

    never = threading.Event()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(
        dist.distributed_c10d, "_abort_process_group", lambda: never.wait(), raising=False
    )
    monkeypatch.setattr(phases, "grace_s", lambda timeout_s: 0.2)
    comms = _communicators("nccl", {"tp": _FakeGroup()})
    start = time.monotonic()
    assert comms.abort() is False
    assert 0.2 <= time.monotonic() - start < 5.0
    assert comms.group("tp") is None
    never.set()


def test_leaving_wedged_saves_the_status_and_skips_teardown(monkeypatch):
    from userbenchmark.maestro.core.runtime import phases, supervision

    class Exited(Exception):
        pass

    def real_exit(code):
        codes.append(code)
        raise Exited

    codes = []
    monkeypatch.setattr(supervision, "_real_exit", real_exit)
    monkeypatch.setattr(supervision, "end_children", lambda: None)
    monkeypatch.setattr(phases, "shutdown_distributed", lambda dist: codes.append("teardown"))
    wedged = SimpleNamespace(wedged=True)
    for status, rank in ((0, 1), (130, 0)):  # a failed run always exits non-zero
        end = phases._Ending(rank, status=status, everyone_answered=False)
        with pytest.raises(Exited):
            phases._leave(SimpleNamespace(), wedged, end)
    assert codes == [1, 130]


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


def test_a_rank_stopped_by_the_launcher_is_secondary_and_names_who_exited():
    from userbenchmark.maestro.core.runtime.supervision import PeerExited

    status = status_of(0, PeerExited((2,)))
    assert status.secondary and not status.interrupted and status.exited == (2,)
    # Rank 1 is late too, but rank 2's process is known to have ended: it is the cause.
    err = _agree([status, status_of(3, RuntimeError("Connection closed by peer"))], [1, 2])
    assert err.rank == 2 and "its process ended before the agreement step" in str(err)
    assert not err.interrupted and "also failed or stopped waiting: rank 1, 0, 3" in str(err)


def _store():
    import torch.distributed as dist

    return dist.HashStore()


def test_waiting_for_keys_times_out_quietly_and_sees_keys():
    from userbenchmark.maestro.core.runtime.agreement import wait_for_keys

    store = _store()
    start = time.monotonic()
    assert not wait_for_keys(store, ["a"], 0.2)
    assert 0.2 <= time.monotonic() - start < 2
    store.set("a", "1")
    assert wait_for_keys(store, ["a"], 0.2)


def test_once_the_launcher_ends_the_run_the_agreement_waits_less(monkeypatch):
    from userbenchmark.maestro.core.runtime import agreement
    from userbenchmark.maestro.core.runtime.supervision import PeerExited

    monkeypatch.setattr(agreement, "ENDING_WAIT_S", 0.3)
    store = _store()
    exchange = agreement.StoreExchange(
        store=store, world_size=2, timeout_s=100.0, owner="rank 0"
    )  # grace 30 s
    start = time.monotonic()
    statuses, missing = exchange(status_of(0, PeerExited((1,))))
    assert time.monotonic() - start < 5 and missing == [1] and statuses[0].exited == (1,)


class _CountingStore:
    """A store whose ``check`` calls are counted: what the watch has looked at is observable."""

    def __init__(self, store) -> None:
        self.store, self.checks = store, 0

    def check(self, keys):
        self.checks += 1
        return self.store.check(keys)

    def get(self, key):
        return self.store.get(key)

    def set(self, key, value):
        return self.store.set(key, value)


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + 5  # a hang limit, not a speed check
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within 5 s"
        time.sleep(0.01)


def test_the_ended_watch_leaves_once_a_verdict_names_this_rank(monkeypatch):
    from userbenchmark.maestro.core.runtime import agreement, supervision
    from userbenchmark.maestro.core.runtime.agreement import post_ended, watch_ended

    store = _store()
    counting = _CountingStore(store)
    left: list[str] = []
    holding, asked = [True], []

    def files_being_written() -> bool:
        asked.append(holding[0])
        return holding[0]

    monkeypatch.setattr(supervision, "holding", files_being_written)
    monkeypatch.setattr(agreement, "ENDED_POLL_S", 0.01)
    stop = watch_ended(lambda: counting, rank=1, leave=left.append)
    post_ended(store, [2], "rank 2 did not reach it", wait=False)
    seen = counting.checks
    _wait_until(lambda: counting.checks >= seen + 3, "look at the store after the verdict")
    assert left == [] and asked == []  # another rank was named: it never got to leave
    post_ended(store, [1], "rank 1 did not reach it", wait=False)
    _wait_until(lambda: len(asked) >= 2, "wait for the files after its own verdict")
    assert left == []  # files are being written: never leave half-way
    holding[0] = False
    _wait_until(lambda: left, "leave once the files are written")
    assert left == ["rank 1 did not reach it"] and store.check(["ended/1/ack"])
    stop.set()
