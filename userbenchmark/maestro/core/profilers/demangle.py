"""C++ symbol names as people and tools read them (``ncclDevKernel_AllGather_RING(...)``).

CUPTI reports kernel names as the compiler mangled them (``_Z28ncclDevKernel_...``); PyTorch's
profiler (Kineto) demangles them, and HolisticTraceAnalysis classifies kernels by the
demangled name (``^nccl.*Kernel`` is communication). libstdc++'s ``__cxa_demangle`` does it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger("maestro.profilers")


@functools.cache
def _cxa_demangle() -> tuple[Callable, Callable] | None:
    """libstdc++'s ``__cxa_demangle`` and libc's ``free``, or None where absent."""
    for name in ("stdc++", "c++"):
        path = ctypes.util.find_library(name)
        if not path:
            continue
        try:
            lib = ctypes.CDLL(path)
            libc = ctypes.CDLL(ctypes.util.find_library("c"))
        except OSError:
            continue
        fn = getattr(lib, "__cxa_demangle", None)
        if fn is None:
            continue
        fn.restype = ctypes.c_void_p
        fn.argtypes = [
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(ctypes.c_int),
        ]
        libc.free.argtypes = [ctypes.c_void_p]
        return fn, libc.free
    log.warning("no C++ demangler (libstdc++) found: kernel names stay mangled")
    return None


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """``name`` demangled when it is a mangled C++ symbol (``_Z...``), else unchanged."""
    if not name.startswith("_Z"):
        return name
    found = _cxa_demangle()
    if found is None:
        return name
    fn, free = found
    status = ctypes.c_int(0)
    pointer = fn(name.encode("utf-8", "replace"), None, None, ctypes.byref(status))
    if not pointer:
        return name
    try:
        text = ctypes.string_at(pointer).decode("utf-8", "replace")
    finally:
        free(pointer)
    return text if status.value == 0 else name
