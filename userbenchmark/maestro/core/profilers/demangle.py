"""Kernel names demangled as PyTorch's profiler does (c10's demangler, the name kept where it
fails): CUPTI reports ``_Z28ncclDevKernel_...``, and HolisticTraceAnalysis classifies kernels by
the demangled name (``^nccl.*Kernel`` is communication)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """``name`` demangled when it is a mangled C++ symbol (``_Z...``), else unchanged."""
    if not name.startswith("_Z"):
        return name
    import torch

    return torch._C._demangle(name)
