"""One rank's whole run, the cluster shell around core/measure: each pattern's phases, each agreed
with every rank (one rank's failure ends every rank with the same error), each outcome handed
to rank 0's sink; one exit status per process (run_worker). Also the communicators of the axes,
and their abort after a failure that left collectives half-issued."""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import torch.distributed as tdist

from ...errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ConfigError,
    OptionError,
    RunError,
    cause_of,
    interrupted_message,
    say,
    user_error_message,
)
from ..analysis.records import PatternOutcome
from ..analysis.whatif import WhatIfResult
from ..config.options import RunOptions
from ..config.spec import AxisSpec, PatternSpec, SuiteSpec
from ..measure.pattern import Measured, measure_pattern
from ..measure.prepare import Allocated
from ..measure.rig import Rig, make_rig
from . import supervision
from .agreement import ENDED_ACK_WAIT_S, agree, grace_s, group_timeout, post_ended
from .rendezvous import (
    DistContext,
    LaunchInfo,
    apply_env,
    detect_launch,
    init_distributed,
    shared_options,
    shutdown_distributed,
)

log = logging.getLogger("maestro")


class Sink(Protocol):
    """Rank 0's reporter, which the command line chooses (core/output/reporter.py); an error
    it raises while saving is agreed on by every rank, as phase ``output``."""

    def start(self, place: Any, profiler: Any, calibration: Mapping[str, float]) -> None: ...

    def note(self, doing: str, step: int = 0, steps: int = 0) -> None: ...

    def finished(
        self, pattern: PatternSpec, outcome: PatternOutcome, run_info: Mapping[str, str]
    ) -> None: ...

    def whatif_finished(self, pattern: PatternSpec, results: tuple[WhatIfResult, ...]) -> None:
        """After ``finished`` for ``pattern`` and for each of its variants: their what-if
        results, in ``pattern.variants`` order."""

    def failed(self, pattern: str, message: str) -> None: ...

    def close(self, status: int) -> None: ...


class SinkFactory(Protocol):
    """What the CLI hands the shell: it makes rank 0's sink, and says first (before any worker
    starts) what the sink cannot write on this machine (OptionError)."""

    def __call__(self, suite: SuiteSpec, options: RunOptions, *, guard: Any) -> Sink: ...

    def check(self, options: RunOptions) -> None: ...


@dataclass
class _Ending:
    """How this rank's run ends, as far as it knows, and rank 0's sink, which saves it."""

    rank: int
    report: Sink | None = None
    status: int = EXIT_OK
    everyone_answered: bool = True  # False: nobody waits again for a rank that died or hung
    missing: set[int] = field(default_factory=set)  # the ranks a verdict named as gone
    verdict: str = ""
    late_interrupt: bool = False  # a signal after the last agreement: no closing round

    def failed(self, err: RunError) -> None:
        self.everyone_answered = err.everyone_answered
        self.missing.update(err.missing or ())
        self.verdict = self.verdict or (str(err) if err.missing else "")
        self.status = EXIT_INTERRUPTED if err.interrupted else EXIT_FAILED


def run_suite(
    suite: SuiteSpec, options: RunOptions, launch: LaunchInfo, sink: SinkFactory | None = None
) -> int:
    """Run every pattern of ``suite`` (validated for this launch) on this rank, rank 0 telling
    a ``sink`` of it; returns the exit status (0, 1 a pattern failed, 130 interrupted).
    ConfigError/OptionError: ranks started inconsistently; RunError: this rank cannot join."""
    apply_env(suite.env)  # before the first communicator: NCCL reads NCCL_* once
    restore_signals = supervision.install()
    try:
        with supervision.deliverable():  # the rendezvous may wait long for a missing rank
            dist = init_distributed(
                launch,
                backend=options.backend,
                timeout_s=suite.timeout_s,
                shared={"pattern_sha256": suite.text_sha256, "options": shared_options(options)},
                source=suite.source,
            )
    except BaseException:
        restore_signals()
        raise
    end = _Ending(dist.rank)
    if sink is not None and dist.rank == 0:
        end.report = sink(suite, options, guard=supervision.held)
    rig = None
    try:
        rig = _phase_setup(suite, options, dist)
        if end.report is not None:
            end.report.start(dist, rig.profiler, rig.calibration)
            rig.note = end.report.note
        for pattern in suite.patterns:
            if not _one_pattern(rig, dist, pattern, end):
                break
        if end.status == EXIT_OK and supervision.pending_interrupt():
            # The signal came after the last agreement: every rank finished every pattern, so
            # there is nobody to tell and nothing to wait for; only the exit status says it.
            end.late_interrupt = True
            end.status = EXIT_INTERRUPTED
    except RunError as err:
        end.failed(err)
        if (end.report is not None or not end.everyone_answered) and not err.interrupted:
            say(f"maestro: {err}")
    except KeyboardInterrupt as exc:
        # A second signal outside a phase: this rank leaves at once, without the agreement.
        end.everyone_answered = False
        peer = isinstance(exc, supervision.PeerExited)  # the launcher reports the exited worker
        end.status = EXIT_FAILED if peer else EXIT_INTERRUPTED
    except BaseException as exc:  # SystemExit or a bug: reported, and left to the others
        end.everyone_answered = False
        end.status = EXIT_FAILED
        say(f"maestro: rank {dist.rank}: stopped by {cause_of(exc)}")
    finally:
        _leave(dist, rig, end)
        restore_signals()
    return end.status


def setup_rig(suite: SuiteSpec, options: RunOptions, dist: DistContext) -> Rig:
    """This rank's rig: the gloo group of its cross-rank figures, the communicators of the axes
    its patterns and variants use, then its profiler and lanes (core/measure/rig.py)."""
    used = {b.axis for p in suite.patterns for v in (p, *p.variants) for b in v.blocks}
    sync_group = tdist.new_group(backend="gloo", timeout=group_timeout("gloo", suite.timeout_s))
    comms = Communicators(
        suite.axes, rank=dist.rank, backend=dist.backend, timeout_s=suite.timeout_s, used=used
    )
    return make_rig(suite, options, dist, comms, sync_group)


GATE_GROUP = "(gate)"  # the gate's alignment group among the axes' (no axis has parentheses)


def nccl_options(axis: AxisSpec, timeout: timedelta) -> Any:
    """A fresh ProcessGroupNCCL.Options for ``axis`` (torch has ProcessGroupNCCL: the default
    group was made on NCCL); unsupported fields are a clear error."""
    opts = tdist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = axis.priority == "high"
    if hasattr(opts, "_timeout"):
        # new_group warns when the options' timeout differs from its own timeout argument.
        opts._timeout = timeout
    config = getattr(opts, "config", None)
    for key, value in axis.nccl.items():
        if config is None or not hasattr(config, key):
            valid = sorted(k for k in dir(config) if not k.startswith("_")) if config else []
            raise RunError(
                f"axis {axis.name!r}: nccl option {key!r} is not supported by the "
                f"installed torch/NCCL (ProcessGroupNCCL.Options.config fields: "
                f"{', '.join(valid) or 'none'})",
                phase="setup",
            )
        setattr(config, key, value)
    return opts


class Communicators:
    """The process group of this rank's team on each axis (None where it is in no team), made
    once per run in the same order on every rank (torch requires it)."""

    def __init__(
        self,
        axes: Mapping[str, AxisSpec],
        *,
        rank: int,
        backend: str,
        timeout_s: float,
        used: Iterable[str] | None = None,
    ) -> None:
        self.rank = rank
        self.backend = backend
        self.timeout_s = timeout_s
        self._timeout = group_timeout(backend, timeout_s)
        self._axes = dict(axes)
        self._groups: dict[str, Any] = {}
        for name in list(self._axes) if used is None else [a for a in self._axes if a in set(used)]:
            self._create(self._axes[name])

    def _create(self, axis: AxisSpec) -> None:
        if axis.nccl and self.backend != "nccl":
            log.warning(
                "axis %r: nccl options %s have no effect on the %s backend",
                axis.name,
                dict(axis.nccl),
                self.backend,
            )
        if axis.priority == "high" and self.backend != "nccl":
            log.warning(
                "axis %r: priority: high has no effect on the %s backend (CPU lanes are "
                "threads without priorities; it sets CUDA stream and NCCL priorities)",
                axis.name,
                self.backend,
            )
        mine = None
        for team in axis.teams:
            kwargs = {"ranks": list(team), "backend": self.backend, "timeout": self._timeout}
            if self.backend == "nccl":  # a fresh object per group: new_group writes into it
                kwargs["pg_options"] = nccl_options(axis, self._timeout)
            group = tdist.new_group(**kwargs)
            if self.rank in team:
                mine = group
        self._groups[axis.name] = mine
        log.debug("axis %s: %d team(s) of %d", axis.name, len(axis.teams), axis.team_size)

    def gate_group(self) -> Any:
        """A new NCCL group of every rank for the gate's alignment all_reduce, held (and
        aborted after a failure) with the axes' groups, under the same watchdog timeout."""
        group = tdist.new_group(backend="nccl", timeout=self._timeout)
        self._groups[GATE_GROUP] = group
        return group

    def group(self, axis: str) -> Any:
        """This rank's group on ``axis`` (None when the rank is in no team of it)."""
        return self._groups[axis]

    def axis(self, name: str) -> AxisSpec:
        return self._axes[name]

    def team(self, axis: str) -> tuple[int, ...] | None:
        return self._axes[axis].team_of(self.rank)

    def abort(self) -> bool:
        """Abort every communicator after a failure left collectives half-issued; False when it
        did not end within grace_s (kernels hold the GPU). NCCL groups all at once (one by one
        they can block each other: pytorch/pytorch#119797); gloo's operations timed out."""
        groups = dict(self._groups)
        self._groups = {name: None for name in self._groups}
        if self.backend != "nccl":
            return True
        thread = threading.Thread(
            target=_abort_groups, args=(groups,), name="maestro-nccl-abort", daemon=True
        )
        thread.start()
        thread.join(wait_s := grace_s(self.timeout_s))
        if not thread.is_alive():
            return True
        log.error(
            "rank %d: the NCCL communicators did not abort within %g s (collective kernels "
            "still hold the GPU); leaving without tearing NCCL down",
            self.rank,
            wait_s,
        )
        return False


def _abort_groups(groups: Mapping[str, Any]) -> None:
    abort_all = getattr(tdist.distributed_c10d, "_abort_process_group", None)
    if abort_all is not None and tdist.is_initialized():
        try:
            abort_all()
            return
        except Exception as exc:  # aborting after a failure must not hide the failure
            log.warning("aborting every process group at once failed (%s); aborting each", exc)
    for name, group in groups.items():
        if group is None:
            continue
        abort = getattr(group, "abort", None)
        if abort is None:
            log.warning("axis %s: this torch cannot abort a process group", name)
            continue
        try:
            abort()
        except Exception as exc:  # aborting after a failure must not hide the failure
            log.debug("axis %s: abort failed: %s", name, exc)


def _phase_setup(suite: SuiteSpec, options: RunOptions, dist: DistContext) -> Any:
    rig = None
    error: BaseException | None = None
    groups = len(suite.axes) + 2  # each new group may wait timeout_s for its peers
    try:
        with supervision.deliverable(), dist.agreement.waiting(groups * suite.timeout_s, dist.rank):
            rig = setup_rig(suite, options, dist)
    except (Exception, KeyboardInterrupt) as exc:  # reported through the agreement step
        error = exc
    agree(dist.agreement, dist.rank, "setup", error)
    return rig


T = TypeVar("T")


def _phase(rig: Rig, dist: DistContext, phase: str, pattern: str, work: Callable[[], T]) -> T:
    error: BaseException | None = None
    result: Any = None
    if rig.note is not None:
        rig.note(f"{pattern}: {phase}")
    # Where a rank that ends without a word was: the phase the others' agreement will name.
    supervision.agreed(f"entering pattern {pattern!r}, phase {phase}")
    try:
        with supervision.deliverable():  # the only place a signal stops a pattern
            result = work()
    except (Exception, KeyboardInterrupt, SystemExit) as exc:  # interrupts too: one message
        error = exc
        log.debug("rank %d failed in %s: %s", dist.rank, phase, exc, exc_info=True)
    # Phases that issue collectives leave them half-done when one rank stops early.
    agree(dist.agreement, dist.rank, phase, error, pattern=pattern, contained=phase == "setup")
    return result


def run_pattern(rig: Rig, dist: DistContext, pattern: PatternSpec) -> Measured:
    """Every phase of ``pattern`` (and of its what-if variants) on this rank, each agreed, then
    its teardown. A failure that left collectives half-issued aborts the communicators before
    the teardown."""
    drain_s = grace_s(rig.suite.timeout_s)  # after a failure, for the device to finish
    held = Allocated(rig, pattern.name)
    failed = False
    try:
        step = functools.partial(_phase, rig, dist)
        return measure_pattern(rig, pattern, held, step, rounds=rig.rounds)
    except RunError as err:
        failed = True
        if not err.contained:
            rig.wedged = not rig.comms.abort()
        raise
    finally:
        held.teardown(failed=failed, drain_s=drain_s)


def _one_pattern(rig: Rig, dist: DistContext, pattern: PatternSpec, end: _Ending) -> bool:
    # Phase output: a teardown's error, or rank 0's files that cannot be written, stop every
    # rank. False: the run stops here.
    measured, failure, error = None, None, None
    try:
        measured = run_pattern(rig, dist, pattern)
    except RunError as err:
        failure = err
        end.failed(err)
        if end.report is None and err.missing and 0 in err.missing:
            say(f"maestro: {err}")  # rank 0 is gone: it cannot say it
    except Exception as exc:  # the pattern's teardown (its phases were agreed): said below
        error = RunError(cause_of(exc), phase="teardown")
        error.__cause__ = exc
    if measured is not None and any(o.check_failed for _, o in measured.outcomes):
        end.status = max(end.status, EXIT_FAILED)  # wrong results fail; numbers are saved
    stop_on_error = rig.suite.stop_on_error
    stop = failure is not None and (
        end.status != EXIT_FAILED or stop_on_error or not failure.contained
    )
    if end.report is not None and error is None:
        try:
            if measured is not None:
                _report(end.report, pattern, measured, rig.profiler.run_info())
            else:
                end.report.failed(pattern.name, str(failure))
        except Exception as exc:  # a full disk, a folder removed: every rank stops
            error = exc if isinstance(exc, RunError) else RunError(cause_of(exc))
            if stop:
                say(f"maestro: rank 0, phase output, pattern {pattern.name!r}: {error.detail}")
    return not stop and _agree_output(dist, pattern.name, error, end, stop_on_error)


def _report(sink: Sink, pattern: PatternSpec, measured: Measured, run_info: Mapping) -> None:
    for spec, outcome in measured.outcomes:
        sink.finished(spec, outcome, run_info)
    if pattern.variants:
        sink.whatif_finished(pattern, measured.whatif)


def _agree_output(
    dist: DistContext, pattern: str, error: RunError | None, end: _Ending, stop_on_error: bool
) -> bool:
    try:
        agree(dist.agreement, dist.rank, "output", error, pattern=pattern)
    except RunError as err:  # a teardown, or rank 0's files
        end.failed(err)
        if end.report is not None and err.phase == "teardown":
            try:
                end.report.failed(pattern, str(err))
            except Exception as exc:  # the sink's RunError names the file's error as its cause
                say(f"maestro: rank 0: cannot save the failure: {cause_of(exc.__cause__ or exc)}")
        elif end.report is not None or not end.everyone_answered:
            say(f"maestro: {err}")
        return err.phase == "teardown" and not stop_on_error and err.contained
    return True


def _leave(dist: DistContext, rig: Rig | None, end: _Ending) -> None:
    # The others leave together: a launcher that sees one fail kills the rest.
    if end.report is not None:
        end.report.close(end.status)
    # Saved and printed: the ranks named as gone may now be ended (by the local launcher,
    # or by their own watch of the store: a rank stuck in a block has no other way out).
    supervision.reached_verdict(end.status, end.missing)
    if gone := sorted(end.missing - {end.rank}):  # told the run ended (agreement.watch_ended)
        try:
            with dist.agreement.waiting(ENDED_ACK_WAIT_S, dist.rank, status=end.status):
                post_ended(dist.agreement.store, gone, end.verdict, wait=dist.hosts_store)
        except Exception as exc:  # the store went away with its host: nobody left to tell
            log.debug("could not post the end of the run: %s", exc)
    if end.status and end.everyone_answered and not end.late_interrupt:
        try:
            agree(dist.agreement, dist.rank, "exit", None)  # the closing round: leave together
        except Exception as exc:  # the run already failed; this is only about timing
            log.debug("closing round: %s", exc)
    if rig is not None and rig.wedged:
        # NCCL could not be aborted: tearing down would hang too, and everything is saved.
        supervision.hard_exit(end.status or EXIT_FAILED, end.rank)
    # Communicators first: detaching CUPTI while NCCL holds them can crash the process.
    try:
        shutdown_distributed(dist)
    finally:
        if rig is not None:
            rig.profiler.close()


LINGER_S = 1.0  # how long a rank's exit waits for threads its blocks left running


def run_worker(suite: SuiteSpec, options: RunOptions, sink: SinkFactory | None = None) -> int:
    """Run ``suite`` on this rank (rank 0 reporting to a ``sink``); returns its exit status.
    What ends the run before its own protocol takes over is said here in one line; what blocks
    leave behind cannot hold the exit (children ended, threads given :data:`LINGER_S`)."""
    launch = detect_launch()
    rank, status = launch.rank, EXIT_FAILED
    one_intra_op_thread_unless_chosen(os.environ)
    try:
        with supervision.exits_refused():
            status = run_suite(suite, options, launch, sink)
    except (ConfigError, OptionError) as err:
        if rank == 0:  # every rank found it; one says it
            say(user_error_message(err))
        status = EXIT_USAGE
    except RunError as err:
        say(f"maestro: rank {rank}: {err}")
        supervision.reached_verdict(EXIT_FAILED, err.missing or ())  # the launcher ends them
    except supervision.PeerExited:
        pass  # another worker ended before the run began: the launcher says which
    except KeyboardInterrupt:
        if rank == 0 and supervision.forwarded():  # else the local launcher knows who and why
            say(interrupted_message(saved=False))
        status = EXIT_INTERRUPTED
    except BaseException as exc:  # torch or the machine, before the run's own protocol
        say(f"maestro: rank {rank}, phase start-up: {cause_of(exc)}")
    supervision.end_children()
    main = threading.main_thread()
    if any(t.is_alive() and not t.daemon and t is not main for t in threading.enumerate()):
        # A block's thread would hold the interpreter's exit forever.
        timer = threading.Timer(LINGER_S, supervision.hard_exit, (status, rank))
        timer.daemon = True
        timer.start()
    return status


def one_intra_op_thread_unless_chosen(environ: Mapping[str, str]) -> None:
    """One intra-op thread per rank unless ``OMP_NUM_THREADS`` says otherwise: a host-wide pool
    competes with the lane threads, and its timings vary from process to process."""
    if "OMP_NUM_THREADS" not in environ:
        import torch

        torch.set_num_threads(1)
