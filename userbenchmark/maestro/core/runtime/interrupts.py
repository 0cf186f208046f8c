"""Where SIGINT/SIGTERM may stop a rank: inside a phase's work, never while files are written.

An interrupt raised at an arbitrary bytecode can land between two output files (results
saved, patterns not) or in the agreement step, where it skips the other ranks. So the
handler raises only inside :func:`deliverable` regions (a phase's work, which reaches the
agreement); elsewhere it records the signal, and the next deliverable region raises it.
A second signal outside a region raises at once (the user insists), except inside
:func:`held`, which defers every signal until output files are consistent again.

Under maestro's local launcher a SIGTERM can also be torch's launcher ending the run because
another worker exited: with :func:`set_exited_peers` installed, such a SIGTERM raises
:class:`PeerExited` instead, which the agreement step reports as the peer's failure.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class PeerExited(KeyboardInterrupt):
    """SIGTERM from the local launcher ending the run because other workers exited: not a
    user's interrupt. ``ranks``: the workers known to have exited."""

    def __init__(self, ranks: tuple[int, ...]) -> None:
        super().__init__(f"the launcher is ending the run: worker {_ranks(ranks)} exited")
        self.ranks = ranks


def _ranks(ranks: tuple[int, ...]) -> str:
    return ", ".join(map(str, ranks))


class _State:
    def __init__(self) -> None:
        self.open_depth = 0  # inside deliverable(): raise at once
        self.held_depth = 0  # inside held(): never raise
        self.pending: int | None = None  # a signal received and not yet raised
        self.exited: tuple[int, ...] = ()  # the pending SIGTERM came from the launcher


_state = _State()
_exited_peers: Callable[[], tuple[int, ...]] = tuple
"""Ranks of sibling workers that exited (empty: a SIGTERM is an interrupt); see
:func:`set_exited_peers`."""


def set_exited_peers(check: Callable[[], tuple[int, ...]] | None) -> None:
    """Install how a SIGTERM tells the launcher's teardown from an interrupt: ``check()``
    returns the ranks of sibling workers that exited (None: every SIGTERM interrupts)."""
    global _exited_peers
    _exited_peers = check or tuple


def exited_peers() -> tuple[int, ...]:
    """Ranks of sibling workers known to have exited (empty outside a local launch)."""
    return _exited_peers()


def _raise(signum: int) -> None:
    exited = _state.exited
    _state.pending = None
    _state.exited = ()
    if exited:
        raise PeerExited(exited)
    raise KeyboardInterrupt(f"signal {signum}")


def _handler(signum: int, frame: Any) -> None:
    repeated = _state.pending is not None
    if not repeated:
        _state.exited = _exited_peers() if signum == signal.SIGTERM else ()
    elif signum == signal.SIGINT:
        _state.exited = ()  # a Ctrl-C after the launcher's SIGTERM is the user's
    _state.pending = signum
    if not _state.held_depth and (_state.open_depth or repeated):
        _raise(signum)


def install() -> Callable[[], None]:
    """Install the handler for SIGINT and SIGTERM; returns a function that restores the old ones.

    Only the main thread may install handlers; elsewhere (a library caller's thread) this
    changes nothing and the returned function does nothing.
    """
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
    """A region an interrupt may stop: a pending one is raised on entry, a new one at once.

    Without :func:`install` nothing is ever pending and this changes nothing.
    """
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
