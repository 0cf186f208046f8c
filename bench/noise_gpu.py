"""The smallest change maestro's A/B verdicts find on one GPU, at 5 % false alarms or fewer.

One pattern file holds a bf16 GEMM and a 1-rank all_gather (a device copy) at 200 iterations,
each unchanged (``d0``) and made larger by known steps: the GEMM's m by 0.78 %, 1.6 %, 3.1 % and
6.3 %, the all_gather's size by 0.5 %, 1 %, 2 %, 3 % and 6 %. ``--runs R`` runs of that file
give R - 1 back-to-back pairs; each pair compares run i's ``d0`` with run i+1's ``d0`` (identical:
a verdict is a false alarm) and with its larger variants (a regression of the average or median
latency is a detection), with the default floors (5 %), a 2 % floor, and no fixed floor (the
noise model alone: the margin and the spread of each run's window means). Prints a markdown table and the smallest step found in 95 % of pairs or more. Each run
measures 11 one-block patterns of 220 iterations: 50-70 s a run on an H200 (2026-12-02), so 21
runs take longer than one sitting may allow. ``--keep DIR`` saves each run's metrics there as it
finishes and first reads the runs already in DIR: call it again to add runs, ``--runs 0`` to
report on what DIR holds. Run from the repository root on one GPU (torch with CUDA;
cupti-python for the default profiler)::

    python -m bench.noise_gpu [--runs 21] [--keep DIR] [--json out.json]

Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench._common import machine_info, machine_lines, maestro_env, markdown_table, write_json
from userbenchmark.maestro.core.output.compare import load_metrics
from userbenchmark.maestro.core.output.metric_keys import judge_all, readings

GEMM_M = 8192
GEMM_STEPS = (0, 64, 128, 256, 512)  # m + this: 0, 0.78, 1.56, 3.13, 6.25 %
GATHER_BYTES = 64 * 2**20
GATHER_STEPS = (0.0, 0.005, 0.01, 0.02, 0.03, 0.06)
FLOORS = {
    "5 % floor (default)": None,
    "2 % floor": {"latency_avg_us": 0.02, "latency_p50_us": 0.02},
    "no fixed floor": {"latency_avg_us": 0.0, "latency_p50_us": 0.0},
}


def pattern_text(iters: int) -> str:
    lines = [
        "name: noise_gpu",
        "world_size: 1",
        f"defaults: {{dtype: bf16, warmup_iters: 20, iters: {iters}}}",
        "patterns:",
    ]
    for step in GEMM_STEPS:
        lines += [
            f"  - name: gemm_d{step}",
            f"    blocks: [{{name: mm, op: gemm, m: {GEMM_M + step}, n: 4096, k: 4096}}]",
        ]
    for step in GATHER_STEPS:
        size = 2 * round(GATHER_BYTES * (1 + step) / 2)  # whole bf16 elements
        lines += [
            f"  - name: ag_d{round(step * 1000)}",
            f"    blocks: [{{name: ag, op: all_gather, size: {size}}}]",
        ]
    return "\n".join(lines) + "\n"


def run_once(config: Path, out: Path) -> dict[str, float]:
    command = [sys.executable, "-m", "userbenchmark.maestro", "run", "-c", str(config)]
    command += ["--output-dir", str(out), "--no-metrics"]
    proc = subprocess.run(command, env=maestro_env(), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"maestro exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return load_metrics(out)


def pattern_metrics(metrics: dict[str, float], pattern: str) -> dict[str, float]:
    """One pattern's keys, renamed to a common pattern name so that two patterns compare."""
    prefix = f"noise_gpu/{pattern}/"
    return {
        f"noise_gpu/p/{k[len(prefix) :]}": v for k, v in metrics.items() if k.startswith(prefix)
    }


def flagged(
    a: dict[str, float], b: dict[str, float], floors: dict[str, float] | None, identical: bool
) -> bool:
    """Identical patterns: any metric called regressed or improved (a false alarm); else the
    average or median latency called regressed (a detection)."""
    verdicts = judge_all(readings(a), readings(b), floors=floors)
    if identical:
        return any(j.verdict in ("regressed", "improved") for j in verdicts)
    latency = ("/latency_avg_us", "/latency_p50_us")
    return any(j.verdict == "regressed" and j.key.endswith(latency) for j in verdicts)


def tally(runs: Sequence[dict[str, float]]) -> dict[tuple[str, str], list[int]]:
    """{(op, step label): [pairs flagged under each of FLOORS]} over consecutive pairs."""
    counts: dict[tuple[str, str], list[int]] = {}
    variants = [("gemm", f"d{s}", f"+{s / GEMM_M:.2%}") for s in GEMM_STEPS]
    variants += [("ag", f"d{round(s * 1000)}", f"+{s:.1%}") for s in GATHER_STEPS]
    for a, b in zip(runs, runs[1:], strict=False):
        for op, suffix, label in variants:
            base = pattern_metrics(a, f"{op}_d0")
            other = pattern_metrics(b, f"{op}_{suffix}")
            row = counts.setdefault((op, label), [0] * len(FLOORS))
            for index, floors in enumerate(FLOORS.values()):
                row[index] += flagged(base, other, floors, suffix == "d0")
    return counts


def report(counts: dict[tuple[str, str], list[int]], pairs: int) -> str:
    """The table, then per op and floor: false alarms and the smallest step found in 95 %."""
    rows = [[op, label, *(f"{n}/{pairs}" for n in found)] for (op, label), found in counts.items()]
    headers = ["op", "change", *(f"flagged, {name}" for name in FLOORS)]
    lines = [machine_lines(machine_info()), "", markdown_table(headers, rows), ""]
    for op in dict.fromkeys(op for op, _ in counts):
        steps = [(label, found) for (o, label), found in counts.items() if o == op]
        (_, false_alarms), changed = steps[0], steps[1:]
        for index, name in enumerate(FLOORS):
            found = next((lab for lab, f in changed if f[index] >= 0.95 * pairs), "none tried")
            lines.append(
                f"- {op}, {name}: {false_alarms[index]}/{pairs} false alarms; smallest change "
                f"found in 95 % of pairs or more: {found}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="runs of the file to add (pairs + 1)")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--keep", type=Path, help="folder of run metrics: read, then added to")
    parser.add_argument("--json", help="also write the counts to this JSON file")
    args = parser.parse_args(argv)
    runs = kept_runs(args.keep, args.iters)
    if args.runs > 0:
        import torch

        if not torch.cuda.is_available():
            print("bench/noise_gpu.py needs a CUDA GPU; none here")
            return 0
    with tempfile.TemporaryDirectory(prefix="maestro-noise-gpu-") as tmp:
        config = Path(tmp) / "noise_gpu.yaml"
        config.write_text(pattern_text(args.iters))
        for index in range(args.runs):
            runs.append(run_once(config, Path(tmp) / f"run{index}"))
            if args.keep is not None:
                name = f"run{len(runs) - 1:03d}-iters{args.iters}.json"
                (args.keep / name).write_text(json.dumps(runs[-1]))
            print(f"run {index + 1}/{args.runs} done ({len(runs)} in all)", file=sys.stderr)
    if len(runs) < 2:
        print(f"bench/noise_gpu.py: {len(runs)} run(s); a pair needs 2")
        return 0
    counts = tally(runs)
    print(report(counts, len(runs) - 1))
    payload = {"machine": machine_info(), "counts": {json.dumps(k): v for k, v in counts.items()}}
    write_json(args.json, payload)
    return 0


def kept_runs(folder: Path | None, iters: int) -> list[dict[str, float]]:
    """The runs of ``iters`` iterations saved in ``folder`` (created if missing), oldest first."""
    if folder is None:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    return [json.loads(f.read_text()) for f in sorted(folder.glob(f"run*-iters{iters}.json"))]


if __name__ == "__main__":
    sys.exit(main())
