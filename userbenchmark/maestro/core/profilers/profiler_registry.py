"""The profiler registry: every profiler by its ``--profiler`` name, the one a run uses (``auto``:
the first registered that times its lanes and can run here), and why another cannot."""

from __future__ import annotations

import logging

from ...errors import OptionError
from .cupti import CuptiProfiler
from .profiler import EventProfiler, HostProfiler, Profiler

log = logging.getLogger("maestro")

PROFILERS: tuple[type[Profiler], ...] = (CuptiProfiler, EventProfiler, HostProfiler)
"""Every profiler, in the order ``auto`` tries them."""


def profiler_names() -> tuple[str, ...]:
    """The choices of ``--profiler``."""
    return ("auto", *(p.name for p in PROFILERS))


def no_gpu() -> str:
    import torch

    cpu_build = "" if torch.version.cuda else " (this torch is a CPU build)"
    return f"torch sees no CUDA device{cpu_build}"


def _alternatives(times: str) -> str:
    names = [p.name for p in PROFILERS if p.times == times]
    return f"{', '.join(names)} or auto" if times == "cuda" else " or ".join(names)


def resolve_profiler(requested: str, *, on_cuda: bool, backend: str = "auto") -> type[Profiler]:
    """The profiler class ``--profiler requested`` gives lanes on CUDA or the CPU; OptionError
    for one that cannot time those lanes, or cannot run on this machine."""
    times = "cuda" if on_cuda else "cpu"
    fitting = [p for p in PROFILERS if p.times == times]
    if requested == "auto":
        return next((p for p in fitting if not p.unusable()), fitting[-1])
    chosen = next(p for p in PROFILERS if p.name == requested)
    if chosen.times == "cuda" and not on_cuda:
        import torch

        hint = f"use --profiler {_alternatives('cpu')}"
        if not torch.cuda.is_available():
            raise OptionError(
                f"--profiler {requested} times CUDA work, and {no_gpu()}; on the CPU {hint} (or auto)"
            )
        raise OptionError(
            f"--profiler {requested} times CUDA work, but --backend {backend} runs every lane on "
            f"the CPU; use --backend nccl (or auto), or --profiler {_alternatives('cpu')}"
        )
    if chosen.times != times:
        raise OptionError(
            f"--profiler {requested} times CPU lanes; on CUDA (backend nccl) it would time the "
            f"enqueue, not the GPU work: use --profiler {_alternatives('cuda')}"
        )
    if why := chosen.unusable():
        other = next(p for p in fitting if p is not chosen)
        raise OptionError(
            f"--profiler {requested} cannot run: {why}; or use --profiler {other.name} (or auto, "
            f"which falls back to {other.described})"
        )
    return chosen


def make_profiler(
    requested: str, *, on_cuda: bool, backend: str, trace: bool = False, warn: bool = False
) -> Profiler:
    """This rank's started profiler; ``trace``: keep named activities (``--trace``); ``warn``:
    say when ``auto`` could not take the first profiler for these lanes (rank 0)."""
    chosen = resolve_profiler(requested, on_cuda=on_cuda, backend=backend)
    first = next(p for p in PROFILERS if p.times == chosen.times)
    if warn and requested == "auto" and chosen is not first:
        log.warning(
            "%s cannot run (%s); timing with %s instead, which is coarser",
            first.name,
            first.unusable(),
            chosen.described,
        )
    profiler = chosen(trace=trace)
    profiler.start()
    return profiler
