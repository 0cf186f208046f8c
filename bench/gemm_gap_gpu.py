"""Why a replayed GEMM is slower than traced: each candidate cause measured per GEMM, one GPU.

The one-rank step of ``tests/data/traces/onerank`` (4 x (LayerNorm + MLP, d 2048), bf16,
AdamW, traced on an H200) replayed its GEMMs 0.5-9 % slower than the trace, every one of them.
This script runs each traced GEMM as maestro's ``gemm`` block does (same shapes, operand
layouts, ``torch.matmul``) under each candidate, timed by the profiler's CUPTI records, and
prints the median replayed / traced ratio per GEMM and candidate, with the kernel cuBLAS chose
against the traced one:

- **operand data** (the trace has no values): uniform in [-1, 1) (maestro's default), zeros,
  normal with std 0.02 (initialised weights) in both operands, normal std 1 in A (activations
  after a LayerNorm) and 0.02 in B (weights);
- **L2**: cold (a 512 MiB write first, as after a replayed ``busy`` block, which moves up to
  250 MB) or warm (A written just before, as the real step's previous kernel wrote it);
- **clocks**: after 1 ms of an idle GPU, or back to back with itself;
- **kernel choice**: the kernel each candidate ran, beside the traced one.

Then maestro itself replays the step with its GEMMs' operands uniform (today) and normal with
``data_std: 0.02``, and the per-GEMM ratios of both runs are printed too. Everything
comes from one run (about a minute of GPU time); exits 0 with a message without CUDA.

Run: ``python bench/gemm_gap_gpu.py --json gemm_gap.json`` (or ``python -m bench.gemm_gap_gpu``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Started as a file: restart as a module of the repository (package imports, no sys.path).
    _root = str(Path(__file__).resolve().parents[1])
    _env = dict(os.environ)
    _env["PYTHONPATH"] = os.pathsep.join(p for p in (_root, _env.get("PYTHONPATH")) if p)
    os.execve(sys.executable, [sys.executable, "-m", "bench.gemm_gap_gpu", *sys.argv[1:]], _env)

import argparse  # noqa: E402
import bisect  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from typing import Any  # noqa: E402

from ._common import (  # noqa: E402
    REPO_ROOT,
    machine_info,
    machine_lines,
    maestro_env,
    markdown_table,
    with_op_params,
    write_json,
)

TRACE = REPO_ROOT / "tests" / "data" / "traces" / "onerank"
TARGET = 0.03
FLUSH_BYTES = 512 * 2**20
CANDIDATES = (
    "uniform, L2 cold",
    "uniform, L2 warm",
    "zeros, L2 cold",
    "normal 0.02, L2 cold",
    "normal A 1 / B 0.02, L2 cold",
    "uniform, after 1 ms idle",
    "uniform, back to back",
)
"""The first is what maestro's replay does today (uniform data; a busy block flushes L2)."""
MAESTRO_DATA = {"maestro, data uniform": {}, "maestro, data_std 0.02": {"data_std": 0.02}}
RUN_TIMEOUT_S = 300


def traced_gemms(trace: Path) -> tuple[list[dict[str, Any]], Any]:
    """Each GEMM block of the imported step: name, params, dtype, traced µs and kernel; and
    the imported suite."""
    from userbenchmark.maestro.core.replay.emit import build_suite
    from userbenchmark.maestro.core.replay.importer import import_traces

    suite = build_suite(import_traces([str(trace)]), name="step")
    gemms = [
        {
            "name": b.name,
            "spec": b,
            "traced_us": b.traced_us,
            "traced_kernel": b.traced_kernel or "",
        }
        for b in suite.patterns[0].blocks
        if b.op == "gemm"
    ]
    return gemms, suite


def _block(spec: Any) -> Any:
    """maestro's gemm block for ``spec`` on the current CUDA device, set up."""
    import torch

    from userbenchmark.maestro.blocks.base import BlockContext
    from userbenchmark.maestro.blocks.compute import Gemm
    from userbenchmark.maestro.blocks.dtypes import torch_dtype

    ctx = BlockContext(
        rank=0, device=torch.device("cuda"), dtype=torch_dtype(spec.dtype), team=(0,)
    )
    block = Gemm(spec, ctx)
    block.setup()
    return block


def _fill(block: Any, candidate: str) -> None:
    """The block's operands as the candidate wants them."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(1234)
    std = {"normal 0.02": (0.02, 0.02), "normal A 1": (1.0, 0.02)}
    for key, (std_a, std_b) in std.items():
        if candidate.startswith(key):
            block.a.normal_(0.0, std_a, generator=gen)
            block.b.normal_(0.0, std_b, generator=gen)
            return
    for operand in (block.a, block.b):
        if candidate.startswith("zeros"):
            operand.zero_()
        else:
            operand.uniform_(-1.0, 1.0, generator=gen)


def measure(gemms: list[dict[str, Any]], reps: int, trace_path: Path) -> dict:
    """{(gemm, candidate): (device µs of each rep, kernel names)}, from one profiler run."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    blocks = [_block(g["spec"]) for g in gemms]
    keep = [b.a.clone() for b in blocks]
    torch.cuda._sleep(200_000_000)  # clocks up before anything is timed
    for block in blocks:
        for _ in range(3):
            block.launch()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for ci, candidate in enumerate(CANDIDATES):
            for gi, block in enumerate(blocks):
                _fill(block, candidate)
                keep[gi].copy_(block.a)
                for _ in range(reps):
                    if "cold" in candidate or "idle" in candidate:
                        flush.zero_()
                    if "warm" in candidate:
                        block.a.copy_(keep[gi])  # A's lines in L2, as a previous kernel left them
                    if "idle" in candidate:
                        torch.cuda.synchronize()
                        time.sleep(1e-3)
                    with record_function(f"gap|{gi}|{ci}"):
                        block.launch()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_path))
    return _attribute(trace_path)


def _attribute(path: Path) -> dict:
    """Device time and kernels of each annotated launch, read with maestro's trace reader."""
    from userbenchmark.maestro.core.replay.kineto import read_trace

    trace = read_trace(path)
    acts = trace.activities
    calls = sorted((c.ts, c.tid, c.corr) for c in trace.launches.values())
    times = [c[0] for c in calls]
    out: dict = defaultdict(lambda: ([], Counter()))
    for span in trace.annotations:
        if not span.name.startswith("gap|"):
            continue
        _, gi, ci = span.name.split("|")
        lo, hi = bisect.bisect_left(times, span.ts), bisect.bisect_right(times, span.end)
        work = [a for _, tid, corr in calls[lo:hi] if tid == span.tid for a in acts.get(corr, ())]
        if work:
            us, names = out[(int(gi), CANDIDATES[int(ci)])]
            us.append(sum(a.end - a.ts for a in work))
            names[max(work, key=lambda a: a.end - a.ts).name] += 1
    return dict(out)


def maestro_ratios(suite: Any, tmp: Path, iters: int) -> dict[str, dict[str, float]]:
    """{variant: {gemm block: replayed / traced}} from maestro's own replay of the step, its
    GEMMs with each variant's data parameters."""
    out = {}
    for variant, data in MAESTRO_DATA.items():
        step = tmp / f"{variant.split()[-1]}.yaml"
        step.write_text(with_op_params(suite, "gemm", data))
        out_dir = tmp / f"out-{variant.split()[-1]}"
        args = ["run", "-c", str(step), "--iters", str(iters), "--warmup-iters", "10"]
        args += ["--no-baseline", "--no-metrics", "--output-dir", str(out_dir)]
        proc = subprocess.run(
            [sys.executable, "-m", "userbenchmark.maestro", *args],
            cwd=REPO_ROOT, env=maestro_env(), capture_output=True, text=True,
            timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"maestro {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
        records = json.loads((out_dir / "results.json").read_text())
        out[variant] = {r["block"]: r["replay_ratio"] for r in records if r["op"] == "gemm"}
    return out


def word_difference(traced: str, replayed: str) -> str:
    """The words (``_``-separated: tile, layout, epilogue) each kernel's name has and the other's
    lacks: 'same' for one kernel, 'unknown' where either name is."""
    if not traced or not replayed:
        return "unknown"
    ours, theirs = replayed.split("_"), traced.split("_")
    only = [
        f"{who} {', '.join(w for w in words if w not in other)}"
        for who, words, other in (("replayed", ours, theirs), ("traced", theirs, ours))
        if any(w not in other for w in words)
    ]
    return "; ".join(only) or ("same" if traced == replayed else "same words, other order")


def report(gemms: list[dict[str, Any]], measured: dict, maestro: dict) -> str:
    """Per GEMM the ratio under each candidate, then per candidate how many are within 3 %."""
    ratios: dict[str, list[float]] = defaultdict(list)
    rows, kernels = [], []
    for gi, g in enumerate(gemms):
        p = g["spec"].params
        shape = f"{p['m']}x{p['n']}x{p['k']}" + "".join(
            f" {k[0].upper()}T" for k in ("a_transposed", "b_transposed") if p.get(k)
        )
        row: list[Any] = [g["name"], shape, g["traced_us"]]
        for candidate in CANDIDATES:
            us, _ = measured.get((gi, candidate), ([], Counter()))
            value = statistics.median(us) / g["traced_us"] if us else None
            row.append(value)
            if value is not None:
                ratios[candidate].append(value)
        for variant in maestro:
            value = maestro[variant].get(g["name"])
            row.append(value)
            if value is not None:
                ratios[variant].append(value)
        rows.append(row)
        _, names = measured.get((gi, CANDIDATES[0]), ([], Counter()))
        replayed = names.most_common(1)[0][0] if names else ""
        difference = word_difference(g["traced_kernel"], replayed)
        kernels.append([g["name"], g["traced_kernel"], replayed, difference])
    summary = [
        [
            name,
            len(vals),
            sum(abs(v - 1) <= TARGET + 1e-12 for v in vals),
            sum(abs(v - 1) <= 0.05 + 1e-12 for v in vals),
            statistics.fmean(vals),
            min(vals),
            max(vals),
        ]
        for name, vals in ratios.items()
        if vals
    ]
    return "\n\n".join(
        [
            "## Replayed / traced per GEMM (median of the reps; 1 = the traced duration)",
            markdown_table(["block", "m x n x k", "traced µs", *CANDIDATES, *maestro], rows),
            f"## Per candidate: GEMMs within {TARGET:.0%} and 5 % of the traced duration",
            markdown_table(
                ["candidate", "GEMMs", f"within {TARGET:.0%}", "within 5 %", "mean", "min", "max"],
                summary,
            ),
            "## Kernel chosen (uniform data, L2 cold) against the traced one",
            markdown_table(["block", "traced kernel", "replayed kernel", "difference"], kernels),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10, help="launches per GEMM and candidate")
    parser.add_argument("--iters", type=int, default=50, help="iterations of each maestro run")
    parser.add_argument("--trace", type=Path, default=TRACE, help="folder of a one-rank trace")
    parser.add_argument("--no-maestro", action="store_true", help="skip maestro's own replays")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    info = machine_info()
    import torch

    if not torch.cuda.is_available():
        print("gemm_gap_gpu: no CUDA device; nothing measured (run it on a GPU machine)")
        return 0
    info["gpu"] = torch.cuda.get_device_name(0)
    gemms, suite = traced_gemms(args.trace)
    with tempfile.TemporaryDirectory() as tmp:
        measured = measure(gemms, args.reps, Path(tmp) / "profile.json")
        try:
            maestro = {} if args.no_maestro else maestro_ratios(suite, Path(tmp), args.iters)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"gemm_gap_gpu: {exc}", file=sys.stderr)
            maestro = {}
    print(f"# The GEMM gap of a replayed one-rank step ({args.trace})\n")
    print(machine_lines(info) + "\n")
    print(report(gemms, measured, maestro))
    rows = {
        f"{g['name']}|{c}": measured.get((i, c), ([], Counter()))[0]
        for i, g in enumerate(gemms)
        for c in CANDIDATES
    }
    write_json(args.json, {"machine": info, "device_us": rows, "maestro": maestro})
    return 0


if __name__ == "__main__":
    sys.exit(main())
