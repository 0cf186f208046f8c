"""Start N local workers through torch's own launcher API when no launcher started us.

Exit status: the worst of the workers' (each leaves with its own); 130 when the launcher was
interrupted. Interrupts: torch's agent turns SIGINT/SIGTERM into a SignalException and
forwards the signal to the workers, which stop through their agreement step (rank 0 prints
the verdict). Workers start with SIGINT/SIGTERM blocked, so a signal that arrives while one
still imports torch waits for its handler instead of raising mid-import; the launcher's own
signals are received by a helper thread and handed to its main thread.

No process outlives the run: workers die with the launcher, and the launcher's watchdog
(core/runtime/supervision.py) ends the workers that cannot end by themselves and what each
worker left behind (its process group). Workers get the suite the command line validated and
its options; they never read the pattern file. The launcher ends once its workers have, even
when torch's launcher would wait on one that vanished.
"""

from __future__ import annotations

import _thread
import logging
import math
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ...errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    interrupted_message,
    say,
)
from ..config.options import RunOptions
from ..config.spec import SuiteSpec
from . import interrupts, supervision

log = logging.getLogger("maestro.launcher")

_ROUTED = (signal.SIGINT, signal.SIGTERM)
_OWN_STATUSES = (EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED)
"""Statuses a worker leaves with after printing why; any other is reported by the launcher."""


@dataclass(frozen=True)
class _Job:
    """What every worker runs (one object: torch's launcher rewrites string arguments)."""

    suite: SuiteSpec
    """The suite the command line validated, with its options applied."""
    options: RunOptions
    parent_pid: int
    """The launcher's pid: a worker ends when it does."""


def _worker(job: _Job, board: supervision.WorkerBoard) -> int:
    """Entry point of one worker process (module level so it can be pickled).

    A non-zero status leaves as SystemExit, so torch's launcher sees it as the process's exit
    status: a success returned as a value would make that worker wait for every other, and an
    interrupted launcher, which no longer collects values, would wait for it in turn.
    """
    rank = int(os.environ["LOCAL_RANK"])  # one node: the global rank
    supervision.die_with_parent(job.parent_pid)
    os.setpgid(0, 0)  # a group of its own: the launcher ends it, and what its blocks started
    supervision.attach(board, rank)
    interrupts.set_exited_peers(supervision.exited_peers)

    from .logs import configure_logging
    from .worker import run_worker

    configure_logging(job.options.log_level)
    status = run_worker(job.suite, job.options)
    supervision.leave(status, rank)
    if status != EXIT_OK:
        raise SystemExit(status)
    return EXIT_OK


@contextmanager
def _signals_to_main_thread(board: supervision.WorkerBoard) -> Iterator[None]:
    """Block SIGINT/SIGTERM in this thread (workers inherit it: see :func:`_worker`), receive
    them in a helper thread and run this thread's handler for the first one.

    The handler is looked up when a signal comes, because torch's agent installs its own while
    it starts the workers. Later signals are dropped so that they cannot break torch's
    shutdown of the workers half-way; Ctrl-C reaches the workers directly anyway, and the
    shutdown has a deadline.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "sigtimedwait"
    ):
        yield
        return
    handlers = {
        s: signal.getsignal(s)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    }
    # Python's resource tracker (started with the first spawned process) unblocks both signals
    # after starting itself, the way this function blocks them (bpo-33613): start it first.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _ROUTED)
    stop = threading.Event()

    def route() -> None:
        forwarded = False
        while not stop.is_set():
            info = signal.sigtimedwait(_ROUTED, 0.1)
            if info is None or forwarded:
                continue
            forwarded = True
            board.interrupted.value = 1  # workers: the SIGTERM that follows is the user's
            handler = signal.getsignal(info.si_signo)
            if callable(handler):
                _thread.interrupt_main(info.si_signo)
            elif handler == signal.SIG_DFL:  # what the signal would have done: end the process
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [info.si_signo])
                signal.raise_signal(info.si_signo)
            # SIG_IGN: ignored, as it would have been

    helper = threading.Thread(target=route, name="maestro-signals", daemon=True)
    helper.start()
    try:
        yield
    finally:
        stop.set()
        helper.join()
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        # torch's agent leaves its handlers installed; after the launch they would turn a
        # signal into a SignalException traceback.
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)


@contextmanager
def _quiet_torch_launcher() -> Iterator[None]:
    """Silence torch's launcher logs (start-up details, the workers' exit codes, the signal it
    forwards): the workers and this launcher report what happened in maestro's own words."""
    names = [
        name
        for name in logging.root.manager.loggerDict
        if name.startswith(
            ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
        )
    ]
    loggers = [logging.getLogger(name) for name in names]
    previous = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, previous, strict=True):
            logger.setLevel(level)


def _describe_exit(exitcode: int) -> str:
    if exitcode == -signal.SIGKILL:
        return "was killed (SIGKILL: out of memory?)"  # what the kernel's OOM killer sends
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def exit_deadline_s(timeout_s: float) -> float:
    """Longest a worker may run on after another worker exited: the agreement step's longest
    wait, then :data:`supervision.EXIT_GRACE_S` to leave."""
    from .agreement import agreement_timeout_s

    return agreement_timeout_s(timeout_s) + supervision.EXIT_GRACE_S


def launch_local(suite: SuiteSpec, options: RunOptions, nproc: int) -> int:
    """Run ``nproc`` workers of ``suite`` on this machine; returns the run's exit status: the
    worst a worker reached (130 only when the user interrupted the launcher).

    An interrupted worker may need the suite's collective timeout plus the agreement's grace
    to stop, so the launcher waits that long before killing it.
    """
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # As torchrun does: one intra-op thread per worker unless the user chose otherwise.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    logs = tempfile.mkdtemp(prefix="maestro-launch-")  # torch's per-run folder: removed after
    cfg = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"maestro-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=logs),
        shutdown_timeout=math.ceil(exit_deadline_s(suite.timeout_s)),
    )
    board = supervision.WorkerBoard(nproc, multiprocessing.get_context("spawn"))
    job = _Job(suite=suite, options=options, parent_pid=os.getpid())
    watchdog = supervision.Watchdog(
        board,
        exit_deadline_s=exit_deadline_s(suite.timeout_s),
        abandon=lambda: _abandon(board, watchdog, logs),
    )
    exits: dict[int, int] = {}
    try:
        with _quiet_torch_launcher(), _signals_to_main_thread(board):
            watchdog.start()  # with the signals blocked, as every thread but the router
            results = elastic_launch(cfg, _worker)(job, board)
        exits = {rank: int(code or 0) for rank, code in results.items()}
    except ChildFailedError as exc:
        exits = {rank: failure.exitcode for rank, failure in exc.failures.items()}
    except (SignalException, KeyboardInterrupt):
        pass  # the workers were sent the signal and have exited (or were killed at the deadline)
    finally:
        watchdog.stop()
        for pid in board.pids:
            supervision.kill_group(pid)
        shutil.rmtree(logs, ignore_errors=True)
    return _outcome(board, watchdog, {**watchdog.exits, **exits})


def _outcome(board: supervision.WorkerBoard, watchdog: supervision.Watchdog, exits: dict) -> int:
    """The run's exit status once every worker has ended, and the launcher's lines: a worker
    killed, or gone without a word; 130 only for the user's interrupt."""
    for kill in watchdog.kills:
        log.warning("rank %d %s: ended it with SIGKILL", kill.rank, kill.reason)
    if board.interrupted.value:
        if not board.told.value:
            say(interrupted_message(saved=False))
        return EXIT_INTERRUPTED
    # A worker's 130 without the user's signal to the launcher is torch's SIGTERM after another
    # worker failed, unless no worker failed: then the user signalled that worker itself.
    crashed = any(c not in (EXIT_OK, EXIT_INTERRUPTED) for c in exits.values())
    statuses = []
    for rank in range(board.num_workers):
        code = exits.get(rank)
        if board.stage[rank] >= supervision.VERDICT:  # its own status, saved and printed
            code = int(board.status[rank])
        elif watchdog.killed(rank):
            code = EXIT_FAILED
        elif code is not None and code not in (EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED):
            step = board.last_step(rank)
            after = f" after {step}" if step else " during start-up"
            how = _describe_exit(code) if code else "exited with status 0"
            log.error("rank %d %s%s, before the run ended", rank, how, after)
            code = EXIT_FAILED
        if code is not None:
            statuses.append(EXIT_FAILED if code == EXIT_INTERRUPTED and crashed else code)
    return max(statuses, default=EXIT_FAILED)


def _abandon(board: supervision.WorkerBoard, watchdog: supervision.Watchdog, logs: str) -> None:
    """Every worker has ended and torch's launcher still waits (on a result a worker that
    vanished never sent): report and end the launcher here."""
    status = _outcome(board, watchdog, dict(watchdog.exits))
    shutil.rmtree(logs, ignore_errors=True)
    supervision.hard_exit(status, -1)
