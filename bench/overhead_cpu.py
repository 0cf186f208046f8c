"""Maestro's own overhead on CPU (gloo): its measured phase against a hand-written loop.

Two ranks in one gloo world (torch.multiprocessing spawn). Each rank runs the same pattern
two ways, alternating which goes first: maestro's measured window (its CPU executor: one
thread per lane, a threading.Barrier gate and a cross-rank barrier per iteration, the host
profiler around each block) and a hand-written loop doing the same (own groups and buffers of
the same sizes, one thread per lane, a threading.Barrier gate, a gloo barrier per iteration).
A window's time is the slowest rank's wall time. Maestro's fixed start-up costs (process
start, init, group creation, buffers) are reported apart, and so is the whole CLI run.

Run from the repository root: ``python -m bench.overhead_cpu [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ._common import (
    REPO_ROOT,
    machine_info,
    machine_lines,
    maestro_env,
    markdown_table,
    median_spread,
    write_json,
)

TARGET_RATIO = 1.10

PATTERN_YAML = """\
name: overhead_cpu
world_size: {world}
defaults: {{dtype: fp32, warmup_iters: {warmup}, iters: {iters}, baseline: false}}
axes:
  world_ag: {{like: world}}
patterns:
  - name: ar_ag
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: {size}}}
      - {{name: ag, op: all_gather, axis: world_ag, size: {size}}}
"""


def pattern_text(world: int, size: str, iters: int, warmup: int) -> str:
    """Two collectives on two lanes (two communicators over the same ranks)."""
    return PATTERN_YAML.format(world=world, size=size, iters=iters, warmup=warmup)


class HandLoop:
    """The same collectives issued by hand: one thread per lane, a Barrier gate per iteration."""

    def __init__(self, world: int, numel: int) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=120)
        self.sync = dist.new_group(backend="gloo", timeout=timeout)
        self.g_ar = dist.new_group(backend="gloo", timeout=timeout)
        self.g_ag = dist.new_group(backend="gloo", timeout=timeout)
        gen = torch.Generator().manual_seed(1)
        # Values that cancel over the ranks, so repeated in-place sums stay finite.
        sign = 1.0 if dist.get_rank() % 2 == 0 else -1.0
        self.ar_buf = torch.rand(numel, generator=gen) * sign
        self.ag_out = torch.empty(numel)
        self.ag_in = torch.rand(numel // world, generator=gen)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.lanes = [
            lambda: dist.all_reduce(self.ar_buf, group=self.g_ar),
            lambda: gather(self.ag_out, self.ag_in, group=self.g_ag),
        ]
        self.dist = dist

    def window(self, num_iters: int) -> None:
        gate = threading.Barrier(len(self.lanes) + 1)
        done = threading.Barrier(len(self.lanes) + 1)

        def lane_main(op: Any) -> None:
            for _ in range(num_iters):
                gate.wait()
                op()
                done.wait()

        threads = [threading.Thread(target=lane_main, args=(op,), daemon=True) for op in self.lanes]
        for t in threads:
            t.start()
        for _ in range(num_iters):
            self.dist.barrier(group=self.sync)
            gate.wait()
            done.wait()
        for t in threads:
            t.join()


def _slowest(value: float, group: Any) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def worker(
    rank: int, world: int, port: int, config: str, opts: dict[str, Any], t_spawn: float
) -> None:
    """One rank: start-up timings, then alternating maestro / hand-loop windows."""
    t_enter = time.time()
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
        }
    )
    import torch.distributed as dist

    from userbenchmark.maestro.core.config.loader import load_suite
    from userbenchmark.maestro.core.config.options import RunOptions
    from userbenchmark.maestro.core.measure.pattern import issue, warm
    from userbenchmark.maestro.core.measure.prepare import Allocated, make_plan, setup
    from userbenchmark.maestro.core.runtime.phases import setup_rig
    from userbenchmark.maestro.core.runtime.rendezvous import LaunchInfo, init_distributed

    suite = load_suite(config, world_size=world)
    launch = LaunchInfo(rank=rank, world_size=world, local_rank=rank, launcher="torchrun")
    t0 = time.perf_counter()
    dctx = init_distributed(launch, backend="gloo", timeout_s=suite.timeout_s)
    t1 = time.perf_counter()
    rt = setup_rig(suite, RunOptions(backend="gloo", profiler="host"), dctx)
    t2 = time.perf_counter()
    pattern = suite.patterns[0]
    held = Allocated(rt, pattern.name)
    (ready,) = setup(rt, [make_plan(rt, pattern)], held)
    t3 = time.perf_counter()
    numel = pattern.blocks[0].params["size"] // 4
    hand = HandLoop(world, numel)
    timer_group = hand.sync
    startup = {
        "spawn_to_worker_s": _slowest(t_enter - t_spawn, timer_group),
        "init_distributed_s": _slowest(t1 - t0, timer_group),
        "runtime_setup_s": _slowest(t2 - t1, timer_group),
        "pattern_setup_s": _slowest(t3 - t2, timer_group),
    }
    num_iters = pattern.num_iters

    def maestro_window() -> float:
        dist.barrier(group=timer_group)
        s = time.perf_counter()
        issue(rt, warmed, num_iters, present=warmed.plan.timed)
        rt.profiler.end_window()
        return time.perf_counter() - s

    def hand_window() -> float:
        dist.barrier(group=timer_group)
        s = time.perf_counter()
        hand.window(num_iters)
        return time.perf_counter() - s

    warmed = warm(rt, ready, held)
    hand.window(pattern.warmup_iters)
    maestro_s, hand_s, ratios = [], [], []
    for rep in range(opts["reps"]):
        order = (maestro_window, hand_window) if rep % 2 == 0 else (hand_window, maestro_window)
        got = {}
        for fn in order:
            got[fn] = _slowest(fn(), timer_group)
        maestro_s.append(got[maestro_window])
        hand_s.append(got[hand_window])
        ratios.append(got[maestro_window] / got[hand_window])
    held.teardown(failed=False, drain_s=0.0)
    if rank == 0:
        Path(opts["out"]).write_text(
            json.dumps(
                {
                    "startup": startup,
                    "maestro_s": maestro_s,
                    "hand_s": hand_s,
                    "ratios": ratios,
                    "iters": num_iters,
                    "warmup_iters": pattern.warmup_iters,
                }
            )
        )
    rt.profiler.close()
    dist.destroy_process_group()


def run_case(size: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from userbenchmark.maestro.core.runtime.rendezvous import free_port

    config = tmp / f"overhead_{size}.yaml"
    config.write_text(pattern_text(args.world, size, args.iters, args.warmup))
    out = tmp / f"result_{size}.json"
    opts = {"reps": args.reps, "out": str(out)}
    mp.spawn(
        worker,
        args=(args.world, free_port(), str(config), opts, time.time()),
        nprocs=args.world,
        join=True,
    )
    res = json.loads(out.read_text())
    per_iter_m = [s / res["iters"] * 1e6 for s in res["maestro_s"]]
    per_iter_h = [s / res["iters"] * 1e6 for s in res["hand_s"]]
    return {
        "size": size,
        "world": args.world,
        "iters": res["iters"],
        "reps": args.reps,
        "maestro_us_per_iter": median_spread(per_iter_m),
        "hand_us_per_iter": median_spread(per_iter_h),
        "ratio": median_spread(res["ratios"]),
        "meets_target": statistics.median(res["ratios"]) <= TARGET_RATIO,
        "startup": res["startup"],
        "config": pattern_text(args.world, size, args.iters, args.warmup),
    }


def cli_runs(size: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Wall time of whole CLI runs: 1 measured iteration (the fixed cost) and args.iters."""
    config = tmp / f"cli_{size}.yaml"
    config.write_text(pattern_text(args.world, size, args.iters, args.warmup))
    env = maestro_env()
    result: dict[str, Any] = {}
    for label, extra in (
        ("one_iter_s", ["--iters", "1", "--warmup-iters", "0"]),
        ("full_s", []),
    ):
        walls = []
        for _ in range(args.cli_reps):
            cmd = [
                sys.executable,
                "-m",
                "userbenchmark.maestro",
                "run",
                "-c",
                str(config),
                "--nproc",
                str(args.world),
                "--no-metrics",
                "--log-level",
                "WARNING",
                *extra,
            ]
            s = time.perf_counter()
            proc = subprocess.run(
                cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
            )
            walls.append(time.perf_counter() - s)
            if proc.returncode != 0:
                raise RuntimeError(f"maestro run failed ({proc.returncode}): {proc.stderr[-2000:]}")
        result[label] = median_spread(walls)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="ranks (gloo, one process each)")
    parser.add_argument("--sizes", nargs="+", default=["64K", "1M"], help="message size S")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--reps", type=int, default=11, help="alternating repetitions")
    parser.add_argument("--cli-reps", type=int, default=3, help="repetitions of the CLI runs")
    parser.add_argument("--no-cli", action="store_true", help="skip the whole-CLI timings")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the launcher does for its workers
    info = machine_info()
    cases = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for size in args.sizes:
            case = run_case(size, args, tmp)
            if not args.no_cli:
                case["cli"] = cli_runs(size, args, tmp)
            cases.append(case)
    print("## Overhead on CPU: maestro's measured phase against a hand-written loop\n")
    print(machine_lines(info))
    print(
        f"\n{args.world} gloo ranks, pattern: all_reduce S on `world` + all_gather S on a second "
        f"communicator, two lanes, {args.iters} iterations, barrier between iterations. "
        f"Per-iteration wall time of a whole window (slowest rank), median (min-max) of "
        f"{args.reps} alternating repetitions; target ratio <= {TARGET_RATIO}.\n"
    )
    headers = ["S", "maestro us/iter", "hand loop us/iter", "ratio median (min-max)", "target met"]
    rows = []
    for c in cases:
        m, h, r = c["maestro_us_per_iter"], c["hand_us_per_iter"], c["ratio"]
        rows.append(
            [
                c["size"],
                f"{m['median']:.1f} ({m['min']:.1f}-{m['max']:.1f})",
                f"{h['median']:.1f} ({h['min']:.1f}-{h['max']:.1f})",
                f"{r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})",
                c["meets_target"],
            ]
        )
    print(markdown_table(headers, rows))
    print("\nFixed start-up cost (slowest rank, seconds):\n")
    s_headers = [
        "S",
        "spawn to worker",
        "init_distributed",
        "runtime setup (groups)",
        "pattern setup (buffers)",
        "CLI run, 1 iter",
        f"CLI run, {args.iters} iters",
    ]
    s_rows = []
    for c in cases:
        st = c["startup"]
        cli = c.get("cli", {})
        s_rows.append(
            [
                c["size"],
                st["spawn_to_worker_s"],
                st["init_distributed_s"],
                st["runtime_setup_s"],
                st["pattern_setup_s"],
                cli.get("one_iter_s", {}).get("median"),
                cli.get("full_s", {}).get("median"),
            ]
        )
    print(markdown_table(s_headers, s_rows))
    write_json(args.json, {"benchmark": "overhead_cpu", "machine": info, "cases": cases})
    return 0


if __name__ == "__main__":
    sys.exit(main())
