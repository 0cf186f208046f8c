"""Keeping a run's processes together: no process outlives the run, no wait lasts forever, no
signal stops a rank where no agreement step follows (the launcher's :class:`Watchdog`, deadlines,
signal regions; docs/reliability.md). Also the log set-up."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...errors import EXIT_FAILED, printable, say

log = logging.getLogger("maestro.launcher")

EXIT_GRACE_S = 10.0  # a worker's time to leave once the outcome is known, then it is killed
WATCH_POLL_S = 0.05
WHERE_BYTES = 240  # room on the board for each worker's last agreement step
# Stages of a worker on the board, in order (VERDICT: rank 0 saved and printed the outcome).
STARTING, RUNNING, VERDICT, LEAVING = 0, 1, 2, 3

_real_exit = os._exit


class _Formatter(logging.Formatter):
    # One spelling for every log line: "maestro: warning: ..." ("maestro r1: ..." in a rank),
    # its message one printable line (a user's string in it cannot drive the terminal).
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return f"{self.prefix}: {record.levelname.lower()}: {printable(record.message)}"


def configure_logging(level: str = "INFO", *, ranked: bool = True) -> None:
    """Log to stderr at ``level``; ``ranked`` lines carry the rank (``maestro r1: warning:``),
    the others (validate, compare, the local launcher: no rank) read ``maestro: warning: ...``."""
    handler = logging.StreamHandler(sys.stderr)
    # The launcher set RANK (or SLURM_PROCID) before this process configured logging.
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    handler.setFormatter(_Formatter(f"maestro r{rank}" if ranked else "maestro"))
    root = logging.getLogger("maestro")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def die_with_parent(parent_pid: int) -> None:
    """End this process with SIGKILL when its parent ``parent_pid`` ends (Linux prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0 and os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)  # 1: PR_SET_PDEATHSIG; the parent ended already


class WorkerBoard:
    """What the local launcher and its workers share: each worker's pid, stage, status, last step
    and whether a verdict named it gone; whether the user's signal came (``interrupted``) and
    rank 0 said why the run ended (``told``). No locks: each cell's writers write one value."""

    def __init__(self, num_workers: int, context: Any) -> None:
        self.num_workers = num_workers
        self.pids = context.Array("q", num_workers, lock=False)
        self.stage = context.Array("b", num_workers, lock=False)
        self.status = context.Array("i", num_workers, lock=False)
        self.missing = context.Array("b", num_workers, lock=False)
        self.interrupted = context.Value("b", 0, lock=False)
        self.told = context.Value("b", 0, lock=False)
        self.where = context.Array("c", num_workers * WHERE_BYTES, lock=False)

    def last_step(self, rank: int) -> str:
        raw = self.where[rank * WHERE_BYTES : (rank + 1) * WHERE_BYTES]
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


_board: WorkerBoard | None = None  # the board of this worker's local launcher (None: none)
_rank = -1


def attach(board: WorkerBoard, rank: int) -> None:
    """This process is worker ``rank`` of ``board`` (first thing in a worker)."""
    global _board, _rank
    _board, _rank = board, rank
    board.pids[rank] = os.getpid()
    board.stage[rank] = RUNNING


def attached() -> bool:
    """Whether this process is a worker of maestro's local launcher."""
    return _board is not None


def agreed(step: str) -> None:
    """This worker passed ``step``: an agreement step (``pattern 'p', phase output``) or the
    start of a phase (``entering pattern 'p', phase measure``); the launcher names it."""
    if _board is not None:
        data = step.encode("utf-8", "replace")[: WHERE_BYTES - 1] + b"\0"
        start = _rank * WHERE_BYTES
        _board.where[start : start + len(data)] = data


def reached_verdict(status: int, missing: Iterable[int] = ()) -> None:
    """The outcome is known here (saved, printed): ``status`` is what this worker exits with,
    ``missing`` the ranks the verdict named as gone."""
    if _board is not None:
        for gone in missing:
            if 0 <= gone < _board.num_workers:
                _board.missing[gone] = 1
        _board.status[_rank] = status
        _board.stage[_rank] = max(_board.stage[_rank], VERDICT)


def leave(status: int, rank: int) -> None:
    """This process is about to exit with ``status``: tell the launcher, flush the output."""
    if _board is not None:
        _board.status[_rank] = status
        _board.stage[_rank] = LEAVING
        if status and rank == 0:  # rank 0 printed why: the launcher need not say it again
            _board.told.value = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that went away
            stream.flush()


def forwarded() -> bool:
    """Whether a signal came to every rank (forwarded by a launcher), not to this one alone."""
    return _board is None or bool(_board.interrupted.value)


def exited_peers() -> tuple[int, ...]:
    """Ranks of sibling workers whose process ended or is leaving: a SIGTERM then comes from
    torch's launcher ending the run, not from the user. Empty outside a local launch, and
    while the launcher forwards the user's signal."""
    if _board is None or _board.interrupted.value:
        return ()
    return tuple(
        rank
        for rank in range(_board.num_workers)
        if rank != _rank
        and _board.pids[rank]
        and (_board.stage[rank] == LEAVING or not _runs(_board.pids[rank]))
    )


def _runs(pid: int) -> bool:  # a zombie has ended: only its parent's wait is missing
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


_exit_hooks: list[Callable[[], None]] = []


def on_hard_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` (releasing the output folder's lock) before :func:`hard_exit`."""
    _exit_hooks.append(hook)


def hard_exit(status: int, rank: int) -> None:
    """End this process now with ``status``: its threads and children cannot hold it."""
    leave(status, rank)
    for hook in _exit_hooks:
        try:
            hook()
        except Exception as exc:  # leaving regardless
            log.debug("exit hook: %s", exc)
    end_children()
    _real_exit(status)


@contextmanager
def deadline(seconds: float, cause: str, *, rank: int, status: int = EXIT_FAILED) -> Iterator[None]:
    """Bound a wait nothing else bounds (a store call to a host that stopped answering):
    past ``seconds`` this process says ``cause`` on one line and exits with ``status``."""

    def expire() -> None:
        say(f"maestro: rank {rank}: {cause}: no answer within {seconds:g} s; exiting")
        hard_exit(status, rank)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


class ExitCalled(Exception):
    """A block called ``os._exit``: refused, it fails the block like any error."""

    def __init__(self, code: int) -> None:
        super().__init__(f"os._exit({code}) called: a block may not end its rank's process")


@contextmanager
def exits_refused() -> Iterator[None]:
    """While a rank runs, ``os._exit`` in its process raises :class:`ExitCalled`, so the block
    is reported through the agreement step (a child the block forked still exits)."""
    owner = os.getpid()

    def refuse(code: int) -> None:
        if os.getpid() != owner:
            _real_exit(code)
        raise ExitCalled(code)

    os._exit = refuse  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = _real_exit


def _children(pid: int) -> list[int]:
    try:
        return [
            int(child)
            for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()
        ]
    except (OSError, ValueError):
        return []


def end_children() -> None:
    """SIGKILL every process this one started that still runs, and theirs (what a block left:
    a ``subprocess.Popen``, a forked copy); each is stopped first, so it starts no more."""
    todo, seen = _children(os.getpid()), set()
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            _signal(pid, signal.SIGSTOP)
            todo += _children(pid)
    for pid in seen:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


def child_exit(pid: int) -> int | None:
    """The exit status of the child ``pid`` (negative: the signal that ended it), None while it
    runs; never reaps it (torch's launcher does), and one reaped already counts as 0."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return 0
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def unattached_workers(board: WorkerBoard) -> list[int]:
    """Workers this launcher spawned that have not written their pid on the board yet."""
    known = set(board.pids)
    found = []
    for pid in _children(os.getpid()):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            if pid not in known and b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def kill_group(pid: int) -> None:
    """SIGKILL the process group the worker ``pid`` leads (the launcher makes it lead one)."""
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


Kill = namedtuple("Kill", "rank reason")  # a worker the watchdog ended, and why


class Watchdog:
    """The launcher's thread that SIGKILLs at once a worker a verdict named as gone and the group
    of one that ended; one still running EXIT_GRACE_S after every verdict or ``exit_deadline_s``
    after another exited. ``abandon()``: torch still waits EXIT_GRACE_S after all ended."""

    def __init__(
        self, board: WorkerBoard, *, exit_deadline_s: float, abandon: Callable[[], None]
    ) -> None:
        self.board = board
        self.exit_deadline_s = exit_deadline_s
        self.kills: list[Kill] = []
        self.exits: dict[int, int] = {}  # each ended worker's status (negative: the signal)
        self._abandon = abandon
        self._since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="maestro-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def killed(self, rank: int) -> bool:
        return any(k.rank == rank for k in self.kills)

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_POLL_S):
            try:
                self.check(time.monotonic())
            except Exception as exc:  # never let the watchdog die silently
                log.debug("watchdog: %s", exc)

    def _for(self, name: str, holds: bool, now: float) -> float:  # -1 while it never held
        if holds:
            self._since.setdefault(name, now)
        return now - self._since[name] if name in self._since else -1.0

    def check(self, now: float) -> None:
        """One look at the board at the time ``now`` (the thread's, every WATCH_POLL_S)."""
        board = self.board
        ranks = range(board.num_workers)
        for r in ranks:
            pid = board.pids[r]
            if pid and r not in self.exits and (status := child_exit(pid)) is not None:
                self.exits[r] = status
                kill_group(pid)  # whatever its blocks left behind
        running = [bool(board.pids[r]) and r not in self.exits for r in ranks]
        for r in ranks:
            if board.missing[r]:
                self._end_missing(r, running[r])
        known = all(r in self.exits or board.stage[r] >= VERDICT or board.missing[r] for r in ranks)
        if self._for("known", known, now) >= EXIT_GRACE_S:
            for r in ranks:
                if running[r]:
                    self._end(r, f"was still running {EXIT_GRACE_S:g} s after the run ended")
        if self._for("exit", bool(self.exits), now) >= self.exit_deadline_s:
            for r in ranks:
                if running[r]:
                    late = f"{self.exit_deadline_s:g} s after another worker exited"
                    self._end(r, f"was still running {late}")
        if self._for("all", len(self.exits) == board.num_workers, now) >= EXIT_GRACE_S:
            self._stop.set()
            self._abandon()

    def _end_missing(self, rank: int, running: bool) -> None:
        if running:
            self._end(rank, "did not reach the run's agreement step (stopped or hung)")
        elif not self.board.pids[rank] and not self.killed(rank):
            for pid in unattached_workers(self.board):
                os.kill(pid, signal.SIGKILL)
                self.kills.append(Kill(rank, "never started (stopped or hung)"))

    def _end(self, rank: int, reason: str) -> None:
        if not self.killed(rank):
            try:
                os.kill(self.board.pids[rank], signal.SIGKILL)
            except ProcessLookupError:
                return
            self.kills.append(Kill(rank, reason))


# Signals stop a rank only where an agreement step follows (docs/reliability.md, "Interrupts").
TERMINATING = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end a run as the user's interrupt does (status 130, one line)."""
_SIGNALS = (signal.SIGINT, *TERMINATING)


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
        _state.exited = exited_peers() if signum == signal.SIGTERM else ()
    elif signum == signal.SIGINT:
        _state.exited = ()  # a Ctrl-C after the launcher's SIGTERM is the user's
    _state.pending = signum
    if not _state.held_depth and (_state.open_depth or repeated):
        _raise(signum)


def install() -> Callable[[], None]:
    """Install the handler for SIGINT, SIGTERM and SIGHUP; returns a function that restores the old
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
