"""The agreement step: at each phase boundary every rank says whether it succeeded.

Statuses go through the rendezvous store (never the timed communicators), each rank waiting
with its own deadline, so when one rank fails every rank learns which rank failed, in which
phase, pattern and block, and raises the same error; a rank that died or hung is named as the
one that did not arrive.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from ...errors import RunError

log = logging.getLogger("maestro.agreement")


@dataclass(frozen=True)
class RankStatus:
    """What one rank reports at a phase boundary."""

    rank: int
    ok: bool
    message: str = ""
    block: str = ""
    contained: bool = True
    """False when the failure left collectives half-issued (communicators must not be reused)."""
    secondary: bool = False
    """True when this rank only saw a peer stop (a timed-out barrier or collective)."""
    interrupted: bool = False
    """True when this rank was interrupted (SIGINT/SIGTERM): the whole run stops."""


def status_of(rank: int, error: BaseException | None, *, contained: bool = True) -> RankStatus:
    """This rank's status from the exception a phase raised (None: success)."""
    if error is None:
        return RankStatus(rank=rank, ok=True)
    if isinstance(error, KeyboardInterrupt):
        return RankStatus(
            rank=rank, ok=False, message="interrupted", contained=False, interrupted=True
        )
    block = getattr(error, "block", "") or ""
    message = getattr(error, "detail", None) or f"{type(error).__name__}: {error}"
    return RankStatus(
        rank=rank,
        ok=False,
        message=str(message),
        block=block,
        contained=contained,
        secondary=_looks_secondary(str(error)),
    )


_SECONDARY_MARKERS = (
    "Timed out",
    "timed out",
    "Connection closed",
    "Connection reset",
    "Broken pipe",
    "another rank stopped",
)


def _looks_secondary(text: str) -> bool:
    """Whether an error only says that a peer stopped answering."""
    return any(marker in text for marker in _SECONDARY_MARKERS)


def grace_s(timeout_s: float) -> float:
    """How long a rank that already timed out waits at the agreement for the missing ranks.

    A rank that failed first arrived long before; ranks that timed out on it arrive within a
    few seconds of each other. Whoever is still missing after this died or hung.
    """
    return 5.0 + 0.25 * timeout_s


def agreement_timeout_s(timeout_s: float) -> float:
    """How long a rank that succeeded (or failed first) waits for the others.

    Peers blocked in a collective on the failed rank arrive up to ``timeout_s`` later.
    """
    return timeout_s + grace_s(timeout_s)


def watchdog_timeout_s(timeout_s: float) -> float:
    """The timeout of NCCL process groups: torch's watchdog must not act before maestro does.

    maestro stops waiting for device work after ``timeout_s``, agrees with the other ranks
    (up to :func:`agreement_timeout_s`), then aborts every communicator. A watchdog that fired
    first would end the process (torch's watchdog raises on a timed-out collective) before the
    failure is agreed, reported and saved, so it waits for all of that and a grace on top.
    """
    return timeout_s + agreement_timeout_s(timeout_s) + grace_s(timeout_s)


class StoreExchange:
    """Exchanges statuses through a c10d store, one numbered round per agreement step."""

    def __init__(self, store: Any, *, world_size: int, timeout_s: float) -> None:
        self.store = store
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.round = 0

    def __call__(self, status: RankStatus) -> tuple[list[RankStatus], list[int]]:
        """Every rank's status that arrived in time, and the ranks that did not arrive."""
        self.round += 1
        prefix = f"agree/{self.round}/"
        self.store.set(prefix + str(status.rank), json.dumps(asdict(status)))
        wait_s = (
            grace_s(self.timeout_s) if status.secondary else (agreement_timeout_s(self.timeout_s))
        )
        start = time.monotonic()
        deadline = start + wait_s
        pending = list(range(self.world_size))
        arrived: list[int] = []
        while pending:
            while pending and self.store.check([prefix + str(pending[0])]):
                arrived.append(pending.pop(0))
            now = time.monotonic()
            if not pending or now >= deadline:
                break
            if now - start < 0.2:
                time.sleep(0.002)  # ranks usually arrive together: poll briefly first
                continue
            try:
                self.store.wait([prefix + str(pending[0])], timedelta(seconds=deadline - now))
            except Exception as exc:  # a timeout; the keys are checked again above
                log.debug("waiting for rank %d: %s", pending[0], exc)
        # Past the deadline, a later rank may have arrived while an earlier one is missing.
        arrived += [r for r in pending if self.store.check([prefix + str(r)])]
        missing = [r for r in pending if r not in arrived]
        statuses = [RankStatus(**json.loads(self.store.get(prefix + str(r)))) for r in arrived]
        if self.round > 2:
            # Every rank finished reading round n-2 before it posted round n-1.
            try:
                self.store.delete_key(f"agree/{self.round - 2}/{status.rank}")
            except Exception as exc:  # only housekeeping
                log.debug("could not delete an old agreement key: %s", exc)
        return statuses, missing


def agree(
    exchange: StoreExchange,
    *,
    rank: int,
    world_size: int,
    phase: str,
    pattern: str,
    error: BaseException | None,
    contained: bool = True,
) -> None:
    """Raise the same RunError on every rank when any rank failed this phase.

    ``contained`` says whether a failure in this phase leaves the communicators usable; the
    agreed error's ``contained`` is True only when no rank is missing, interrupted or waiting
    on a peer, and either every failure is contained or every rank failed at the same block
    (so every rank issued the same collectives). ``missing`` lists ranks that never answered.
    """
    status = status_of(rank, error, contained=contained)
    try:
        statuses, missing = exchange(status)
    except Exception as exc:
        err = RunError(
            f"could not agree with the other ranks ({type(exc).__name__}: {exc}); "
            "a rank died or stopped answering (the rendezvous store lives in rank 0 "
            "or in the launcher)",
            rank=rank,
            phase=phase,
            pattern=pattern,
            interrupted=status.interrupted,
        )
        raise err from (error or exc)
    failed = [s for s in statuses if not s.ok]
    if not failed and not missing:
        return
    err = _agreed_error(failed, missing, phase=phase, pattern=pattern, world_size=world_size)
    raise err from error


def _agreed_error(
    failed: list[RankStatus],
    missing: list[int],
    *,
    phase: str,
    pattern: str,
    world_size: int,
) -> RunError:
    """The one error every rank raises (pure: same inputs, same message on every rank)."""
    primary = sorted((s for s in failed if not s.secondary), key=lambda s: s.rank)
    secondary = sorted((s for s in failed if s.secondary), key=lambda s: s.rank)
    if primary:
        first = primary[0]
        rank, block, detail = first.rank, first.block, first.message
        if first.interrupted:
            detail = "interrupted (SIGINT/SIGTERM); the run stops"
        rest = [s.rank for s in primary[1:]] + missing + [s.rank for s in secondary]
    elif missing:
        rank, block = missing[0], ""
        detail = "did not reach the agreement step at the end of the phase: it died or hung"
        rest = missing[1:] + [s.rank for s in secondary]
    else:
        first = secondary[0]
        rank, block, detail = first.rank, first.block, first.message
        rest = [s.rank for s in secondary[1:]]
    if rest:
        detail += f" (also failed or stopped waiting: rank {', '.join(map(str, rest))})"
    same_block = (
        len(failed) == world_size
        and not secondary
        and len({s.block for s in failed}) == 1
        and failed[0].block != ""
    )
    return RunError(
        detail,
        rank=rank,
        phase=phase,
        pattern=pattern,
        block=block,
        contained=(
            not missing
            and not secondary
            and not any(s.interrupted for s in failed)
            and (all(s.contained for s in failed) or same_block)
        ),
        missing=tuple(missing),
        interrupted=any(s.interrupted for s in failed),
    )
