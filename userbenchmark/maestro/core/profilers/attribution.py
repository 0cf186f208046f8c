"""Attribute device activities to (block, iteration) through external correlation ids: pure
numpy, no CUPTI (its backend fills `ActivityRecords` and `ExternalCorrelation`). Nothing is
dropped silently: every problem is an AttributionError."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..analysis.intervals import (
    API_DRIVER,
    API_RUNTIME,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_NAMES,
    ApiRecords,
    Columns,
    DeviceActivities,
    LaunchCalls,
    WindowTimings,
)

# External id layout (63 bits, so every id is also a non-negative int64):
#   bit 62: tag (marks an id as ours), bits 40..61: window, 24..39: block, 0..23: iteration.
_TAG = 1 << 62
_WINDOW_SHIFT = 40
_WINDOW_BITS = 22
_BLOCK_SHIFT = 24
_BLOCK_BITS = 16
_ITER_BITS = 24
MAX_WINDOW_ID = (1 << _WINDOW_BITS) - 1
HARNESS_BLOCK = (1 << _BLOCK_BITS) - 1
"""Block index reserved for harness work (barriers, syncs): in no block, left out."""
GATE_BLOCK = HARNESS_BLOCK - 1
"""Block index reserved for the gate's spin kernel: harness too, but its end per iteration
is kept as the moment the gate opened."""
MAX_NUM_BLOCKS = GATE_BLOCK
MAX_NUM_ITERS = 1 << _ITER_BITS

# Dense join table allowed while its span stays within this many entries beyond the inputs;
# past that (correlation ids far apart) the sort-based join keeps memory bounded.
_DENSE_SLACK = 1 << 20
_MISSING = np.iinfo(np.int64).min
# How many offending items an error message names.
_SHOWN = 8


class AttributionError(RuntimeError):
    """Device activity that cannot be attributed, or a (block, iteration) without activity: the
    message counts each problem."""


def encode_external_id(window_id: int, block_index: int, iteration: int) -> int:
    """Pack (window, block, iteration) into one 63-bit external correlation id."""
    if not 0 <= window_id <= MAX_WINDOW_ID:
        raise ValueError(f"window_id must be in [0, {MAX_WINDOW_ID}], got {window_id}")
    if not 0 <= block_index <= HARNESS_BLOCK:
        raise ValueError(f"block_index must be in [0, {HARNESS_BLOCK}], got {block_index}")
    if not 0 <= iteration < MAX_NUM_ITERS:
        raise ValueError(f"iteration must be in [0, {MAX_NUM_ITERS}), got {iteration}")
    return _TAG | (window_id << _WINDOW_SHIFT) | (block_index << _BLOCK_SHIFT) | iteration


def _as_int64(a: np.ndarray) -> np.ndarray:
    """int64 view or copy; uint64 values of 2**63 and above become negative (never ours)."""
    return a.view(np.int64) if a.dtype == np.uint64 else a.astype(np.int64, copy=False)


KERNEL_DIMS = tuple(f"{dims}_{axis}" for dims in ("grid", "block") for axis in "xyz")


@dataclass(frozen=True, kw_only=True)
class ActivityRecords(Columns):
    """Device activities (kernels, memcpys, memsets) of one window."""

    correlation_id: np.ndarray  # uint64, CUPTI correlation id of the launching API call
    start_ns: np.ndarray  # int64, the rank's own clock (CUPTI: CLOCK_REALTIME)
    end_ns: np.ndarray  # int64
    kind: np.ndarray  # uint8, KIND_KERNEL / KIND_MEMCPY / KIND_MEMSET
    stream_id: np.ndarray  # int64
    device_id: np.ndarray  # int32
    size_bytes: np.ndarray  # int64, memcpy/memset bytes (0 for kernels)
    grid_x: np.ndarray  # int32 kernel grid dims (0 for memcpy/memset)
    grid_y: np.ndarray
    grid_z: np.ndarray
    block_x: np.ndarray  # int32 kernel block (thread) dims
    block_y: np.ndarray
    block_z: np.ndarray


@dataclass(frozen=True, kw_only=True)
class ExternalCorrelation(Columns):
    """CUPTI correlation id -> our external id, one entry per EXTERNAL_CORRELATION record."""

    correlation_id: np.ndarray  # uint64
    external_id: np.ndarray  # uint64


@dataclass(frozen=True, kw_only=True)
class Attribution:
    """Per (block, iteration) timing of one window, (num_blocks, num_iters); rows of blocks
    this rank does not run are zeros."""

    start_ns: np.ndarray  # earliest activity start
    end_ns: np.ndarray  # latest activity end
    activity_count: np.ndarray
    kernel_ctas_max: np.ndarray  # (num_blocks,) largest grid (CTAs, x*y*z); 0 without a kernel
    gate_end_ns: np.ndarray  # (num_iters,) end of the gate's spin kernel (gate open); 0 if none
    # int32 per input record (``per_activity``): its block and iteration, -1 for harness work.
    activity_block: np.ndarray | None = None
    activity_iteration: np.ndarray | None = None

    def timings(self, present: np.ndarray, activities: DeviceActivities | None) -> WindowTimings:
        """The window as every profiler returns it, on CUPTI's clock (CLOCK_REALTIME ns)."""
        return WindowTimings(
            starts_ns=self.start_ns,
            ends_ns=self.end_ns,
            present=present,
            clock="cupti",
            gate_open_ns=None if (self.gate_end_ns <= 0).any() else self.gate_end_ns,
            activity_counts=self.activity_count.sum(axis=1),
            kernel_ctas_max=self.kernel_ctas_max,
            activities=activities,
        )


def _lookup(act_corr: np.ndarray, ext: ExternalCorrelation) -> tuple[np.ndarray, np.ndarray]:
    """Join activities to external ids: (external id or _MISSING, ambiguous mask)."""
    ac = _as_int64(act_corr)
    ec = _as_int64(ext.correlation_id)
    ev = _as_int64(ext.external_id)
    n = ac.shape[0]
    if n == 0 or ec.shape[0] == 0:
        return np.full(n, _MISSING), np.zeros(n, bool)
    # CUPTI emits one record per API call in call order, so the table is normally strictly
    # increasing: then no correlation id can carry two external ids and the check is free.
    increasing = bool(np.all(ec[1:] > ec[:-1]))
    lo, hi = (int(ec[0]), int(ec[-1])) if increasing else (int(ec.min()), int(ec.max()))
    span = hi - lo + 1
    conflict = np.zeros(ec.shape[0], bool)  # table entries of an id with several external ids
    if span <= 2 * (ec.shape[0] + n) + _DENSE_SLACK:
        # Correlation ids are a per-process counter, so a window's ids are nearly dense:
        # a direct table is one scatter and one gather, no sort.
        table = np.full(span, _MISSING, dtype=np.int64)
        table[ec - lo] = ev
        if not increasing:
            conflict = table[ec - lo] != ev
        inside = (ac >= lo) & (ac <= hi)
        vals = table[np.where(inside, ac - lo, 0)]
        vals[~inside] = _MISSING
    else:
        if not increasing:
            order = np.argsort(ec, kind="stable")
            ec, ev = ec[order], ev[order]
            conflict[1:] = (ec[1:] == ec[:-1]) & (ev[1:] != ev[:-1])
        # Sorted queries keep searchsorted cache-friendly (random ones are far slower).
        qorder = np.argsort(ac)
        pos = np.empty(n, dtype=np.int64)
        pos[qorder] = np.searchsorted(ec, ac[qorder])
        pos = np.minimum(pos, ec.shape[0] - 1)
        vals = np.where(ec[pos] == ac, ev[pos], _MISSING)
    return vals, np.isin(ac, np.unique(ec[conflict]))


def _kind_summary(kind: np.ndarray) -> str:
    codes, counts = np.unique(kind, return_counts=True)
    pairs = zip(codes.tolist(), counts.tolist(), strict=True)
    return ", ".join(f"{KIND_NAMES.get(c, f'kind {c}')}: {k}" for c, k in pairs)


def _shown(values: np.ndarray) -> str:
    more = "" if values.shape[0] <= _SHOWN else f", ... ({values.shape[0]} in all)"
    return ", ".join(str(v) for v in values[:_SHOWN].tolist()) + more


class _Decoded:
    """Each record decoded from its external id, and what is wrong with it (strays are broken
    down on the error path only)."""

    def __init__(
        self,
        records: ActivityRecords,
        ext_correlation: ExternalCorrelation,
        window_id: int,
        present: np.ndarray,
        num_iters: int,
    ) -> None:
        num_blocks = present.shape[0]
        self.ext_id, self.ambiguous = _lookup(records.correlation_id, ext_correlation)
        self.this_window = (self.ext_id >> _WINDOW_SHIFT) == ((_TAG >> _WINDOW_SHIFT) | window_id)
        self.block = block = (self.ext_id >> _BLOCK_SHIFT) & HARNESS_BLOCK
        self.iteration = iteration = self.ext_id & (MAX_NUM_ITERS - 1)
        # Records of a block (not harness, not the gate) of this window, and of the gate's.
        self.mine = mine = self.this_window & (block < GATE_BLOCK)
        self.gate = gate = self.this_window & (block == GATE_BLOCK)
        self.out_of_range = (mine & ((block >= num_blocks) | (iteration >= num_iters))) | (
            gate & (iteration >= num_iters)
        )
        self.absent = np.zeros(len(records), dtype=bool)  # of a block this rank does not run
        if not present.all():
            self.absent = mine & ~self.out_of_range & ~present[np.minimum(block, num_blocks - 1)]
        start, end = _as_int64(records.start_ns), _as_int64(records.end_ns)
        # CUPTI writes 0 for a timestamp it never got (a record flushed before it completed).
        self.incomplete = (start <= 0) | (end < start)
        bad = self.out_of_range | self.ambiguous | self.incomplete | self.absent
        self.good = mine & ~bad


_PROBLEMS = {
    "no_external_id": "device activities have no external correlation id: enqueued outside "
    "every pushed block or harness range",
    "foreign_external_id": "activities carry an external id that is not maestro's",
    "other_window": "activities belong to other windows ({windows}), not window {window_id}: a "
    "flush was missing before this window began",
    "out_of_range": "activities map outside {num_blocks} blocks x {num_iters} iterations "
    "(blocks {blocks}; iterations {iters})",
    "absent_block": "activities belong to blocks this rank does not run (blocks {absent})",
    "ambiguous": "activities have a correlation id with several external ids",
    "incomplete": "activity records are incomplete (zero or reversed timestamps: flushed before "
    "the device finished?)",
    "empty_cells": "(block, iteration) got no activity: {cells}",
}
"""What keeps records (or cells) from being attributed: AttributionError's message counts each."""
_BY_RECORDS = ("no_external_id", "foreign_external_id", "ambiguous", "incomplete")


def _raise_problems(
    records: ActivityRecords, d: _Decoded, window_id: int, empty: np.ndarray
) -> None:
    found, ours, stray = d.ext_id != _MISSING, (d.ext_id >> 62) == 1, ~d.this_window
    masks = {
        "no_external_id": stray & ~found,
        "foreign_external_id": stray & found & ~ours,
        "other_window": stray & ours,
        "out_of_range": d.out_of_range,
        "absent_block": d.absent,
        "ambiguous": d.ambiguous,
        "incomplete": d.incomplete,
        "empty_cells": empty,
    }
    counts = {key: int(np.count_nonzero(mask)) for key, mask in masks.items() if mask.any()}
    if not counts:
        return
    window = (d.ext_id[masks["other_window"]] >> _WINDOW_SHIFT) & MAX_WINDOW_ID
    pairs = zip(*np.unique(window, return_counts=True), strict=True)
    per_block = empty.sum(axis=1)
    listed = "; ".join(
        f"block {b}: {per_block[b]} of {empty.shape[1]} iterations (first {np.argmax(empty[b])})"
        for b in np.flatnonzero(per_block)[:_SHOWN].tolist()
    )
    if np.count_nonzero(per_block) > _SHOWN:
        listed += f"; ... ({np.count_nonzero(per_block)} blocks in all)"
    details = {
        "windows": _shown(np.array([f"{w}: {c}" for w, c in pairs])),
        "window_id": window_id,
        "num_blocks": empty.shape[0],
        "num_iters": empty.shape[1],
        "blocks": _shown(np.unique(d.block[d.out_of_range])),
        "iters": _shown(np.unique(d.iteration[d.out_of_range])),
        "absent": _shown(np.unique(d.block[d.absent])),
        "cells": listed,
    }
    messages = []
    for key, num in counts.items():
        text, mask = _PROBLEMS[key].format(**details), masks[key]
        if key in _BY_RECORDS:
            streams = _shown(np.unique(records.stream_id[mask]))
            text += f" ({_kind_summary(records.kind[mask])}; streams {streams})"
        messages.append(f"{num} {text}")
    raise AttributionError(
        f"window {window_id}: cannot attribute device activity: " + "; ".join(messages)
    )


def attribute(
    records: ActivityRecords,
    ext_correlation: ExternalCorrelation,
    *,
    window_id: int,
    num_blocks: int,
    num_iters: int,
    present: np.ndarray | None = None,
    per_activity: bool = False,
) -> Attribution:
    """Each activity's (block, iteration) by correlation id (``per_activity``: kept per record,
    for traces); AttributionError for a record that maps to none, or a cell of a ``present``
    block (default: all) without activity."""
    encode_external_id(window_id, 0, 0)  # checks window_id
    if not 1 <= num_blocks <= MAX_NUM_BLOCKS:
        raise ValueError(f"num_blocks must be in [1, {MAX_NUM_BLOCKS}], got {num_blocks}")
    if not 1 <= num_iters <= MAX_NUM_ITERS:
        raise ValueError(f"num_iters must be in [1, {MAX_NUM_ITERS}], got {num_iters}")
    present = np.ones(num_blocks, dtype=bool) if present is None else np.asarray(present, bool)
    if present.shape != (num_blocks,):
        raise ValueError(f"present must have shape ({num_blocks},), got {present.shape}")
    d = _Decoded(records, ext_correlation, window_id, present, num_iters)
    # Everything not good goes to one extra row that is cut off at the end: cheaper than
    # extracting the good subset of every array.
    good = d.good
    row = np.where(good, d.block, num_blocks)
    flat = row * num_iters + np.where(good, d.iteration, 0)
    cells = num_blocks * num_iters
    activity_count = np.bincount(flat, minlength=cells + 1)[:cells].reshape(num_blocks, num_iters)
    _raise_problems(records, d, window_id, (activity_count == 0) & present[:, None])
    first = np.full(cells + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, flat, _as_int64(records.start_ns))
    last = np.zeros(cells + 1, dtype=np.int64)
    np.maximum.at(last, flat, _as_int64(records.end_ns))
    first[:cells][activity_count.reshape(-1) == 0] = 0  # rows of absent blocks
    gate_end = np.zeros(num_iters, dtype=np.int64)
    np.maximum.at(gate_end, d.iteration[d.gate], _as_int64(records.end_ns)[d.gate])
    ctas = np.zeros(num_blocks + 1, dtype=np.int64)
    grid = records.grid_x.astype(np.int64) * records.grid_y * records.grid_z
    np.maximum.at(ctas, np.where(records.kind == KIND_KERNEL, row, num_blocks), grid)
    return Attribution(
        start_ns=first[:cells].reshape(num_blocks, num_iters),
        end_ns=last[:cells].reshape(num_blocks, num_iters),
        activity_count=activity_count,
        kernel_ctas_max=ctas[:num_blocks],
        gate_end_ns=gate_end,
        activity_block=np.where(d.mine, d.block, -1).astype(np.int32) if per_activity else None,
        activity_iteration=(
            np.where(d.mine, d.iteration, -1).astype(np.int32) if per_activity else None
        ),
    )


# What a launch is called when CUPTI cannot name its callback id: generic names of the call
# that launches each kind of activity, in the style of the real ones (HolisticTraceAnalysis
# knows cudaLaunchKernel and cuLaunchKernel by name).
_GENERIC_API_NAMES = {
    (API_RUNTIME, KIND_KERNEL): "cudaLaunchKernel",
    (API_RUNTIME, KIND_MEMCPY): "cudaMemcpyAsync",
    (API_RUNTIME, KIND_MEMSET): "cudaMemsetAsync",
    (API_DRIVER, KIND_KERNEL): "cuLaunchKernel",
    (API_DRIVER, KIND_MEMCPY): "cuMemcpyAsync",
    (API_DRIVER, KIND_MEMSET): "cuMemsetAsync",
}


def window_activities(
    records: ActivityRecords,
    attribution: Attribution,
    *,
    name_index: np.ndarray,
    names: Sequence[str],
    api: ApiRecords,
    api_name: Callable[[int, int], str | None],
) -> DeviceActivities:
    """The block activities of ``attribute(..., per_activity=True)``, named
    (``names[name_index[i]]``), with one launching API call each (``api_name`` or generic)."""
    keep = np.flatnonzero(attribution.activity_block >= 0)
    corr = _as_int64(records.correlation_id)[keep]
    # One API call per kept correlation id: the earliest (a runtime call that calls the driver
    # starts first), the runtime one on a tie.
    api_corr = _as_int64(api.correlation_id)
    chosen = np.flatnonzero(np.isin(api_corr, corr))
    chosen = chosen[np.lexsort((api.api[chosen], api.start_ns[chosen], api_corr[chosen]))]
    chosen = chosen[np.unique(api_corr[chosen], return_index=True)[1]]  # each id's first
    # Names: the activities' own, then the calls' (one per API, callback and kind launched);
    # compacted to those used.
    corr_order = np.argsort(corr, kind="stable")
    at = np.searchsorted(corr[corr_order], api_corr[chosen])
    launched_kind = records.kind[keep][corr_order][np.minimum(at, corr.size - 1)]
    keys = np.stack([api.api[chosen], api.cbid[chosen], launched_kind], axis=1).astype(np.int64)
    distinct, inverse = np.unique(keys, axis=0, return_inverse=True)
    table = list(names)
    for code, cbid, kind_code in distinct.tolist():
        name = api_name(code, cbid) or _GENERIC_API_NAMES.get((code, kind_code), "cudaLaunch")
        table.append(name)
    call_names = len(table) - len(distinct) + inverse.reshape(-1)
    act_names = name_index[keep].astype(np.int64)
    used, inverse = np.unique(np.concatenate([act_names, call_names]), return_inverse=True)
    inverse = inverse.astype(np.int32)

    def dims(prefix: str) -> np.ndarray:
        cols = [getattr(records, f"{prefix}_{axis}")[keep] for axis in "xyz"]
        return np.stack(cols, axis=1).astype(np.int32).reshape(-1, 3)

    launches = LaunchCalls(
        correlation_id=api_corr[chosen],
        start_ns=_as_int64(api.start_ns)[chosen],
        end_ns=_as_int64(api.end_ns)[chosen],
        api=api.api[chosen].astype(np.uint8),
        cbid=api.cbid[chosen].astype(np.int32),
        thread_id=_as_int64(api.thread_id)[chosen],
        name_index=inverse[keep.size :],
    )
    return DeviceActivities(
        block=attribution.activity_block[keep],
        iteration=attribution.activity_iteration[keep],
        kind=records.kind[keep].astype(np.uint8),
        start_ns=_as_int64(records.start_ns)[keep],
        end_ns=_as_int64(records.end_ns)[keep],
        stream_id=_as_int64(records.stream_id)[keep],
        device_id=records.device_id[keep].astype(np.int32),
        correlation_id=corr,
        grid=dims("grid"),
        block_dims=dims("block"),
        size_bytes=records.size_bytes[keep].astype(np.int64),
        name_index=inverse[: keep.size],
        names=tuple(table[i] for i in used.tolist()),
        launches=launches,
    )
