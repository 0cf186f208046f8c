"""Checks made before any worker starts: the options against this machine (OptionError
saying what was asked, why it cannot work here and what would), and the one validation of
the pattern file with the options applied."""

from __future__ import annotations

import os
from typing import Any

from ...errors import ConfigError, OptionError
from ..config.loader import load_suite
from ..config.options import RunOptions, apply_overrides, check_graphs
from ..config.spec import SuiteSpec
from ..profilers.profiler_registry import no_gpu, resolve_profiler

SHARED_GPU_VARIABLE = "NCCL_MULTI_RANK_GPU_ENABLE"

MAX_LOCAL_WORKERS = 256  # most --nproc workers on one machine; more come from torchrun or srun
FILES_PER_WORKER = 8  # open files the local launcher holds per worker (about five measured)
FILES_RESERVED = 64  # open files the launcher needs for itself (Python, torch, the store)


def check_nproc(nproc: int, *, limit: int | None = None) -> None:
    """OptionError when ``--nproc`` is more workers than this machine can start: maestro's
    limit, or what the open-file limit (``limit``, default ``ulimit -n``) leaves."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if limit is None else limit
    by_files = max(1, (soft - FILES_RESERVED) // FILES_PER_WORKER)
    most, why = (
        MAX_LOCAL_WORKERS,
        "maestro's limit for one machine; start more ranks with torchrun or srun across machines",
    )
    if soft != resource.RLIM_INFINITY and soft >= 0 and by_files < MAX_LOCAL_WORKERS:
        most = by_files
        why = (
            f"the launcher holds about {FILES_PER_WORKER} open files per worker and may open "
            f"{soft} (ulimit -n); raise the limit or start fewer workers"
        )
    if nproc > most:
        raise OptionError(f"--nproc must be at most {most}, got {nproc}: {why}")


def resolve_backend(requested: str, cuda_available: bool) -> str:
    """``auto`` is NCCL when CUDA is available, else gloo; NCCL without CUDA is an OptionError."""
    if requested == "nccl" and not cuda_available:
        raise OptionError(
            f"--backend nccl needs CUDA, and {no_gpu()}; use --backend gloo (or auto, which "
            "picks gloo without CUDA)"
        )
    if requested == "auto":
        return "nccl" if cuda_available else "gloo"
    return requested


def check_devices(*, backend: str, profiler: str, local_workers: int = 1) -> str:
    """The backend ``--backend`` resolves to here; OptionError when it or ``--profiler`` cannot
    run on this machine, where ``local_workers`` ranks share its GPUs (``--nproc``)."""
    import torch

    resolved = resolve_backend(backend, torch.cuda.is_available())
    on_cuda = resolved == "nccl"
    resolve_profiler(profiler, on_cuda=on_cuda, backend=backend)
    if on_cuda and local_workers > 1 and os.environ.get(SHARED_GPU_VARIABLE) != "1":
        gpus = torch.cuda.device_count()
        if local_workers > gpus:
            raise OptionError(
                f"--nproc {local_workers} on the nccl backend needs one GPU per worker, and "
                f"torch sees {gpus}; use --nproc {gpus} or fewer, or --backend gloo (or set "
                f"{SHARED_GPU_VARIABLE}=1, NCCL >= 2.30.7, to let ranks share GPUs in a "
                "correctness test whose timings describe nothing real)"
            )
    return resolved


def prepare_suite(
    config: str,
    options: RunOptions,
    *,
    world_size: int,
    local_workers: int = 1,
    sink: Any = None,
) -> SuiteSpec:
    """Everything checked before any worker starts: ``--nproc``, backend and profiler here, what
    the ``sink`` (a phases.SinkFactory) cannot write here, then the pattern file ``config``,
    validated once with the options applied (ConfigError, OptionError)."""
    if local_workers > 1:
        check_nproc(local_workers)
    backend = check_devices(
        backend=options.backend, profiler=options.profiler, local_workers=local_workers
    )
    if sink is not None:
        sink.check(options)
    suite = load_suite(config, world_size=world_size)
    try:
        suite = apply_overrides(suite, options)
    except ConfigError as err:  # the file is fine: the option does not fit it
        raise OptionError(
            "; ".join(_placed(i.message, i.file, i.path) for i in err.issues)
        ) from None
    check_graphs(suite, options, backend)
    return suite


def _placed(message: str, file: str, path: str) -> str:
    where = ": ".join(part for part in (file, path) if part)
    return f"{message} ({where})" if where else message
