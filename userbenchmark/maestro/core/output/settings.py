"""A run's ``environ`` (metrics file, ``run.json``), written by :func:`run_environ` and read
back here: the measurement settings two runs must share before their numbers compare, and the
stack (versions, device), which an A/B comparison changes on purpose: shown, never refused."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Mapping
from typing import Any, Final

from ..config.options import RunOptions
from ..config.spec import SuiteSpec

RUN_SETTINGS: Final = ("backend", "profiler", "world_size", "num_hosts", "ranks_per_gpu",
                       "max_size_bytes", "iters_override", "warmup_iters_override",
                       "graph_override")  # fmt: skip
"""Run-wide measurement settings (environ keys)."""
SETTING_PREFIXES: Final = ("pattern.", "block.")
"""Per-pattern and per-block measurement settings (environ keys with these prefixes)."""
STACK: Final = {"maestro_version": "maestro", "pytorch_version": "torch", "cuda_version": "CUDA",
                "nccl_version": "NCCL", "cupti_python_version": "cupti-python",
                "device": "device"}  # fmt: skip
"""What the runs ran on (environ key: label): shown beside a comparison, never refused."""


def suite_settings(suite: SuiteSpec) -> dict[str, str]:
    """What each pattern and block measures, after command-line overrides and --max-size:
    ``pattern.<name>`` -> iterations, warmup, sync and graph mode; ``block.<pattern>/<block>``
    -> op, dtype, team size and parameters."""
    out = {}
    for p in suite.patterns:
        out[f"pattern.{p.name}"] = (
            f"iters={p.num_iters} warmup_iters={p.warmup_iters} sync={p.sync} "
            f"graph={str(p.graph).lower()}"
        )
        for b in p.blocks:
            team = suite.axes[b.axis].team_size
            out[f"block.{p.name}/{b.name}"] = f"op={b.op} dtype={b.dtype} team_size={team} {b.work}"
    return out


def _text(value: object) -> str:
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def run_environ(
    suite: SuiteSpec,
    options: RunOptions,
    dist: Any,
    profiler: str,
    calibration: Mapping[str, float],
) -> dict[str, str]:
    """The metrics file's ``environ`` from the rank's ``dist`` (backend, hosts, ranks per GPU,
    device): the settings (:data:`RUN_SETTINGS`, ``pattern.*``, ``block.*``), the :data:`STACK`,
    the host, ``calibration`` (``sleep_cycles_per_us``...) and the file's ``env.<NAME>``."""
    import torch

    from ... import __version__

    hosts, device = dist.hosts, dist.device
    info = {
        "maestro_version": __version__,
        "pytorch_version": torch.__version__,
        "pytorch_git_version": str(getattr(torch.version, "git_version", "")),
        "backend": dist.backend,
        "profiler": profiler,
        "world_size": str(len(hosts)),
        "num_hosts": str(len(set(hosts)) or 1),
        "ranks_per_gpu": _text(dist.ranks_per_gpu),
        "max_size_bytes": _text(options.max_size_bytes),
        "iters_override": _text(options.iters),
        "warmup_iters_override": _text(options.warmup_iters),
        "graph_override": _text(options.graph),
        "config": suite.source,
        "suite": suite.name,
        "hostname": os.uname().nodename if hasattr(os, "uname") else "",
    }
    if device.type == "cuda":
        info["cuda_version"] = str(torch.version.cuda)
        info["device"] = torch.cuda.get_device_name(device)
        with contextlib.suppress(Exception):  # NCCL may be absent from a CUDA build
            info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    info.update({key: repr(float(value)) for key, value in calibration.items()})
    info.update(suite_settings(suite))
    info.update({f"env.{key}": value for key, value in suite.env.items()})
    return info


def measurement_settings(environ: Mapping[str, object]) -> dict[str, str]:
    """The entries of ``environ`` that decide what was measured."""
    return {
        key: str(value)
        for key, value in environ.items()
        if key in RUN_SETTINGS or key.startswith(SETTING_PREFIXES)
    }


def setting_differences(
    a: Mapping[str, object], b: Mapping[str, object], *, skip: Collection[str] = ()
) -> list[str]:
    """One line per measurement setting both runs record with different values, but those in
    ``skip`` (a pattern or block only one run has is not a difference: compare reports it as
    only in A or B)."""
    sa, sb = measurement_settings(a), measurement_settings(b)
    return [
        f"{key}: A {sa[key]!r}, B {sb[key]!r}"
        for key in sorted(sa.keys() & sb.keys() - set(skip))
        if sa[key] != sb[key]
    ]


def stack_line(environ: Mapping[str, object]) -> str:
    """``torch 2.11.0+cu130, CUDA 13.0, NCCL 2.28.9, ...`` (what the run ran on)."""
    parts = [f"{label} {environ[key]}" for key, label in STACK.items() if environ.get(key)]
    return ", ".join(parts) or "unknown"
