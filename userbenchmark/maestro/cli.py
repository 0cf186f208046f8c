"""Command-line interface: ``run``, ``validate``, ``compare`` and ``list-blocks``.

Exit status: 0 success, 1 a run or comparison failed (a regression, a rank's error),
2 invalid input (pattern file, options, files to compare). User errors print one message,
never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from .blocks.dtypes import DTYPES
from .core.runtime.logs import configure_logging
from .core.runtime.worker import _load, run_worker
from .errors import EXIT_OK, EXIT_USAGE

log = logging.getLogger("maestro")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``run`` (also TorchBench's ``run_benchmark.py maestro`` arguments)."""
    parser.add_argument(
        "-c",
        "--config",
        default="quickstart",
        help="pattern file: a path, or a name from userbenchmark/maestro/configs "
        "(default: quickstart)",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="start N local workers (without torchrun/srun); default 1",
    )
    parser.add_argument(
        "--output-dir", default=None, help="write results.{json,csv} and patterns.{json,csv} here"
    )
    parser.add_argument(
        "--metrics-dir",
        default=None,
        help="folder of the TorchBench metrics file (default <repo>/.userbenchmark/maestro)",
    )
    parser.add_argument(
        "--no-metrics", action="store_true", help="do not write the TorchBench metrics file"
    )
    parser.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "gloo", "nccl"),
        help="auto: NCCL when CUDA is available, else gloo",
    )
    parser.add_argument(
        "--profiler",
        default="auto",
        choices=("auto", "cupti", "events", "host"),
        help="auto: cupti on CUDA when cupti-python works, else events; host on CPU",
    )
    parser.add_argument("--iters", type=int, default=None, help="override every pattern's iters")
    parser.add_argument(
        "--warmup-iters", type=int, default=None, help="override every pattern's warmup_iters"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        default=None,
        help="verify every collective's output after timing",
    )
    parser.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        default=None,
        help="skip the isolated run of each block",
    )
    parser.add_argument(
        "--pattern",
        dest="patterns",
        action="append",
        default=[],
        help="run only patterns matching this glob (repeatable)",
    )
    parser.add_argument(
        "--precision",
        type=int,
        default=2,
        help="decimals of printed latencies (small values keep a digit)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="write trace.json (Chrome/Perfetto: a process per rank, a track per lane) "
        "in --output-dir",
    )
    parser.add_argument(
        "--plot",
        action="store_true",
        help="write plot-<pattern>.png (one iteration per rank, isolated vs overlapped) "
        "in --output-dir; needs matplotlib",
    )

    def max_size(text: str) -> int:
        from .core.config.sizes import parse_size

        try:
            return parse_size(text)
        except ValueError as exc:  # argparse turns this into a usage error, exit status 2
            raise argparse.ArgumentTypeError(str(exc)) from None

    parser.add_argument(
        "--max-size",
        type=max_size,
        default=None,
        metavar="SIZE",
        help="cap every message size and GEMM operand at SIZE (e.g. 64K) for small machines; "
        "sweep points that become identical run once",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )


def _options(ns: argparse.Namespace) -> dict[str, Any]:
    return {
        "backend": ns.backend,
        "profiler": ns.profiler,
        "output_dir": ns.output_dir,
        "metrics_dir": ns.metrics_dir,
        "write_metrics": not ns.no_metrics,
        "precision": ns.precision,
        "iters": ns.iters,
        "warmup_iters": ns.warmup_iters,
        "check": ns.check,
        "baseline": ns.baseline,
        "patterns": tuple(ns.patterns),
        "seed": ns.seed,
        "trace": ns.trace,
        "plot": ns.plot,
        "max_size_bytes": ns.max_size,
    }


def _check_numbers(ns: argparse.Namespace) -> None:
    from .errors import ConfigError

    for name in ("nproc", "iters"):
        value = getattr(ns, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name} must be at least 1, got {value}")
    if ns.warmup_iters is not None and ns.warmup_iters < 0:
        raise ConfigError(f"--warmup-iters must be 0 or more, got {ns.warmup_iters}")
    if ns.precision < 0 or ns.precision > 9:
        raise ConfigError(f"--precision must be between 0 and 9, got {ns.precision}")
    for flag in ("trace", "plot"):
        if getattr(ns, flag, False) and not ns.output_dir:
            raise ConfigError(f"--{flag} writes into --output-dir: give --output-dir DIR")
    if getattr(ns, "plot", False):
        from .core.output.plot import MISSING_MATPLOTLIB, matplotlib_available

        if not matplotlib_available():
            raise ConfigError(MISSING_MATPLOTLIB)


def cmd_run(ns: argparse.Namespace) -> int:
    from .core.runtime.distributed import detect_launch
    from .core.runtime.launcher import launch_local
    from .errors import ConfigError

    launch = detect_launch()
    options = _options(ns)
    try:
        _check_numbers(ns)
        if launch.launcher != "none":
            if ns.nproc is not None and ns.nproc != launch.world_size:
                raise ConfigError(
                    f"--nproc {ns.nproc} conflicts with the launcher's world size "
                    f"{launch.world_size}; drop --nproc under torchrun/srun"
                )
            world_size = launch.world_size
        else:
            world_size = ns.nproc or 1
        # Validate before any worker starts: a bad file fails once, with exit status 2.
        suite = _load(ns.config, world_size, options)
    except ConfigError as err:
        if launch.rank == 0:
            print(f"maestro: invalid configuration:\n{err}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    if launch.launcher == "none" and world_size > 1:
        return launch_local(suite.source, world_size, options, ns.log_level)
    return run_worker(suite.source, world_size, options)


def cmd_validate(ns: argparse.Namespace) -> int:
    from .core.config.loader import load_suite
    from .core.config.summary import suite_summary
    from .errors import ConfigError

    try:
        suite = load_suite(ns.config, world_size=ns.world_size)
    except ConfigError as err:
        print(f"maestro: invalid configuration:\n{err}", file=sys.stderr)
        return EXIT_USAGE
    print(suite_summary(suite))
    return EXIT_OK


def cmd_compare(ns: argparse.Namespace) -> int:
    from .core.output.compare import (
        CompareError,
        compare_files,
        exit_code,
        format_compare_table,
        parse_threshold_overrides,
    )

    try:
        overrides = parse_threshold_overrides(ns.threshold)
        result = compare_files(ns.a, ns.b, threshold_overrides=overrides or None)
    except CompareError as err:
        print(f"maestro: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(format_compare_table(result))
    return exit_code(result)


def cmd_list_blocks(ns: argparse.Namespace) -> int:
    from tabulate import tabulate

    from .blocks.registry import registered_ops

    common = [
        ("name", "str", "required", "block name, unique in its pattern"),
        ("op", "str", "required", "a name below, or package.module:ClassName"),
        ("axis", "str", "world", "axis whose teams run the block"),
        ("lane", "str", "the axis", "in-order queue the block is issued on"),
        ("dtype", "str", "defaults.dtype", " | ".join(DTYPES)),
        (
            "register_buffers",
            "bool",
            "defaults.register_buffers",
            "buffers from the communicator's registered memory (NCCL)",
        ),
    ]
    print("Keys of every block:")
    print(tabulate(common, headers=["key", "type", "default", "meaning"]))
    for name, cls in registered_ops().items():
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        print(f"\n{name} ({cls.category}): {doc}")
        rows = []
        for p in cls.params:
            default = "required" if p.required else ("-" if p.default is None else p.default)
            meaning = p.doc + (f" (one of {', '.join(map(str, p.choices))})" if p.choices else "")
            rows.append((p.name, p.kind, default, meaning))
        if rows:
            print(tabulate(rows, headers=["param", "type", "default", "meaning"]))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m userbenchmark.maestro",
        description="Maestro: overlap benchmark for collectives and compute.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a pattern file")
    add_run_arguments(run)
    run.set_defaults(func=cmd_run)
    val = sub.add_parser("validate", help="check a pattern file and summarise it")
    val.add_argument("config", help="pattern file path or name in configs/")
    val.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="world size to validate against (when the file does not fix it)",
    )
    val.set_defaults(func=cmd_validate)
    cmp_ = sub.add_parser("compare", help="compare two results or metrics files")
    cmp_.add_argument("a", help="control: results.json, patterns.json or a metrics JSON")
    cmp_.add_argument("b", help="treatment, same kinds")
    cmp_.add_argument(
        "--threshold",
        action="append",
        default=[],
        help="METRIC=FRACTION override of a metric's relative threshold",
    )
    cmp_.set_defaults(func=cmd_compare)
    lb = sub.add_parser("list-blocks", help="every op with its parameters")
    lb.set_defaults(func=cmd_list_blocks)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    configure_logging(getattr(ns, "log_level", "INFO"))
    try:
        return int(ns.func(ns))
    except KeyboardInterrupt:
        print("maestro: interrupted", file=sys.stderr)
        return 130


def run_args_parser() -> argparse.ArgumentParser:
    """The parser TorchBench's ``run_benchmark.py maestro ARGS`` goes through."""
    parser = argparse.ArgumentParser(
        prog="run_benchmark.py maestro", description="Maestro overlap benchmark (TorchBench)."
    )
    add_run_arguments(parser)
    return parser


def run_from_torchbench(args: Sequence[str]) -> int:
    ns = run_args_parser().parse_args(list(args))
    configure_logging(ns.log_level)
    return cmd_run(ns)
