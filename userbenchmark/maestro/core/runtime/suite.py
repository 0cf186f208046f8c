"""One rank's whole run and its failure protocol: start the runtime, measure every pattern,
agree on each outcome; rank 0 hands each pattern to its reporter (core/output/reporter.py)
before the next one starts."""

from __future__ import annotations

import datetime as _dt
import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from ...errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, RunError, cause_of, say
from ..analysis import fidelity
from ..config.options import RunOptions, shared_options
from ..config.spec import SuiteSpec
from ..output.reporter import Reporter
from ..output.settings import run_environ
from ..profilers.profiler_registry import make_profiler
from . import interrupts, supervision
from .agreement import ENDED_ACK_WAIT_S, agree, post_ended
from .communicators import Communicators
from .distributed import (
    DistContext,
    LaunchInfo,
    apply_env,
    init_distributed,
    shutdown_distributed,
    torch_reducer,
)
from .lanes import CpuLanes, CudaLanes, calibrate_sleep_cycles_per_us
from .pattern import Runtime, measure_pattern

log = logging.getLogger("maestro")


def _device_alignment(dist: DistContext, comms: Any) -> Any:
    """What the gate stream runs before its spin so that every rank's gate opens together:
    a one-element all_reduce on a communicator of its own (None for one rank)."""
    if dist.world_size == 1:
        return None
    group, one = comms.gate_group(), torch.zeros(1, device=dist.device)
    return lambda: tdist.all_reduce(one, group=group)


def _start_agreement(dist: DistContext, group: Any) -> Any:
    """CPU lanes: the latest of every rank's proposed start instant, or None when the ranks
    share no clock (several hosts) or there is nobody to agree with."""
    if dist.world_size == 1 or not dist.one_host:
        return None
    reduce = torch_reducer(group)
    return lambda proposal_ns: int(reduce(np.array([proposal_ns], dtype=np.int64), "max")[0])


def _setup_runtime(suite: SuiteSpec, options: RunOptions, dist: DistContext) -> Runtime:
    used = {b.axis for p in suite.patterns for b in p.blocks}
    sync_group = tdist.new_group(backend="gloo", timeout=_dt.timedelta(seconds=suite.timeout_s))
    comms = Communicators(
        suite.axes, rank=dist.rank, backend=dist.backend, timeout_s=suite.timeout_s, used=used
    )
    # Kernel names are kept for a trace, and for an imported step's kernels against its trace's.
    names = options.trace or any(fidelity.has_traced(p) for p in suite.patterns)
    profiler = make_profiler(
        options.profiler,
        on_cuda=dist.is_cuda,
        backend=dist.backend,
        trace=names,
        warn=dist.rank == 0,
    )
    registered = sorted({b.name for p in suite.patterns for b in p.blocks if b.register_buffers})
    if registered and dist.is_cuda:
        from .registration import require_support

        require_support(dist.device.index or 0)
    elif registered and dist.rank == 0:
        log.warning(
            "register_buffers has no effect on the %s backend (blocks %s)",
            dist.backend,
            ", ".join(registered),
        )

    barrier = functools.partial(tdist.barrier, group=sync_group)
    calibration: dict[str, float] = {}
    if dist.is_cuda:
        calibration["sleep_cycles_per_us"] = calibrate_sleep_cycles_per_us(dist.device)
        executor: Any = CudaLanes(
            barrier=barrier,
            device=dist.device,
            sleep_cycles_per_us=calibration["sleep_cycles_per_us"],
            timeout_s=suite.timeout_s,
            align=_device_alignment(dist, comms),
        )
    else:
        agree_start = _start_agreement(dist, sync_group)
        executor = CpuLanes(barrier=barrier, agree_start=agree_start, timeout_s=suite.timeout_s)
    return Runtime(
        suite=suite,
        dist=dist,
        comms=comms,
        profiler=profiler,
        executor=executor,
        sync_group=sync_group,
        seed=options.seed,
        calibration=calibration,
        collect_timeline=options.trace or options.plot,
    )


@dataclass
class _Ending:
    """How this rank's run ends, as far as it knows: the status, whether every rank answered
    (nobody waits again for one that died or hung), the ranks a verdict named as gone and that
    verdict, a signal after the last agreement (no closing round to hold)."""

    rank: int
    status: int = EXIT_OK
    everyone_answered: bool = True
    missing: set[int] = field(default_factory=set)
    verdict: str = ""
    late_interrupt: bool = False

    def failed(self, err: RunError) -> None:
        self.everyone_answered = err.everyone_answered
        self.missing.update(err.missing or ())
        self.verdict = self.verdict or (str(err) if err.missing else "")
        self.status = EXIT_INTERRUPTED if err.interrupted else EXIT_FAILED


def run_suite(suite: SuiteSpec, options: RunOptions, launch: LaunchInfo) -> int:
    """Run every pattern of ``suite`` (validated for this launch) on this rank; returns the exit
    status (0, 1 a pattern failed, 130 interrupted). ConfigError/OptionError: ranks started
    inconsistently; RunError: this rank cannot join the others."""
    apply_env(suite.env)  # before the first communicator: NCCL reads NCCL_* once
    restore_signals = interrupts.install()
    try:
        with interrupts.deliverable():  # the rendezvous may wait long for a missing rank
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
    report = Reporter(suite, options, guard=interrupts.held) if dist.rank == 0 else None
    rt = None
    try:
        rt = _phase_setup(suite, options, dist)
        if report is not None:
            environ = run_environ(suite, options, dist, rt.profiler.name, rt.calibration)
            report.start({**environ, **rt.profiler.run_info()})
            rt.note = report.progress.note
        _measure_every_pattern(rt, end, report)
        if end.status == EXIT_OK and interrupts.pending_interrupt():
            # The signal came after the last agreement: every rank finished every pattern, so
            # there is nobody to tell and nothing to wait for; only the exit status says it.
            end.late_interrupt = True
            end.status = EXIT_INTERRUPTED
    except RunError as err:
        end.failed(err)
        if (report is not None or not end.everyone_answered) and not err.interrupted:
            say(f"maestro: {err}")
    except KeyboardInterrupt as exc:
        # A second signal outside a phase: this rank leaves at once, without the agreement.
        end.everyone_answered = False
        peer = isinstance(exc, interrupts.PeerExited)  # the launcher reports the exited worker
        end.status = EXIT_FAILED if peer else EXIT_INTERRUPTED
    except BaseException as exc:  # SystemExit or a bug: reported, and left to the others
        end.everyone_answered = False
        end.status = EXIT_FAILED
        say(f"maestro: rank {dist.rank}: stopped by {cause_of(exc)}")
    finally:
        _leave(dist, rt, end, report)
        restore_signals()
    return end.status


def _measure_every_pattern(rt: Any, end: _Ending, report: Reporter | None) -> None:
    """Measure each pattern and agree that it was torn down and reported (phase ``output``:
    a teardown's error, or rank 0's files that cannot be written, stop every rank)."""
    for pattern in rt.suite.patterns:
        outcome, failure, error = None, None, None
        try:
            outcome = measure_pattern(rt, pattern)
        except RunError as err:
            failure = err
            end.failed(err)
            if report is None and err.missing and 0 in err.missing:
                say(f"maestro: {err}")  # rank 0 is gone: it cannot say it
        except Exception as exc:  # the pattern's teardown (its phases were agreed): said below
            error = RunError(cause_of(exc), phase="teardown")
            error.__cause__ = exc
        if outcome is not None and outcome.check_failed:
            end.status = max(end.status, EXIT_FAILED)  # wrong results fail; numbers are saved
        stop = failure is not None and (
            end.status != EXIT_FAILED or rt.suite.stop_on_error or not failure.contained
        )
        if report is not None and error is None:
            try:
                if outcome is not None:
                    report.finished(pattern, outcome, rt.profiler.run_info())
                else:
                    report.failed(pattern.name, str(failure))
            except Exception as exc:  # a full disk, a folder removed: every rank stops
                error = _output_error(exc, report)
                if stop:
                    say(f"maestro: rank 0, phase output, pattern {pattern.name!r}: {error.detail}")
        if stop:
            return
        try:
            agree(rt.dist.agreement, rt.dist.rank, "output", error, pattern=pattern.name)
        except RunError as err:  # a teardown, or rank 0's files
            end.failed(err)
            if report is not None and err.phase == "teardown":
                try:
                    report.failed(pattern.name, str(err))
                except Exception as exc:
                    say(f"maestro: rank 0: cannot save the failure: {cause_of(exc)}")
            elif report is not None or not end.everyone_answered:
                say(f"maestro: {err}")
            if err.phase != "teardown" or rt.suite.stop_on_error or not err.contained:
                return


def _output_error(exc: Exception, report: Reporter) -> RunError:
    """What rank 0 reports when its files cannot be written."""
    folder = report.options.output_dir
    if folder and not os.path.isdir(folder):
        return RunError(f"the output folder {folder} was removed during the run ({cause_of(exc)})")
    return RunError(f"cannot write the results: {cause_of(exc)}")


def _leave(dist: DistContext, rt: Any, end: _Ending, report: Reporter | None) -> None:
    """Rank 0 closes its report, the ranks a verdict gave up on are told, the others leave
    together (a launcher that sees one fail kills the rest), the runtime is torn down."""
    if report is not None:
        report.close(end.status)
    # Saved and printed: the ranks named as gone may now be ended (by the local launcher,
    # or by their own watch of the store: a rank stuck in a block has no other way out).
    supervision.reached_verdict(end.status, end.missing)
    if gone := sorted(end.missing - {end.rank}):  # told the run ended (agreement.EndedWatch)
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
    if rt is not None and rt.wedged:
        _leave_wedged(end.status, end.rank)
    # Communicators first: CUPTI detached while NCCL still held its communicators was
    # seen to crash the process in destroy_process_group (SIGSEGV after the results).
    try:
        shutdown_distributed(dist)
    finally:
        if rt is not None:
            rt.profiler.close()


def _leave_wedged(status: int, rank: int) -> None:
    """NCCL could not be aborted (kernels hold the GPU): tearing down would hang too, and
    everything is saved and printed, so the process ends here."""
    supervision.hard_exit(status or EXIT_FAILED, rank)


def _phase_setup(suite: SuiteSpec, options: RunOptions, dist: DistContext) -> Any:
    rt = None
    error: BaseException | None = None
    groups = len(suite.axes) + 2  # each new group may wait timeout_s for its peers
    try:
        with interrupts.deliverable(), dist.agreement.waiting(groups * suite.timeout_s, dist.rank):
            rt = _setup_runtime(suite, options, dist)
    except (Exception, KeyboardInterrupt) as exc:  # reported through the agreement step
        error = exc
    agree(dist.agreement, dist.rank, "setup", error)
    return rt
