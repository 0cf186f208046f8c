"""Unit tests for correlation-id attribution of device activities (no GPU, no CUPTI)."""

from __future__ import annotations

import enum
import re
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

from userbenchmark.maestro.core.profilers.attribution import (
    _PROBLEMS,
    GATE_BLOCK,
    HARNESS_BLOCK,
    KERNEL_DIMS,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    MAX_NUM_ITERS,
    MAX_WINDOW_ID,
    ActivityRecords,
    AttributionError,
    ExternalCorrelation,
    attribute,
    encode_external_id,
)

WINDOW = 7


def _records(**columns) -> ActivityRecords:
    """ActivityRecords with the columns a test leaves out as zeros (CUPTI's fills them all)."""
    n = len(columns["kind"])
    dtypes = {"device_id": np.int32, "size_bytes": np.int64} | dict.fromkeys(KERNEL_DIMS, np.int32)
    return ActivityRecords(**{name: np.zeros(n, dtype) for name, dtype in dtypes.items()} | columns)


def _synthetic(
    num_blocks: int,
    num_iters: int,
    per_cell: int = 2,
    *,
    num_harness: int = 3,
    seed: int = 0,
    corr_stride: int = 1,
    local_order: bool = False,
) -> tuple[ActivityRecords, ExternalCorrelation, np.ndarray, np.ndarray]:
    """Shuffled activities of one window plus a CUPTI-like external correlation table.

    Every activity gets its own API correlation id; the table also maps API calls that made
    no device activity (as RUNTIME/DRIVER records do), so it is twice as long. With
    local_order, the table is in call order and activities are shuffled only locally, as
    CUPTI delivers them; otherwise both are shuffled completely (the worst case).
    """
    rng = np.random.default_rng(seed)
    cells = num_blocks * num_iters
    n_cell = cells * per_cell
    n = n_cell + num_harness
    block = np.concatenate(
        [
            np.repeat(np.arange(num_blocks), num_iters * per_cell),
            np.full(num_harness, HARNESS_BLOCK),
        ]
    )
    iteration = np.concatenate(
        [
            np.tile(np.repeat(np.arange(num_iters), per_cell), num_blocks),
            np.arange(num_harness) % num_iters,
        ]
    )
    ext_ids = ((1 << 62) | (WINDOW << 40) | (block.astype(np.int64) << 24) | iteration).astype(
        np.uint64
    )
    # Activities' API calls take even correlation ids; odd ones are API calls with no activity.
    corr = (np.arange(n, dtype=np.uint64) * 2 + 2) * np.uint64(corr_stride)
    start = 1_700_000_000_000_000_000 + rng.integers(0, 10**9, n)
    end = start + rng.integers(1, 10**5, n)
    kind = rng.choice([KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET], n).astype(np.uint8)
    stream = rng.choice([7, 13, 14], n).astype(np.int64)
    gx = np.where(kind == KIND_KERNEL, rng.integers(1, 200, n), 0).astype(np.int32)
    ones = np.where(kind == KIND_KERNEL, 1, 0).astype(np.int32)
    if local_order:
        perm = np.argsort(np.arange(n) + rng.integers(0, 64, n), kind="stable")
    else:
        perm = rng.permutation(n)
    records = _records(
        correlation_id=corr[perm],
        start_ns=start[perm],
        end_ns=end[perm],
        kind=kind[perm],
        stream_id=stream[perm],
        grid_x=gx[perm],
        grid_y=ones[perm] * 2,
        grid_z=ones[perm],
    )
    ext_corr = np.stack([corr, corr + np.uint64(1)], axis=1).ravel()
    ext_val = np.stack([ext_ids, ext_ids], axis=1).ravel()
    eperm = np.arange(2 * n) if local_order else rng.permutation(2 * n)
    ext = ExternalCorrelation(correlation_id=ext_corr[eperm], external_id=ext_val[eperm])
    return records, ext, block[perm], iteration[perm]


def _reference(records, block, iteration, num_blocks, num_iters):
    """Per-record Python loop, the obvious way, to check the vectorised join against."""
    start = np.full((num_blocks, num_iters), np.iinfo(np.int64).max)
    end = np.zeros((num_blocks, num_iters), np.int64)
    count = np.zeros((num_blocks, num_iters), np.int64)
    ctas = np.zeros(num_blocks, np.int64)
    for i in range(len(records)):
        b, it = int(block[i]), int(iteration[i])
        if b == HARNESS_BLOCK:
            continue
        s, e = int(records.start_ns[i]), int(records.end_ns[i])
        start[b, it] = min(start[b, it], s)
        end[b, it] = max(end[b, it], e)
        count[b, it] += 1
        if records.kind[i] == KIND_KERNEL:
            grid = int(records.grid_x[i]) * int(records.grid_y[i]) * int(records.grid_z[i])
            ctas[b] = max(ctas[b], grid)
    return start, end, count, ctas


def test_encode_decode_round_trip_and_bounds():
    cases = [(0, 0, 0), (MAX_WINDOW_ID, HARNESS_BLOCK, MAX_NUM_ITERS - 1), (3, 17, 12345)]
    ids = np.array([encode_external_id(*c) for c in cases], dtype=np.uint64)
    assert all(0 < int(i) < 2**63 for i in ids)
    decoded = [
        (int(i) >> 40 & MAX_WINDOW_ID, int(i) >> 24 & HARNESS_BLOCK, int(i) & (MAX_NUM_ITERS - 1))
        for i in ids
    ]
    assert decoded == cases
    for bad in [
        (-1, 0, 0),
        (MAX_WINDOW_ID + 1, 0, 0),
        (0, HARNESS_BLOCK + 1, 0),
        (0, 0, MAX_NUM_ITERS),
    ]:
        with pytest.raises(ValueError):
            encode_external_id(*bad)


@pytest.mark.parametrize("corr_stride", [1, 1_000_003])  # dense table and sort-based join
def test_attribute_matches_reference(corr_stride):
    records, ext, block, iteration = _synthetic(4, 6, per_cell=3, corr_stride=corr_stride)
    before = {f: getattr(records, f).copy() for f in ("correlation_id", "start_ns", "kind")}
    ext_before = ext.external_id.copy()
    att = attribute(records, ext, window_id=WINDOW, num_blocks=4, num_iters=6)
    start, end, count, ctas = _reference(records, block, iteration, 4, 6)
    np.testing.assert_array_equal(att.start_ns, start)
    np.testing.assert_array_equal(att.end_ns, end)
    np.testing.assert_array_equal(att.activity_count, count)
    np.testing.assert_array_equal(att.end_ns - att.start_ns, end - start)
    np.testing.assert_array_equal(att.kernel_ctas_max, ctas)
    assert count.sum() == np.count_nonzero(block != HARNESS_BLOCK)  # the 3 harness left out
    for f, arr in before.items():  # inputs never mutated
        np.testing.assert_array_equal(getattr(records, f), arr)
    np.testing.assert_array_equal(ext.external_id, ext_before)


def _with_ext(ext: ExternalCorrelation, corr: int, ext_id: int) -> ExternalCorrelation:
    return ExternalCorrelation(
        correlation_id=np.append(ext.correlation_id, np.uint64(corr)),
        external_id=np.append(ext.external_id, np.uint64(ext_id)),
    )


def _with_activity(
    records: ActivityRecords,
    corr: int,
    kind: int = KIND_KERNEL,
    start: int = 10**18,
    end: int = 10**18 + 5,
) -> ActivityRecords:
    return _records(
        correlation_id=np.append(records.correlation_id, np.uint64(corr)),
        start_ns=np.append(records.start_ns, start),
        end_ns=np.append(records.end_ns, end),
        kind=np.append(records.kind, np.uint8(kind)),
        stream_id=np.append(records.stream_id, 99),
    )


def _error(records, ext, **kw) -> AttributionError:
    args = {"window_id": WINDOW, "num_blocks": 2, "num_iters": 3} | kw
    with pytest.raises(AttributionError) as info:
        attribute(records, ext, **args)
    return info.value


def _counts(err: AttributionError) -> dict[str, int]:
    """The problems the message counts, by _PROBLEMS' keys: the number before each one's wording
    (its text up to the first detail)."""
    found = {}
    for key, template in _PROBLEMS.items():
        wording = template.split("{")[0].split(":")[0].split(" (")[0]
        if match := re.search(rf"(\d+) {re.escape(wording)}", str(err)):
            found[key] = int(match.group(1))
    return found


def test_activity_without_external_id_is_an_error():
    records, ext, _, _ = _synthetic(2, 3)
    err = _error(_with_activity(records, 10**6, KIND_MEMCPY), ext)
    assert _counts(err) == {"no_external_id": 1}
    assert "memcpy: 1" in str(err) and "99" in str(err)


def test_warmup_activity_of_older_window_is_an_error():
    records, ext, _, _ = _synthetic(2, 3)
    ext = _with_ext(ext, 10**6, encode_external_id(WINDOW - 1, 0, 0))
    err = _error(_with_activity(records, 10**6), ext)
    assert _counts(err) == {"other_window": 1}
    assert "flush" in str(err)


def test_foreign_external_id_is_an_error():
    records, ext, _, _ = _synthetic(2, 3)
    ext = _with_ext(ext, 10**6, 42)
    assert _counts(_error(_with_activity(records, 10**6), ext)) == {"foreign_external_id": 1}


def test_block_or_iteration_out_of_range_is_an_error():
    records, ext, _, _ = _synthetic(2, 3)
    ext = _with_ext(ext, 10**6, encode_external_id(WINDOW, 2, 0))
    ext = _with_ext(ext, 10**6 + 2, encode_external_id(WINDOW, 0, 3))
    records = _with_activity(_with_activity(records, 10**6), 10**6 + 2)
    err = _error(records, ext)
    assert _counts(err) == {"out_of_range": 2}


def test_missing_iteration_is_an_error_naming_the_block():
    records, ext, _, _ = _synthetic(2, 3)
    err = _error(records, ext, num_blocks=3)
    assert _counts(err) == {"empty_cells": 3}
    assert "block 2: 3 of 3 iterations" in str(err)
    err = _error(records, ext, num_iters=5)
    assert _counts(err) == {"empty_cells": 4}


def test_ambiguous_and_incomplete_records_are_errors():
    records, ext, _, _ = _synthetic(2, 3)
    corr = int(records.correlation_id[0])
    err = _error(records, _with_ext(ext, corr, encode_external_id(WINDOW, 1, 2)))
    assert _counts(err)["ambiguous"] == 1
    bad = _with_activity(records, corr, start=0, end=0)
    assert _counts(_error(bad, ext)) == {"incomplete": 1}


def _no_records() -> tuple[ActivityRecords, ExternalCorrelation]:
    ids = np.zeros(0, np.uint64)
    none = np.zeros(0, np.int64)
    records = _records(
        correlation_id=ids, start_ns=none, end_ns=none, kind=np.zeros(0, np.uint8), stream_id=none
    )
    return records, ExternalCorrelation(correlation_id=ids, external_id=ids)


def test_harness_only_window_reports_every_block_empty():
    ext = ExternalCorrelation(
        correlation_id=np.array([5], np.uint64),
        external_id=np.array([encode_external_id(WINDOW, HARNESS_BLOCK, 0)], np.uint64),
    )
    records = _with_activity(_no_records()[0], 5)
    err = _error(records, ext, num_blocks=1, num_iters=1)
    assert _counts(err) == {"empty_cells": 1}
    assert _counts(_error(*_no_records(), num_blocks=1, num_iters=1)) == {"empty_cells": 1}


def test_gate_end_per_iteration_and_absent_blocks():
    records, ext, _, _ = _synthetic(2, 3)
    for it in range(3):
        corr = 10**6 + 2 * it
        ext = _with_ext(ext, corr, encode_external_id(WINDOW, GATE_BLOCK, it))
        records = _with_activity(records, corr, start=10**18 + it, end=10**18 + 100 + it)
    att = attribute(
        records,
        ext,
        window_id=WINDOW,
        num_blocks=3,
        num_iters=3,
        present=np.array([True, True, False]),
    )
    np.testing.assert_array_equal(att.gate_end_ns, 10**18 + 100 + np.arange(3))
    assert (att.start_ns[2] == 0).all() and (att.end_ns[2] == 0).all()
    assert (att.activity_count[:2] > 0).all() and att.kernel_ctas_max[2] == 0
    err = _error(records, ext, present=np.array([True, False]))
    assert _counts(err) == {"absent_block": int(att.activity_count[1].sum())}


def test_large_grid_values_use_the_sorted_path():
    records, ext, block, iteration = _synthetic(2, 3)
    big = _records(
        correlation_id=records.correlation_id,
        start_ns=records.start_ns,
        end_ns=records.end_ns,
        kind=np.full(len(records), KIND_KERNEL, np.uint8),
        stream_id=records.stream_id,
        grid_x=np.full(len(records), 2**30, np.int32),
        grid_y=np.full(len(records), 4, np.int32),
        grid_z=np.ones(len(records), np.int32),
    )
    att = attribute(big, ext, window_id=WINDOW, num_blocks=2, num_iters=3)
    assert att.kernel_ctas_max.tolist() == [2**32, 2**32]


def test_invalid_arguments():
    records, ext, _, _ = _synthetic(2, 3)
    with pytest.raises(ValueError):
        attribute(records, ext, window_id=WINDOW, num_blocks=0, num_iters=3)
    with pytest.raises(ValueError):
        _records(
            correlation_id=np.zeros(2, np.uint64),
            start_ns=np.zeros(1, np.int64),
            end_ns=np.zeros(2, np.int64),
            kind=np.ones(2, np.uint8),
            stream_id=np.zeros(2, np.int64),
        )


def test_one_million_records_vectorised():
    # A per-record Python loop would take tens of seconds here; the join takes well under one.
    records, ext, _, _ = _synthetic(10, 50_000, per_cell=2, num_harness=1000, seed=1)
    att = attribute(records, ext, window_id=WINDOW, num_blocks=10, num_iters=50_000)
    assert int(att.activity_count.sum()) == 1_000_000


# -- the CUPTI backend's window logic against a fake cupti module (no GPU) -------------------


def _record_dtype(fields: list[tuple[str, str]]) -> np.dtype:
    return np.dtype([("kind", "<u4"), *fields], align=True)


class _FakeCupti:
    """Just enough of cupti-python's activity API: flush lays the records out in one buffer
    and hands over objects that expose each field and the record's address (``ptr``)."""

    activity_kernel10_dtype = _record_dtype(
        [
            ("correlation_id", "<u4"),
            ("start", "<u8"),
            ("end", "<u8"),
            ("stream_id", "<u4"),
            ("device_id", "<u4"),
            ("grid_x", "<i4"),
            ("grid_y", "<i4"),
            ("grid_z", "<i4"),
            ("block_x", "<i4"),
            ("block_y", "<i4"),
            ("block_z", "<i4"),
            ("name", "<u8"),
        ]
    )
    activity_memcpy6_dtype = _record_dtype(
        [
            ("copy_kind", "<u1"),
            ("src_kind", "<u1"),
            ("dst_kind", "<u1"),
            ("bytes", "<u8"),
            ("start", "<u8"),
            ("end", "<u8"),
            ("device_id", "<u4"),
            ("stream_id", "<u4"),
            ("correlation_id", "<u4"),
        ]
    )
    activity_memset4_dtype = _record_dtype(
        [
            ("value", "<u4"),
            ("bytes", "<u8"),
            ("start", "<u8"),
            ("end", "<u8"),
            ("device_id", "<u4"),
            ("stream_id", "<u4"),
            ("correlation_id", "<u4"),
            ("memory_kind", "<u2"),
        ]
    )
    activity_external_correlation_dtype = _record_dtype(
        [
            ("external_kind", "<u4"),
            ("external_id", "<u8"),
            ("correlation_id", "<u4"),
        ]
    )
    activity_api_dtype = _record_dtype(
        [
            ("cbid", "<u4"),
            ("start", "<u8"),
            ("end", "<u8"),
            ("process_id", "<u4"),
            ("thread_id", "<u4"),
            ("correlation_id", "<u4"),
        ]
    )
    CallbackDomain = enum.IntEnum("CallbackDomain", {"DRIVER_API": 1, "RUNTIME_API": 2})

    ActivityKind = enum.IntEnum(
        "ActivityKind",
        {
            "MEMCPY": 1,
            "MEMSET": 2,
            "DRIVER": 4,
            "RUNTIME": 5,
            "CONCURRENT_KERNEL": 10,
            "EXTERNAL_CORRELATION": 39,
        },
    )
    ExternalCorrelationKind = enum.IntEnum(
        "ExternalCorrelationKind",
        {
            "CUSTOM0": 3,
            "CUSTOM1": 4,
            "CUSTOM2": 5,
        },
    )
    ActivityFlag = enum.IntEnum("ActivityFlag", {"FLUSH_FORCED": 1})

    def __init__(self):
        self.enabled, self.stack, self.pending, self.calls = set(), [], [], []
        self.next_corr, self.clock = 1, 10**18

    def activity_register_callbacks(self, requested, completed):
        assert requested()[0] > 0
        self.completed = completed

    def activity_enable(self, kind):
        self.enabled.add(kind)

    def activity_disable(self, kind):
        self.enabled.discard(kind)

    def activity_flush_all(self, flag):
        self.calls.append(("flush", flag))
        batch, self.pending = self.pending, []
        dtypes = [self._dtype(r.kind) for r in batch]
        offsets = np.cumsum([0] + [d.itemsize for d in dtypes])
        buffer = np.zeros(int(offsets[-1]) + 8, dtype=np.uint8)
        for record, dtype, offset in zip(batch, dtypes, offsets, strict=False):
            view = buffer[offset : offset + dtype.itemsize].view(dtype)
            for field in dtype.names:
                # A kernel's name is a pointer in CUPTI's buffer, read through the object.
                view[field] = 0 if field == "name" else getattr(record, field, 0)
            record.ptr = buffer.ctypes.data + int(offset)
        self.completed(batch)

    def _dtype(self, kind):
        kinds = self.ActivityKind
        return {
            kinds.CONCURRENT_KERNEL: self.activity_kernel10_dtype,
            kinds.MEMCPY: self.activity_memcpy6_dtype,
            kinds.MEMSET: self.activity_memset4_dtype,
            kinds.EXTERNAL_CORRELATION: self.activity_external_correlation_dtype,
        }.get(kind, self.activity_api_dtype)

    def finalize(self):
        self.calls.append(("finalize",))

    def get_callback_name(self, domain, cbid):
        names = {
            (self.CallbackDomain.RUNTIME_API, 1): "cudaLaunchKernel_v7000",
            (self.CallbackDomain.DRIVER_API, 2): "cuLaunchKernelEx",
        }
        if (domain, cbid) not in names:
            raise ValueError(f"unknown callback {cbid}")
        return names[(domain, cbid)]

    def activity_push_external_correlation_id(self, kind, ext_id):
        self.stack.append((kind, ext_id))

    def activity_pop_external_correlation_id(self, kind):
        return self.stack.pop()[1]

    def launch(self, kind_name, grid=(1, 1, 1), name="fake_kernel(float*)", api="RUNTIME"):
        """One API call that enqueues one device activity, as CUPTI reports it (a runtime
        call has cbid 1, a driver call cbid 2)."""
        corr, self.next_corr = self.next_corr, self.next_corr + 1
        kinds = self.ActivityKind
        for ext_kind, ext_id in self.stack[-1:]:
            self.pending.append(
                SimpleNamespace(
                    kind=kinds.EXTERNAL_CORRELATION,
                    external_kind=ext_kind,
                    external_id=ext_id,
                    correlation_id=corr,
                )
            )
        self.pending.append(
            SimpleNamespace(
                kind=kinds[api],
                correlation_id=corr,
                cbid=1 if api == "RUNTIME" else 2,
                start=self.clock + 10,
                end=self.clock + 20,
                process_id=77,
                thread_id=88,
            )
        )
        self.clock += 1000
        self.pending.append(
            SimpleNamespace(
                kind=kinds[kind_name],
                correlation_id=corr,
                start=self.clock,
                end=self.clock + 500,
                stream_id=7,
                device_id=0,
                bytes=64,
                grid_x=grid[0],
                grid_y=grid[1],
                grid_z=grid[2],
                block_x=128,
                block_y=1,
                block_z=1,
                name=name,
                copy_kind=8,
                src_kind=3,
                dst_kind=3,
                memory_kind=3,
            )
        )


@pytest.fixture
def fake_cupti(monkeypatch):
    import torch

    from userbenchmark.maestro.core.profilers import cupti as backend

    fake = _FakeCupti()
    package = types.ModuleType("cupti")
    package.cupti = fake
    monkeypatch.setitem(sys.modules, "cupti", package)
    monkeypatch.setattr(backend, "cupti_available", lambda: (True, "fake"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    return fake, backend


def _profiler(backend, parse: str, **kw):
    """A CuptiProfiler whose parser reads as ``parse`` says from the first buffer on (what
    ``auto`` settles on, after checking the first buffers)."""
    prof = backend.CuptiProfiler(**kw)
    if parse != "auto":
        prof._parser.mode, prof._parser._to_verify = parse, 0
    return prof


@pytest.mark.parametrize("parse", ["auto", "objects", "numpy"])
def test_cupti_profiler_discards_warmup_and_attributes_a_window(fake_cupti, parse):
    fake, backend = fake_cupti
    prof = _profiler(backend, parse)
    prof.start()
    assert len(fake.enabled) == 6
    prof.begin_window(0, 1, 4)
    for it in range(4):  # warmup: never reaches the numbers
        prof.push(0, it)
        fake.launch("CONCURRENT_KERNEL")
        prof.pop()
    fake.launch("MEMSET")  # unpushed, before the window: discarded too (else an error)
    prof.begin_window(1, num_blocks=2, num_iters=3)
    for it in range(3):
        if it == 2:
            fake.activity_flush_all(0)  # a buffer CUPTI delivers mid-window still counts
        prof.push_gate(it)
        fake.launch("CONCURRENT_KERNEL")
        prof.pop()
        prof.push(0, it)
        fake.launch("CONCURRENT_KERNEL", grid=(8, 2, 1))
        prof.pop()
        prof.push(1, it)
        fake.launch("MEMCPY")
        prof.pop()
    prof.push_harness()
    fake.launch("CONCURRENT_KERNEL")
    prof.pop()
    att = prof.attribute_window()
    np.testing.assert_array_equal(att.activity_count, np.ones((2, 3)))
    assert att.kernel_ctas_max.tolist() == [16, 0]
    assert (att.gate_end_ns > 0).all()
    assert (att.start_ns[0] > att.gate_end_ns).all()
    assert prof._parser.mode == ("objects" if parse == "objects" else "numpy")
    with pytest.raises(RuntimeError, match="begin_window"):
        prof.push(0, 0)
    prof.close()
    prof.close()
    assert ("finalize",) in fake.calls and not fake.enabled


def test_cupti_profiler_reports_unpushed_work_and_cleans_up_after_errors(fake_cupti):
    fake, backend = fake_cupti
    prof = backend.CuptiProfiler()
    prof.start()
    prof.begin_window(3, 1, 1)
    prof.push(0, 0)
    fake.launch("CONCURRENT_KERNEL")
    prof.pop()
    fake.launch("MEMCPY")  # enqueued outside every block
    with pytest.raises(AttributionError) as info:
        prof.attribute_window()
    assert _counts(info.value) == {"no_external_id": 1}
    prof.begin_window(4, 1, 1)
    prof.push(0, 0)  # an exception here would leave the id pushed: stop() pops it
    prof.close()
    assert fake.stack == [] and not fake.enabled


def test_cupti_record_parser_falls_back_when_records_differ(fake_cupti, caplog):
    fake, backend = fake_cupti
    parser = backend._RecordParser(fake)
    for _ in range(3):
        fake.launch("CONCURRENT_KERNEL")
    batch, fake.pending = fake.pending, []
    fake.completed = lambda b: None
    fake.pending = batch
    fake.activity_flush_all(1)  # lays out the buffer and sets each record's ptr
    batch[-1].start += 1  # the object says something the buffer does not
    rows = parser.parse(batch)
    assert parser.mode == "objects" and "differ" in caplog.text
    # Under maestro's logger: the line gets the rank prefix and follows --log-level.
    assert {r.name for r in caplog.records} == {"maestro.cupti"}
    assert rows["kernel"][-1, 1] == batch[-1].start


def test_cupti_profiler_surfaces_callback_errors(fake_cupti):
    fake, backend = fake_cupti
    prof = backend.CuptiProfiler()
    prof.start()
    prof.begin_window(0, 1, 1)
    fake.pending.append(SimpleNamespace(kind=fake.ActivityKind.CONCURRENT_KERNEL))  # no fields
    with pytest.raises(RuntimeError, match="parsing CUPTI records failed"):
        prof.attribute_window()
    prof.close()


def test_window_buffer_holds_the_whole_window(fake_cupti):
    # Records are delivered once, after the window: its buffer is sized for every launch.
    fake, backend = fake_cupti
    prof = backend.CuptiProfiler()
    prof.start()
    prof.begin_window(1, num_blocks=8, num_iters=2_500)
    assert prof._buffer_requested()[0] == 20_000 * backend.BYTES_PER_LAUNCH
    prof.begin_window(2, num_blocks=1, num_iters=5)  # the next window: sized again
    assert prof._buffer_requested()[0] == backend.BUFFER_SIZE_BYTES  # at least the smallest
    prof.begin_window(3, num_blocks=1_000, num_iters=10_000)
    assert prof._buffer_requested()[0] == backend.MAX_BUFFER_SIZE_BYTES  # at most the largest
    prof.close()


class _NameNotRead(SimpleNamespace):
    """A kernel record whose name must not be read (the fast path without a trace)."""

    @property
    def name(self):
        raise AssertionError("kernel name read without --trace")


@pytest.mark.parametrize("parse", ["auto", "objects", "numpy"])
def test_cupti_profiler_keeps_named_activities_and_their_launches(fake_cupti, parse):
    fake, backend = fake_cupti
    prof = _profiler(backend, parse, trace=True)
    prof.start()
    prof.begin_window(2, num_blocks=3, num_iters=2)
    for it in range(2):
        if it == 1:
            fake.activity_flush_all(0)  # two buffers: "auto" checks numpy against objects
        prof.push_gate(it)
        fake.launch("CONCURRENT_KERNEL", name="spin_kernel(long)")
        prof.pop()
        prof.push(0, it)
        fake.launch("CONCURRENT_KERNEL", name="ncclDevKernel_AllGather_RING_LL(x)", api="DRIVER")
        prof.pop()
        prof.push(1, it)
        fake.launch("MEMCPY")
        prof.pop()
        prof.push(2, it)
        fake.launch("CONCURRENT_KERNEL", grid=(4, 2, 1), name="gemm_kernel")
        fake.launch("MEMSET")
        prof.pop()
    att = prof.attribute_window()
    acts = prof.last_activities
    assert prof._parser.mode == ("objects" if parse == "objects" else "numpy")
    assert len(acts) == int(att.activity_count.sum()) == 8  # the gate's kernels are left out
    named = sorted({acts.names[i] for i in acts.name_index.tolist()})
    assert named == [
        "Memcpy DtoD (Device -> Device)",
        "Memset (Device)",
        "gemm_kernel",
        "ncclDevKernel_AllGather_RING_LL(x)",
    ]
    for b, it, i in zip(
        acts.block.tolist(), acts.iteration.tolist(), range(len(acts)), strict=True
    ):
        assert att.start_ns[b, it] <= acts.start_ns[i] and acts.end_ns[i] <= att.end_ns[b, it]
    assert acts.grid[acts.block == 2].tolist().count([4, 2, 1]) == 2
    assert set(acts.block_dims[acts.kind == KIND_KERNEL][:, 0].tolist()) == {128}
    assert sorted(acts.size_bytes.tolist()) == [0] * 4 + [64] * 4  # copies and sets: 64 B
    calls = acts.launches
    assert sorted(calls.correlation_id.tolist()) == sorted(set(acts.correlation_id.tolist()))
    call_names = {acts.names[i] for i in calls.name_index.tolist()}
    assert call_names == {"cudaLaunchKernel", "cuLaunchKernelEx"}  # version suffix dropped
    assert set(calls.thread_id.tolist()) == {88}
    prof.close()


def test_cupti_profiler_without_a_trace_reads_no_names(fake_cupti):
    fake, backend = fake_cupti
    prof = _profiler(backend, "objects")
    prof.start()
    prof.begin_window(1, num_blocks=1, num_iters=1)
    prof.push(0, 0)
    fake.launch("CONCURRENT_KERNEL")
    prof.pop()
    record = fake.pending[-1]
    fake.pending[-1] = _NameNotRead(**{k: v for k, v in vars(record).items() if k != "name"})
    att = prof.attribute_window()
    assert int(att.activity_count.sum()) == 1 and prof.last_activities is None
    assert att.activity_block is None  # per-activity arrays only when asked for
    prof.close()


def test_per_activity_attribution_marks_harness_work():
    records, ext, block, iteration = _synthetic(3, 4, per_cell=2, num_harness=5, seed=3)
    att = attribute(records, ext, window_id=WINDOW, num_blocks=3, num_iters=4, per_activity=True)
    harness = block == HARNESS_BLOCK
    np.testing.assert_array_equal(att.activity_block, np.where(harness, -1, block))
    np.testing.assert_array_equal(att.activity_iteration, np.where(harness, -1, iteration))
    assert att.activity_block.dtype == np.int32


def test_cupti_records_only_the_api_calls_that_enqueue_device_work(fake_cupti, monkeypatch):
    import importlib.metadata

    fake, backend = fake_cupti
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "13.0.1")
    runtime = enum.IntEnum(
        "runtime_api_trace_cbid",
        {"INVALID": 0, "cudaLaunchKernel_v7000": 1, "cudaEventQuery_v3020": 2, "SIZE": 3}
        | {"cudaMemcpyAsync_v3020": 4, "cudaGraphLaunch_v10000": 5, "cudaGetDevice_v3020": 6},
    )
    driver = enum.IntEnum(
        "driver_api_trace_cbid",
        {"INVALID": 0, "cuLaunchKernelEx": 1, "cuEventQuery": 2, "cuMemsetD8Async": 3},
    )
    chosen = {}
    fake.runtime_api_trace_cbid, fake.driver_api_trace_cbid = runtime, driver
    fake.activity_enable_runtime_api = lambda cbid, on: chosen.update({runtime(cbid).name: on})
    fake.activity_enable_driver_api = lambda cbid, on: chosen.update({driver(cbid).name: on})
    prof = backend.CuptiProfiler()
    prof.start()
    assert prof.api_records == "launches"
    assert chosen == {
        "cudaLaunchKernel_v7000": 1,
        "cudaEventQuery_v3020": 0,
        "cudaMemcpyAsync_v3020": 1,
        "cudaGraphLaunch_v10000": 1,
        "cudaGetDevice_v3020": 0,
        "cuLaunchKernelEx": 1,
        "cuEventQuery": 0,
        "cuMemsetD8Async": 1,
    }
    assert "cupti_records_per_iteration" not in prof.run_info()
    prof.begin_window(1, num_blocks=1, num_iters=4)
    for it in range(4):
        prof.push(0, it)
        fake.launch("CONCURRENT_KERNEL")  # an ext, an API and a kernel record
        prof.pop()
    prof.attribute_window()
    assert prof.run_info()["cupti_records_per_iteration"] == "3.0"
    prof.close()


def test_cupti_without_per_function_choice_records_every_api_call(fake_cupti):
    fake, backend = fake_cupti
    prof = backend.CuptiProfiler()
    prof.start()
    assert prof.api_records.startswith("all (this cupti-python has no activity_enable_runtime_api")
    prof.close()


def test_the_registered_cupti_profiler_times_a_window_and_says_its_version(fake_cupti, monkeypatch):
    """The profiler a run gets for ``--profiler cupti``: the lanes' hooks push and pop the ids,
    the window comes back as every profiler's WindowTimings (the CTAs, the gate, the counts)."""
    import importlib.metadata

    from userbenchmark.maestro.core.profilers.profiler_registry import make_profiler

    fake, backend = fake_cupti
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "13.0.1")
    prof = make_profiler("cupti", on_cuda=True, backend="nccl")
    assert prof.name == "cupti" and len(fake.enabled) == 6  # started
    prof.begin_window(1, 2, 3, np.array([True, True]))
    for it in range(3):
        prof.gate_begin(it)
        fake.launch("CONCURRENT_KERNEL")
        prof.gate_end(it)
        prof.before(0, it)
        fake.launch("CONCURRENT_KERNEL", grid=(8, 2, 1))
        prof.after(0, it)
        prof.before(1, it)
        fake.launch("MEMCPY")
        prof.after(1, it)
    timings = prof.end_window()
    assert timings.clock == "cupti" and timings.host_clock
    assert timings.kernel_ctas_max.tolist() == [16, 0]
    assert timings.activity_counts.tolist() == [3, 3]
    assert (timings.starts_ns[0] > timings.gate_open_ns).all()
    assert prof.run_info()["cupti_python_version"] == "13.0.1"
    prof.close()
    assert not fake.enabled
