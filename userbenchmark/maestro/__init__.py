"""Maestro: measure NCCL collectives, GEMMs and copies while they overlap (a TorchBench
userbenchmark). See README.md; ``python -m userbenchmark.maestro --help`` lists the commands.
"""

from __future__ import annotations

# The one version of maestro. pyproject.toml reads it (setuptools' dynamic version), so an
# installed package's metadata and a checkout (TorchBench runs one, never installed) agree.
__version__ = "0.2.0"

__all__ = ["Results", "__version__", "load_results"]


def __getattr__(name: str):
    # Lazy: ``import userbenchmark.maestro`` (every rank, TorchBench's dispatcher) stays free of
    # pandas; ``from userbenchmark.maestro import load_results`` imports it on first use.
    if name in ("load_results", "Results"):
        from .core.output import results

        return getattr(results, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
