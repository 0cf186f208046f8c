"""CUPTI's record buffers read into numpy rows per record kind, and the names a trace shows
for them: demangled kernel symbols, ``Memcpy DtoD (Device -> Device)``, API function names."""

from __future__ import annotations

import functools
import logging
from operator import attrgetter

import numpy as np

from ..analysis.intervals import API_DRIVER, API_RUNTIME, KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET
from .attribution import KERNEL_DIMS, ActivityRecords, ApiRecords, ExternalCorrelation

# The CUPTI profiler's logger (both modules'): under "maestro", its lines get the rank prefix
# and follow --log-level.
logger = logging.getLogger("maestro.cupti")


_READ = {
    "kernel": ("CONCURRENT_KERNEL", "activity_kernel10_dtype"),
    "memcpy": ("MEMCPY", "activity_memcpy6_dtype"),
    "memset": ("MEMSET", "activity_memset4_dtype"),
    "ext": ("EXTERNAL_CORRELATION", "activity_external_correlation_dtype"),
}
"""The record kinds read: (CUpti_ActivityKind, cupti-python's dtype of that record)."""
_COMMON = ("correlation_id", "start", "end", "stream_id", "device_id")
_FIELDS = {
    "kernel": (*_COMMON, *KERNEL_DIMS),
    "memcpy": (*_COMMON, "bytes"),
    "memset": (*_COMMON, "bytes"),
    "ext": ("correlation_id", "external_id"),
}
_NAMED_FIELDS = {
    "memcpy": ("copy_kind", "src_kind", "dst_kind"),
    "memset": ("memory_kind",),
    "api": ("correlation_id", "start", "end", "cbid", "thread_id"),
}
"""Fields read only when names are kept (a trace is wanted): what names a copy or a set, and
the API calls that launched the activities."""

# CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind, spelled as PyTorch's Kineto writes
# them into its traces ("Memcpy DtoD (Device -> Device)", "Memset (Device)"), names that
# HolisticTraceAnalysis classifies as memory work by their first word.
_COPY_KINDS = ("Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH")
_COPY_KINDS += ("PtoP",)
_MEMORY_KINDS = ("Unknown", "Pageable", "Pinned", "Device", "Array", "Managed")
_MEMORY_KINDS += ("Device Static", "Managed Static")


def _kind_name(table: tuple[str, ...], code: int) -> str:
    return table[code] if 0 <= code < len(table) else "Unknown"


_NAMERS = {
    "memcpy": lambda copy_kind, src_kind, dst_kind: (
        f"Memcpy {_kind_name(_COPY_KINDS, copy_kind)} "
        f"({_kind_name(_MEMORY_KINDS, src_kind)} -> {_kind_name(_MEMORY_KINDS, dst_kind)})"
    ),
    "memset": lambda memory_kind: f"Memset ({_kind_name(_MEMORY_KINDS, memory_kind)})",
}


class _RecordParser:
    """One CUPTI buffer's records as int64 (uint64 for "ext") rows: ``objects`` reads each field
    of each record object, ``numpy`` gathers them by address (a fraction of the Python work),
    ``auto`` checks one against the other first. ``names``: also name indices and API calls."""

    _VERIFY_BUFFERS = 2

    def __init__(self, cupti, mode: str, buffer_size_bytes: int, *, names: bool = False) -> None:
        if mode not in ("auto", "numpy", "objects"):
            raise ValueError(f"parse must be 'auto', 'numpy' or 'objects', got {mode!r}")
        kinds = cupti.ActivityKind
        self.codes = {name: int(getattr(kinds, kind)) for name, (kind, _) in _READ.items()}
        self.keep_names = names
        self.api_codes = {int(kinds.RUNTIME): API_RUNTIME, int(kinds.DRIVER): API_DRIVER}
        self.names: list[str] = []  # every name seen so far (rows index it; it only grows)
        self._name_ids: dict[str, int] = {}
        self.custom2 = int(cupti.ExternalCorrelationKind.CUSTOM2)
        self.mode = mode
        self._to_verify = self._VERIFY_BUFFERS if mode == "auto" else 0
        self._buffer_size_bytes = buffer_size_bytes
        try:
            self._dtypes = {name: getattr(cupti, dtype) for name, (_, dtype) in _READ.items()}
            if names:
                self._dtypes["api"] = cupti.activity_api_dtype
            for name, dtype in self._dtypes.items():
                wanted = {*_FIELDS.get(name, ()), *(_NAMED_FIELDS.get(name, ()) if names else ())}
                if missing := wanted - set(dtype.names):
                    raise KeyError(f"{name} record dtype lacks {sorted(missing)}")
        except (AttributeError, KeyError) as exc:
            self._fallback(f"record dtypes unusable: {exc}")

    def _fallback(self, why: str) -> None:
        if self.mode != "objects":
            logger.warning("cupti: reading records field by field (%s)", why)
        self.mode = "objects"
        self._to_verify = 0

    def _intern(self, name: str) -> int:
        if name not in self._name_ids:
            self._name_ids[name] = len(self.names)
            self.names.append(name)
        return self._name_ids[name]

    def _interned(self, names: list[str]) -> np.ndarray:
        return np.array([self._intern(n) for n in names], dtype=np.int32).reshape(-1)

    def parse(self, activities: list) -> dict[str, np.ndarray]:
        """Rows of the record kinds in one buffer (empty arrays when none)."""
        if self.mode == "objects" or not activities:
            return self.parse_objects(activities)
        try:
            fast = self.parse_numpy(activities)
            why = "record addresses do not lie in one buffer"
        except Exception as exc:
            fast, why = None, repr(exc)
        if fast is None:
            self._fallback(why)
            return self.parse_objects(activities)
        if self._to_verify > 0:
            self._to_verify -= 1
            slow = self.parse_objects(activities)
            if any(not np.array_equal(fast[k], slow[k]) for k in slow):
                self._fallback("gathered records differ from the record objects")
                return slow
            if self._to_verify == 0:
                self.mode = "numpy"
        return fast

    def parse_objects(self, activities: list) -> dict[str, np.ndarray]:
        """One attribute read per field and record."""
        kinds = {code: (name, attrgetter(*_FIELDS[name])) for name, code in self.codes.items()}
        api_codes = self.api_codes if self.keep_names else {}
        api_fields = attrgetter(*_NAMED_FIELDS["api"])
        rows: dict[str, list[tuple]] = {name: [] for name in _FIELDS}
        names: dict[str, list[str]] = {"kernel": [], "memcpy": [], "memset": []}
        api: list[tuple] = []
        for a in activities:
            if a.kind in kinds:
                name, fields = kinds[a.kind]
                if name == "ext" and a.external_kind != self.custom2:
                    continue
                rows[name].append(fields(a))
                if self.keep_names and name == "kernel":
                    names[name].append(_kernel_name(a))
                elif self.keep_names and name != "ext":
                    names[name].append(_NAMERS[name](*(getattr(a, f) for f in _NAMED_FIELDS[name])))
            elif a.kind in api_codes:
                api.append((*api_fields(a), api_codes[a.kind]))
        out = {}
        for name, found in rows.items():  # (0, width) where none
            dtype = np.uint64 if name == "ext" else np.int64
            out[name] = np.array(found, dtype).reshape(-1, len(_FIELDS[name]))
        if self.keep_names:
            out.update({f"{name}_name": self._interned(found) for name, found in names.items()})
            out["api"] = np.array(api, dtype=np.int64).reshape(-1, len(_NAMED_FIELDS["api"]) + 1)
        return out

    def parse_numpy(self, activities: list) -> dict[str, np.ndarray] | None:
        """One address read per record; fields gathered from the buffer in bulk."""
        import ctypes

        n = len(activities)
        ptrs = np.fromiter((a.ptr for a in activities), dtype=np.int64, count=n)
        base = int(ptrs.min())
        widest = max(d.itemsize for d in self._dtypes.values())
        span = int(ptrs.max()) - base + widest
        if span > self._buffer_size_bytes + widest:
            return None  # not views into one CUPTI buffer: never read across foreign memory
        # Only the bytes of each record are read; the view's extent itself touches nothing.
        mem = np.frombuffer((ctypes.c_ubyte * span).from_address(base), dtype=np.uint8)
        offsets = ptrs - base
        # Every CUPTI record starts with its CUpti_ActivityKind (uint32).
        kinds = mem[offsets[:, None] + np.arange(4)].copy().view("<u4")[:, 0]

        def gather(dtype: np.dtype, at: np.ndarray) -> np.ndarray:
            return mem[at[:, None] + np.arange(dtype.itemsize)].copy().view(dtype)[:, 0]

        out = {}
        for name, code in self.codes.items():
            recs = gather(self._dtypes[name], offsets[kinds == code])
            if name == "ext":
                recs = recs[recs["external_kind"] == self.custom2]
            target = np.uint64 if name == "ext" else np.int64
            # Per field first: stacking uint64 with int32 columns would promote to float64.
            out[name] = np.stack([recs[f].astype(target) for f in _FIELDS[name]], axis=1)
            if self.keep_names and name == "kernel":
                # The name is a pointer into CUPTI's memory: read through the record object.
                which = np.flatnonzero(kinds == code).tolist()
                out["kernel_name"] = self._interned([_kernel_name(activities[i]) for i in which])
            elif self.keep_names and name in _NAMERS:
                codes = np.stack([recs[f].astype(np.int64) for f in _NAMED_FIELDS[name]], axis=1)
                out[f"{name}_name"] = self._names_of_codes(codes, _NAMERS[name])
        if self.keep_names:  # RUNTIME and DRIVER records share one layout; in record order
            is_api = np.isin(kinds, list(self.api_codes))
            recs = gather(self._dtypes["api"], offsets[is_api])
            cols = [recs[f].astype(np.int64) for f in _NAMED_FIELDS["api"]]
            which = [kinds[is_api] == code for code in self.api_codes]
            cols.append(np.select(which, list(self.api_codes.values())).astype(np.int64))
            out["api"] = np.stack(cols, axis=1)
        return out

    def _names_of_codes(self, codes: np.ndarray, name_of) -> np.ndarray:
        """Name indices of rows of kind codes, naming each distinct combination once."""
        distinct, inverse = np.unique(codes, axis=0, return_inverse=True)
        ids = np.array([self._intern(name_of(*row)) for row in distinct.tolist()], np.int32)
        return ids[inverse.reshape(-1)]


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """``name`` demangled as PyTorch's profiler does (``_Z28ncclDevKernel_...`` reads
    ``ncclDevKernel_AllGather_RING(...)``): HolisticTraceAnalysis classifies kernels by it."""
    if not name.startswith("_Z"):
        return name
    import torch

    return torch._C._demangle(name)


def _kernel_name(record) -> str:
    name = record.name
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    return demangle(str(name)) if name else "kernel (no name from CUPTI)"


NamedRecords = tuple[np.ndarray, tuple[str, ...], ApiRecords]
"""Each activity's index into the names, the names, and the API calls (for traces)."""
_KINDS = (("kernel", KIND_KERNEL), ("memcpy", KIND_MEMCPY), ("memset", KIND_MEMSET))


def _joined(chunks: list[np.ndarray], *width: int) -> np.ndarray:
    return np.concatenate(chunks) if chunks else np.zeros((0, *width), dtype=np.int64)


def activity_records(chunks: dict[str, list[np.ndarray]]) -> ActivityRecords:
    """The kernel, memcpy and memset rows of a window's buffers, in that order, as one table."""
    parts = [(code, _joined(chunks[name], len(_FIELDS[name]))) for name, code in _KINDS]
    column = [np.concatenate([p[:, i] for _, p in parts]) for i in range(len(_COMMON))]
    num_kernels = parts[0][1].shape[0]
    extra = np.zeros((column[0].shape[0], 1 + len(KERNEL_DIMS)), np.int64)  # bytes, kernel dims
    extra[num_kernels:, 0] = np.concatenate([p[:, len(_COMMON)] for _, p in parts[1:]])
    extra[:num_kernels, 1:] = parts[0][1][:, len(_COMMON) :]
    return ActivityRecords(
        correlation_id=column[0].astype(np.uint64),
        start_ns=column[1],
        end_ns=column[2],
        kind=np.concatenate([np.full(p.shape[0], code, np.uint8) for code, p in parts]),
        stream_id=column[3],
        device_id=column[4].astype(np.int32),
        size_bytes=extra[:, 0],
        **{dim: extra[:, i].astype(np.int32) for i, dim in enumerate(KERNEL_DIMS, start=1)},
    )


def external_correlation(chunks: list[np.ndarray]) -> ExternalCorrelation:
    """The CUSTOM2 correlation rows of a window's buffers."""
    table = np.concatenate(chunks) if chunks else np.zeros((0, 2), dtype=np.uint64)
    return ExternalCorrelation(correlation_id=table[:, 0].copy(), external_id=table[:, 1].copy())


def named_records(chunks: dict[str, list[np.ndarray]], names: tuple[str, ...]) -> NamedRecords:
    """The name rows (in ``activity_records``' order) and API calls of a window's buffers."""
    name_index = np.concatenate([_joined(chunks[f"{k}_name"]) for k, _ in _KINDS])
    rows = _joined(chunks["api"], 6)
    api = ApiRecords(
        correlation_id=rows[:, 0].copy(),
        start_ns=rows[:, 1].copy(),
        end_ns=rows[:, 2].copy(),
        cbid=rows[:, 3].astype(np.int32),
        thread_id=rows[:, 4].copy(),
        api=rows[:, 5].astype(np.uint8),
    )
    return name_index.astype(np.int32), names, api
