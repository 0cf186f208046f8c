"""One rank's whole run: start the runtime, measure every pattern, report and save.

Rank 0 alone prints tables and writes files; the metrics timestamp is taken once on rank 0
and broadcast. Patterns that finished are saved before the next one starts.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import sys
from pathlib import Path
from typing import Any

from ...errors import EXIT_FAILED, EXIT_INTERRUPTED, ConfigError, RunError
from ..config.options import RunOptions, shared_options
from ..config.spec import SuiteSpec
from . import interrupts, supervision
from .distributed import (
    DistContext,
    LaunchInfo,
    apply_env,
    detect_launch,
    init_distributed,
    shutdown_distributed,
)

log = logging.getLogger("maestro")

PROFILERS = ("auto", "cupti", "events", "host")
REPO_ROOT = Path(__file__).resolve().parents[4]
"""The folder holding ``userbenchmark/`` (TorchBench's repo root, or this repo's)."""


def make_profiler(name: str, dist: DistContext, *, trace: bool = False) -> Any:
    """The profiler asked for, or the best available one for ``auto``.

    ``trace``: the CUPTI profiler also keeps each window's named activities (``--trace``).
    """
    if name not in PROFILERS:
        raise ConfigError(f"unknown profiler {name!r}; valid: {', '.join(PROFILERS)}")
    if not dist.is_cuda:
        if name not in ("auto", "host"):
            raise RunError(f"profiler {name!r} needs CUDA; CPU lanes use the host profiler")
        from ..profilers.base import HostProfiler

        return HostProfiler()
    if name == "host":
        raise RunError(
            "the host profiler times CPU lanes; on CUDA it would time the enqueue, "
            "not the GPU work: use cupti or events"
        )
    if name in ("auto", "cupti"):
        from ..profilers.cupti import CuptiWindowProfiler, cupti_available

        ok, why = cupti_available()
        if ok:
            prof = CuptiWindowProfiler(trace=trace)
            prof.start()
            return prof
        if name == "cupti":
            raise RunError(f"profiler cupti is not available: {why}")
        if dist.rank == 0:
            log.warning(
                "cupti-python is not usable (%s); timing with CUDA events, which are "
                "coarser (stream-level)",
                why,
            )
    from ..profilers.base import EventProfiler

    return EventProfiler()


def suite_settings(suite: SuiteSpec) -> dict[str, str]:
    """What each pattern and block measures, after command-line overrides and --max-size:
    ``pattern.<name>`` -> iterations, warmup, sync and graph mode; ``block.<pattern>/<block>``
    -> op, dtype, team size and parameters. compare refuses runs where these differ."""
    from ...blocks.registry import resolve_op
    from ..config.summary import describe_params

    out = {}
    for p in suite.patterns:
        out[f"pattern.{p.name}"] = (
            f"iters={p.num_iters} warmup_iters={p.warmup_iters} sync={p.sync} "
            f"graph={str(p.graph).lower()}"
        )
        for b in p.blocks:
            team = suite.axes[b.axis].team_size
            work = describe_params(resolve_op(b.op), b.params)
            out[f"block.{p.name}/{b.name}"] = f"op={b.op} dtype={b.dtype} team_size={team} {work}"
    return out


def environ_info(
    dist: DistContext,
    suite: SuiteSpec,
    options: RunOptions,
    calibration: dict[str, float] | None = None,
    profiler: str = "",
) -> dict[str, str]:
    """The ``environ`` block of the metrics file: what produced these numbers.

    The run's measurement settings (backend, profiler, world size, ranks per GPU, the
    command-line overrides of sizes and iterations) and its stack (versions, device).
    ``calibration`` holds run-wide measured constants, such as rank 0's
    ``sleep_cycles_per_us`` (what a ``sleep`` block's duration was turned into).
    """
    import torch

    from ... import __version__

    info = {
        "maestro_version": __version__,
        "pytorch_version": torch.__version__,
        "pytorch_git_version": str(getattr(torch.version, "git_version", "")),
        "backend": dist.backend,
        "profiler": profiler,
        "world_size": str(dist.world_size),
        "num_hosts": str(len(set(dist.hosts)) or 1),
        "ranks_per_gpu": "" if dist.ranks_per_gpu is None else str(dist.ranks_per_gpu),
        "max_size_bytes": "" if options.max_size_bytes is None else str(options.max_size_bytes),
        "iters_override": "" if options.iters is None else str(options.iters),
        "warmup_iters_override": "" if options.warmup_iters is None else str(options.warmup_iters),
        "graph_override": "" if options.graph is None else str(options.graph).lower(),
        "config": suite.source,
        "suite": suite.name,
        "hostname": os.uname().nodename if hasattr(os, "uname") else "",
    }
    if dist.is_cuda:
        info["cuda_version"] = str(torch.version.cuda)
        info["device"] = torch.cuda.get_device_name(dist.device)
        try:
            info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # NCCL may be absent from a CUDA build
            pass
        if profiler == "cupti":
            from importlib.metadata import version

            info["cupti_python_version"] = version("cupti-python")
    for key, value in (calibration or {}).items():
        info[key] = repr(float(value))
    info.update(suite_settings(suite))
    for key, value in suite.env.items():
        info[f"env.{key}"] = value
    return info


def _broadcast_object(obj: Any, group: Any) -> Any:
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _device_alignment(dist: DistContext, comms: Any) -> Any:
    """What the gate stream runs before its spin so that every rank's gate opens together:
    a one-element all_reduce on a communicator of its own (None for one rank)."""
    if dist.world_size == 1:
        return None
    import torch
    import torch.distributed as tdist

    group = comms.gate_group()
    one = torch.zeros(1, device=dist.device)

    def align() -> None:
        tdist.all_reduce(one, group=group)

    return align


def _start_agreement(dist: DistContext, group: Any) -> Any:
    """CPU lanes: the latest of every rank's proposed start instant, or None when the ranks
    share no clock (several hosts) or there is nobody to agree with."""
    if dist.world_size == 1 or not dist.one_host:
        return None
    import torch
    import torch.distributed as tdist

    def agree_start(proposal_ns: int) -> int:
        box = torch.tensor([proposal_ns], dtype=torch.int64)
        tdist.all_reduce(box, op=tdist.ReduceOp.MAX, group=group)
        return int(box.item())

    return agree_start


def _setup_runtime(suite: SuiteSpec, options: RunOptions, dist: DistContext) -> Any:
    import torch.distributed as tdist

    from .communicators import Communicators
    from .lanes import CpuLanes, CudaLanes, calibrate_sleep_cycles_per_us
    from .pattern import Runtime

    used = {b.axis for p in suite.patterns for b in p.blocks}
    sync_group = tdist.new_group(backend="gloo", timeout=_dt.timedelta(seconds=suite.timeout_s))
    comms = Communicators(
        suite.axes, rank=dist.rank, backend=dist.backend, timeout_s=suite.timeout_s, used=used
    )
    profiler = make_profiler(options.profiler, dist, trace=options.trace)
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

    def barrier() -> None:
        tdist.barrier(group=sync_group)

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
        executor = CpuLanes(
            barrier=barrier,
            agree_start=_start_agreement(dist, sync_group),
            timeout_s=suite.timeout_s,
        )
    return Runtime(
        suite=suite,
        dist=dist,
        comms=comms,
        profiler=profiler,
        executor=executor,
        barrier=barrier,
        sync_group=sync_group,
        seed=options.seed,
        calibration=calibration,
        collect_timeline=options.trace or options.plot,
    )


def run_suite(suite: SuiteSpec, options: RunOptions, launch: LaunchInfo | None = None) -> int:
    """Run every pattern of ``suite`` on this rank; returns the process exit status.

    0: every pattern finished; 1: a pattern failed (every rank agrees on the error); 130: a
    rank was interrupted (SIGINT/SIGTERM). Finished patterns are saved as they finish.
    """
    from ..output.progress import Progress
    from ..output.table import Tables
    from ..output.writer import OutputWriter
    from .agreement import agree
    from .pattern import measure_pattern

    launch = launch or detect_launch()
    if launch.world_size != suite.world_size:
        raise ConfigError(
            f"the launch has {launch.world_size} rank(s) but the suite is "
            f"configured for world_size {suite.world_size}",
            file=suite.source,
        )
    apply_env(suite.env)  # before the first communicator: NCCL reads NCCL_* once
    restore_signals = interrupts.install()
    try:
        with interrupts.deliverable():  # the rendezvous may wait long for a missing rank
            dist = init_distributed(
                launch,
                backend=options.backend,
                timeout_s=suite.timeout_s,
                shared={
                    "pattern_sha256": suite.text_sha256,
                    "options": shared_options(options),
                },
                source=suite.source,
            )
    except BaseException:
        restore_signals()
        raise
    rank = dist.rank
    rt = None
    status = 0
    everyone_answered = True  # False once a rank died or hung: nobody waits for it again
    late_interrupt = False  # a signal after the last pattern: no closing round to hold
    saved = False  # rank 0 saved a finished pattern somewhere (for the interrupt message)
    missing: set[int] = set()  # ranks a verdict named as gone (never reached an agreement)
    verdict = ""  # the agreed error that named them
    try:
        rt = _phase_setup(suite, options, dist, agree)
        stamp = _broadcast_object(
            _dt.datetime.now().strftime("%Y%m%d%H%M%S") if rank == 0 else None, dist.control
        )
        writer = None
        if rank == 0:
            metrics_path = None
            if options.write_metrics and options.metrics_path:
                metrics_path = Path(options.metrics_path)  # reserved before the run started
            elif options.write_metrics:
                folder = (
                    Path(options.metrics_dir)
                    if options.metrics_dir
                    else (REPO_ROOT / ".userbenchmark" / "maestro")
                )
                metrics_path = folder / f"metrics-{stamp}.json"
            writer = OutputWriter(
                output_dir=Path(options.output_dir) if options.output_dir else None,
                metrics_path=metrics_path,
                environ=environ_info(dist, suite, options, rt.calibration, rt.profiler.name),
                trace=options.trace,
                plot=options.plot,
                guard=interrupts.held,
            )
            tables = Tables(precision=options.precision)
            progress = Progress(total=len(suite.patterns))
            progress.start()
        for pattern in suite.patterns:
            try:
                outcome = measure_pattern(rt, pattern)
            except RunError as err:
                everyone_answered = err.everyone_answered
                missing.update(err.missing or ())
                verdict = verdict or (str(err) if err.missing else "")
                status = _failure_status(err)
                if rank == 0:
                    print(
                        f"maestro: pattern {pattern.name} failed: {err}",
                        file=sys.stderr,
                        flush=True,
                    )
                    writer.add_failure(pattern.name, str(err))
                    progress.advance(f"pattern {pattern.name} (failed)")
                elif err.missing and 0 in err.missing:
                    print(f"maestro: {err}", file=sys.stderr, flush=True)  # rank 0 cannot
                if status != 1 or suite.stop_on_error or not err.contained:
                    break
                continue
            if rank == 0:
                progress.clear()
                for warning in outcome.warnings:
                    log.warning("%s", warning)
                print(tables.pattern(pattern, outcome), flush=True)
                print(flush=True)
                writer.add(outcome)
                saved = saved or writer.metrics_path is not None or writer.output_dir is not None
                progress.advance(f"pattern {pattern.name}")
            if outcome.check_failed:
                status = max(status, 1)  # wrong results fail the run; numbers are still saved
        if rank == 0:
            progress.close()
            for summary in tables.closing():
                print(summary, flush=True)
                print(flush=True)
        if status == 0 and interrupts.pending_interrupt():
            # The signal came after the last agreement: every rank finished every pattern, so
            # there is nobody to tell and nothing to wait for; only the exit status says it.
            late_interrupt = True
            status = 130
        if status == 130 and rank == 0:
            print(interrupts.message(saved=saved), file=sys.stderr, flush=True)
        if rank == 0 and writer is not None:
            if writer.metrics_path is not None:
                print(f"maestro: metrics written to {writer.metrics_path}", flush=True)
            if writer.output_dir is not None:
                print(f"maestro: results written to {writer.output_dir}", flush=True)
    except RunError as err:
        everyone_answered = err.everyone_answered
        missing.update(err.missing or ())
        verdict = verdict or (str(err) if err.missing else "")
        status = _failure_status(err)
        if status == 130 and rank == 0:  # interrupted in a run-wide phase (setup)
            print(interrupts.message(saved=saved), file=sys.stderr, flush=True)
        elif rank == 0 or not everyone_answered:
            print(f"maestro: {err}", file=sys.stderr, flush=True)
    except KeyboardInterrupt as exc:
        # A second signal outside a phase: this rank leaves at once, without the agreement.
        everyone_answered = False
        if isinstance(exc, interrupts.PeerExited):  # the launcher reports the worker that exited
            status = EXIT_FAILED
        else:
            status = 130
            if rank == 0:
                print(interrupts.message(saved=saved), file=sys.stderr, flush=True)
    finally:
        # Saved and printed: the ranks named as gone may now be ended (by the local launcher,
        # or by their own watch of the store: a rank stuck in a block has no other way out).
        supervision.reached_verdict(status, missing)
        if missing - {rank}:
            _post_ended(dist, sorted(missing - {rank}), verdict)
        if status and everyone_answered and not late_interrupt:
            _closing_round(dist, agree)
        if rt is not None and rt.wedged:
            _leave_wedged(status, rank)
        # Communicators first: CUPTI detached while NCCL still held its communicators was
        # seen to crash the process in destroy_process_group (SIGSEGV after the results).
        try:
            shutdown_distributed(dist)
        finally:
            try:
                if rt is not None:
                    rt.profiler.close()
            finally:
                restore_signals()
    return status


def _post_ended(dist: DistContext, missing: list[int], verdict: str) -> None:
    """Tell the ranks a verdict gave up on that the run ended (see agreement.EndedWatch)."""
    from .agreement import post_ended

    try:
        post_ended(dist.agreement.store, missing, verdict, wait=dist.hosts_store)
    except Exception as exc:  # the store went away with its host: nobody left to tell
        log.debug("could not post the end of the run: %s", exc)


def _leave_wedged(status: int, rank: int) -> None:
    """NCCL could not be aborted (its kernels still hold the GPU): destroying the groups, or
    detaching CUPTI under those kernels, would hang as well. Everything is saved and printed,
    so the process ends here."""
    status = status or EXIT_FAILED
    supervision.leave(status, rank)
    os._exit(status)


def _failure_status(err: RunError) -> int:
    return EXIT_INTERRUPTED if err.interrupted else EXIT_FAILED


def _closing_round(dist: DistContext, agree: Any) -> None:
    """After an agreed failure, leave together: a launcher that sees one worker fail kills
    the others, which must not happen before rank 0 has saved the failure and printed it."""
    try:
        _agree_run_wide(dist, agree, "exit", None)
    except Exception as exc:  # the run already failed; this is only about timing
        log.debug("closing round: %s", exc)


def _phase_setup(suite: SuiteSpec, options: RunOptions, dist: DistContext, agree: Any) -> Any:
    rt = None
    error: BaseException | None = None
    try:
        with interrupts.deliverable():
            rt = _setup_runtime(suite, options, dist)
    except (Exception, KeyboardInterrupt) as exc:  # reported through the agreement step
        error = exc
    _agree_run_wide(dist, agree, "setup", error)
    return rt


def _agree_run_wide(dist: DistContext, agree: Any, phase: str, error: BaseException | None) -> None:
    """The agreement step of a phase that belongs to no pattern (setup, exit)."""
    agree(
        dist.agreement,
        rank=dist.rank,
        world_size=dist.world_size,
        phase=phase,
        pattern="",
        error=error,
    )
