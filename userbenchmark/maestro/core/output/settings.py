"""What a run measured under: the settings two runs must share before their numbers compare.

A run's settings are its metrics file's ``environ`` (also ``run.json`` in ``--output-dir``).
Two kinds of entries matter to ``compare``:

- measurement settings: backend, profiler, world size, hosts, ranks per GPU, the command-line
  overrides of sizes and iterations, and per pattern (``pattern.<name>``: iterations, warmup,
  sync, graph mode) and per block (``block.<pattern>/<block>``: op, dtype, team size,
  parameters after --max-size). Runs that differ here measured different things;
- the stack (maestro, torch, CUDA, NCCL, cupti-python versions, device): what an A/B
  comparison usually changes on purpose; shown, never refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

RUN_SETTINGS: Final = (
    "backend",
    "profiler",
    "world_size",
    "num_hosts",
    "ranks_per_gpu",
    "max_size_bytes",
    "iters_override",
    "warmup_iters_override",
    "graph_override",
)
"""Run-wide measurement settings (environ keys)."""
SETTING_PREFIXES: Final = ("pattern.", "block.")
"""Per-pattern and per-block measurement settings (environ keys with these prefixes)."""
STACK: Final = (
    "maestro_version",
    "pytorch_version",
    "cuda_version",
    "nccl_version",
    "cupti_python_version",
    "device",
)
"""What the runs ran on: shown beside a comparison, never a reason to refuse it."""


def measurement_settings(environ: Mapping[str, object]) -> dict[str, str]:
    """The entries of ``environ`` that decide what was measured."""
    return {
        key: str(value)
        for key, value in environ.items()
        if key in RUN_SETTINGS or key.startswith(SETTING_PREFIXES)
    }


def setting_differences(a: Mapping[str, object], b: Mapping[str, object]) -> list[str]:
    """One line per measurement setting that both runs record with different values.

    A pattern or block that only one run has is not a difference here (compare reports its
    metrics as only in A or only in B).
    """
    sa, sb = measurement_settings(a), measurement_settings(b)
    return [
        f"{key}: A {sa[key]!r}, B {sb[key]!r}"
        for key in sorted(sa.keys() & sb.keys())
        if sa[key] != sb[key]
    ]


def stack_line(environ: Mapping[str, object]) -> str:
    """``torch 2.11.0+cu130, CUDA 13.0, NCCL 2.28.9, ...`` (what the run ran on)."""
    labels = {
        "maestro_version": "maestro",
        "pytorch_version": "torch",
        "cuda_version": "CUDA",
        "nccl_version": "NCCL",
        "cupti_python_version": "cupti-python",
        "device": "device",
    }
    parts = [f"{labels[key]} {environ[key]}" for key in STACK if environ.get(key)]
    return ", ".join(parts) or "unknown"
