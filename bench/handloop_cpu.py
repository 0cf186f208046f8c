"""Maestro's CPU timings against a hand-written loop of the same op, in the same processes.

Two gloo ranks (torch.multiprocessing spawn), each with one intra-op thread as a maestro rank
has (unless OMP_NUM_THREADS says otherwise). Per op (a 128x128x128 fp32 GEMM, a 64K
all_reduce) and repetition, in alternating order:

- the hand loop, the baseline: the op issued back to back on the rank's main thread, each
  call timed with ``perf_counter_ns``; an iteration's latency is the max over ranks (as
  maestro's). Beside it, the same loop with each of maestro's ways of starting an iteration
  done by hand: a gloo barrier before each call (``sync: barrier-only``), and the agreed start
  (an all_reduce MAX of now + maestro's calibrated margin, then a wait until that instant:
  ``sync: barrier``). They show what a way of starting costs by itself, without maestro;
- maestro's measurement of the same op (``run_pattern``: setup, warmup, the measured
  window on a lane thread, the records), once per ``sync`` mode: ``barrier`` (the default),
  ``barrier-only`` and ``none``.

Reported per op and way: average and median latency (medians over repetitions), maestro /
hand loop, and maestro / the hand loop that starts its iterations the same way. The target
is maestro within TARGET_RATIO of the hand loop. Run from the repository root:
``python -m bench.handloop_cpu [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import machine_info, machine_lines, markdown_table, write_json

TARGET_RATIO = 1.5
OPS = {
    "gemm": "{name: op, op: gemm, m: 128, n: 128, k: 128}",
    "all_reduce": "{name: op, op: all_reduce, size: 64K}",
}
"""The block of each op's pattern (fp32; the hand loop does the same work)."""
LABELS = {"gemm": "GEMM 128x128x128 fp32", "all_reduce": "all_reduce 64K fp32"}
SYNCS = ("barrier", "barrier-only", "none")
PATTERN = """\
name: handloop_cpu
world_size: 2
defaults: {{dtype: fp32, warmup_iters: {warmup}, iters: {iters}, baseline: false}}
patterns:
"""
ONE = """\
  - name: {op}_{sync}
    sync: {sync}
    blocks:
      - {block}
"""


def pattern_text(args: argparse.Namespace) -> str:
    """One pattern per (op, sync mode), named ``<op>_<sync>``."""
    text = PATTERN.format(warmup=args.warmup, iters=args.iters)
    for op in args.ops:
        for sync in args.syncs:
            text += ONE.format(op=op, sync=sync, block=OPS[op])
    return text


WAYS = {
    "hand": "hand loop, back to back",
    "hand_barrier": "hand loop, a barrier before each call",
    "hand_agreed": "hand loop, an agreed start before each call",
    "barrier": "maestro, sync: barrier",
    "barrier-only": "maestro, sync: barrier-only",
    "none": "maestro, sync: none",
}
SAME_START = {"barrier": "hand_agreed", "barrier-only": "hand_barrier", "none": "hand"}
"""The hand loop that starts its iterations as each sync mode does."""


class HandLoop:
    """The op by hand on this rank's main thread: its own buffers (and group, for the
    collective), the per-iteration latency the max over ranks."""

    def __init__(self, op: str) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        self.dist, self.torch = dist, torch
        timeout = datetime.timedelta(seconds=120)
        self.sync = dist.new_group(backend="gloo", timeout=timeout)
        gen = torch.Generator().manual_seed(1 + dist.get_rank())
        if op == "gemm":
            a, b = (torch.rand(128, 128, generator=gen) for _ in range(2))
            c = torch.empty(128, 128)
            self.call = lambda: torch.matmul(a, b, out=c)
        else:
            group = dist.new_group(backend="gloo", timeout=timeout)
            # Values that cancel over the two ranks: repeated in-place sums stay finite.
            buf = torch.rand(64 * 1024 // 4, generator=gen) * (-1) ** dist.get_rank()
            self.call = lambda: dist.all_reduce(buf, group=group)

    def _agreed_start(self, margin_ns: int) -> None:
        """Wait for the latest of every rank's now + margin, as maestro's ``sync: barrier``."""
        from userbenchmark.maestro.blocks.compute import fine_timer_slack, sleep_until_ns

        fine_timer_slack()  # as maestro's main thread
        proposal = self.torch.tensor([time.perf_counter_ns() + margin_ns])
        self.dist.all_reduce(proposal, op=self.dist.ReduceOp.MAX, group=self.sync)
        sleep_until_ns(int(proposal.item()))

    def run(self, way: str, num_iters: int, warmup: int, margin_us: float) -> list[float]:
        """Per-iteration latency (µs, max over ranks) of ``num_iters`` calls after ``warmup``,
        each call started ``way`` (``hand``, ``hand_barrier`` or ``hand_agreed``)."""
        start = {
            "hand": lambda: None,
            "hand_barrier": lambda: self.dist.barrier(group=self.sync),
            "hand_agreed": lambda: self._agreed_start(round(margin_us * 1e3)),
        }[way]
        for _ in range(warmup):
            self.call()
        durations = self.torch.zeros(num_iters, dtype=self.torch.int64)
        for i in range(num_iters):
            start()
            t0 = time.perf_counter_ns()
            self.call()
            durations[i] = time.perf_counter_ns() - t0
        self.dist.all_reduce(durations, op=self.dist.ReduceOp.MAX, group=self.sync)
        return (durations.double() / 1e3).tolist()


def worker(rank: int, port: int, config: str, opts: dict[str, Any]) -> None:
    """One rank: for each op and repetition, maestro's patterns of that op and the hand loops,
    alternating which comes first (maestro first in the first: the agreed start by hand uses
    the margin maestro calibrated last); rank 0 writes every figure to ``opts["out"]``."""
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
        }
    )
    import torch.distributed as dist

    from userbenchmark.maestro.core.config.loader import load_suite
    from userbenchmark.maestro.core.config.options import RunOptions
    from userbenchmark.maestro.core.measure import pattern as maestro_pattern
    from userbenchmark.maestro.core.measure.lanes import DEFAULT_START_MARGIN_US
    from userbenchmark.maestro.core.runtime.phases import (
        one_intra_op_thread_unless_chosen,
        run_pattern,
        setup_rig,
    )
    from userbenchmark.maestro.core.runtime.rendezvous import LaunchInfo, init_distributed

    one_intra_op_thread_unless_chosen(os.environ)  # as maestro's own ranks
    suite = load_suite(config, world_size=2)
    launch = LaunchInfo(rank=rank, world_size=2, local_rank=rank, launcher="torchrun")
    dctx = init_distributed(launch, backend="gloo", timeout_s=suite.timeout_s)
    rt = setup_rig(suite, RunOptions(backend="gloo", profiler="host"), dctx)
    patterns = {p.name: p for p in suite.patterns}
    results: dict[str, Any] = {}
    margin_us = [DEFAULT_START_MARGIN_US]  # maestro's last calibrated one
    calibrated, leads = maestro_pattern.warm_up, []

    def warm_up(*args: Any, **kwargs: Any) -> Any:  # maestro's warmup, its lead kept
        warmed = calibrated(*args, **kwargs)
        leads.append(warmed.lead_us)
        return warmed

    maestro_pattern.warm_up = warm_up
    for op in opts["ops"]:
        hand = HandLoop(op)
        got: dict[str, list[dict[str, float]]] = {"margin_us": []}

        def by_hand(hand: HandLoop = hand, got: dict = got) -> None:
            for way in ("hand", "hand_barrier", "hand_agreed"):
                latencies = hand.run(way, opts["iters"], opts["warmup"], margin_us[-1])
                got.setdefault(way, []).append(_summary(latencies))

        def by_maestro(op: str = op, got: dict = got) -> None:
            for sync in opts["syncs"]:
                measured = run_pattern(rt, dctx, patterns[f"{op}_{sync}"])
                block = measured.outcomes[0][1].blocks[0]
                got.setdefault(sync, []).append(
                    {"avg_us": block.latency_avg_us, "p50_us": block.latency_p50_us}
                )
                if sync == "barrier":
                    margin_us.append(leads[-1])
                    got["margin_us"].append(margin_us[-1])

        for rep in range(opts["reps"]):
            for step in (by_maestro, by_hand) if rep % 2 == 0 else (by_hand, by_maestro):
                step()
        results[op] = got
    if rank == 0:
        Path(opts["out"]).write_text(json.dumps(results))
    rt.profiler.close()
    dist.destroy_process_group()


def _summary(latencies_us: list[float]) -> dict[str, float]:
    return {"avg_us": statistics.fmean(latencies_us), "p50_us": statistics.median(latencies_us)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """{op: {way: [{avg_us, p50_us} per repetition], "margin_us": [...]}}."""
    import torch.multiprocessing as mp

    from userbenchmark.maestro.core.runtime.rendezvous import free_port

    with tempfile.TemporaryDirectory(prefix="maestro-handloop-") as tmp:
        config, out = Path(tmp) / "handloop.yaml", Path(tmp) / "out.json"
        config.write_text(pattern_text(args))
        opts = {k: getattr(args, k) for k in ("ops", "syncs", "iters", "warmup", "reps")}
        mp.spawn(worker, args=(free_port(), str(config), opts | {"out": str(out)}), nprocs=2)
        return json.loads(out.read_text())


def _ratio(got: dict[str, Any], way: str, base: str, stat: str) -> float:
    """Median over repetitions of way / base (each repetition's own pair)."""
    return statistics.median(m[stat] / h[stat] for m, h in zip(got[way], got[base], strict=True))


def rows_of(results: dict[str, Any]) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    """Table rows (one per op and way) and their figures: medians over repetitions."""
    rows, summary = [], []
    for op, got in results.items():
        for way, label in WAYS.items():
            if way not in got:
                continue
            med = {s: statistics.median(r[s] for r in got[way]) for s in ("avg_us", "p50_us")}
            ratio = {s: _ratio(got, way, "hand", s) for s in ("avg_us", "p50_us")}
            maestro = way in SAME_START
            same = _ratio(got, way, SAME_START[way], "p50_us") if maestro else None
            met = max(ratio.values()) <= TARGET_RATIO if maestro else None
            rows.append(
                [LABELS[op], label, med["avg_us"], med["p50_us"]]
                + [ratio["avg_us"], ratio["p50_us"], met, same]
            )
            summary.append(
                {"op": op, "way": way, **med, "ratio_avg": ratio["avg_us"]}
                | {"ratio_p50": ratio["p50_us"], "met": met, "ratio_same_start_p50": same}
            )
    return rows, summary


HEADERS = [
    "op",
    "way",
    "avg µs",
    "p50 µs",
    "/ hand loop, avg",
    "/ hand loop, p50",
    f"within {TARGET_RATIO}x",
    "/ hand loop started the same way, p50",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="+", choices=list(OPS), default=list(OPS))
    parser.add_argument("--syncs", nargs="+", choices=SYNCS, default=list(SYNCS))
    parser.add_argument("--iters", type=int, default=300, help="measured iterations")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--reps", type=int, default=5, help="alternating repetitions")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    info = machine_info() | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset")}
    results = measure(args)
    rows, summary = rows_of(results)
    margins = [m for got in results.values() for m in got["margin_us"]]
    print("## CPU timings against a hand-written loop: 2 gloo ranks, the same processes\n")
    print(machine_lines(info))
    print(
        f"\n{args.iters} iterations after {args.warmup} warmup, {args.reps} repetitions "
        "alternating the order, medians over repetitions. Latency of an iteration: the max "
        "over ranks of each rank's own duration. Hand loop: the op on the rank's main thread "
        "(back to back; or after a gloo barrier; or after an agreed start, with maestro's "
        "calibrated margin"
        + (f", {min(margins) / 1e3:.1f}-{max(margins) / 1e3:.1f} ms" if margins else "")
        + f"); maestro: the op as a one-block pattern. Target: maestro within {TARGET_RATIO}x "
        "of the hand loop (avg and p50).\n"
    )
    print(markdown_table(HEADERS, rows))
    write_json(
        args.json,
        {"benchmark": "handloop_cpu", "machine": info, "summary": summary, "runs": results},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
