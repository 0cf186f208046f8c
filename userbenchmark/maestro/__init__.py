"""Maestro: measure NCCL collectives, GEMMs and copies while they overlap (a TorchBench
userbenchmark). See README.md; ``python -m userbenchmark.maestro --help`` lists the commands.
"""

from __future__ import annotations

from importlib import metadata


def _version() -> str:
    try:
        return metadata.version("maestro-bench")
    except metadata.PackageNotFoundError:  # run from a source tree or a TorchBench checkout
        return "0+unknown"


__version__ = _version()
