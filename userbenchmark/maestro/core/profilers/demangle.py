"""C++ symbol names as people and tools read them (``ncclDevKernel_AllGather_RING(...)``).

CUPTI reports kernel names as the compiler mangled them (``_Z28ncclDevKernel_...``); PyTorch's
profiler demangles them with c10's demangler (libstdc++'s ``__cxa_demangle``, the name left as
it is where that fails), and HolisticTraceAnalysis classifies kernels by the demangled name
(``^nccl.*Kernel`` is communication).
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """``name`` demangled when it is a mangled C++ symbol (``_Z...``), else unchanged."""
    if not name.startswith("_Z"):
        return name
    import torch

    return torch._C._demangle(name)
