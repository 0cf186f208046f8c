"""Start N local workers through torch's launcher API when no launcher started us. They start
with SIGINT/SIGTERM/SIGHUP blocked (a signal during torch's import waits for their handler) and die
with the launcher, whose watchdog (supervision.py) ends what cannot end by itself."""

from __future__ import annotations

import _thread
import gc
import inspect
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
from typing import TYPE_CHECKING

from ...errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, interrupted_message, say
from ..config.options import RunOptions
from ..config.spec import SuiteSpec
from . import supervision
from .agreement import agreement_timeout_s

if TYPE_CHECKING:
    from .phases import SinkFactory

log = logging.getLogger("maestro.launcher")

_ROUTED = (signal.SIGINT, *supervision.TERMINATING)
_OWN_STATUSES = (EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED)  # a worker printed why itself


def _worker(
    suite: SuiteSpec,
    options: RunOptions,
    parent_pid: int,
    sink: SinkFactory | None,
    board: supervision.WorkerBoard,
) -> int:
    # A failure leaves as SystemExit: torch's launcher sees the exit status at once, instead
    # of waiting for a returned value after every other worker.
    rank = int(os.environ["LOCAL_RANK"])  # one node: the global rank
    supervision.die_with_parent(parent_pid)
    os.setpgid(0, 0)  # a group of its own: the launcher ends it, and what its blocks started
    supervision.attach(board, rank)

    from .phases import run_worker  # a running rank's modules: imported in the worker only

    supervision.configure_logging(options.log_level)
    status = run_worker(suite, options, sink)
    supervision.leave(status, rank)
    gc.freeze()  # no collection of the whole heap at exit (__main__.py)
    if status != EXIT_OK:
        raise SystemExit(status)
    return EXIT_OK


@contextmanager
def _signals_to_main_thread(board: supervision.WorkerBoard) -> Iterator[None]:
    # Block SIGINT/SIGTERM/SIGHUP here (workers inherit it); a helper thread runs this thread's
    # handler, looked up then (torch's agent installs its own), for the first one only: later
    # ones would cut torch's shutdown of the workers short.
    main = threading.current_thread() is threading.main_thread()
    if not main or not hasattr(signal, "sigtimedwait"):
        yield
        return
    handlers = {s: signal.getsignal(s) for s in (*_ROUTED, signal.SIGQUIT)}
    # Python's resource tracker (started with the first spawned process) unblocks the signals
    # after starting itself, the way this function blocks them (bpo-33613): start it first.
    # It ignores SIGINT and SIGTERM, not the SIGHUP a closed terminal sends the whole process
    # group: ignored (as its child inherits), or every worker's exit prints its traceback.
    from multiprocessing import resource_tracker

    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, handlers[signal.SIGHUP] or signal.SIG_DFL)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _ROUTED)
    stop = threading.Event()

    def route() -> None:
        forwarded = False
        while not stop.is_set():
            info = signal.sigtimedwait(_ROUTED, 0.1)
            if info is None or forwarded or info.si_signo not in _ROUTED:  # 0: a tracer woke it
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
def _quiet_torch_launcher() -> Iterator[None]:  # the workers and this launcher say it
    prefixes = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
    names = [name for name in logging.root.manager.loggerDict if name.startswith(prefixes)]
    previous = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in previous.items():
            logging.getLogger(name).setLevel(level)


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
    """Longest a worker may run on after another exited: the longest agreement wait, then
    :data:`supervision.EXIT_GRACE_S` to leave."""
    return agreement_timeout_s(timeout_s) + supervision.EXIT_GRACE_S


# torch's launcher's wait between its SIGTERM and SIGKILL to a worker where LaunchConfig has
# no shutdown_timeout (torch < 2.12).
TORCH_SHUTDOWN_DEFAULT_S = 30


def _shutdown_timeout_kwargs(launch_config: type, deadline_s: float) -> dict[str, int]:
    # torch >= 2.12: workers ended by torch get the whole exit deadline to save and leave;
    # older ones kill them sooner, and the watchdog and _outcome still report every worker.
    if "shutdown_timeout" in inspect.signature(launch_config).parameters:
        return {"shutdown_timeout": math.ceil(deadline_s)}
    if deadline_s > TORCH_SHUTDOWN_DEFAULT_S:
        log.debug(
            "this torch's launcher kills workers %d s after its SIGTERM (exit deadline %.0f s)",
            TORCH_SHUTDOWN_DEFAULT_S,
            deadline_s,
        )
    return {}


def launch_local(
    suite: SuiteSpec, options: RunOptions, nproc: int, sink: SinkFactory | None = None
) -> int:
    """Run ``nproc`` workers of ``suite`` here (rank 0 reporting to a ``sink``); returns the
    run's exit status: the worst a worker reached (130 only when the user interrupted)."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logs = tempfile.mkdtemp(prefix="maestro-launch-")  # torch's per-run folder: removed after
    cfg = LaunchConfig(
        **_shutdown_timeout_kwargs(LaunchConfig, exit_deadline_s(suite.timeout_s)),
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
    )
    board = supervision.WorkerBoard(nproc, multiprocessing.get_context("spawn"))
    watchdog = supervision.Watchdog(
        board,
        exit_deadline_s=exit_deadline_s(suite.timeout_s),
        abandon=lambda: _abandon(board, watchdog, logs),
    )
    exits: dict[int, int] = {}
    try:
        with _quiet_torch_launcher(), _signals_to_main_thread(board):
            watchdog.start()  # with the signals blocked, as every thread but the router
            # No string among the arguments: torch's launcher would rewrite it.
            results = elastic_launch(cfg, _worker)(suite, options, os.getpid(), sink, board)
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
    for kill in watchdog.kills:
        log.warning("rank %d %s: ended it with SIGKILL", kill.rank, kill.reason)
    if board.interrupted.value:
        if not board.told.value:
            say(interrupted_message(saved=False))
        return EXIT_INTERRUPTED
    # A worker's 130 without the user's signal to the launcher is the user's signal to that
    # worker, unless a worker crashed before: then it is torch's SIGTERM ending the run.
    crashed = any(c not in (EXIT_OK, *_OWN_STATUSES) for c in exits.values())
    statuses = []
    for rank in range(board.num_workers):
        code = exits.get(rank)
        if board.stage[rank] >= supervision.VERDICT:  # its own status, saved and printed
            code = int(board.status[rank])
        elif watchdog.killed(rank):
            code = EXIT_FAILED
        elif code is not None and code not in _OWN_STATUSES:
            how = _describe_exit(code) if code else "exited with status 0"
            step = board.last_step(rank)
            when = f" after {step}" if step else " during start-up"
            log.error("rank %d %s%s, before the run ended", rank, how, when)
            code = EXIT_FAILED
        if code == EXIT_INTERRUPTED and crashed:
            code = EXIT_FAILED
        elif code == EXIT_INTERRUPTED and not board.last_step(rank):  # it said nothing yet
            say(f"maestro: rank {rank}: interrupted (a signal sent to it) during start-up")
        if code is not None:
            statuses.append(code)
    return max(statuses, default=EXIT_FAILED)


def _abandon(board: supervision.WorkerBoard, watchdog: supervision.Watchdog, logs: str) -> None:
    # Every worker ended and torch's launcher still waits (for a worker that vanished).
    status = _outcome(board, watchdog, dict(watchdog.exits))
    shutil.rmtree(logs, ignore_errors=True)
    supervision.hard_exit(status, -1)
