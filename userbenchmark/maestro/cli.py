"""The click commands ``run``, ``validate``, ``compare``, ``list-blocks`` and ``import-trace``;
:func:`main` for ``python -m userbenchmark.maestro``, :func:`run_from_torchbench` for
TorchBench's ``run_benchmark.py maestro``. Input errors print one line and exit 2."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any

import click

from .core.config.options import DEFAULT_ROUNDS, RunOptions
from .core.profilers.profiler_registry import profiler_names
from .core.runtime.supervision import TERMINATING, configure_logging
from .errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ConfigError,
    LaunchError,
    OptionError,
    RunError,
    interrupted_message,
    say,
    user_error_message,
)

PROG = "python -m userbenchmark.maestro"
TORCHBENCH_PROG = "run_benchmark.py maestro"
EXIT_STATUS_HELP = (
    "Exit status: 0 success; 1 a pattern failed (run) or a metric regressed (compare); "
    "2 invalid input, reported before any worker starts; 130 interrupted."
)
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _interruptible(command: Callable[..., int]) -> Callable[..., int]:
    # SIGINT, and SIGTERM and SIGHUP (a closed terminal) unless a caller chose their handling,
    # end the command with status 130 and one line (a run installs its own handlers once it
    # starts).

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        main = threading.current_thread() is threading.main_thread()
        ours = [s for s in TERMINATING if main and signal.getsignal(s) is signal.SIG_DFL]
        for signum in ours:
            signal.signal(signum, signal.default_int_handler)
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
                say(interrupted_message(saved=False))  # one line per run
            return EXIT_INTERRUPTED
        finally:
            for signum in ours:
                signal.signal(signum, signal.SIG_DFL)

    return wrapper


@click.group(
    context_settings=CONTEXT,
    no_args_is_help=False,  # a missing command is a usage error (status 2) on every click 8.x
    epilog=EXIT_STATUS_HELP,
)
def cli() -> None:
    """Maestro: overlap benchmark for collectives and compute."""
    configure_logging("INFO", ranked=False)


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from .core.config.sizes import parse_size

    try:
        return None if value is None else parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _options_of(params: dict[str, Any]) -> RunOptions:
    given = {f.name: params[f.name] for f in dataclasses.fields(RunOptions) if f.name in params}
    given.update(
        write_metrics=not params["no_metrics"],
        # Flags override the pattern file only when given.
        check=params["check"] or None,
        baseline=False if params["no_baseline"] else None,
        graph=params["graph"] or None,
        patterns=tuple(params["patterns"]),
        max_size_bytes=params["max_size"],
    )
    return RunOptions(**given)


def _world_size(nproc: int | None, launch: Any) -> int:
    if nproc is not None and nproc < 1:
        raise OptionError(f"--nproc must be at least 1, got {nproc}")
    if launch.launcher == "none":
        return nproc or 1
    if nproc is not None and nproc != launch.world_size:
        raise OptionError(
            f"--nproc {nproc} conflicts with the launcher's world size {launch.world_size}; "
            "drop --nproc under torchrun/srun"
        )
    return int(launch.world_size)


def _run_inputs(suite: Any) -> list[str]:
    """What a run reads and must never move nor overwrite: its pattern file and the modules of
    its custom ops (imported by then)."""
    modules = {b.op.partition(":")[0] for p in suite.patterns for b in p.blocks if ":" in b.op}
    files = (getattr(sys.modules.get(name), "__file__", None) for name in sorted(modules))
    return [suite.source, *filter(None, files)]


def cmd_run(params: dict[str, Any]) -> int:
    """Check what can be checked before a worker starts (each failure one line, exit 2), in
    order: the launcher's variables, the options, this machine and the pattern file, validated
    once (rendezvous.prepare_suite), then the output locations; then run."""
    from .core.output.locations import metrics_folder, prepare_output_locations
    from .core.output.reporter import Reporter
    from .core.runtime import rendezvous, supervision

    try:
        launch = rendezvous.detect_launch()
        rendezvous.check_rendezvous_env(launch)
    except LaunchError as err:  # every process says it: its rank cannot be trusted
        say(user_error_message(err))
        return EXIT_USAGE
    if launch.launcher == "torchrun" and os.environ.get("TORCHELASTIC_RUN_ID"):
        supervision.die_with_parent(os.getppid())  # a killed agent leaves no worker behind
    local = launch.launcher == "none" and ((params["nproc"] or 1) > 1 or params["repeat"] > 1)
    outputs = None
    try:
        world_size = _world_size(params["nproc"], launch)
        if params["repeat"] > 1 and launch.launcher != "none":
            raise OptionError(
                "--repeat starts fresh processes itself: run it without torchrun or srun "
                "(under a launcher, launch the run N times)"
            )
        options = _options_of(params)
        # The local launcher is no rank; every process below it is one.
        configure_logging(options.log_level, ranked=not local)
        if launch.rank != 0:  # one copy of the loader's warnings per run
            logging.getLogger("maestro.config").setLevel(logging.ERROR)
        suite = rendezvous.prepare_suite(
            params["config"],
            options,
            world_size=world_size,
            local_workers=world_size * local,
            sink=Reporter,
        )
        # Only rank 0 writes: it (or the local launcher, which outlives its workers) claims the
        # output locations; the other ranks of a torchrun/srun launch do not touch them.
        if launch.rank == 0:
            outputs = prepare_output_locations(
                options.output_dir, metrics_folder(options), inputs=_run_inputs(suite)
            )
            supervision.on_hard_exit(outputs.close)
            if outputs.metrics_path is not None:
                options = dataclasses.replace(options, metrics_path=str(outputs.metrics_path))
    except (OptionError, ConfigError) as err:
        if launch.rank == 0:
            say(user_error_message(err))
        return EXIT_USAGE
    try:
        if params["repeat"] > 1:
            return _run_processes(suite, options, world_size, params["repeat"], outputs)
        if local:
            from .core.runtime.launcher import launch_local

            return launch_local(suite, options, world_size, Reporter)
        from .core.runtime.phases import run_worker

        return run_worker(suite, options, Reporter)
    finally:
        if outputs is not None:
            outputs.close()


def _run_processes(
    suite: Any, options: RunOptions, world_size: int, repeat: int, outputs: Any
) -> int:
    """``--repeat N``: the run in N fresh launches, one after the other, each process's files
    in ``processes/K`` and every file of the run rewritten from them after each; stops at the
    first that does not succeed (what the earlier ones measured stays)."""
    from pathlib import Path

    from .core.output.processes import gather_processes, process_dir
    from .core.output.reporter import Reporter
    from .core.runtime.launcher import launch_local

    with tempfile.TemporaryDirectory(prefix="maestro-repeat-") as scratch:
        base = outputs.output_dir or Path(scratch)  # without --output-dir: only the metrics stay
        folders, status = [], EXIT_OK
        for index in range(repeat):
            folders.append(process_dir(base, index))
            folders[-1].mkdir(parents=True)
            say(f"maestro: process {index + 1} of {repeat}")
            one = dataclasses.replace(options, output_dir=str(folders[-1]), metrics_path=None)
            status = launch_local(suite, one, world_size, Reporter)
            gather_processes(folders, outputs.output_dir, outputs.metrics_path)
            if status != EXIT_OK:
                break
    where = [str(p) for p in (outputs.output_dir, outputs.metrics_path) if p is not None]
    if where:
        say(f"maestro: {len(folders)} of {repeat} processes gathered in {' and '.join(where)}")
    return status


@cli.command("run", context_settings=CONTEXT, short_help="run a pattern file")
@click.option("-c", "--config", default="quickstart", help="pattern file: a path or a shipped name")
@click.option("--nproc", type=int, help="start N local workers (no torchrun/srun); default 1")
@click.option(
    "--repeat", type=click.IntRange(min=1), default=1, metavar="N", help="N runs in fresh processes"
)
@click.option("--output-dir", help="write results, patterns and pairs (.json, .csv) here")
@click.option("--metrics-dir", help="TorchBench metrics folder (<repo>/.userbenchmark/maestro)")
@click.option("--no-metrics", is_flag=True, help="do not write the TorchBench metrics file")
@click.option(
    "--backend", type=click.Choice(("auto", "gloo", "nccl")), default="auto", help="comm backend"
)
@click.option(
    "--profiler", type=click.Choice(profiler_names()), default="auto", help="how blocks are timed"
)
@click.option("--iters", type=int, help="override every pattern's iters")
@click.option("--warmup-iters", type=int, help="override every pattern's warmup_iters")
@click.option("--check", is_flag=True, help="verify every collective's output after timing")
@click.option("--no-baseline", is_flag=True, help="skip the isolated run of each block")
@click.option("--pattern", "patterns", multiple=True, help="run only patterns matching GLOB")
@click.option("--precision", type=int, default=2, help="decimals of printed latencies")
@click.option("--seed", type=int, default=0, help="seed of the random inputs")
@click.option("--trace", is_flag=True, help="write a trace per rank in --output-dir/traces/")
@click.option("--plot", is_flag=True, help="write plot-<pattern>.png in --output-dir")
@click.option(
    "--max-size", callback=_size, metavar="SIZE", help="cap message and GEMM operand sizes at SIZE"
)
@click.option("--graph", is_flag=True, help="CUDA-graph mode for every pattern (needs CUDA)")
@click.option(
    "--rounds",
    type=int,
    default=DEFAULT_ROUNDS,
    show_default=True,
    help="rounds of what-if variants",
)
@click.option(
    "--log-level",
    type=click.Choice(("DEBUG", "INFO", "WARNING", "ERROR")),
    default="INFO",
    help="lowest level of log lines shown",
)
@_interruptible
def run_command(**params: Any) -> int:
    """Run a pattern file and report every block's numbers.

    Without torchrun or srun, --nproc N starts N local workers; under a launcher its RANK and
    WORLD_SIZE (or SLURM_PROCID and SLURM_NTASKS) decide.

    Exit status: 0 every pattern finished; 1 a pattern failed on some rank; 2 invalid input,
    reported before any worker starts; 130 interrupted (patterns that finished are saved)."""
    return cmd_run(params)


@cli.command("validate", context_settings=CONTEXT, short_help="check and summarise a pattern file")
@click.argument("config")
@click.option("--world-size", type=click.IntRange(min=1), help="the world size to check at")
@click.option("--no-import", is_flag=True, help="check custom ops by name, without importing them")
@_interruptible
def validate_command(config: str, world_size: int | None, no_import: bool) -> int:
    """Check the pattern file CONFIG (a path, or a name in userbenchmark/maestro/configs) and
    summarise it: exit status 0 when it is valid, 2 with every problem found when not."""
    from .core.config.loader import listed_world_sizes, load_suite
    from .core.config.summary import suite_summary

    sizes: tuple[int | None, ...] = (world_size,)
    suites = []
    try:
        if world_size is None:  # the file's world_size, else each size its header lists
            sizes = listed_world_sizes(config) or sizes
        for size in sizes:
            suites.append(load_suite(config, world_size=size, import_ops=not no_import))
    except ConfigError as err:
        message = user_error_message(err)
        if world_size is None and sizes[0] is not None:
            where = f" at world size {sizes[len(suites)]}, which the file's header lists:\n"
            message = message.replace(":\n", where, 1)
        say(message)
        return EXIT_USAGE
    print(suite_summary(suites[0], import_ops=not no_import))
    if len(suites) > 1:
        others = ", ".join(str(s.world_size) for s in suites[1:])
        print(f"also valid at the other world sizes its header lists: {others}")
    return EXIT_OK


@cli.command("compare", context_settings=CONTEXT, short_help="compare two results or metrics files")
@click.argument("a")
@click.argument("b")
@click.option("--threshold", multiple=True, metavar="METRIC=FLOOR", help="a metric's own floor")
@click.option("--force", is_flag=True, help="compare even when the runs' settings differ")
@click.option("--plot", "plot_path", metavar="FILE.png", help="also plot each block's latency")
@click.option("--judge-harness", is_flag=True, help="harness diagnostics decide the status too")
@click.option("--all", "show_all", is_flag=True, help="list every metric, not only what changed")
@_interruptible
def compare_command(
    a: str,
    b: str,
    threshold: tuple[str, ...],
    force: bool,
    plot_path: str | None,
    judge_harness: bool,
    show_all: bool,
) -> int:
    """Compare B (treatment) against A (control): each a results.json, a patterns.json, an
    --output-dir or a TorchBench metrics JSON. A metric regressed only beyond the noise both
    runs measured and past its floor. Exit status (docs/torchbench.md): 0 nothing regressed, 1
    a metric regressed or B lacks what A has, 2 a file or the runs' settings cannot be used."""
    from .core.output.compare import (
        compare_files,
        exit_code,
        files_read,
        format_compare_table,
        parse_threshold_overrides,
    )
    from .core.output.locations import check_output_file
    from .core.output.writer import PLOT_SUFFIXES, plot_compare

    try:
        if plot_path is not None:  # before anything is read
            inputs = [*files_read(a), *files_read(b)]
            check_output_file(
                "--plot", plot_path, suffixes=PLOT_SUFFIXES, writes="an image", inputs=inputs
            )
        overrides = parse_threshold_overrides(threshold)
        result = compare_files(
            a, b, threshold_overrides=overrides or None, force=force, judge_harness=judge_harness
        )
    except (RunError, ValueError, OSError) as err:  # CompareError, OptionError: ValueErrors
        say(f"maestro: {err}")
        return EXIT_USAGE
    print(format_compare_table(result, show_all=show_all), flush=True)
    status = exit_code(result)
    if plot_path is not None:
        try:
            plot_compare(result.judgements, plot_path, title=f"A: {a}\nB: {b}")
        except (RunError, ValueError, OSError) as err:  # the table stands; the plot is not drawn
            reason = err.strerror if isinstance(err, OSError) and err.strerror else err
            say(f"maestro: --plot {plot_path}: not written: {reason}")
            status = max(status, EXIT_USAGE)
    return status


ABTEST_OWNED = ("-c", "--config", "--output-dir", "--metrics-dir", "--no-metrics", "--repeat")


@cli.command(
    "abtest",
    context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_extra_args": True},
    short_help="one pattern file under two Python environments, in alternating rounds",
)
@click.argument("config")
@click.option("--a", "python_a", required=True, metavar="PYTHON", help="A's interpreter")
@click.option("--b", "python_b", required=True, metavar="PYTHON", help="B's interpreter")
@click.option(
    "--rounds", type=click.IntRange(min=2), default=6, show_default=True, help="paired A/B rounds"
)
@click.option("--output-dir", required=True, help="abtest.json, each side's files and metrics file")
@click.option("--all", "show_all", is_flag=True, help="list every metric, not only what changed")
@click.pass_context
@_interruptible
def abtest_command(ctx: click.Context, config: str, **params: Any) -> int:
    """Run the pattern file CONFIG under two Python environments (two torch or NCCL builds), in
    rounds of fresh runs of A and of B, each metric's change paired by round (docs/torchbench.md).
    Other options are run's, passed to each side. Exit status 0 nothing regressed, 1 a metric
    regressed or a side's run failed, 2 invalid input, 130 interrupted."""
    from .core.output.abtest import run_abtest
    from .core.output.locations import prepare_output_locations
    from .core.runtime.rendezvous import detect_launch

    pythons = {"a": params["python_a"], "b": params["python_b"]}
    try:
        owned = [a for a in ctx.args if a.split("=", 1)[0] in ABTEST_OWNED]
        if owned:
            raise OptionError(f"abtest sets {', '.join(owned)} itself; leave it out")
        if detect_launch().launcher != "none":
            raise OptionError("abtest starts its own processes: run it without torchrun or srun")
        for side, python in pythons.items():
            if not shutil.which(python):
                raise OptionError(f"--{side} {python}: no such interpreter (or not executable)")
        outputs = prepare_output_locations(params["output_dir"], None)
    except (OptionError, LaunchError) as err:
        say(user_error_message(err))
        return EXIT_USAGE
    with outputs:
        assert outputs.output_dir is not None
        return run_abtest(
            os.path.abspath(config) if os.path.exists(config) else config,
            pythons,
            rounds=params["rounds"],
            run_args=ctx.args,
            output_dir=outputs.output_dir,
            show_all=params["show_all"],
        )


@cli.command("list-blocks", context_settings=CONTEXT, short_help="every op with its parameters")
@_interruptible
def list_blocks_command() -> int:
    """List every op a block may name, with its parameters, types and defaults."""
    from .core.config.summary import ops_summary

    print(ops_summary())
    return EXIT_OK


@cli.command("import-trace", context_settings=CONTEXT, short_help="a traced step as a pattern")
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--output", required=True, help="the pattern file to write (YAML)")
@click.option("--step", type=click.IntRange(min=0), help="import ProfilerStep#N (default: last)")
@click.option(
    "--idle-us",
    type=click.FloatRange(min=0),
    default=20.0,
    show_default=True,
    help="lane idle gaps longer than this become sleep blocks",
)
@click.option("--no-idle", is_flag=True, help="drop lane idle gaps instead")
@click.option("--world-size", type=click.IntRange(min=1), help="replay the files' ranks at N ranks")
@click.option("--annotation", metavar="NAME", help="the record_function span that is the step")
@_interruptible
def import_trace_command(**params: Any) -> int:
    """Turn torch.profiler traces of a training step, one file per rank (PATHS: the files, or
    folders of .json/.json.gz files), into a pattern file replaying the step (docs/replay.md).
    Exit status 0 written, 2 the traces cannot be imported (nothing written)."""
    from .core.output.locations import atomic_write_bytes, check_output_file
    from .core.replay.emit import run_command
    from .core.replay.kineto import TraceError, iter_trace_files

    inputs = paths = list(params["paths"])
    with contextlib.suppress(TraceError, OSError):  # the importer says what is wrong with them
        inputs = [*paths, *iter_trace_files(paths)]  # a folder's traces are inputs too
    try:  # before anything is read
        check_output_file(
            "-o", params["output"], suffixes=(".yaml", ".yml"), writes="YAML", inputs=inputs
        )
    except OptionError as err:
        say(user_error_message(err))
        return EXIT_USAGE
    return run_command(**params, write=atomic_write_bytes)


def _invoke(command: click.Command, argv: Sequence[str] | None, prog_name: str) -> int:
    try:
        status = command.main(
            args=None if argv is None else list(argv), prog_name=prog_name, standalone_mode=False
        )
    except click.ClickException as err:  # usage errors (status 2): click's message, no trace
        err.show()
        return err.exit_code
    except click.exceptions.Abort:  # click's form of an interrupt outside a command
        say(interrupted_message(saved=False))
        return EXIT_INTERRUPTED
    return int(status or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m userbenchmark.maestro ARGS`` (or the installed ``maestro ARGS``); ``argv``
    defaults to ``sys.argv[1:]``."""
    return _invoke(cli, argv, "maestro" if os.path.basename(sys.argv[0]) == "maestro" else PROG)


def run_from_torchbench(args: Sequence[str]) -> int:
    """TorchBench's ``run_benchmark.py maestro ARGS``: the options of ``run``."""
    return _invoke(run_command, list(args), TORCHBENCH_PROG)
