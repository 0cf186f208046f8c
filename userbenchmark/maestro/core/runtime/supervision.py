"""Keeping a run's processes together: no process outlives the run, no wait lasts forever.

Workers end with their launcher (``PR_SET_PDEATHSIG`` on Linux, a parent watch elsewhere).
A :class:`WorkerBoard` in shared memory tells the launcher each worker's pid and how far it
got, and tells the workers whether the launcher forwards a user's signal. The launcher's
:class:`Watchdog` ends with SIGKILL the workers that can no longer end by themselves: those a
verdict named as gone (stopped, hung), and those still running :data:`EXIT_GRACE_S` after
every worker had its verdict or after a worker exited; and each ended worker's process group
(what its blocks left behind). Every rank bounds the waits nothing else bounds (a call to a
store whose host stopped) with :func:`deadline`, refuses a block's ``os._exit`` while it runs
(:func:`exits_refused`), and ends its own children when it leaves (see docs/reliability.md).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import EXIT_FAILED

log = logging.getLogger("maestro.launcher")

EXIT_GRACE_S = 10.0
"""How long a worker may take to leave once the run's outcome is known (the closing round,
destroying communicators, the interpreter's exit) before the launcher kills it."""
PARENT_POLL_S = 0.5
"""How often the fallback parent watch looks at the parent pid."""
WATCH_POLL_S = 0.05
"""How often the launcher's watchdog looks at the board."""
WHERE_BYTES = 240
"""Room on the board for where each worker last agreed with the others."""

_real_exit = os._exit

# Stages of a worker on the board, in order.
STARTING, RUNNING, VERDICT, LEAVING = 0, 1, 2, 3


def die_with_parent(parent_pid: int) -> str:
    """End this process with SIGKILL when ``parent_pid``, its parent, ends; returns how.

    ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` where the C library has it (Linux), else a daemon
    thread that watches the parent pid. A parent already gone ends this process at once.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:  # 1: PR_SET_PDEATHSIG
                if os.getppid() != parent_pid:  # it ended before the call above
                    os.kill(os.getpid(), signal.SIGKILL)
                return "prctl"
        except (OSError, AttributeError) as exc:
            log.debug("prctl(PR_SET_PDEATHSIG) unavailable: %s", exc)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="maestro-parent-watch", daemon=True).start()
    return "watch"


def die_with_torchrun_agent() -> str | None:
    """Under torchrun (its agent is this process's parent, ``TORCHELASTIC_RUN_ID`` is set),
    end this process with the agent, as local workers end with theirs; None elsewhere."""
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return None
    return die_with_parent(os.getppid())


class WorkerBoard:
    """What the local launcher and its workers share (no locks: each cell has one writer, or
    writers that all write the same value)."""

    def __init__(self, num_workers: int, context: Any) -> None:
        self.num_workers = num_workers
        self.pids = context.Array("q", num_workers, lock=False)
        """Each worker's pid (0 until it started)."""
        self.stage = context.Array("b", num_workers, lock=False)
        """STARTING, RUNNING, VERDICT (the run's outcome is known here; rank 0 saved and
        printed it), LEAVING."""
        self.status = context.Array("i", num_workers, lock=False)
        """Each worker's exit status, once at VERDICT."""
        self.missing = context.Array("b", num_workers, lock=False)
        """1 for a rank that a verdict named as gone (it never reached an agreement step)."""
        self.interrupted = context.Value("b", 0, lock=False)
        """1 once the launcher forwards a user's SIGINT/SIGTERM to the workers."""
        self.told = context.Value("b", 0, lock=False)
        """1 once rank 0 printed why the run ended."""
        self.where = context.Array("c", num_workers * WHERE_BYTES, lock=False)
        """Each worker's last agreement step (``pattern 'p', phase setup``), for the message
        of a worker that ends without a word."""

    def last_step(self, rank: int) -> str:
        raw = self.where[rank * WHERE_BYTES : (rank + 1) * WHERE_BYTES]
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


@dataclass
class _Attached:
    board: WorkerBoard
    rank: int


_attached: _Attached | None = None


def attach(board: WorkerBoard, rank: int) -> None:
    """This process is worker ``rank`` of ``board`` (called first thing in a worker)."""
    global _attached
    _attached = _Attached(board, rank)
    board.pids[rank] = os.getpid()
    board.stage[rank] = RUNNING


def agreed(step: str) -> None:
    """This worker passed the agreement step ``step`` (``pattern 'p', phase setup``)."""
    if _attached is not None:
        data = step.encode("utf-8", "replace")[: WHERE_BYTES - 1] + b"\0"
        start = _attached.rank * WHERE_BYTES
        _attached.board.where[start : start + len(data)] = data


def reached_verdict(status: int, missing: Iterable[int] = ()) -> None:
    """The run's outcome is known on this worker (files saved, message printed): ``status`` is
    what it will exit with, ``missing`` the ranks the verdict named as gone."""
    if _attached is None:
        return
    board = _attached.board
    for rank in missing:
        if 0 <= rank < board.num_workers:
            board.missing[rank] = 1
    board.status[_attached.rank] = status
    board.stage[_attached.rank] = max(board.stage[_attached.rank], VERDICT)


def told_why() -> None:
    """Rank 0 printed why the run ended (the launcher need not say it again)."""
    if _attached is not None:
        _attached.board.told.value = 1


def leaving(status: int) -> None:
    """This worker returns ``status`` and exits."""
    if _attached is not None:
        _attached.board.status[_attached.rank] = status
        _attached.board.stage[_attached.rank] = LEAVING


def leave(status: int, rank: int) -> None:
    """This worker is about to exit with ``status``: tell the launcher (rank 0 of a failed run
    has printed why, so the launcher need not say it again) and flush its output."""
    leaving(status)
    if status and rank == 0:
        told_why()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away: nothing to flush into
            pass


_exit_hooks: list[Callable[[], None]] = []


def on_hard_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` (releasing the output folder's lock) before :func:`hard_exit` ends us."""
    _exit_hooks.append(hook)


def hard_exit(status: int, rank: int) -> None:
    """End this process now with ``status`` (its threads and children cannot hold it)."""
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
    """Bound a wait nothing else bounds (a store call to a host that stopped answering has no
    timeout): past ``seconds`` this process prints one line naming ``cause`` and exits with
    ``status``."""

    def expire() -> None:
        try:
            print(
                f"maestro: rank {rank}: {cause}: no answer within {seconds:g} s; exiting",
                file=sys.stderr,
                flush=True,
            )
        except (OSError, ValueError):
            pass
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
        self.code = code


@contextmanager
def exits_refused() -> Iterator[None]:
    """While a rank runs blocks, ``os._exit`` in this process raises :class:`ExitCalled`, so
    the rank reports the block through the agreement step instead of vanishing (a child the
    block forked still exits)."""
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
        tasks = Path(f"/proc/{pid}/task").iterdir()
        found = []
        for task in tasks:
            text = (task / "children").read_text()
            found += [int(c) for c in text.split()]
        return found
    except (OSError, ValueError):
        return []


def end_children() -> None:
    """SIGKILL every process this one started that is still running, and theirs (Linux; what
    a block left behind: a ``subprocess.Popen``, a forked copy)."""
    todo, seen = _children(os.getpid()), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            os.kill(pid, signal.SIGSTOP)  # stopped first, so that it starts nothing more
        except OSError:
            continue
        todo += _children(pid)
    for pid in seen:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def attached() -> bool:
    """Whether this process is a worker of maestro's local launcher."""
    return _attached is not None


def forwarded() -> bool:
    """Whether a signal this process got came to every rank (the launcher forwarding the
    user's, or a launcher other than maestro's own), not to this rank alone."""
    return _attached is None or bool(_attached.board.interrupted.value)


def exited_peers() -> tuple[int, ...]:
    """Ranks of other workers whose process has ended or is leaving.

    Used when SIGTERM arrives: torch's launcher terminates every worker once one exited with
    a failure, and that SIGTERM is no interrupt (a sibling that never started counts as
    ended: it died starting). Empty outside a local launch, and while the launcher forwards a
    user's signal.
    """
    if _attached is None or _attached.board.interrupted.value:
        return ()
    board = _attached.board
    gone = []
    for rank in range(board.num_workers):
        pid = board.pids[rank]
        if rank != _attached.rank and (
            not pid or board.stage[rank] == LEAVING or not _process_exists(pid)
        ):
            gone.append(rank)
    return tuple(gone)


def _process_exists(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: only its parent's wait is missing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def child_exit(pid: int) -> int | None:
    """The exit status of the child ``pid`` of this process (negative: the signal that ended
    it), or None while it runs (stopped counts as running); never reaps it (torch's launcher
    does). A child already reaped counts as ended with status 0."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return 0
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def kill_group(pid: int) -> None:
    """SIGKILL the process group of the worker ``pid`` (it leads its own, see attach)."""
    try:
        if pid:
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass(frozen=True)
class Kill:
    """A worker the watchdog ended, and why."""

    rank: int
    reason: str


class Watchdog:
    """The launcher's thread that ends, with SIGKILL, what cannot end by itself.

    - A rank that a verdict named as gone (it never reached an agreement step: stopped,
      hung) is killed at once: the verdict was printed and saved before it was posted.
    - Once every worker has its verdict, has exited or was named as gone, a worker still
      running :data:`EXIT_GRACE_S` later is stuck on its way out.
    - Once a worker exited, every worker still running ``exit_deadline_s`` later (the
      agreement step's longest wait plus :data:`EXIT_GRACE_S`) is stuck.
    - A worker that has exited has its process group killed (its blocks' children).
    - Once every worker has exited, ``abandon()`` is called when the launch has not returned
      :data:`EXIT_GRACE_S` later (torch's launcher waiting on a worker that vanished).
    """

    def __init__(
        self,
        board: WorkerBoard,
        *,
        exit_deadline_s: float,
        clock: Callable[[], float] = time.monotonic,
        exit_status: Callable[[int], int | None] = child_exit,
        kill: Callable[[int], None] = lambda pid: os.kill(pid, signal.SIGKILL),
        kill_group: Callable[[int], None] = kill_group,
        abandon: Callable[[], None] = lambda: None,
    ) -> None:
        self.board = board
        self.exit_deadline_s = exit_deadline_s
        self.kills: list[Kill] = []
        self.exits: dict[int, int] = {}
        """Each exited worker's status (negative: the signal), by rank."""
        self._clock = clock
        self._exit_status = exit_status
        self._kill = kill
        self._kill_group = kill_group
        self._abandon = abandon
        self._killed: set[int] = set()
        self._accounted_at: float | None = None
        self._first_exit_at: float | None = None
        self._all_exited_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="maestro-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def killed(self, rank: int) -> bool:
        """Whether this watchdog ended ``rank``."""
        return any(k.rank == rank for k in self.kills)

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_POLL_S):
            try:
                self.check()
            except Exception as exc:  # never let the watchdog die silently
                log.debug("watchdog: %s", exc)

    def check(self) -> None:
        """One look at the board (the thread calls it every :data:`WATCH_POLL_S`)."""
        board, now = self.board, self._clock()
        ranks = range(board.num_workers)
        pids = [board.pids[r] for r in ranks]
        for r in ranks:
            if pids[r] and r not in self.exits:
                status = self._exit_status(pids[r])
                if status is not None:
                    self.exits[r] = status
                    self._kill_group(pids[r])  # whatever its blocks left behind
        running = [bool(pids[r]) and r not in self.exits for r in ranks]
        for r in ranks:
            if board.missing[r] and running[r]:
                self._end(r, "did not reach the run's agreement step (stopped or hung)")
        if all(not running[r] or board.stage[r] >= VERDICT or board.missing[r] for r in ranks):
            if self._accounted_at is None:
                self._accounted_at = now
            elif now - self._accounted_at >= EXIT_GRACE_S:
                for r in ranks:
                    if running[r]:
                        self._end(r, f"was still running {EXIT_GRACE_S:g} s after the run ended")
        if self.exits and self._first_exit_at is None:
            self._first_exit_at = now
        if self._first_exit_at is not None and now - self._first_exit_at >= self.exit_deadline_s:
            for r in ranks:
                if running[r]:
                    self._end(
                        r,
                        f"was still running {self.exit_deadline_s:g} s after another worker exited",
                    )
        if len(self.exits) == board.num_workers:
            if self._all_exited_at is None:
                self._all_exited_at = now
            elif now - self._all_exited_at >= EXIT_GRACE_S:
                self._stop.set()
                self._abandon()

    def _end(self, rank: int, reason: str) -> None:
        if rank in self._killed:
            return
        self._killed.add(rank)
        try:
            self._kill(self.board.pids[rank])
        except ProcessLookupError:
            return
        self.kills.append(Kill(rank, reason))
