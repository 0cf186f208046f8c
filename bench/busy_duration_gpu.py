"""Does ``busy`` take its asked time on the device, as CUPTI (the default profiler, and the
profiler of the traces that import-trace replays) measures it? On one CUDA GPU.

One pattern per asked duration and mode (eager, CUDA graph): a ``busy`` block alone, and after a
4096^3 GEMM on its lane (as a replayed stand-in runs, behind other work). maestro runs them with
``--profiler cupti --trace``; per pattern the table gives the reported latency over the asked
duration, the kernels per block, their mean CUPTI duration and the mean gap between them (from
the rank's trace). Target: blocks of 50 µs and more within 3 % (a replayed step's stand-ins).

Run: ``python bench/busy_duration_gpu.py --json busy_duration.json`` (about 30 s on one H200).
Exits 0 with a message without CUDA; exits 1 when a block of 50 µs or more is outside 3 %.
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
    os.execve(
        sys.executable, [sys.executable, "-m", "bench.busy_duration_gpu", *sys.argv[1:]], _env
    )

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from collections import defaultdict  # noqa: E402
from typing import Any  # noqa: E402

from ._common import REPO_ROOT, machine_info, maestro_env, markdown_table, write_json  # noqa: E402

DURATIONS_US = (10, 20, 32, 45, 57, 100, 200, 500)
AFTER_GEMM_US = (32, 57, 200)
TARGET = 0.03
"""Blocks of TARGET_FROM_US and more must take their asked time within this part."""
TARGET_FROM_US = 50.0


def pattern_yaml(iters: int) -> str:
    """The pattern file: busy alone per duration, and after a GEMM, each eager and graphed."""
    return f"""name: busy_duration
world_size: 1
defaults: {{dtype: bf16, warmup_iters: 10, iters: {iters}, baseline: false}}
patterns:
  - name: alone
    sweep: {{d: {list(DURATIONS_US)}, mode: [false, true]}}
    graph: "${{mode}}"
    blocks:
      - {{name: busy, op: busy, duration_us: "${{d}}"}}
  - name: after_gemm
    sweep: {{d: {list(AFTER_GEMM_US)}, mode: [false, true]}}
    graph: "${{mode}}"
    blocks:
      - {{name: mm, op: gemm, m: 4096, n: 4096, k: 4096}}
      - {{name: busy, op: busy, duration_us: "${{d}}", after: mm}}
"""


def busy_kernels(trace: dict[str, Any]) -> dict[str, list[list[tuple[float, float]]]]:
    """Per pattern, each iteration's busy kernels as sorted (start, duration) in µs."""
    found: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        args = e.get("args", {})
        if e.get("ph") == "X" and "stream" in args and args.get("block") == "busy":
            found[(args["pattern"], args["pattern_iteration"])].append((e["ts"], e["dur"]))
    per_pattern: dict[str, list[list[tuple[float, float]]]] = defaultdict(list)
    for (pattern, _), kernels in found.items():
        per_pattern[pattern].append(sorted(kernels))
    return per_pattern


def rows_of(records: list[dict[str, Any]], trace: dict[str, Any]) -> list[list[Any]]:
    """One row per busy block: pattern, asked, latency, ratio, kernels, kernel and gap means."""
    kernels = busy_kernels(trace)
    rows = []
    for r in records:
        if r["block"] != "busy":
            continue
        asked = float(re.search(r"d=([\d.]+)", r["pattern"]).group(1))
        its = kernels.get(r["pattern"], [])
        durations = [d for it in its for _, d in it]
        gaps = [b[0] - (a[0] + a[1]) for it in its for a, b in itertools.pairwise(it)]
        ratio = r["latency_avg_us"] / asked
        rows.append([
            r["pattern"], asked, r["latency_avg_us"], ratio,
            len(durations) / max(1, len(its)),
            statistics.fmean(durations) if durations else None,
            statistics.fmean(gaps) if gaps else None,
            "-" if asked < TARGET_FROM_US else ("yes" if abs(ratio - 1) <= TARGET else "NO"),
        ])  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    info = machine_info()
    import torch

    if not torch.cuda.is_available():
        print("busy_duration_gpu: no CUDA device; nothing measured (run it on a GPU machine)")
        return 0
    info["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        config, out = Path(tmp) / "busy_duration.yaml", Path(tmp) / "out"
        config.write_text(pattern_yaml(args.iters), encoding="utf-8")
        cmd = [sys.executable, "-m", "userbenchmark.maestro", "run", "-c", str(config),
               "--profiler", "cupti", "--trace", "--output-dir", str(out), "--no-metrics"]  # fmt: skip
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=maestro_env(), capture_output=True, text=True)
        if proc.returncode:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            return proc.returncode
        records = json.loads((out / "results.json").read_text())
        trace = json.loads((out / "traces" / "rank0.json").read_text())
    rows = rows_of(records, trace)
    headers = ["pattern", "asked µs", "latency µs (CUPTI)", "ratio", "kernels", "kernel µs",
               "gap µs", f"within {TARGET:.0%} (from {TARGET_FROM_US:.0f} µs)"]  # fmt: skip
    print(markdown_table(headers, rows))
    write_json(args.json, {"machine": info, "headers": headers, "rows": rows})
    return 1 if any(row[-1] == "NO" for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
