"""The agreement step: at each phase boundary every rank says, through the rendezvous store
(never a timed communicator), whether it succeeded; every rank then raises the same error,
naming the rank, phase, pattern and block, or the rank that did not arrive."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any

from ...blocks.base import Block
from ...errors import RunError, cause_of
from . import supervision

log = logging.getLogger("maestro.agreement")


@dataclass(frozen=True)
class RankStatus:
    """What one rank reports at a phase boundary."""

    rank: int
    ok: bool
    message: str = ""
    block: str = ""
    contained: bool = True  # False: collectives left half-issued (communicators not reusable)
    secondary: bool = False  # this rank only saw a peer stop (a timed-out barrier or collective)
    interrupted: bool = False
    phase: str = ""  # where this rank failed, when not the step's own phase (a teardown)
    exited: tuple[int, ...] = ()  # ranks whose process its local launcher saw end


def status_of(rank: int, error: BaseException | None, *, contained: bool = True) -> RankStatus:
    """This rank's status from the exception a phase raised (None: success)."""
    if error is None:
        return RankStatus(rank=rank, ok=True)
    if isinstance(error, supervision.PeerExited):  # the launcher ends the run: a peer failed
        message, exited = f"another rank stopped: {error}", tuple(error.ranks)
        return RankStatus(rank=rank, ok=False, message=message, contained=False, exited=exited,
                          secondary=True)  # fmt: skip
    if isinstance(error, KeyboardInterrupt):
        return RankStatus(rank=rank, ok=False, message="interrupted", contained=False,
                          interrupted=True)  # fmt: skip
    return RankStatus(
        rank=rank,
        ok=False,
        message=str(getattr(error, "detail", None) or cause_of(error)),
        block=getattr(error, "block", "") or _block_in(error) or _block_in(error.__cause__),
        contained=contained,
        phase=getattr(error, "phase", ""),
        secondary=any(marker in str(error) for marker in _SECONDARY_MARKERS),
    )


def _block_in(error: BaseException | None) -> str:
    """The innermost block in ``error``'s traceback: names it for errors past maestro's wrapping."""
    name, tb = "", error and error.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, Block):
            name = owner.spec.name
        tb = tb.tb_next
    return name


_STUCK = "did not return within timeout_s"  # a block stuck itself, or waiting on a stopped peer
_SECONDARY_MARKERS = (  # an error with one of these only says that a peer stopped answering
    _STUCK,
    "Timed out",
    "timed out",
    "device work did not finish",  # CUDA lanes waiting on a collective whose peer stopped
    "Connection closed",
    "Connection reset",
    "Broken pipe",
    "another rank stopped",
)


def grace_s(timeout_s: float) -> float:
    """How long a rank that timed out waits at the agreement (ranks that timed out on one failure
    arrive within seconds), and for its NCCL communicators to abort, then for the device to
    drain (either can hang while kernels hold the GPU: the rank then leaves without them)."""
    return 5.0 + 0.25 * timeout_s


def agreement_timeout_s(timeout_s: float) -> float:
    """How long a rank that succeeded (or failed first) waits: peers blocked in a collective
    on a failed rank arrive up to ``timeout_s`` later."""
    return timeout_s + grace_s(timeout_s)


def group_timeout(backend: str, timeout_s: float) -> timedelta:
    """A process group's timeout. NCCL's: torch's watchdog (which ends the process) acts only
    after maestro's device wait, agreement, abort and drain, plus a grace."""
    if backend == "nccl":
        timeout_s += agreement_timeout_s(timeout_s) + 3 * grace_s(timeout_s)
    return timedelta(seconds=timeout_s)


ENDING_WAIT_S = 20.0  # once the local launcher ends the run (torch kills workers 30 s later)
SLOW_POLL_AFTER_S = 5.0  # a wait polls every 10 ms at most for this long, then every 100 ms
# A store wait past its deadline by this much: the store's host is gone (a call to a store
# whose host stopped never returns by itself).
STORE_SLACK_S = 2.0


def wait_for_keys(store: Any, keys: list[str], timeout_s: float) -> bool:
    """Poll ``store`` until every key exists (True) or ``timeout_s`` passed (False); a timed
    ``wait`` would print C++ warnings for a missing rank, an expected outcome here."""
    start = time.monotonic()
    deadline = start + timeout_s
    pause = 0.001
    while not store.check(keys):
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 1.2, 0.01 if now - start < SLOW_POLL_AFTER_S else 0.1)
    return True


ENDED_PREFIX = "ended/"  # store keys ended/<rank>: the verdict that gave up on that rank
ENDED_POLL_S = 0.5
ENDED_ACK_WAIT_S = 2.0  # the poster waits for them to see it (the store may live in its process)


def post_ended(store: Any, missing: list[int], message: str, *, wait: bool = True) -> None:
    """Tell the ranks ``missing`` that the run ended without them (``message``: the verdict);
    ``wait`` (the store lives here): until every one of them saw it."""
    for rank in missing:
        store.set(f"{ENDED_PREFIX}{rank}", message)
    if wait:
        wait_for_keys(store, [f"{ENDED_PREFIX}{rank}/ack" for rank in missing], ENDED_ACK_WAIT_S)


def watch_ended(
    connect: Callable[[], Any],
    *,
    rank: int,
    leave: Callable[[str], None],
) -> threading.Event:
    """A daemon thread, stopped by the event returned, that calls ``leave(verdict)`` once a verdict
    names this rank as gone: a rank stuck in a block ends under any launcher. ``connect()`` opens
    its own store client (the main thread's may be blocked); it waits while output files are
    being written (:func:`supervision.holding`)."""
    key, stop = f"{ENDED_PREFIX}{rank}", threading.Event()

    def watch() -> None:
        try:
            store = connect()
            while not stop.wait(ENDED_POLL_S):
                if store.check([key]):
                    verdict = store.get(key).decode("utf-8", "replace")
                    break
            else:
                return
            while supervision.holding() and not stop.is_set():
                time.sleep(0.05)  # never leave half-written files
            if stop.is_set():
                return
            store.set(f"{key}/ack", "1")
        except Exception as exc:  # no store (any more): the agreement step reports it
            log.debug("ended watch: %s", exc)
            return
        leave(verdict)

    threading.Thread(target=watch, name="maestro-ended-watch", daemon=True).start()
    return stop


@dataclass(kw_only=True)
class StoreExchange:
    """Exchanges statuses through a c10d store, one numbered round per agreement step;
    ``owner`` (``rank 0 at HOST:PORT``) is named when the store stops answering."""

    store: Any
    world_size: int
    timeout_s: float
    owner: str
    round: int = 0  # the last agreement step's number

    def waiting(self, seconds: float, rank: int, *, status: int = 1) -> Any:
        """A deadline on store calls: past ``seconds`` the rank exits naming the store's host."""
        return supervision.deadline(
            seconds + STORE_SLACK_S,
            f"{self.owner}, which hosts the rendezvous store, stopped answering",
            rank=rank,
            status=status,
        )

    def __call__(self, status: RankStatus) -> tuple[list[RankStatus], list[int]]:
        """Every rank's status that arrived in time, and the ranks that did not arrive."""
        wait_s = (
            grace_s(self.timeout_s) if status.secondary else agreement_timeout_s(self.timeout_s)
        )
        if status.exited:
            wait_s = min(wait_s, ENDING_WAIT_S)
        with self.waiting(wait_s, status.rank):
            self.round += 1
            prefix = f"agree/{self.round}/"
            self.store.set(prefix + str(status.rank), json.dumps(asdict(status)))
            deadline = time.monotonic() + wait_s
            pending = list(range(self.world_size))
            arrived: list[int] = []
            while pending:
                while pending and self.store.check([prefix + str(pending[0])]):
                    arrived.append(pending.pop(0))
                now = time.monotonic()
                # A rank whose process is known to have ended will not come: nobody waits for it.
                awaited = [r for r in pending if r not in status.exited]
                if not awaited or now >= deadline:
                    break
                wait_for_keys(self.store, [prefix + str(awaited[0])], deadline - now)
            # Past the deadline, a later rank may have arrived while an earlier one is missing.
            arrived += [r for r in pending if self.store.check([prefix + str(r)])]
            missing = [r for r in pending if r not in arrived]
            statuses = [_decode(self.store.get(prefix + str(r))) for r in arrived]
            if self.round > 2:
                # Every rank finished reading round n-2 before it posted round n-1.
                try:
                    self.store.delete_key(f"agree/{self.round - 2}/{status.rank}")
                except Exception as exc:  # only housekeeping
                    log.debug("could not delete an old agreement key: %s", exc)
            return statuses, missing


def _decode(raw: bytes) -> RankStatus:
    fields = json.loads(raw)
    fields["exited"] = tuple(fields.get("exited", ()))
    return RankStatus(**fields)


def agree(
    exchange: StoreExchange,
    rank: int,
    phase: str,
    error: BaseException | None,
    *,
    pattern: str = "",
    contained: bool = True,
) -> None:
    """Raise the same RunError on every rank when any rank failed this phase. It is
    ``contained`` (communicators reusable) only when nobody is missing, interrupted or waiting
    on a peer, and every failure is contained or every rank failed at the same block."""
    status = status_of(rank, error, contained=contained)
    if not status.exited:  # under the local launcher: the siblings known to have ended
        status = replace(status, exited=supervision.exited_peers())
    try:
        statuses, missing = exchange(status)
    except Exception as exc:
        err = RunError(
            f"could not agree with the other ranks: the rendezvous store went away "
            f"({cause_of(exc)}); {exchange.owner} hosts it",
            rank=rank,
            phase=phase,
            pattern=pattern,
            interrupted=status.interrupted,
        )
        raise err from (error or exc)
    supervision.agreed(f"pattern {pattern!r}, phase {phase}" if pattern else f"phase {phase}")
    failed = [s for s in statuses if not s.ok]
    if not failed and not missing:
        return
    err = _agreed_error(
        failed, missing, phase=phase, pattern=pattern, world_size=exchange.world_size
    )
    raise err from error


def _agreed_error(
    failed: list[RankStatus], missing: list[int], *, phase: str, pattern: str, world_size: int
) -> RunError:
    # Pure: the same inputs give every rank the same message.
    primary = sorted((s for s in failed if not s.secondary), key=lambda s: s.rank)
    # Nearest the cause first: a missing rank (its peers waited on it), then a stuck block,
    # then a timeout; among missing ranks, one whose process is known to have ended.
    secondary = sorted(
        (s for s in failed if s.secondary), key=lambda s: (_STUCK not in s.message, s.rank)
    )
    exited = {r for s in failed for r in s.exited}
    missing = sorted(missing, key=lambda r: (r not in exited, r))
    rank, *rest = [s.rank for s in primary] + missing + [s.rank for s in secondary]
    block, detail, phase = _first_cause(primary, secondary, missing, exited, phase)
    if rest:
        detail += f" (also failed or stopped waiting: rank {', '.join(map(str, rest))})"
    interrupted = any(s.interrupted for s in failed)
    # Every failure contained, or every rank failed at the same block: nothing half-issued.
    same_block = len(failed) == world_size and len({s.block for s in failed}) == 1
    consistent = all(s.contained for s in failed) or (same_block and failed[0].block != "")
    return RunError(
        detail,
        rank=rank,
        phase=phase,
        pattern=pattern,
        block=block,
        contained=not missing and not secondary and not interrupted and consistent,
        missing=tuple(missing),
        interrupted=interrupted,
    )


def _first_cause(
    primary: list[RankStatus],
    secondary: list[RankStatus],
    missing: list[int],
    exited: set[int],
    phase: str,
) -> tuple[str, str, str]:
    if primary:
        first = primary[0]
        detail = (
            "interrupted (SIGINT, SIGTERM or SIGHUP); the run stops"
            if first.interrupted
            else first.message
        )
        return first.block, detail, first.phase or phase
    if not missing:
        return secondary[0].block, secondary[0].message, phase
    if missing[0] in exited:
        return "", "its process ended before the agreement step at the end of the phase", phase
    return "", "did not reach the agreement step at the end of the phase: it died or hung", phase
