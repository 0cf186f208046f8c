"""Cost of cross-rank aggregation as the world grows, with blocks x iterations fixed.

What one rank pays is ``local_summary`` on its own (blocks, iters) timings plus
``reduce_summaries``: six element-wise all_reduces of fixed-size float64/int64 arrays (the
per-rank comm/compute overlap adds 2 x W floats). Here the
all_reduces are replayed in-process (each returns what the real reduction over W ranks
returns), so the time is rank 0's own compute and the payload is reported in bytes; network
time is not in it. ``simulate_ranks`` is the other number: one process holding every rank's
summary and reducing them (what tests use), so it grows with W by construction.

Run from the repository root: ``python -m bench.aggregate_scale [--json out.json]``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from userbenchmark.maestro.core.analysis.aggregate import (
    WindowAggregate,
    _combined,
    _vote,
    local_summary,
    reduce_summaries,
)
from userbenchmark.maestro.core.analysis.intervals import WindowTimings

from ._common import machine_info, machine_lines, markdown_table, median_spread, write_json


def simulate_ranks(summaries: Sequence[WindowAggregate]) -> WindowAggregate:
    """The summary every rank would get, computed in one process (tests and this benchmark):
    ``summaries[r]`` is rank r's :func:`local_summary` (``rank=r``, world ``len(summaries)``)."""
    ops = {"max": np.max, "min": np.min, "sum": np.sum}

    def combine(op: str, dtype: Any, names: tuple[str, ...]) -> list[np.ndarray]:
        return [ops[op](np.stack([getattr(s, n) for s in summaries]), axis=0).astype(dtype)
                for n in names]  # fmt: skip

    out = _combined(summaries[0], combine)
    votes = [_vote(s, out.start_hi, r) for r, s in enumerate(summaries)]
    return replace(out, world_size=len(summaries), last_start_vote=np.max(votes, axis=0))


def rank_timings(rank: int, num_blocks: int, num_iters: int, seed: int = 0) -> WindowTimings:
    """One rank's window: blocks on two lanes, ~10-60 us each, per-rank jitter, gate times."""
    rng = np.random.default_rng(seed * 100_003 + rank)
    origin = 1_700_000_000_000_000_000 + rank * 1_000_000
    iter_start = origin + np.arange(num_iters, dtype=np.int64) * 1_000_000
    offsets = rng.integers(0, 5_000, size=(num_blocks, num_iters), dtype=np.int64)
    dur = rng.integers(10_000, 60_000, size=(num_blocks, num_iters), dtype=np.int64)
    starts = iter_start[None, :] + offsets
    return WindowTimings(
        starts_ns=starts,
        ends_ns=starts + dur,
        present=np.ones(num_blocks, dtype=bool),
        clock="cupti",
        gate_open_ns=iter_start - 1_000,
        activity_counts=np.full(num_blocks, num_iters, dtype=np.int64),
    )


def lanes_and_kinds(num_blocks: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    lane_of_block = [b % 2 for b in range(num_blocks)]
    is_comm = np.array([b % 2 == 0 for b in range(num_blocks)])
    return lane_of_block, is_comm, ~is_comm


def peer_side(summaries: list[WindowAggregate]) -> tuple[list[np.ndarray], np.ndarray]:
    """What ranks 1..W-1 contribute to each all_reduce of ``reduce_summaries``, pre-combined.

    Each peer's payloads are recorded by running its own ``reduce_summaries``; the last call
    is the last-to-start vote, which depends on every rank's starts: its peer side is
    computed from the true maximum start over all ranks.
    """
    ops = {"max": np.maximum, "min": np.minimum, "sum": np.add}
    recorded: list[list[tuple[np.ndarray, str]]] = []
    for rank, local in enumerate(summaries[1:], start=1):
        calls: list[tuple[np.ndarray, str]] = []

        def record(values: np.ndarray, op: str, calls: list = calls) -> np.ndarray:
            calls.append((values.copy(), op))
            return values

        reduce_summaries(local, rank=rank, world_size=len(summaries), reduce=record)
        recorded.append(calls)
    combined: list[np.ndarray] = []
    if recorded:
        for k in range(len(recorded[0]) - 1):
            op = recorded[0][k][1]
            combined.append(ops[op].reduce(np.stack([calls[k][0] for calls in recorded])))
    start_hi = np.max(np.stack([s.start_hi for s in summaries]), axis=0)
    votes = [_vote(s, start_hi, r) for r, s in enumerate(summaries) if r >= 1]
    vote = np.max(np.stack(votes), axis=0) if votes else np.zeros(0, dtype=np.int64)
    return combined, vote


def replay_reducer(
    combined: list[np.ndarray], vote: np.ndarray, world: int
) -> Callable[[np.ndarray, str], np.ndarray]:
    """Rank 0's reducer: each call returns what the all_reduce over every rank would return.

    The timed work is the one element-wise combine of this rank's payload with the peers'.
    """
    ops = {"max": np.maximum, "min": np.minimum, "sum": np.add}
    state = {"call": 0}

    def reduce(values: np.ndarray, op: str) -> np.ndarray:
        k = state["call"]
        state["call"] += 1
        if world == 1:
            return values  # a world of one: the all_reduce returns the input
        if k < len(combined):
            return ops[op](values, combined[k])
        return np.maximum(values, vote)

    return reduce


def rank_side(
    timings: WindowTimings,
    kinds: tuple,
    reducer: Callable[[np.ndarray, str], np.ndarray],
    world: int,
) -> WindowAggregate:
    lane_of_block, is_comm, is_compute = kinds
    local = local_summary(
        timings,
        lane_of_block=lane_of_block,
        is_comm=is_comm,
        is_compute=is_compute,
        rank=0,
        world_size=world,
        shared_clock=True,
    )
    return reduce_summaries(local, rank=0, world_size=world, reduce=reducer)


def same_aggregate(a: WindowAggregate, b: WindowAggregate) -> bool:
    """Field-by-field equality up to summation order (NaN equals NaN)."""
    for name in WindowAggregate.__dataclass_fields__:
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        if x.shape != y.shape or not np.allclose(x, y, rtol=1e-12, atol=0.0, equal_nan=True):
            return False
    return True


def timed(fn: Callable[[], Any], reps: int) -> tuple[dict[str, float], int, Any]:
    """Median/min/max seconds over ``reps`` calls, tracemalloc peak bytes of one more call."""
    fn()  # warm
    secs = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        secs.append(time.perf_counter() - t0)
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return median_spread(secs), peak - before, result


def measure(world: int, num_blocks: int, num_iters: int, reps: int) -> dict[str, Any]:
    """Rank 0's side and simulate_ranks for one (world, blocks, iters)."""
    kinds = lanes_and_kinds(num_blocks)
    lane_of_block, is_comm, is_compute = kinds
    timings = [rank_timings(r, num_blocks, num_iters) for r in range(world)]
    summaries = [
        local_summary(
            t,
            lane_of_block=lane_of_block,
            is_comm=is_comm,
            is_compute=is_compute,
            rank=r,
            world_size=world,
            shared_clock=True,
        )
        for r, t in enumerate(timings)
    ]
    sim_s, sim_peak, expected = timed(functools.partial(simulate_ranks, summaries), reps)
    payload = sum(
        np.asarray(getattr(summaries[0], f)).nbytes for f in WindowAggregate.__dataclass_fields__
    )

    # Each timed call needs a fresh replay (it counts its calls); build them untimed. Only
    # rank 0's own timings stay alive while it is timed, as on a real rank.
    combined, vote = peer_side(summaries)
    replays = [replay_reducer(combined, vote, world) for _ in range(reps + 2)]
    mine = timings[0]
    del timings, summaries
    gc.collect()

    def one_rank_timed() -> WindowAggregate:
        return rank_side(mine, kinds, replays.pop(), world)

    rank_s, rank_peak, got = timed(one_rank_timed, reps)
    if not same_aggregate(got, expected):
        raise RuntimeError(
            f"world {world}: rank 0's reduce_summaries differs from simulate_ranks; the "
            "replayed all_reduce no longer matches aggregate.reduce_summaries' calls"
        )
    cells = num_blocks * num_iters
    return {
        "world": world,
        "blocks": num_blocks,
        "iters": num_iters,
        "cells": cells,
        "rank0_s": rank_s,
        "rank0_peak_bytes": rank_peak,
        "rank0_ns_per_cell": rank_s["median"] * 1e9 / cells,
        "rank0_peak_bytes_per_cell": rank_peak / cells,
        "allreduce_payload_bytes": payload,
        "simulate_s": sim_s,
        "simulate_peak_bytes": sim_peak,
        "matches_simulate_ranks": True,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 8, 64, 256, 1024])
    parser.add_argument("--blocks", type=int, default=8, help="blocks at the fixed shape")
    parser.add_argument("--iters", type=int, default=1000, help="iterations at the fixed shape")
    parser.add_argument("--shape-world", type=int, default=64, help="world of the shape sweep")
    parser.add_argument(
        "--shapes",
        default="4x1000,8x1000,16x1000,8x250,8x4000,8x16000",
        help="blocks x iters at --shape-world, comma-separated",
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    info = machine_info()
    by_world = [measure(w, args.blocks, args.iters, args.reps) for w in args.worlds]
    shapes = []
    for text in args.shapes.split(","):
        b, i = (int(x) for x in text.lower().split("x"))
        shapes.append(measure(args.shape_world, b, i, args.reps))
    headers = [
        "world",
        "blocks x iters",
        "rank 0 ms (min-max)",
        "rank 0 ns / cell",
        "rank 0 peak KB",
        "all_reduce payload KB",
        "simulate_ranks ms",
        "simulate_ranks peak KB",
    ]

    def rows(results: list[dict[str, Any]]) -> list[list[Any]]:
        out = []
        for r in results:
            s = r["rank0_s"]
            out.append(
                [
                    r["world"],
                    f"{r['blocks']} x {r['iters']:,}",
                    f"{s['median'] * 1e3:.2f} ({s['min'] * 1e3:.2f}-{s['max'] * 1e3:.2f})",
                    r["rank0_ns_per_cell"],
                    r["rank0_peak_bytes"] / 1e3,
                    r["allreduce_payload_bytes"] / 1e3,
                    r["simulate_s"]["median"] * 1e3,
                    r["simulate_peak_bytes"] / 1e3,
                ]
            )
        return out

    print("## Aggregation cost against world size\n")
    print(machine_lines(info))
    print(
        "\nRank 0's side = local_summary + reduce_summaries with the all_reduces replayed "
        "in-process (compute only; the payload is what each all_reduce carries). "
        "simulate_ranks = every rank's summary reduced in one process. Medians of "
        f"{args.reps} runs; every rank-0 result equals simulate_ranks' (to 1e-12).\n"
    )
    print(f"### World size varies, {args.blocks} blocks x {args.iters} iterations\n")
    print(markdown_table(headers, rows(by_world)))
    print(f"\n### Blocks x iterations vary, world {args.shape_world}\n")
    print(markdown_table(headers, rows(shapes)))
    write_json(
        args.json,
        {"benchmark": "aggregate_scale", "machine": info, "by_world": by_world, "by_shape": shapes},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
