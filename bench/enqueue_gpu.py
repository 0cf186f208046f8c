"""Where a block's host enqueue time goes on CUDA: a launch alone against the same launch under
maestro's CUPTI profiler, one variable at a time.

Each variant runs in a process of its own (CUPTI is set up once per process). Per op, 200
launches are enqueued while one spin kernel holds the stream, so the host never waits for the
device; the figure is host time per launch (median of 5 rounds).

    plain        the launch alone (the hand-written reference)
    kinds        maestro's CUPTI activity kinds enabled, no external ids pushed
    maestro      the same plus a push/pop of an external id around each launch (what a block
                 costs in a maestro window; the window is attributed afterwards, which also
                 proves that every activity found its block)
    launch-apis  as maestro, but runtime/driver API records kept only for the calls that put
                 work on a stream (cupti's per-API switches); attribution checked the same way
    driver-only  as maestro without the RUNTIME kind; attribution checked the same way

    python bench/enqueue_gpu.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

VARIANTS = ("plain", "kinds", "maestro", "launch-apis", "driver-only")
OPS = ("gemm256", "gemm4096", "gemm8192", "allgather4M", "sleep10us", "add64M")
LAUNCHES = 200
ROUNDS = 5

# Calls that put work on a stream: their records carry the correlation ids that kernels,
# memcpys and memsets are matched by. Names as CUPTI's callback-id enums spell them.
LAUNCH_API_WORDS = ("Launch", "Memcpy", "Memset", "GraphLaunch")


def make_ops(torch: Any) -> dict[str, Any]:
    dev = torch.device("cuda", 0)
    bf = torch.bfloat16
    ops: dict[str, Any] = {}
    for n in (256, 4096, 8192):
        a, b = torch.randn(n, n, device=dev, dtype=bf), torch.randn(n, n, device=dev, dtype=bf)
        c = torch.empty(n, n, device=dev, dtype=bf)
        ops[f"gemm{n}"] = lambda a=a, b=b, c=c: torch.matmul(a, b, out=c)
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 300))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    inp = torch.randn(1 << 21, device=dev, dtype=bf)  # 4 MiB gathered by one rank
    out = torch.empty_like(inp)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    ops["allgather4M"] = lambda: gather(out, inp)
    ops["sleep10us"] = lambda: torch.cuda._sleep(18_000)
    x, y = torch.randn(1 << 25, device=dev), torch.randn(1 << 25, device=dev)
    z = torch.empty_like(x)
    ops["add64M"] = lambda: torch.add(x, y, out=z)
    return ops


def _profiler(variant: str) -> Any:
    from userbenchmark.maestro.core.profilers.cupti import CuptiProfiler

    prof = CuptiProfiler()
    if variant == "driver-only":
        prof._kinds = tuple(k for k in prof._kinds if k.name != "RUNTIME")
    prof.start()
    if variant == "launch-apis":
        cupti = prof._cupti
        for enum, switch in (
            (cupti.runtime_api_trace_cbid, cupti.activity_enable_runtime_api),
            (cupti.driver_api_trace_cbid, cupti.activity_enable_driver_api),
        ):
            for cbid in enum:
                keep = any(word in cbid.name for word in LAUNCH_API_WORDS)
                if not keep and cbid.value > 0:
                    try:
                        switch(int(cbid), 0)
                    except Exception:
                        pass
    return prof


def child(variant: str) -> dict[str, Any]:
    import numpy as np
    import torch

    torch.cuda.set_device(0)
    ops = make_ops(torch)
    stream = torch.cuda.Stream()
    prof = None if variant == "plain" else _profiler(variant)
    window = 0
    result: dict[str, Any] = {}
    with torch.cuda.stream(stream):
        for name, op in ops.items():
            for _ in range(10):  # warm: cuBLAS heuristics, NCCL's first call
                op()
            torch.cuda.synchronize()
            per_launch = []
            attributed = None
            for _ in range(ROUNDS):
                push = variant not in ("plain", "kinds")
                if prof is not None:
                    window += 1
                    prof.begin_window(window, 1, LAUNCHES, np.ones(1, dtype=bool))
                if push:
                    prof.push_harness(0)  # the hold below is harness work, in no block
                torch.cuda._sleep(200_000_000)  # ~100 ms: holds the stream while we enqueue
                if push:
                    prof.pop()
                t0 = time.perf_counter_ns()
                for it in range(LAUNCHES):
                    if push:
                        prof.push(0, it)
                    op()
                    if push:
                        prof.pop()
                per_launch.append((time.perf_counter_ns() - t0) / 1e3 / LAUNCHES)
                torch.cuda.synchronize()
                if push:  # without external ids there is nothing to attribute
                    try:
                        att = prof.attribute_window()
                        spans = (att.end_ns - att.start_ns)[0]
                        attributed = f"ok ({float(np.median(spans)) / 1e3:.2f} us/launch)"
                    except Exception as exc:  # attribution refused: unmatched activities
                        attributed = f"FAILED: {str(exc)[:160]}"
            result[name] = {
                "host_us_per_launch": statistics.median(per_launch),
                "attribution": attributed,
            }
    if prof is not None:
        prof.close()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.variant:
        print(json.dumps(child(args.variant)), flush=True)
        return 0
    rows: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        proc = subprocess.run(
            [sys.executable, __file__, "--variant", variant],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            print(f"{variant}: exit {proc.returncode}\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        rows[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
    print("| op | " + " | ".join(f"{v} us" for v in VARIANTS) + " | maestro / plain |")
    print("|---|" + "---|" * (len(VARIANTS) + 1))
    for op in OPS:
        cells = [rows.get(v, {}).get(op, {}).get("host_us_per_launch") for v in VARIANTS]
        ratio = cells[2] / cells[0] if cells[0] and cells[2] else None
        text = [f"{c:.1f}" if c is not None else "-" for c in cells]
        print(f"| {op} | " + " | ".join(text) + f" | {ratio:.2f} |" if ratio else " | - |")
    print()
    for variant in VARIANTS[2:]:
        for op in OPS:
            print(
                f"attribution {variant} {op}: {rows.get(variant, {}).get(op, {}).get('attribution')}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
