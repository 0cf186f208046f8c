"""The agreement step: at each phase boundary every rank says whether it succeeded.

It runs over the gloo control group (never the timed communicators) with a timeout, so when
one rank fails every rank learns which rank failed, in which phase, pattern and block, and
raises the same error; a rank that died or hung makes the others fail instead of waiting.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .errors import RunError

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


def status_of(rank: int, error: BaseException | None, *, contained: bool = True) -> RankStatus:
    """This rank's status from the exception a phase raised (None: success)."""
    if error is None:
        return RankStatus(rank=rank, ok=True)
    block = getattr(error, "block", "") or ""
    message = getattr(error, "detail", None) or f"{type(error).__name__}: {error}"
    return RankStatus(
        rank=rank,
        ok=False,
        message=str(message),
        block=block,
        contained=contained,
        secondary=bool(getattr(error, "secondary", False)) or _looks_secondary(str(error)),
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


def exchange(group: Any, status: RankStatus, world_size: int) -> list[RankStatus]:
    """Every rank's status (all_gather_object over the control group)."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, status, group=group)
    return gathered


def agree(
    group: Any,
    *,
    rank: int,
    world_size: int,
    phase: str,
    pattern: str,
    error: BaseException | None,
    contained: bool = True,
) -> None:
    """Raise the same RunError on every rank when any rank failed this phase."""
    status = status_of(rank, error, contained=contained)
    try:
        statuses = exchange(group, status, world_size)
    except Exception as exc:
        raise RunError(
            f"could not agree with the other ranks ({type(exc).__name__}: {exc}); "
            "a rank died or stopped answering",
            rank=rank,
            phase=phase,
            pattern=pattern,
        ) from (error or exc)
    failed = [s for s in statuses if not s.ok]
    if not failed:
        return
    # Name the rank that caused it, not the peers that timed out waiting for it.
    failed.sort(key=lambda s: (s.secondary, s.rank))
    first = failed[0]
    others = ", ".join(str(s.rank) for s in failed[1:])
    detail = first.message + (f" (ranks {others} failed too)" if others else "")
    err = RunError(detail, rank=first.rank, phase=phase, pattern=pattern, block=first.block)
    err.contained = all(s.contained for s in failed)  # type: ignore[attr-defined]
    raise err from error
