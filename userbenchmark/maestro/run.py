"""TorchBench entry point: ``python run_benchmark.py maestro -c FILE [options]``."""

from __future__ import annotations

from collections.abc import Sequence


def run(args: Sequence[str]) -> None:
    """Run maestro with command-line ``args``; exits non-zero when the run failed."""
    from .cli import run_from_torchbench

    if status := run_from_torchbench(args):
        raise SystemExit(status)
