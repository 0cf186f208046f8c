"""A hand-written NCCL timing loop in the nccl-tests convention, to compare maestro against.

Per op and size: warmup, then N back-to-back ops on the current stream between two CUDA events;
time per op = elapsed / N, the max over ranks; S as nccl-tests defines it; algbw = S / t
(GB = 1e9) and busbw = algbw x the nccl-tests factor, written out here (not maestro's own).

Run: ``python bench/nccl_event_loop.py --nproc 2 --ops all_reduce --sizes 1M,64M --json o.json``
(one process per GPU through torch.multiprocessing), or under ``torchrun`` without ``--nproc``.
Without CUDA it exits 1 with a message.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Started as a file: restart as a module of the repository, so that package imports
    # resolve without touching sys.path.
    _root = str(Path(__file__).resolve().parents[1])
    _env = dict(os.environ)
    _env["PYTHONPATH"] = os.pathsep.join(p for p in (_root, _env.get("PYTHONPATH")) if p)
    os.execve(sys.executable, [sys.executable, "-m", "bench.nccl_event_loop", *sys.argv[1:]], _env)

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any  # noqa: E402

from userbenchmark.maestro.core.config.sizes import format_size, parse_size

from ._common import machine_info, markdown_table  # noqa: E402

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
DEFAULT_SIZES = "1M,4M,16M,64M,256M,1G"
# nccl-tests doc/PERFORMANCE.md, written out here so that this reference does not share the
# arithmetic of the code it checks: busbw = algbw x factor(n).
NCCL_TESTS_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
}


def buffer_numels(op: str, size_bytes: int, team_size: int, element_bytes: int) -> tuple[int, int]:
    """(input, output) element counts of `op` for message size S as nccl-tests defines it.

    all_reduce: S in place; all_gather: S / n in, S out; reduce_scatter: S in, S / n out;
    all_to_all: S in and out; send_recv: S sent, S received. Raises ValueError when S does not
    split into whole elements (per rank where the op splits the message).
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; valid: {', '.join(OPS)}")
    if team_size < 1 or (op == "send_recv" and team_size < 2):
        raise ValueError(f"{op} needs a team of at least {2 if op == 'send_recv' else 1} ranks")
    splits = op in ("all_gather", "reduce_scatter", "all_to_all")
    unit = element_bytes * (team_size if splits else 1)
    if size_bytes <= 0 or size_bytes % unit:
        what = f"{team_size} ranks x {element_bytes}-byte elements" if splits else "elements"
        raise ValueError(f"{op}: size {size_bytes} bytes does not split into whole {what}")
    numel = size_bytes // element_bytes
    if op == "all_gather":
        return numel // team_size, numel
    if op == "reduce_scatter":
        return numel, numel // team_size
    return numel, numel


def loop_numbers(
    op: str, size_bytes: int, team_size: int, rank_total_ms: Sequence[float], iters: int
) -> dict[str, Any]:
    """Time per op (max over ranks of total / iters), algbw and busbw of one timed loop."""
    if iters < 1 or not rank_total_ms:
        raise ValueError("need iters >= 1 and at least one rank's time")
    time_us = max(float(t) for t in rank_total_ms) * 1e3 / iters
    algbw = size_bytes / (time_us * 1e-6) / 1e9  # GB = 1e9 bytes, as nccl-tests
    return {
        "op": op,
        "size_bytes": size_bytes,
        "team_size": team_size,
        "iters": iters,
        "time_us": time_us,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * NCCL_TESTS_BUS_FACTOR[op](team_size),
        "rank_time_us": [float(t) * 1e3 / iters for t in rank_total_ms],
    }


def parse_sizes(text: str) -> list[int]:
    """Comma-separated sizes ("1M,64M,1G") in bytes, K/M/G as powers of 1024."""
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise ValueError(f"no sizes in {text!r}")
    return sizes


def parse_ops(text: str) -> list[str]:
    """Comma-separated op names, each one of OPS."""
    ops = [part.strip() for part in text.split(",") if part.strip()]
    bad = [op for op in ops if op not in OPS]
    if bad or not ops:
        raise ValueError(f"unknown ops {bad or text!r}; valid: {', '.join(OPS)}")
    return ops


def _launcher(op: str, inp: Any, out: Any, rank: int, world: int):
    """A zero-argument callable that enqueues one `op` exactly as maestro's block does."""
    import torch.distributed as dist

    if op == "all_reduce":
        return lambda: dist.all_reduce(inp)
    if op == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, inp)
    if op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(out, inp)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(out, inp)

    def send_recv() -> None:
        ops = [
            dist.P2POp(dist.isend, inp, (rank + 1) % world),
            dist.P2POp(dist.irecv, out, (rank - 1) % world),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()  # a stream wait on CUDA: the current stream depends on the transfer

    return send_recv


def _measure(args: argparse.Namespace, rank: int, world: int) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    rows = []
    for op in args.ops:
        for size in args.sizes:
            n_in, n_out = buffer_numels(op, size, world, DTYPE_BYTES[args.dtype])
            # NCCL's time does not depend on the values; zeros keep repeated in-place sums finite.
            inp = torch.zeros(n_in, dtype=dtype, device="cuda")
            out = inp if op == "all_reduce" else torch.empty(n_out, dtype=dtype, device="cuda")
            launch = _launcher(op, inp, out, rank, world)
            for _ in range(args.warmup_iters):
                launch()
            torch.cuda.synchronize()
            dist.barrier()
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.iters):
                launch()
            stop.record()
            stop.synchronize()
            mine = torch.tensor([start.elapsed_time(stop)], dtype=torch.float64, device="cuda")
            every = torch.empty(world, dtype=torch.float64, device="cuda")
            (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(every, mine)
            rows.append(loop_numbers(op, size, world, every.tolist(), args.iters))
            del inp, out, launch
            torch.cuda.empty_cache()
    return rows


def _worker(local_rank: int, args: argparse.Namespace, world: int, rank_offset: int) -> None:
    import torch
    import torch.distributed as dist

    rank = rank_offset + local_rank
    torch.cuda.set_device(local_rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, device_id=torch.device("cuda", local_rank)
    )
    try:
        rows = _measure(args, rank, world)
        if rank == 0:
            _report(args, rows, world)
    finally:
        dist.destroy_process_group()


def _report(args: argparse.Namespace, rows: list[dict[str, Any]], world: int) -> None:
    headers = ["op", "size", "time_us", "algbw_gbps", "busbw_gbps"]
    table = [
        [r["op"], format_size(r["size_bytes"]), r["time_us"], r["algbw_gbps"], r["busbw_gbps"]]
        for r in rows
    ]
    print(f"nccl event loop: {world} ranks, {args.dtype}, {args.iters} iters per size")
    print(markdown_table(headers, table))
    if args.json:
        doc = {
            "machine": machine_info(),
            "world_size": world,
            "dtype": args.dtype,
            "iters": args.iters,
            "warmup_iters": args.warmup_iters,
            "results": rows,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python bench/nccl_event_loop.py",
        description="nccl-tests style CUDA-event loop of one NCCL op over a list of sizes.",
    )
    parser.add_argument("--ops", type=parse_ops, default=["all_reduce"], help=", ".join(OPS))
    parser.add_argument("--sizes", type=parse_sizes, default=parse_sizes(DEFAULT_SIZES))
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bf16")
    parser.add_argument("--iters", type=int, default=20, help="timed ops per size (nccl-tests: 20)")
    parser.add_argument("--warmup-iters", type=int, default=5, help="untimed ops per size")
    parser.add_argument(
        "--nproc", type=int, default=None, help="spawn N local ranks (omit under torchrun)"
    )
    parser.add_argument("--json", default=None, help="write the results here (rank 0)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.iters < 1 or args.warmup_iters < 0:
        print("nccl_event_loop: --iters must be >= 1 and --warmup-iters >= 0", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print(
            "nccl_event_loop: needs NVIDIA GPUs with CUDA (torch.cuda.is_available() is False); "
            "nothing was measured",
            file=sys.stderr,
        )
        return 1
    if "RANK" in os.environ and args.nproc is None:  # under torchrun: this process is one rank
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
        _worker(local, args, world, int(os.environ["RANK"]) - local)
        return 0
    nproc = args.nproc or torch.cuda.device_count()
    if nproc > torch.cuda.device_count():
        print(
            f"nccl_event_loop: --nproc {nproc} needs one GPU per rank, "
            f"found {torch.cuda.device_count()}",
            file=sys.stderr,
        )
        return 1
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(args, nproc, 0), nprocs=nproc, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
