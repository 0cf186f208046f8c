"""The agreed error every rank raises: who failed, and what the failure leaves usable."""

from __future__ import annotations

from userbenchmark.maestro.core.runtime.agreement import RankStatus, _agreed_error, status_of
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
