"""Replay fidelity on one CUDA GPU: a real one-rank training step, imported and replayed.

Imports ``tests/data/traces/onerank`` (4 x (LayerNorm + MLP, d 2048), bf16, AdamW, traced on
an H200; its README says how) with ``import-trace``, runs the file with maestro eager and under
CUDA graphs (``--graph``; profiler ``auto``: CUPTI where cupti-python works), and prints as
markdown, each replayed figure over its traced one with the 95 % interval of the replayed mean
(the trace is one sample):

- the step (makespan), target within 3 %;
- each GEMM, target within 3 %, and, for a trace of several active steps
  (``bench/attention_trace_gpu.py --active N``), how many GEMMs replay inside the range their
  traced durations had over the steps (``traced_min_us`` to ``traced_max_us``);
- the ``busy`` stand-ins of the other kernels (no target: their duration is the traced one);
- launch-bound iterations (``host_late_iters``, target 0) and maestro's host enqueue per block
  (``enqueue_avg_us``), eager against graphs;
- each GEMM's traced kernel (``traced_kernel``), and the GEMMs' errors apart for those a
  collective ran beside in the trace (``traced_overlap``) and the others.

``--trace`` takes several folders (the shipped one-rank trace, and one of
``bench/attention_trace_gpu.py``): each is imported and replayed, and reported in turn.

A figure is "within" its target when |ratio - 1| is at most the target, "outside" only when the
whole interval is beyond it, else "within noise of the target". Two maestro runs of 60
iterations of an 11.6 ms step each, plus their start-up. Exits 0 with a message without CUDA;
1 when a figure is outside its target, an iteration was launch-bound, or a run fails.

Run: ``python bench/replay_gpu.py --json replay.json`` (or ``python -m bench.replay_gpu``).
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
    os.execve(sys.executable, [sys.executable, "-m", "bench.replay_gpu", *sys.argv[1:]], _env)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
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
MODES = {"eager": (), "graph": ("--graph",)}
STEP_TARGET = 0.03
GEMM_TARGET = 0.03
RUN_TIMEOUT_S = 300


def maestro(args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "userbenchmark.maestro", *args]
    return subprocess.run(
        cmd, cwd=REPO_ROOT, env=maestro_env(), capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S,
    )  # fmt: skip


def replay(step: Path, out: Path, extra: tuple[str, ...], iters: int, warmup: int) -> dict:
    """One maestro run of the imported step: its block and pattern records, and its time."""
    args = ["run", "-c", str(step), "--iters", str(iters), "--warmup-iters", str(warmup)]
    args += ["--no-baseline", "--no-metrics", "--output-dir", str(out), *extra]
    began = time.monotonic()
    proc = maestro(args)
    if proc.returncode != 0:
        raise RuntimeError(f"maestro {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
    blocks = json.loads((out / "results.json").read_text())
    (pattern,) = json.loads((out / "patterns.json").read_text())
    return {"blocks": blocks, "pattern": pattern, "wall_s": time.monotonic() - began}


def ratio_of(record: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(replayed / traced, low, high) of a block or pattern record (None where unknown)."""
    return tuple(
        record.get(k) for k in ("replay_ratio", "replay_ratio_ci_low", "replay_ratio_ci_high")
    )


def verdict(record: dict[str, Any], target: float) -> str:
    """``within``, ``outside`` (the whole interval beyond the target) or ``within noise``."""
    ratio, low, high = ratio_of(record)
    if ratio is None:
        return "-"
    if abs(ratio - 1) <= target + 1e-12:  # 0.97 is within 3 % in binary too
        return "within"
    if low is not None and (low > 1 + target or high < 1 - target):
        return "outside"
    return "within noise of the target"


def figure(record: dict[str, Any]) -> str:
    """``1.012 [1.008, 1.016]``: replayed / traced and its interval."""
    ratio, low, high = ratio_of(record)
    if ratio is None:
        return "-"
    return f"{ratio:.3f} [{low:.3f}, {high:.3f}]" if low is not None else f"{ratio:.3f}"


def step_rows(runs: dict[str, dict]) -> list[list[Any]]:
    rows = []
    for mode, run in runs.items():
        p = run["pattern"]
        rows.append([f"{mode} ({p['profiler']})", p["traced_us"], p["makespan_avg_us"]])
        rows[-1] += [figure(p), verdict(p, STEP_TARGET), p["host_late_iters"]]
        rows[-1] += [p["gate_spin_us"], p["enqueue_max_us"], run["wall_s"]]
    return rows


def block_rows(
    runs: dict[str, dict], op: str, target: float | None, kernels: dict[str, str] | None = None
) -> list[list[Any]]:
    """Per block of ``op``: traced (and its kernel, with ``kernels``), then per mode replayed,
    ratio [interval] and verdict."""
    by_mode = {
        m: {b["block"]: b for b in run["blocks"] if b["op"] == op} for m, run in runs.items()
    }
    rows = []
    for name, first in next(iter(by_mode.values())).items():
        row: list[Any] = [name, first["work"] or "-", first["traced_us"]]
        if kernels is not None:  # the traced kernel, and the replayed one where it differs
            replayed = first.get("kernel") or ""
            traced = kernels.get(name) or "-"
            row.append(traced if replayed in ("", traced) else f"{traced}; replayed {replayed}")
        for mode in runs:
            b = by_mode[mode][name]
            row += [b["latency_avg_us"], figure(b)]
            row += [verdict(b, target)] if target is not None else []
        rows.append(row)
    return rows


def enqueue_rows(runs: dict[str, dict]) -> list[list[Any]]:
    """Per op: maestro's host enqueue per block (mean and largest of the blocks' means)."""
    rows = []
    for op in sorted({b["op"] for run in runs.values() for b in run["blocks"]}):
        row: list[Any] = [op]
        for run in runs.values():
            us = [b["enqueue_avg_us"] for b in run["blocks"] if b["op"] == op]
            us = [u for u in us if u is not None]
            row += [statistics.fmean(us) if us else None, max(us) if us else None]
        rows.append(row)
    return rows


def overlap_rows(runs: dict[str, dict], overlaps: dict[str, float | None]) -> list[list[Any]]:
    """Per mode, the GEMMs' errors apart: overlapped a collective in the trace, or ran alone."""
    from userbenchmark.maestro.core.replay.fidelity import error_groups

    rows = []
    for mode, run in runs.items():
        gemms = [b for b in run["blocks"] if b["op"] == "gemm"]
        ratios = [b["replay_ratio"] if b["replay_ratio"] is not None else math.nan for b in gemms]
        for group in error_groups(ratios, [overlaps.get(b["block"]) for b in gemms]):
            rows.append([mode, group.name, group.count, group.within, group.mean_error])
            rows[-1].append(group.max_error)
    return rows


def range_rows(runs: dict[str, dict], specs: dict[str, Any]) -> list[list[Any]]:
    """Per mode: the GEMMs whose traced durations have a range, and how many replay inside it."""
    ranged = {
        n: (s.traced_min_us, s.traced_max_us)
        for n, s in specs.items()
        if s.op == "gemm" and s.traced_min_us is not None
    }
    rows = []
    for mode, run in runs.items():
        avg = {b["block"]: b["latency_avg_us"] for b in run["blocks"] if b["block"] in ranged}
        inside = sum(ranged[n][0] <= us <= ranged[n][1] for n, us in avg.items())
        run["gemms_inside_traced_range"] = [inside, len(ranged)]
        rows.append([mode, len(ranged), inside])
    return rows


def report(runs: dict[str, dict], specs: dict[str, Any] | None = None) -> tuple[str, bool]:
    """The markdown report, and whether every figure with a target is not outside it;
    ``specs`` (block name -> its spec) adds traced kernels and the overlap split."""
    specs = specs or {}
    modes = list(runs)
    steps = step_rows(runs)
    kernels = {name: spec.traced_kernel for name, spec in specs.items()}
    gemms = block_rows(runs, "gemm", GEMM_TARGET, kernels)
    busy = block_rows(runs, "busy", None)
    parts = [
        f"## Step (makespan), target within {STEP_TARGET:.0%}",
        markdown_table(
            [
                "mode (profiler)",
                "traced µs",
                "replayed µs",
                "replayed / traced [95 %]",
                "verdict",
                "launch-bound iterations (target 0)",
                "gate spin µs",
                "max enqueue µs",
                "run s",
            ],
            steps,
        ),
        f"## GEMMs, target within {GEMM_TARGET:.0%}",
        markdown_table(
            ["block", "work", "traced µs", "traced kernel"]
            + [h for m in modes for h in (f"{m} µs", f"{m} ratio [95 %]", f"{m} verdict")],
            gemms,
        ),
        "## GEMMs apart: a collective ran beside them in the trace, or they ran alone",
        markdown_table(
            ["mode", "group", "GEMMs", f"within {GEMM_TARGET:.0%}", "mean error", "max error"],
            overlap_rows(runs, {n: s.traced_overlap for n, s in specs.items()}),
        ),
        "## GEMMs inside their traced range (min to max over the traced steps)",
        markdown_table(["mode", "GEMMs with a range", "inside"], range_rows(runs, specs)),
        "## busy stand-ins (the other kernels; no target)",
        markdown_table(
            ["block", "work", "traced µs"] + [h for m in modes for h in (f"{m} µs", f"{m} ratio")],
            busy,
        ),
        "## Host enqueue per block (enqueue_avg_us, µs)",
        markdown_table(
            ["op"] + [h for m in modes for h in (f"{m} mean", f"{m} largest")], enqueue_rows(runs)
        ),
    ]
    verdicts = [row[4] for row in steps] + [c for row in gemms for c in row if c == "outside"]
    late = any(row[5] for row in steps)
    return "\n\n".join(parts), "outside" not in verdicts and not late


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup-iters", type=int, default=10)
    parser.add_argument(
        "--trace",
        type=Path,
        nargs="+",
        default=[TRACE],
        help="folders of one-rank traces, each imported and replayed",
    )
    parser.add_argument(
        "--modes", nargs="+", choices=tuple(MODES), default=list(MODES), help="eager and/or graph"
    )
    parser.add_argument(
        "--gemm-data-std",
        type=float,
        default=None,
        help="replay every GEMM with this data_std (normal operands) instead of the import's",
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    info = machine_info()
    import torch

    if not torch.cuda.is_available():
        print("replay_gpu: no CUDA device; nothing measured (run it on a GPU machine)")
        return 0
    info["gpu"] = torch.cuda.get_device_name(0)
    print(machine_lines(info) + "\n")
    results, ok = {}, True
    for trace in args.trace:
        try:
            text, fine, runs = replay_trace(trace, args)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"replay_gpu: {trace}: {exc}", file=sys.stderr)
            return 1
        print(f"# Replay of a one-rank training step ({trace})\n\n{text}\n")
        results[str(trace)], ok = runs, ok and fine
    write_json(args.json, {"machine": info, "runs": results, "within_targets": ok})
    return 0 if ok else 1


def replay_trace(trace: Path, args: argparse.Namespace) -> tuple[str, bool, dict]:
    """Import ``trace``, replay it in each mode: (the report, its verdict, the runs)."""
    from userbenchmark.maestro.core.config.loader import load_suite

    with tempfile.TemporaryDirectory() as tmp:
        step = Path(tmp) / "step.yaml"
        proc = maestro(["import-trace", str(trace), "-o", str(step)])
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr)
        if args.gemm_data_std is not None:
            text = with_op_params(load_suite(step), "gemm", {"data_std": args.gemm_data_std})
            step = step.with_name("step_data.yaml")
            step.write_text(text)
        specs = {b.name: b for b in load_suite(step).patterns[0].blocks}
        runs = {
            mode: replay(step, Path(tmp) / mode, extra, args.iters, args.warmup_iters)
            for mode, extra in MODES.items()
            if mode in args.modes
        }
    text, ok = report(runs, specs)
    return f"{proc.stdout.strip()}\n\n{text}", ok, runs


if __name__ == "__main__":
    sys.exit(main())
