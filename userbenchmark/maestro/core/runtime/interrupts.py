"""Where SIGINT/SIGTERM may stop a rank: only inside :func:`deliverable` regions (a phase's
work, which reaches the agreement step), never between two output files (:func:`held`).
Elsewhere a signal waits for the next region; a second one outside raises at once. A SIGTERM
from torch's launcher ending the run (supervision.exited_peers) raises PeerExited."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from . import supervision

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class PeerExited(KeyboardInterrupt):
    """SIGTERM from the local launcher ending the run because other workers exited: not a
    user's interrupt. ``ranks``: the workers known to have exited."""

    def __init__(self, ranks: tuple[int, ...]) -> None:
        shown = ", ".join(map(str, ranks))
        super().__init__(f"the launcher is ending the run: worker {shown} exited")
        self.ranks = ranks


class _State:
    def __init__(self) -> None:
        self.open_depth = 0  # inside deliverable(): raise at once
        self.held_depth = 0  # inside held(): never raise
        self.pending: int | None = None  # a signal received and not yet raised
        self.exited: tuple[int, ...] = ()  # the pending SIGTERM came from the launcher


_state = _State()


def _raise(signum: int) -> None:
    exited, _state.pending, _state.exited = _state.exited, None, ()
    if exited:
        raise PeerExited(exited)
    raise KeyboardInterrupt(f"signal {signum}")


def _handler(signum: int, frame: Any) -> None:
    repeated = _state.pending is not None
    if not repeated:
        _state.exited = supervision.exited_peers() if signum == signal.SIGTERM else ()
    elif signum == signal.SIGINT:
        _state.exited = ()  # a Ctrl-C after the launcher's SIGTERM is the user's
    _state.pending = signum
    if not _state.held_depth and (_state.open_depth or repeated):
        _raise(signum)


def install() -> Callable[[], None]:
    """Install the handler for SIGINT and SIGTERM; returns a function that restores the old
    ones (outside the main thread nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    _state.__init__()
    for s in _SIGNALS:
        signal.signal(s, _handler)
    # maestro's local launcher starts workers with these signals blocked, so that one arriving
    # while a worker imports torch waits for this handler instead of raising mid-import. Those
    # that waited (Ctrl-C and the launcher's forwarded signal: one interrupt) run their
    # handler inside the unblocking call; held, they become pending, not a second signal.
    if hasattr(signal, "pthread_sigmask"):
        with held():
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)
        _state.__init__()

    return restore


def pending() -> bool:
    """True when a signal arrived that no deliverable region has raised yet."""
    return _state.pending is not None


def holding() -> bool:
    """True inside :func:`held` (output files are being written)."""
    return _state.held_depth > 0


def pending_interrupt() -> bool:
    """True when a user's signal (not the launcher ending the run) waits to be raised."""
    return _state.pending is not None and not _state.exited


@contextmanager
def deliverable() -> Iterator[None]:
    """A region an interrupt may stop: a pending one is raised on entry, a new one at once."""
    if _state.pending is not None and not _state.held_depth:
        _raise(_state.pending)
    _state.open_depth += 1
    try:
        yield
    finally:
        _state.open_depth -= 1


@contextmanager
def held() -> Iterator[None]:
    """A region no interrupt may split (writing a set of files); signals wait until the next
    deliverable region."""
    _state.held_depth += 1
    try:
        yield
    finally:
        _state.held_depth -= 1
