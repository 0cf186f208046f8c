"""GPU smoke test of the CUPTI profiler: warmup discard, gated streams, NCCL copy, join rate.

Run on a CUDA machine with cupti-python installed: ``python -m tests.gpu.probe_cupti``.
Exits non-zero if a check fails; prints the numbers it measured.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

from userbenchmark.maestro.core.profilers.attribution import (
    HARNESS_BLOCK,
    KERNEL_DIMS,
    KIND_KERNEL,
    KIND_MEMCPY,
    ActivityRecords,
    AttributionError,
    ExternalCorrelation,
    attribute,
)
from userbenchmark.maestro.core.profilers.cupti import CuptiProfiler, cupti_available

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("  ok   " if ok else "  FAIL ") + what)
    if not ok:
        failures.append(what)


def us(ns: np.ndarray | float) -> str:
    arr = np.asarray(ns, dtype=np.float64) / 1e3
    if arr.size == 1:
        return f"{float(arr):.2f} us"
    return (
        f"mean {arr.mean():.2f} min {arr.min():.2f} p50 {np.median(arr):.2f} max {arr.max():.2f} us"
    )


def warmup_discard(prof: CuptiProfiler, torch) -> None:
    """10 warmup matmuls in window 0, then 20 measured ones in window 1: exactly 20 counted
    (a warmup record left over would be an AttributionError: another window's)."""
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    prof.begin_window(0, 1, 10)
    for it in range(10):
        prof.push(0, it)
        torch.mm(a, b)
        prof.pop()
    torch.cuda.synchronize()
    t_begin = time.time_ns()
    prof.begin_window(1, 1, 20)
    for it in range(20):
        prof.push(0, it)
        torch.mm(a, b)
        prof.pop()
    t0 = time.perf_counter_ns()
    att = prof.attribute_window()
    t_end = time.time_ns()
    print(f"  end_window (sync+flush+join) took {us(time.perf_counter_ns() - t0)}")
    acts = prof.last_activities
    print(f"  per-iteration activity count {att.activity_count[0].tolist()}")
    print(
        f"  kernel duration: {us((att.end_ns - att.start_ns)[0])}; largest grid {att.kernel_ctas_max[0]}"
    )
    check(
        len(acts) == 20 and bool((acts.kind == KIND_KERNEL).all()),
        "exactly 20 kernels in the measured window",
    )
    check(
        bool((att.start_ns >= t_begin).all() and (att.end_ns <= t_end).all()),
        "timestamps lie within time.time_ns() of begin/end (CLOCK_REALTIME)",
    )
    print(
        f"  first kernel started {us(att.start_ns.min() - t_begin)} after begin_window's "
        f"time.time_ns(); last ended {us(t_end - att.end_ns.max())} before end_window's"
    )


def gated_streams(prof: CuptiProfiler, torch, iters: int = 20) -> None:
    """Two matmuls on two streams released by one gate: start skew and gate-to-start delay."""
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    gate_stream, s0, s1 = (torch.cuda.Stream() for _ in range(3))
    for s in (s0, s1):  # warm each stream's cuBLAS handle outside the window
        with torch.cuda.stream(s):
            torch.mm(a, b)
    torch.cuda.synchronize()
    prof.begin_window(2, 2, iters)
    for it in range(iters):
        gate = torch.cuda.Event()
        with torch.cuda.stream(gate_stream):
            prof.push_gate(it)
            torch.cuda._sleep(400_000)  # ~220 us once clocks are up: outlasts the enqueue
            prof.pop()
            gate.record(gate_stream)
        for block, s in enumerate((s0, s1)):
            s.wait_event(gate)
            with torch.cuda.stream(s):
                prof.push(block, it)
                torch.mm(a, b)
                prof.pop()
        torch.cuda.synchronize()
    att = prof.attribute_window()
    skew = np.abs(att.start_ns[0] - att.start_ns[1])
    delay = att.start_ns.min(axis=0) - att.gate_end_ns
    print(f"  start skew |block0 - block1|: {us(skew)}")
    print(f"  gate open -> first lane start: {us(delay)}")
    print(
        f"  durations block0 {us((att.end_ns - att.start_ns)[0])}; block1 {us((att.end_ns - att.start_ns)[1])}"
    )
    check(bool((att.gate_end_ns > 0).all()), "gate end seen for every iteration")
    check(float(np.median(skew)) < 20_000, "median start skew below 20 us")


def nccl_all_gather(prof: CuptiProfiler, torch) -> None:
    """World-size-1 NCCL all_gather out of place: its memcpy lands in its block."""
    import torch.distributed as dist

    store_path = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group(
        "nccl",
        init_method=f"file://{store_path}",
        rank=0,
        world_size=1,
        device_id=torch.device("cuda", 0),
    )
    try:
        inp = torch.randn(1 << 20, device="cuda")
        out = torch.empty(1 << 20, device="cuda")
        prof.begin_window(3, 2, 3)
        for it in range(3):  # communicator setup and warmup, discarded
            prof.push(0, it)
            dist.all_gather_into_tensor(out, inp)
            prof.pop()
            prof.push(1, it)
            dist.all_gather_into_tensor(out, inp, async_op=True).wait()
            prof.pop()
        torch.cuda.synchronize()
        prof.begin_window(4, 2, 5)
        for it in range(5):
            prof.push(0, it)
            dist.all_gather_into_tensor(out, inp)
            prof.pop()
            prof.push(1, it)
            dist.all_gather_into_tensor(out, inp, async_op=True).wait()
            prof.pop()
        att = prof.attribute_window()
        acts = prof.last_activities
        for b, label in enumerate(("async_op=False", "async_op=True ")):
            mine = acts.block == b
            print(
                f"  block{b} ({label}): memcpy {int((acts.kind[mine] == KIND_MEMCPY).sum())}, "
                f"kernel {int((acts.kind[mine] == KIND_KERNEL).sum())}, streams "
                f"{sorted(set(acts.stream_id[mine].tolist()))}, {us((att.end_ns - att.start_ns)[b])}"
            )
        copies = acts.size_bytes[acts.kind != KIND_KERNEL]
        print(f"  memcpy sizes {sorted(set(copies.tolist()))} bytes")
        check(bool((att.activity_count > 0).all()), "every all_gather iteration attributed")
        check(int((acts.kind == KIND_MEMCPY).sum()) >= 10, "all_gather copies are memcpy records")
        # In-place all_reduce on one rank enqueues nothing: must be an error, not a zero.
        buf = torch.ones(1024, device="cuda")
        dist.all_reduce(buf)
        prof.begin_window(5, 1, 1)
        prof.push(0, 0)
        dist.all_reduce(buf)
        prof.pop()
        try:
            prof.attribute_window()
            check(False, "1-rank in-place all_reduce reported as an error")
        except AttributionError as exc:
            print(f"  1-rank in-place all_reduce -> AttributionError: {exc}")
            check("got no activity" in str(exc), "empty (block, iteration) is an error")
    finally:
        torch.cuda.synchronize()
        dist.destroy_process_group()


def host_costs(prof: CuptiProfiler, torch) -> None:
    """Host cost of a push+pop pair (the callback's cost per record: "record parsing costs")."""
    n = 20_000
    prof.begin_window(6, 1, n)
    t0 = time.perf_counter_ns()
    for it in range(n):
        prof.push(0, it)
        prof.pop()
    print(f"  push+pop pair: {us((time.perf_counter_ns() - t0) / n)}")
    prof.begin_window(7, 1, 1)


def counted_callbacks(prof: CuptiProfiler) -> list[tuple[int, int]]:
    """(thread, wall ns) of each buffer ``prof`` parses from now on (before ``start``)."""
    calls: list[tuple[int, int]] = []
    original = prof._buffer_completed

    def counted(activities: list) -> None:
        t0 = time.perf_counter_ns()
        original(activities)
        calls.append((threading.get_ident(), time.perf_counter_ns() - t0))

    prof._buffer_completed = counted
    return calls


def small_buffers(prof_unused: CuptiProfiler, torch) -> None:
    """A window spanning many small buffers: all attributed; where were they parsed?"""
    from userbenchmark.maestro.core.profilers import cupti as backend

    prof_unused.close()
    prof = CuptiProfiler()
    calls = counted_callbacks(prof)
    prof.start()
    try:
        a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
        iters = 2000
        largest, backend.MAX_BUFFER_SIZE_BYTES = backend.MAX_BUFFER_SIZE_BYTES, 256 << 10
        try:
            prof.begin_window(10, 1, iters)  # buffers capped at 256 KiB: it spans many
        finally:
            backend.MAX_BUFFER_SIZE_BYTES = largest
        t0 = time.perf_counter_ns()
        for it in range(iters):
            prof.push(0, it)
            torch.mm(a, a)
            prof.pop()
        enqueue = time.perf_counter_ns() - t0
        cb_before = sum(ns for _, ns in calls)
        att = prof.attribute_window()
        other = sum(thread != threading.get_ident() for thread, _ in calls)
        print(
            f"  {iters} matmuls enqueued in {enqueue / 1e6:.1f} ms; {len(calls)} buffers, "
            f"{other} delivered on another thread; callback wall during the enqueue "
            f"{cb_before / 1e6:.1f} ms; parse mode {prof._parser.mode}"
        )
        check(int(att.activity_count.sum()) == iters, f"{iters} kernels over many buffers")
    finally:
        prof.close()


def parse_costs(torch) -> None:
    """Per-record cost of reading CUPTI's record objects, both parsers on the same buffers."""
    from userbenchmark.maestro.core.profilers import cupti as backend

    prof = CuptiProfiler()
    prof._parser.mode = "objects"  # the profiler's own reading stays out of the way
    kept: list[list] = []
    original = prof._buffer_completed

    def keep(activities: list) -> None:
        kept.append(activities)  # holding the objects keeps their buffer alive
        original(activities)

    prof._buffer_completed = keep
    prof.start()
    try:
        a = torch.randn(1024, 1024, device="cuda")
        b = torch.empty_like(a)
        prof.begin_window(8, 1, 300)
        for it in range(300):
            prof.push(0, it)
            torch.mm(a, a)
            b.copy_(a)
            prof.pop()
        prof.attribute_window()
        records = [r for batch in kept for r in batch]
        n = len(records)
        print(
            f"  {n} records in {len(kept)} buffers; record types "
            f"{sorted({type(r).__name__ for r in records})}"
        )
        for label, fn in (
            ("a.kind", lambda: [r.kind for r in records]),
            ("a.ptr", lambda: [r.ptr for r in records]),
            ("int(a)", lambda: [int(r) for r in records]),
        ):
            t0 = time.perf_counter_ns()
            fn()
            print(f"  {label:8s} {(time.perf_counter_ns() - t0) / n:.0f} ns/record")
        print(f"  int(a) == a.ptr: {all(int(r) == r.ptr for r in records[:100])}")
        parser = backend._RecordParser(prof._cupti)
        for label, fn in (("objects", parser.parse_objects), ("numpy", parser.parse_numpy)):
            t0 = time.perf_counter_ns()
            out = [fn(batch) for batch in kept]
            print(f"  parse {label:8s} {(time.perf_counter_ns() - t0) / n:.0f} ns/record")
            if label == "objects":
                slow = out
            else:
                same = all(
                    f is not None and all(np.array_equal(f[k], s_[k]) for k in s_)
                    for f, s_ in zip(out, slow, strict=True)
                )
                check(same, "numpy gather equals the record objects on every buffer")
        counts = {k: sum(o[k].shape[0] for o in slow) for k in slow[0]}
        print(f"  rows: {counts}")
    finally:
        kept.clear()
        prof.close()


def join_rate() -> None:
    """attribute() on synthetic records: 1e6 and 1e7, activities locally out of order."""
    rng = np.random.default_rng(0)
    for n, blocks, iters in ((1_000_000, 10, 1000), (10_000_000, 10, 1000)):
        block = np.repeat(np.arange(blocks), n // blocks)
        iteration = np.tile(np.repeat(np.arange(iters), n // blocks // iters), blocks)
        ext_ids = ((1 << 62) | (9 << 40) | (block << 24) | iteration).astype(np.uint64)
        corr = np.arange(n, dtype=np.uint64) * 2 + 2
        perm = np.argsort(np.arange(n) + rng.integers(0, 64, n), kind="stable")
        start = 1_700_000_000_000_000_000 + rng.integers(0, 10**9, n)
        zeros = np.zeros(n, np.int32)
        records = ActivityRecords(
            correlation_id=corr[perm],
            start_ns=start[perm],
            end_ns=start[perm] + 1000,
            kind=np.ones(n, np.uint8),
            stream_id=np.full(n, 7),
            device_id=zeros,
            size_bytes=np.zeros(n, np.int64),
            **dict.fromkeys(KERNEL_DIMS, zeros),
        )
        ext = ExternalCorrelation(
            correlation_id=np.stack([corr, corr + 1], 1).ravel(),
            external_id=np.stack([ext_ids, ext_ids], 1).ravel(),
        )
        t0 = time.perf_counter()
        att = attribute(records, ext, window_id=9, num_blocks=blocks, num_iters=iters)
        dt = time.perf_counter() - t0
        assert int(att.activity_count.sum()) == n and blocks < HARNESS_BLOCK
        print(f"  {n:>10} records: {dt:.3f} s, {n / dt / 1e6:.1f} M records/s")


def main() -> int:
    ok, message = cupti_available()
    print(f"cupti_available: {ok}: {message}")
    if not ok:
        return 1
    import torch

    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
        f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
    )
    torch.ones(1, device="cuda")  # CUDA context exists before CUPTI starts, as in the harness
    prof = CuptiProfiler(trace=True)  # the checks read the named activities
    prof.start()
    try:
        for title, step in (
            ("1. warmup is discarded", warmup_discard),
            ("2. gated matmuls on two streams", gated_streams),
            ("3. NCCL all_gather, world size 1", nccl_all_gather),
            ("host costs", host_costs),
            ("5. one window over many small buffers", small_buffers),
        ):
            print(title)
            try:
                step(prof, torch)
            except Exception:
                traceback.print_exc()
                failures.append(title)
                prof.close()  # leave CUPTI clean, then carry on with a fresh profiler
                prof = CuptiProfiler(trace=True)
                prof.start()
    finally:
        prof.close()
        prof.close()  # twice is safe
    print("record parsing costs")
    try:
        parse_costs(torch)
    except Exception:
        traceback.print_exc()
        failures.append("record parsing costs")
    print("4. attribute() join rate")
    join_rate()
    print("FAILED: " + "; ".join(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
