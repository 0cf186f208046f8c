"""Checks of a run's options against this machine, made before any worker starts.

Each failure is an OptionError (exit status 2) that says what was asked, why this machine
cannot do it and what would work, instead of a failure on every rank after start-up.
"""

from __future__ import annotations

import os

from ...errors import ConfigError, OptionError
from ..config.spec import SuiteSpec
from .distributed import SHARED_GPU_VARIABLE, resolve_backend
from .graphs import graph_refusal

MAX_LOCAL_WORKERS = 256
"""Most workers ``--nproc`` starts on one machine; more ranks come from torchrun or srun."""
FILES_PER_WORKER = 8
"""Open files the local launcher holds per worker (pipes to it, its store connection: about
five measured on Linux, rounded up for those open while a worker starts)."""
FILES_RESERVED = 64
"""Open files the launcher needs for itself (Python, torch, the rendezvous store)."""


def open_file_limit() -> int | None:
    """This process's soft limit on open files (``ulimit -n``); None when unlimited or unknown."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    return int(soft)


def max_local_workers(limit: int | None = None) -> tuple[int, str]:
    """How many workers ``--nproc`` may start here, and why that many (for the message).

    ``limit`` is the open-file limit to assume (default: this process's).
    """
    limit = open_file_limit() if limit is None else limit
    if limit is not None:
        by_files = max(1, (limit - FILES_RESERVED) // FILES_PER_WORKER)
        if by_files < MAX_LOCAL_WORKERS:
            return by_files, (
                f"the launcher holds about {FILES_PER_WORKER} open files per worker and may "
                f"open {limit} (ulimit -n); raise the limit or start fewer workers"
            )
    return MAX_LOCAL_WORKERS, (
        "maestro's limit for one machine; start more ranks with torchrun or srun across machines"
    )


def check_nproc(nproc: int, *, limit: int | None = None) -> None:
    """Raise OptionError when ``--nproc`` is more workers than this machine can start."""
    most, why = max_local_workers(limit)
    if nproc > most:
        raise OptionError(f"--nproc must be at most {most}, got {nproc}: {why}")


def check_devices(*, backend: str, profiler: str, local_workers: int = 1) -> None:
    """Raise OptionError when ``--backend``/``--profiler`` cannot run on this machine.

    ``local_workers`` is how many ranks share this machine's GPUs (``--nproc``).
    """
    import torch

    cuda = torch.cuda.is_available()
    no_gpu = "torch sees no CUDA device" + (
        "" if torch.version.cuda else " (this torch is a CPU build)"
    )
    if backend == "nccl" and not cuda:
        raise OptionError(
            f"--backend nccl needs CUDA, and {no_gpu}; use --backend gloo (or auto, which "
            "picks gloo without CUDA)"
        )
    on_cuda = resolve_backend(backend, cuda) == "nccl"
    if profiler in ("cupti", "events") and not on_cuda:
        if not cuda:
            raise OptionError(
                f"--profiler {profiler} times CUDA work, and {no_gpu}; on the CPU use "
                "--profiler host (or auto)"
            )
        raise OptionError(
            f"--profiler {profiler} times CUDA work, but --backend {backend} runs every lane "
            "on the CPU; use --backend nccl (or auto), or --profiler host"
        )
    if profiler == "host" and on_cuda:
        raise OptionError(
            "--profiler host times CPU lanes; on CUDA (backend nccl) it would time the "
            "enqueue, not the GPU work: use --profiler cupti, events or auto"
        )
    if profiler == "cupti" and on_cuda:
        from ..profilers.cupti import cupti_available

        ok, why = cupti_available()
        if not ok:
            raise OptionError(
                f"--profiler cupti cannot run: {why}; or use --profiler events (or auto, "
                "which falls back to CUDA events)"
            )
    if on_cuda and local_workers > 1 and os.environ.get(SHARED_GPU_VARIABLE) != "1":
        gpus = torch.cuda.device_count()
        if local_workers > gpus:
            raise OptionError(
                f"--nproc {local_workers} on the nccl backend needs one GPU per worker, and "
                f"torch sees {gpus}; use --nproc {gpus} or fewer, or --backend gloo (or set "
                f"{SHARED_GPU_VARIABLE}=1, NCCL >= 2.30.7, to let ranks share GPUs in a "
                "correctness test whose timings describe nothing real)"
            )


def check_suite(suite: SuiteSpec, *, backend: str) -> None:
    """Raise ConfigError when a pattern asks for what this machine's backend cannot do (CUDA
    graphs on gloo), naming the file and the pattern."""
    import torch

    resolved = resolve_backend(backend, torch.cuda.is_available())
    refusal = graph_refusal(resolved)
    graphs = [p for p in suite.patterns if p.graph]
    if refusal and graphs:
        names = ", ".join(p.name for p in graphs[:5]) + (", ..." if len(graphs) > 5 else "")
        raise ConfigError(
            f"patterns {names}: {refusal}", file=suite.source, path=graphs[0].yaml_path
        )
