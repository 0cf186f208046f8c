"""CUPTI activity profiler: each block's enqueue is bracketed by an external correlation id
(kind CUSTOM2; Kineto uses CUSTOM0/1) that `attribution.attribute` joins the records by; record
buffers become numpy rows, named as a trace names them (demangled kernels, ``Memset (Device)``).
cupti-python is imported lazily; never run torch.profiler in the same process (one CUPTI)."""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import re
import threading
from collections import defaultdict
from operator import attrgetter
from typing import Any

import numpy as np

from ..analysis.intervals import (
    API_DRIVER,
    API_RUNTIME,
    KIND_NAMES,
    DeviceActivities,
    WindowTimings,
)
from .attribution import (
    GATE_BLOCK,
    HARNESS_BLOCK,
    KERNEL_DIMS,
    ActivityRecords,
    ApiRecords,
    Attribution,
    ExternalCorrelation,
    attribute,
    encode_external_id,
    window_activities,
)
from .profiler import Profiler

# Under "maestro", the CUPTI profiler's lines get the rank prefix and follow --log-level.
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
    """One CUPTI buffer's records as int64 (uint64 for "ext") rows. ``mode``: ``auto`` checks the
    ``numpy`` gather by address (a fraction of the Python work) against ``objects`` (each field of
    each record object) on the first buffers, then keeps one. ``names``: also names and API calls."""

    _VERIFY_BUFFERS = 2

    def __init__(self, cupti, *, names: bool = False) -> None:
        kinds = cupti.ActivityKind
        self.codes = {name: int(getattr(kinds, kind)) for name, (kind, _) in _READ.items()}
        self.keep_names = names
        self.api_codes = {int(kinds.RUNTIME): API_RUNTIME, int(kinds.DRIVER): API_DRIVER}
        self.names: list[str] = []  # every name seen so far (rows index it; it only grows)
        self._name_ids: dict[str, int] = {}
        self.custom2 = int(cupti.ExternalCorrelationKind.CUSTOM2)
        self.mode = "auto"
        self._to_verify = self._VERIFY_BUFFERS
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
        logger.warning("cupti: reading records field by field (%s)", why)
        self.mode = "objects"

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
        if span > MAX_BUFFER_SIZE_BYTES + widest:
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


_KINDS = tuple((name, code) for code, name in KIND_NAMES.items())  # kernel, memcpy, memset


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


def named_records(chunks: dict[str, list[np.ndarray]]) -> tuple[np.ndarray, ApiRecords]:
    """Each activity's index into the names (in ``activity_records``' order) and the API calls
    of a window's buffers, for traces."""
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
    return name_index.astype(np.int32), api


# A buffer is delivered on CUPTI's own thread, whose Python work per record competes with the
# host's enqueue for the GIL: a window's records go to buffers sized to hold them all, delivered
# once it ends (flushing every iteration made the host outlast the gate, BENCHMARKS.md).
BUFFER_SIZE_BYTES = 32 << 20
"""Smallest buffer handed to CUPTI (it asks for more as they fill)."""
BYTES_PER_LAUNCH = 4096
"""Room per block launch in a window's buffer: ~35 records of 40-200 bytes, with margin."""
MAX_BUFFER_SIZE_BYTES = 256 << 20
"""Largest buffer; a longer window's records spill into more buffers (delivered mid-window)."""


def cupti_available() -> tuple[bool, str]:
    """Whether cupti-python imports and matches torch's CUDA major version, and why not."""
    import torch

    cuda = torch.version.cuda
    if not cuda:
        return False, "torch is built without CUDA; the cupti profiler needs a CUDA build"
    major = int(cuda.split(".")[0])
    hint = f"pip install 'cupti-python>={major},<{major + 1}'"
    try:
        version = importlib.metadata.version("cupti-python")
    except importlib.metadata.PackageNotFoundError:
        return False, f"cupti-python is not installed (torch uses CUDA {cuda}): {hint}"
    if int(version.split(".")[0]) != major:
        return False, f"cupti-python {version} does not match torch's CUDA {cuda}: {hint}"
    try:
        from cupti import cupti  # noqa: F401
    except Exception as exc:  # a missing libcupti raises more than ImportError
        return False, f"cupti-python {version} does not import ({exc}): {hint}"
    return True, f"cupti-python {version} with torch CUDA {cuda}"


_DEVICE_WORK_API = re.compile(r"Launch|Memcpy|Memset")
"""API records kept: the calls that enqueue device work. Others cost: the host's ``Event.query``
polls alone made millions of records in one run."""


def api_record_filter(cupti: Any) -> str:
    """Keep API records only of the functions that enqueue device work; returns ``"launches"``,
    or ``"all"`` with why where this CUPTI cannot choose per function (cupti-python < 12.6)."""
    for api in ("runtime", "driver"):
        enable_name = f"activity_enable_{api}_api"
        enable = getattr(cupti, enable_name, None)
        table = getattr(cupti, f"{api}_api_trace_cbid", None)
        if enable is None or table is None:
            return f"all (this cupti-python has no {enable_name})"
        for member in table:
            name = member.name
            if name in ("INVALID", "SIZE", "FORCE_INT"):
                continue
            try:
                enable(int(member), 1 if _DEVICE_WORK_API.search(name) else 0)
            except Exception as exc:  # an id this CUPTI does not know: it records it
                logger.debug("cupti: %s(%s) refused: %s", enable_name, name, exc)
    return "launches"


class CuptiProfiler(Profiler):
    """Device timestamps per (block, iteration), CLOCK_REALTIME ns of this host; ``trace``: also
    names and API calls in ``last_activities`` (parsing time: off otherwise)."""

    name = "cupti"
    times = "cuda"
    described = "CUPTI's device timestamps"

    def __init__(self, *, trace: bool = False) -> None:
        if why := self.unusable():
            raise RuntimeError(why)
        from cupti import cupti

        self._cupti = cupti
        # The kinds read, and both APIs: RUNTIME or DRIVER must be on for EXTERNAL_CORRELATION
        # records to appear, and NCCL launches through the driver API.
        read = [getattr(cupti.ActivityKind, kind) for kind, _ in _READ.values()]
        self._kinds = (*read, cupti.ActivityKind.RUNTIME, cupti.ActivityKind.DRIVER)
        self._ext_kind = int(cupti.ExternalCorrelationKind.CUSTOM2)
        self._flush_forced = int(cupti.ActivityFlag.FLUSH_FORCED)
        self._push_id = cupti.activity_push_external_correlation_id
        self._pop_id = cupti.activity_pop_external_correlation_id
        self._buffer_size_bytes = BUFFER_SIZE_BYTES
        self._parser = _RecordParser(cupti, names=trace)
        self._api_name = functools.cache(self._callback_name)
        self._lock = threading.Lock()
        self._chunks: dict[str, list[np.ndarray]] = defaultdict(list)  # rows of _RecordParser
        self._callback_error: BaseException | None = None
        self._enabled: list = []
        self._started = False
        self._window_id: int | None = None
        self._depth = 0
        self._present: np.ndarray | None = None
        self._shape = (0, 0)  # (blocks, iterations) of the open window
        self.api_records = "all"  # or "launches" (api_record_filter)
        # Records delivered since the last _take; the ended windows' records and iterations.
        self._delivered = self._window_records = self._window_iters = 0
        self.last_activities: DeviceActivities | None = None

    @classmethod
    def unusable(cls) -> str:
        ok, why = cupti_available()
        return "" if ok else why

    def start(self) -> None:
        if self._started:
            return
        cupti = self._cupti
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        try:
            for kind in self._kinds:
                cupti.activity_enable(kind)
                self._enabled.append(kind)
        except Exception as exc:
            self._disable()
            raise RuntimeError(
                f"CUPTI refused activity kind {kind.name}: {exc} (is another profiler, such "
                "as torch.profiler or nsys, attached to this process?)"
            ) from exc
        self.api_records = api_record_filter(cupti)
        self._started = True

    def close(self) -> None:
        """Flush, disable and finalise CUPTI; safe twice and on an exception path."""
        if not self._started:
            return
        self._started = False
        while self._depth > 0:  # a block raised between push and pop
            self._depth -= 1
            try:
                self._pop_id(self._ext_kind)
            except Exception:
                break
        import torch  # imported already: cupti_available() did

        for step, call in (
            ("synchronize", torch.cuda.synchronize),
            ("flush", lambda: self._cupti.activity_flush_all(self._flush_forced)),
            ("disable", self._disable),
            ("finalize", self._cupti.finalize),
        ):
            try:
                call()
            except Exception as exc:  # a failed CUDA context must not hide the original error
                logger.warning("cupti stop: %s failed: %s", step, exc)
        self._take()
        self._window_id = None

    def _disable(self) -> None:
        while self._enabled:
            self._cupti.activity_disable(self._enabled.pop())

    def begin_window(
        self, window_id: int, num_blocks: int, num_iters: int, present: np.ndarray | None = None
    ) -> None:
        """Flush and discard everything captured so far (warmup included); open a window of
        ``num_blocks`` x ``num_iters`` (``present``: default all), its buffer sized to hold it."""
        self._require_started()
        if self._depth:
            raise RuntimeError(f"begin_window with {self._depth} external id(s) still pushed")
        encode_external_id(window_id, 0, 0)  # validates window_id
        launches_bytes = num_blocks * num_iters * BYTES_PER_LAUNCH
        self._buffer_size_bytes = min(max(launches_bytes, BUFFER_SIZE_BYTES), MAX_BUFFER_SIZE_BYTES)
        self._flush()
        self._take()  # warmup and anything before: never reaches the numbers
        self._window_id = window_id
        import torch

        # CUPTI gets a buffer ready at the first records after a flush: let one harness
        # kernel (counted, in no block) pay for that here, not the first iteration's enqueue.
        self.push_harness(0)
        torch.cuda._sleep(1)
        self.pop()
        torch.cuda.synchronize()
        self._shape = (num_blocks, num_iters)
        self._present = None if present is None else np.asarray(present, dtype=bool).copy()

    def end_window(self) -> WindowTimings:
        return self.attribute_window().timings(self._present, self.last_activities)

    def attribute_window(self) -> Attribution:
        """Synchronize, flush and attribute everything since begin_window."""
        self._require_started()
        if self._window_id is None:
            raise RuntimeError("end_window without begin_window")
        if self._depth:
            raise RuntimeError(f"end_window with {self._depth} external id(s) still pushed")
        num_blocks, num_iters = self._shape
        window_id, self._window_id = self._window_id, None
        self._flush()
        chunks, names, delivered = self._take()
        self._window_records += delivered
        self._window_iters += num_iters
        self.last_activities = None
        records, named = activity_records(chunks), self._parser.keep_names
        att = attribute(
            records,
            external_correlation(chunks["ext"]),
            window_id=window_id,
            num_blocks=num_blocks,
            num_iters=num_iters,
            present=self._present,
            per_activity=named,
        )
        if named:
            index, api = named_records(chunks)
            self.last_activities = window_activities(
                records, att, name_index=index, names=names, api=api, api_name=self._api_name
            )
        return att

    def _callback_name(self, api: int, cbid: int) -> str | None:
        getter = getattr(self._cupti, "get_callback_name", None)
        domains = getattr(self._cupti, "CallbackDomain", None)
        if getter is None or domains is None:
            return None
        domain = domains.RUNTIME_API if api == API_RUNTIME else domains.DRIVER_API
        try:
            name = getter(domain, cbid)
        except Exception as exc:  # an id this CUPTI does not know: a generic name
            logger.debug("cupti: no name for callback %d of API %d: %s", cbid, api, exc)
            return None
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        # Without CUPTI's version suffix (cudaLaunchKernel_v7000), as PyTorch's traces name it.
        return re.sub(r"_v\d+$", "", name) if isinstance(name, str) and name else None

    def push(self, block_index: int, iteration: int) -> None:
        """Attribute what this thread enqueues until pop() to (block_index, iteration)."""
        if block_index >= GATE_BLOCK:
            raise ValueError(f"block_index must be below {GATE_BLOCK}, got {block_index}")
        self._push(block_index, iteration)

    def push_gate(self, iteration: int) -> None:
        """Mark the gate's spin kernel of one iteration (its end is when the gate opened)."""
        self._push(GATE_BLOCK, iteration)

    def push_harness(self, iteration: int = 0) -> None:
        """Mark harness work (barriers, syncs): never part of a block."""
        self._push(HARNESS_BLOCK, iteration)

    def _push(self, block_index: int, iteration: int) -> None:
        if self._window_id is None:
            raise RuntimeError("push outside a window: call begin_window first")
        self._push_id(self._ext_kind, encode_external_id(self._window_id, block_index, iteration))
        self._depth += 1

    def pop(self, *_: int) -> None:
        """End the innermost push (the lanes' ``after`` and ``gate_end``)."""
        if self._depth <= 0:
            raise RuntimeError("pop without push")
        self._pop_id(self._ext_kind)
        self._depth -= 1

    before, gate_begin = push, push_gate
    after = gate_end = pop

    def run_info(self) -> dict[str, str]:
        info = {
            "cupti_python_version": importlib.metadata.version("cupti-python"),
            "cupti_api_records": self.api_records,
        }
        if self._window_iters:  # CUPTI records (every kind) per measured iteration
            info["cupti_records_per_iteration"] = f"{self._window_records / self._window_iters:.1f}"
        return info

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("CuptiProfiler is not started")
        if self._callback_error is not None:
            error, self._callback_error = self._callback_error, None
            raise RuntimeError(f"parsing CUPTI records failed: {error!r}") from error

    def _flush(self) -> None:
        import torch

        # CUPTI holds records in its buffers until flushed, and a forced flush of work still
        # running returns incomplete records: synchronize first.
        torch.cuda.synchronize()
        self._cupti.activity_flush_all(self._flush_forced)
        self._require_started()  # raises a callback's error

    def _buffer_requested(self) -> tuple[int, int]:
        return self._buffer_size_bytes, 0  # 0: as many records as fit

    def _buffer_completed(self, activities: list) -> None:
        # Called on CUPTI's own thread (even inside activity_flush_all, which returns only once
        # the callbacks are done) with one buffer's records as Python objects; copy the few
        # fields needed into numpy chunks and keep nothing else.
        try:
            rows = self._parser.parse(activities)
            with self._lock:
                self._delivered += len(activities)
                for name, found in rows.items():
                    if found.shape[0]:
                        self._chunks[name].append(found)
        except BaseException as exc:  # raised later on the caller's thread, never lost
            if self._callback_error is None:
                self._callback_error = exc

    def _take(self) -> tuple[dict[str, list[np.ndarray]], tuple[str, ...], int]:
        with self._lock:
            chunks, self._chunks = self._chunks, defaultdict(list)
            delivered, self._delivered = self._delivered, 0
            # Every name a taken chunk refers to was added before the chunk was.
            return chunks, tuple(self._parser.names), delivered
