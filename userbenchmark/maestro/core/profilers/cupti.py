"""CUPTI activity profiler: each block's enqueue is bracketed by an external correlation id
(kind CUSTOM2; Kineto uses CUSTOM0/1) that `attribution.attribute` joins the records by.
cupti-python is imported lazily; never run torch.profiler in the same process (one CUPTI)."""

from __future__ import annotations

import functools
import importlib.metadata
import re
import threading
from collections import defaultdict
from typing import Any

import numpy as np

from ..analysis.intervals import API_RUNTIME, DeviceActivities, WindowTimings
from .attribution import (
    GATE_BLOCK,
    HARNESS_BLOCK,
    ActivityRecords,
    Attribution,
    ExternalCorrelation,
    attribute,
    encode_external_id,
    window_activities,
)
from .cupti_records import (
    NamedRecords,
    _RecordParser,
    activity_records,
    external_correlation,
    logger,
    named_records,
)
from .profiler import Profiler

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

    def __init__(self, *, trace: bool = False, parse: str = "auto") -> None:
        if why := self.unusable():
            raise RuntimeError(why)
        from cupti import cupti

        self._cupti = cupti
        kinds = cupti.ActivityKind
        # RUNTIME or DRIVER must be on for EXTERNAL_CORRELATION records to appear; NCCL
        # launches through the driver API, so both are on.
        device = (kinds.CONCURRENT_KERNEL, kinds.MEMCPY, kinds.MEMSET)
        self._kinds = (*device, kinds.RUNTIME, kinds.DRIVER, kinds.EXTERNAL_CORRELATION)
        self._ext_kind = int(cupti.ExternalCorrelationKind.CUSTOM2)
        self._flush_forced = int(cupti.ActivityFlag.FLUSH_FORCED)
        self._push_id = cupti.activity_push_external_correlation_id
        self._pop_id = cupti.activity_pop_external_correlation_id
        self._buffer_size_bytes = BUFFER_SIZE_BYTES
        self._parser = _RecordParser(cupti, parse, MAX_BUFFER_SIZE_BYTES, names=trace)
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
        # Records delivered since this window began; the ended windows' records and iterations.
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
        with self._lock:
            self._delivered = 0
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
        records, ext, named = self._take()
        with self._lock:
            self._window_records += self._delivered
        self._window_iters += num_iters
        self.last_activities = None
        att = attribute(
            records,
            ext,
            window_id=window_id,
            num_blocks=num_blocks,
            num_iters=num_iters,
            present=self._present,
            per_activity=named is not None,
        )
        if named is not None:
            name_index, names, api = named
            self.last_activities = window_activities(
                records, att, name_index=name_index, names=names, api=api, api_name=self._api_name
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

    def _take(self) -> tuple[ActivityRecords, ExternalCorrelation, NamedRecords | None]:
        with self._lock:
            chunks, self._chunks = self._chunks, defaultdict(list)
            # Every name a taken chunk refers to was added before the chunk was.
            names = tuple(self._parser.names) if self._parser.keep_names else ()
        records, ext = activity_records(chunks), external_correlation(chunks["ext"])
        return records, ext, named_records(chunks, names) if self._parser.keep_names else None
