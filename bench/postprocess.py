"""Post-processing cost: attribution of CUPTI-like activity records, then latency statistics.

Builds synthetic records shaped like one CUPTI window (gate kernels, several activities per
(block, iteration), an external-correlation table with one row per API call, records in
nearly-completion order) and times the real ``attribute`` and ``latency_stats``. Peak memory
is what tracemalloc sees (numpy reports its buffers to it), compared with the input arrays.

Run from the repository root: ``python -m bench.postprocess [--json out.json]``.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import io
import pstats
import sys
import time
import tracemalloc
from typing import Any

import numpy as np

from userbenchmark.maestro.core.analysis.stats import latency_stats
from userbenchmark.maestro.core.profilers.attribution import (
    GATE_BLOCK,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    ActivityRecords,
    ExternalCorrelation,
    attribute,
    encode_external_id,
)

from ._common import machine_info, machine_lines, markdown_table, median_spread, write_json

WINDOW = 3
TARGET_RECORDS_PER_S = 5e6
TARGET_MEMORY_RATIO = 2.0


def synthetic_window(
    num_records: int, num_blocks: int, per_cell: int, *, seed: int = 0, shuffle_span: int = 64
) -> tuple[ActivityRecords, ExternalCorrelation, int]:
    """About ``num_records`` activities of one window; returns (records, table, num_iters).

    Per iteration: one gate kernel, then ``per_cell`` activities per block. Every activity
    has its own API call, and each API call leaves two external-correlation rows (runtime
    and driver call), so the table is twice as long as the records, as with CUPTI's RUNTIME
    and DRIVER kinds on. Records are shuffled within runs of ``shuffle_span`` (CUPTI delivers
    them in about completion order, interleaving concurrent lanes).
    """
    rng = np.random.default_rng(seed)
    per_iter = 1 + num_blocks * per_cell
    num_iters = max(1, num_records // per_iter)
    n = num_iters * per_iter
    # Position j of an iteration: 0 is the gate, then block (j-1)//per_cell.
    slot = np.tile(np.arange(per_iter), num_iters)
    iteration = np.repeat(np.arange(num_iters, dtype=np.int64), per_iter)
    block = np.where(slot == 0, GATE_BLOCK, (slot - 1) // per_cell).astype(np.int64)
    ext_of_activity = (encode_external_id(WINDOW, 0, 0) | (block << 24) | iteration).astype(
        np.uint64
    )
    # API calls are numbered in call order; each activity's launch is call 2i (runtime), and
    # call 2i+1 is the driver call below it: both carry the pushed external id.
    base_corr = 1_000_000
    corr = (base_corr + 2 * np.arange(n, dtype=np.int64)).astype(np.uint64)
    table_corr = (base_corr + np.arange(2 * n, dtype=np.int64)).astype(np.uint64)
    table_ext = np.repeat(ext_of_activity, 2)
    kind = np.full(n, KIND_KERNEL, dtype=np.uint8)
    cell = slot > 0
    r = rng.random(n)
    kind[cell & (r < 0.10)] = KIND_MEMCPY
    kind[cell & (r >= 0.10) & (r < 0.15)] = KIND_MEMSET
    dur = rng.integers(1_000, 100_000, size=n, dtype=np.int64)
    start = 1_700_000_000_000_000_000 + np.cumsum(dur // 2 + 500)
    end = start + dur
    stream = np.where(block == GATE_BLOCK, 7, 13 + block % 4).astype(np.int64)
    is_kernel = kind == KIND_KERNEL
    grid = np.where(is_kernel, rng.choice([132, 264, 1024], size=n), 0).astype(np.int32)
    ones = is_kernel.astype(np.int32)
    # Completion order: shuffle within short runs only.
    order = np.arange(n)
    if shuffle_span > 1:
        keys = (order // shuffle_span) * 2.0 + rng.random(n)
        order = np.argsort(keys, kind="stable")
    records = ActivityRecords(
        correlation_id=corr[order],
        start_ns=start[order],
        end_ns=end[order],
        kind=kind[order],
        stream_id=stream[order],
        device_id=np.zeros(n, np.int32),
        size_bytes=np.where(is_kernel, 0, 1 << 20)[order].astype(np.int64),
        grid_x=grid[order],
        grid_y=ones[order],
        grid_z=ones[order],
        block_x=(ones * 256)[order],
        block_y=ones[order],
        block_z=ones[order],
    )
    table = ExternalCorrelation(correlation_id=table_corr, external_id=table_ext)
    return records, table, num_iters


def input_bytes(records: ActivityRecords, table: ExternalCorrelation) -> tuple[int, int]:
    """(bytes of the activity arrays, bytes of the correlation table)."""
    rec = sum(getattr(records, f.name).nbytes for f in dataclasses.fields(records))
    return rec, table.correlation_id.nbytes + table.external_id.nbytes


def process(
    records: ActivityRecords, table: ExternalCorrelation, num_blocks: int, num_iters: int
) -> tuple[float, float]:
    """Attribute, then statistics per block: (attribute seconds, stats seconds)."""
    t0 = time.perf_counter()
    att = attribute(records, table, window_id=WINDOW, num_blocks=num_blocks, num_iters=num_iters)
    t1 = time.perf_counter()
    durations = att.end_ns - att.start_ns
    for b in range(num_blocks):
        latency_stats(durations[b])
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def peak_bytes(
    records: ActivityRecords, table: ExternalCorrelation, num_blocks: int, num_iters: int
) -> int:
    """Peak bytes tracemalloc sees above the inputs while attribution and stats run."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        process(records, table, num_blocks, num_iters)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


def profile_once(
    records: ActivityRecords, table: ExternalCorrelation, num_blocks: int, num_iters: int
) -> str:
    """cProfile of one pass (numpy calls show as built-ins), top entries by own time."""
    prof = cProfile.Profile()
    prof.enable()
    process(records, table, num_blocks, num_iters)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
    return buf.getvalue()


def run_size(num_records: int, args: argparse.Namespace) -> dict[str, Any]:
    records, table, num_iters = synthetic_window(num_records, args.blocks, args.per_cell)
    n = len(records)
    rec_bytes, table_bytes = input_bytes(records, table)
    reps = args.reps if n <= 2_000_000 else max(1, args.reps - 2)
    process(records, table, args.blocks, num_iters)  # first touch of the code paths
    att_s, stats_s, total_s = [], [], []
    for _ in range(reps):
        gc.collect()
        a, s = process(records, table, args.blocks, num_iters)
        att_s.append(a)
        stats_s.append(s)
        total_s.append(a + s)
    peak = peak_bytes(records, table, args.blocks, num_iters)
    total = median_spread(total_s)
    raw = rec_bytes + table_bytes
    row: dict[str, Any] = {
        "records": n,
        "table_rows": len(table),
        "blocks": args.blocks,
        "iters": num_iters,
        "reps": reps,
        "attribute_s": median_spread(att_s),
        "stats_s": median_spread(stats_s),
        "total_s": total,
        "records_per_s": n / total["median"],
        "records_bytes": rec_bytes,
        "table_bytes": table_bytes,
        "raw_bytes": raw,
        "peak_bytes": peak,
        "peak_over_raw": peak / raw,
        "peak_over_records": peak / rec_bytes,
    }
    row["meets_rate"] = row["records_per_s"] >= TARGET_RECORDS_PER_S
    row["meets_memory"] = row["peak_over_raw"] <= TARGET_MEMORY_RATIO
    if args.profile or not (row["meets_rate"] and row["meets_memory"]):
        row["profile"] = profile_once(records, table, args.blocks, num_iters)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000], help="records"
    )
    parser.add_argument("--blocks", type=int, default=16, help="blocks per iteration")
    parser.add_argument("--per-cell", type=int, default=2, help="activities per (block, iter)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (fewer >2M)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile per size")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    info = machine_info()
    rows = [run_size(n, args) for n in args.sizes]
    headers = [
        "records",
        "table rows",
        "blocks x iters",
        "attribute s",
        "stats s",
        "total s (min-max)",
        "records/s",
        "raw MB",
        "peak MB",
        "peak / raw",
        "peak / activity arrays",
        "targets met",
    ]
    table_rows = []
    for r in rows:
        t = r["total_s"]
        table_rows.append(
            [
                r["records"],
                r["table_rows"],
                f"{r['blocks']} x {r['iters']:,}",
                r["attribute_s"]["median"],
                r["stats_s"]["median"],
                f"{t['median']:.3f} ({t['min']:.3f}-{t['max']:.3f})",
                f"{r['records_per_s'] / 1e6:.1f} M",
                r["raw_bytes"] / 1e6,
                r["peak_bytes"] / 1e6,
                r["peak_over_raw"],
                r["peak_over_records"],
                f"rate {'yes' if r['meets_rate'] else 'NO'}, "
                f"memory {'yes' if r['meets_memory'] else 'NO'}",
            ]
        )
    print("## Post-processing: attribution + statistics\n")
    print(machine_lines(info))
    print(
        f"\nTargets: >= {TARGET_RECORDS_PER_S / 1e6:.0f} M records/s; tracemalloc peak <= "
        f"{TARGET_MEMORY_RATIO:.0f}x the input arrays (activity arrays + correlation table). "
        "Times are medians.\n"
    )
    print(markdown_table(headers, table_rows))
    for r in rows:
        if "profile" in r:
            print(f"\ncProfile, {r['records']:,} records:\n```\n{r['profile']}```")
    write_json(args.json, {"benchmark": "postprocess", "machine": info, "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
