"""Do ranks start each iteration together? Small all_reduces on CPU (gloo), 2 ranks.

A collective's latency is the max over ranks of each rank's own duration (nccl-tests -I). When
ranks start an iteration at different moments, the early rank's duration includes the late
rank's lateness, so small collectives read long. This bench times the same all_reduce sizes
(4K-1M) three ways in one run, alternating their order:

- maestro with ``sync: barrier`` (a host barrier, then every rank opens its gate at one agreed
  instant on the host clock: the aligned start);
- maestro with ``sync: barrier-only`` (each rank starts when it leaves the barrier: the
  protocol before alignment);
- a hand-written back-to-back loop: each rank issues the all_reduces one after another, times
  each with ``perf_counter_ns``, and an iteration's latency is the max over ranks. Back-to-back
  collectives start together because the previous one ends together on every rank.

Reported per size: p50 and avg latency of each, and maestro / hand ratios (medians over
repetitions). Run from the repository root: ``python -m bench.alignment_cpu [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import (
    REPO_ROOT,
    machine_info,
    machine_lines,
    maestro_env,
    markdown_table,
    write_json,
)

SIZES = ("4K", "16K", "64K", "256K", "1M")
SYNC = {"aligned": "barrier", "barrier-only": "barrier-only"}
"""maestro's two ways: the ``sync`` of their patterns."""
PATTERN = """\
name: alignment_cpu
world_size: 2
defaults: {{dtype: fp32, warmup_iters: {warmup}, iters: {iters}, baseline: false}}
patterns:
"""
WAY = """\
  - name: {name}
    sync: {sync}
    sweep: {{size: [{sizes}]}}
    blocks:
      - {{name: ar, op: all_reduce, size: "${{size}}"}}
"""


def maestro_run(
    ways: tuple[str, ...], args: argparse.Namespace, tmp: Path
) -> dict[str, dict[str, dict[str, float]]]:
    """One maestro run of every size, one way after the other in the order given:
    {way: {size label: {p50_us, avg_us}}}."""
    config = tmp / "align.yaml"
    text = PATTERN.format(warmup=args.warmup, iters=args.iters)
    for way in ways:
        name = way.replace("-", "_")
        text += WAY.format(name=name, sync=SYNC[way], sizes=", ".join(args.sizes))
    config.write_text(text)
    out = tmp / "out"
    cmd = [sys.executable, "-m", "userbenchmark.maestro", "run", "-c", str(config)]
    cmd += ["--nproc", "2", "--output-dir", str(out), "--no-metrics"]
    proc = subprocess.run(
        cmd, cwd=REPO_ROOT, env=maestro_env(), capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise RuntimeError(f"maestro failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, dict[str, dict[str, float]]] = {way: {} for way in ways}
    for rec in json.loads((out / "results.json").read_text()):
        name, _, label = rec["pattern"].partition("[size=")
        stats = {"p50_us": rec["latency_p50_us"], "avg_us": rec["latency_avg_us"]}
        result[name.replace("_", "-")][label.rstrip("]")] = stats
    return result


def hand_worker(rank: int, port: int, sizes: list[int], iters: int, warmup: int, out: str) -> None:
    """One rank of the back-to-back loop; rank 0 writes {size: [per-iteration max-rank us]}."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    result = {}
    for size in sizes:
        buf = torch.zeros(size // 4)
        for _ in range(warmup):
            dist.all_reduce(buf)
        dur = torch.zeros(iters, dtype=torch.int64)
        for i in range(iters):
            t0 = time.perf_counter_ns()
            dist.all_reduce(buf)
            dur[i] = time.perf_counter_ns() - t0
        dist.all_reduce(dur, op=dist.ReduceOp.MAX)  # per iteration: the slowest rank
        result[size] = (dur.double() / 1e3).tolist()
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def hand_run(args: argparse.Namespace, tmp: Path) -> dict[str, dict[str, float]]:
    import torch.multiprocessing as mp

    from userbenchmark.maestro.core.config.sizes import parse_size
    from userbenchmark.maestro.core.runtime.rendezvous import free_port

    sizes = [parse_size(s) for s in args.sizes]
    out = tmp / "hand.json"
    mp.spawn(
        hand_worker,
        args=(free_port(), sizes, args.iters, args.warmup, str(out)),
        nprocs=2,
        join=True,
    )
    raw = json.loads(out.read_text())
    return {
        label: {
            "p50_us": statistics.median(raw[str(size)]),
            "avg_us": statistics.fmean(raw[str(size)]),
        }
        for label, size in zip(args.sizes, sizes, strict=True)
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), help="all_reduce sizes")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    info = machine_info()
    runs: list[dict[str, Any]] = []
    ways = ("aligned", "barrier-only", "hand")
    with tempfile.TemporaryDirectory(prefix="maestro-align-") as tmpdir:
        tmp = Path(tmpdir)
        for rep in range(args.reps):
            # Alternating which comes first: the hand loop or maestro, and maestro's two ways.
            order = tuple(SYNC) if rep % 2 == 0 else tuple(reversed(SYNC))
            got: dict[str, Any] = {}
            if rep % 2:
                got["hand"] = hand_run(args, tmp)
            got.update(maestro_run(order, args, tmp))
            if not rep % 2:
                got["hand"] = hand_run(args, tmp)
            runs.append(got)
    rows = []
    summary = []
    for size in args.sizes:
        med = {
            (way, stat): statistics.median(r[way][size][stat] for r in runs)
            for way in ways
            for stat in ("p50_us", "avg_us")
        }
        ratio = {
            (way, stat): statistics.median(r[way][size][stat] / r["hand"][size][stat] for r in runs)
            for way in ("aligned", "barrier-only")
            for stat in ("p50_us", "avg_us")
        }
        rows.append(
            [
                size,
                med[("hand", "p50_us")],
                med[("aligned", "p50_us")],
                med[("barrier-only", "p50_us")],
                ratio[("aligned", "p50_us")],
                ratio[("barrier-only", "p50_us")],
                ratio[("aligned", "avg_us")],
                ratio[("barrier-only", "avg_us")],
            ]
        )
        summary.append(
            {"size": size, **{f"{w}_{s}": v for (w, s), v in med.items()}}
            | {f"ratio_{w}_{s}": v for (w, s), v in ratio.items()}
        )
    headers = [
        "size",
        "hand p50 µs",
        "aligned p50 µs",
        "barrier-only p50 µs",
        "aligned/hand p50",
        "barrier-only/hand p50",
        "aligned/hand avg",
        "barrier-only/hand avg",
    ]
    print("## Cross-rank start alignment: all_reduce at 2 gloo ranks\n")
    print(machine_lines(info))
    print(
        f"\n{args.iters} iterations after {args.warmup} warmup, {args.reps} repetitions "
        "alternating the order; medians over repetitions. Latency per iteration = max over "
        "ranks of the rank's own duration.\n"
    )
    print(markdown_table(headers, rows))
    write_json(
        args.json,
        {"benchmark": "alignment_cpu", "machine": info, "summary": summary, "runs": runs},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
