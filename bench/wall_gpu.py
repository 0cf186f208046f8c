"""Where a GPU run's wall time goes: maestro's whole run against the GPU work it times.

Each figure is one fresh ``python -m userbenchmark.maestro`` process, timed from its start to
its exit, as a user would run it (the process start, torch's import and CUDA's start included):

1. the noise bench's file (``bench/noise_gpu.py``: 11 one-block patterns of 220 iterations,
   baseline on) under ``--profiler events``, then under ``--profiler cupti`` (the default),
   then again under events (the baseline measured on both sides of the run it judges). Targets:
   cupti within 1.3x of the mean of the two events runs, and under 20 s. ``run.json`` gives
   CUPTI's records per measured iteration and which API calls it recorded;
2. the shipped one-rank trace (``tests/data/traces/onerank``) imported and replayed, 20
   iterations, baseline on: target under 20 s for import and run together;
3. each ``--multi-rank DIR`` (a folder of ``rank<r>.json.gz``, e.g. the FSDP2 2-rank and TP x DP
   4-rank traces) imported and replayed at its world size with ``--nproc`` (ranks sharing the
   GPU need NCCL 2.30.7 or newer with ``NCCL_MULTI_RANK_GPU_ENABLE=1``; ``NCCL_MAX_CTAS=2``
   unless set, see docs/multi-gpu.md), baseline and ``--check`` on: target under 90 s each, and
   every rank's step reported (``replay_by_rank`` in the pattern record).

Prints markdown tables; ``--json FILE`` keeps the figures. Exits 0 with a message without CUDA,
1 when a run fails or a target is missed. Run from the repository root::

    python -m bench.wall_gpu [--multi-rank DIR ...] [--json wall.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import (
    REPO_ROOT,
    machine_info,
    machine_lines,
    maestro_env,
    markdown_table,
    write_json,
)
from bench.noise_gpu import pattern_text

NOISE_ITERS = 200
ONE_RANK_TRACE = REPO_ROOT / "tests" / "data" / "traces" / "onerank"
REPLAY_ITERS = 20
TARGETS = {"cupti_over_events": 1.3, "noise_cupti_s": 20.0, "one_rank_s": 20.0, "multi_s": 90.0}
RUN_TIMEOUT_S = 600


def timed(args: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall seconds of ``python -m userbenchmark.maestro ARGS`` and its stderr's last lines."""
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "userbenchmark.maestro", *args],
        cwd=REPO_ROOT,
        env={**maestro_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    wall_s = time.monotonic() - began
    if proc.returncode != 0:
        raise RuntimeError(
            f"maestro {' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
        )
    return wall_s, proc.stderr[-2000:]


def noise_file_runs(tmp: Path) -> dict[str, Any]:
    """The noise bench's file under events, cupti, events: wall times and CUPTI's figures."""
    config = tmp / "noise.yaml"
    config.write_text(pattern_text(NOISE_ITERS))
    out: dict[str, Any] = {"events_s": []}
    for i, profiler in enumerate(("events", "cupti", "events")):
        folder = tmp / f"noise_{i}_{profiler}"
        args = ["run", "-c", str(config), "--profiler", profiler, "--no-metrics"]
        wall_s, _ = timed([*args, "--output-dir", str(folder)])
        if profiler == "cupti":
            environ = json.loads((folder / "run.json").read_text())
            out["cupti_s"] = wall_s
            out["records_per_iteration"] = environ.get("cupti_records_per_iteration", "-")
            out["api_records"] = environ.get("cupti_api_records", "-")
        else:
            out["events_s"].append(wall_s)
    out["events_mean_s"] = sum(out["events_s"]) / len(out["events_s"])
    out["ratio"] = out["cupti_s"] / out["events_mean_s"]
    return out


def replay_run(trace: Path, tmp: Path, *, nproc: int | None, check: bool) -> dict[str, Any]:
    """``trace`` imported, then replayed (baseline on): wall times and every rank's step."""
    step = tmp / f"{trace.name}.yaml"
    import_s, _ = timed(["import-trace", str(trace), "-o", str(step)])
    folder = tmp / f"replay_{trace.name}"
    args = ["run", "-c", str(step), "--iters", str(REPLAY_ITERS), "--no-metrics"]
    args += ["--output-dir", str(folder)] + (["--check"] if check else [])
    env = None
    if nproc is not None:
        args += ["--nproc", str(nproc)]
        env = {"NCCL_MAX_CTAS": os.environ.get("NCCL_MAX_CTAS", "2")}
    run_s, _ = timed(args, env)
    (pattern,) = json.loads((folder / "patterns.json").read_text())
    steps = json.loads(pattern.get("replay_by_rank") or "[]")
    blocks = json.loads((folder / "results.json").read_text())
    return {
        "trace": str(trace),
        "ranks": nproc or 1,
        "blocks": len({b["block"] for b in blocks}),
        "import_s": import_s,
        "run_s": run_s,
        "total_s": import_s + run_s,
        "rank_steps": steps,
        "every_rank_step": len(steps) == (nproc or 1)
        and all(s["replayed_us"] is not None for s in steps),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multi-rank", nargs="*", default=[], type=Path, metavar="DIR")
    parser.add_argument(
        "--multi-rank-only", action="store_true", help="only the --multi-rank replays (3.)"
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench.wall_gpu: no CUDA device; nothing measured")
        return 0
    info = machine_info()
    info["device"] = torch.cuda.get_device_name(0)
    print(machine_lines(info), "\n")
    missed = []
    with tempfile.TemporaryDirectory(prefix="maestro-wall-") as tmp_name:
        tmp = Path(tmp_name)
        single = not args.multi_rank_only
        noise = noise_file_runs(tmp) if single else None
        one = replay_run(ONE_RANK_TRACE, tmp, nproc=None, check=False) if single else None
        multi = []
        for trace in args.multi_rank:
            world = len(list(trace.glob("rank*.json*")))
            multi.append(replay_run(trace, tmp, nproc=world, check=True))
    rows = [] if noise is None or one is None else [
        ["noise file, --profiler events (two runs)", " / ".join(f"{s:.1f}" for s in noise["events_s"]), "-", "baseline"],
        ["noise file, --profiler cupti", f"{noise['cupti_s']:.1f}", f"{noise['ratio']:.2f}x events", f"< {TARGETS['noise_cupti_s']:.0f} s and < {TARGETS['cupti_over_events']}x events"],
        ["one-rank trace: import + replay", f"{one['import_s']:.1f} + {one['run_s']:.1f}", f"{one['blocks']} blocks", f"< {TARGETS['one_rank_s']:.0f} s"],
    ]  # fmt: skip
    if noise is not None and (
        noise["ratio"] > TARGETS["cupti_over_events"] or noise["cupti_s"] > TARGETS["noise_cupti_s"]
    ):
        missed.append("noise file under cupti")
    if one is not None and one["total_s"] > TARGETS["one_rank_s"]:
        missed.append("one-rank replay")
    for m in multi:
        rows.append(
            [f"{Path(m['trace']).name}: import + replay at {m['ranks']} ranks, --check",
             f"{m['import_s']:.1f} + {m['run_s']:.1f}",
             f"{m['blocks']} blocks, every rank's step: {'yes' if m['every_rank_step'] else 'no'}",
             f"< {TARGETS['multi_s']:.0f} s"]
        )  # fmt: skip
        if m["total_s"] > TARGETS["multi_s"] or not m["every_rank_step"]:
            missed.append(Path(m["trace"]).name)
    print(markdown_table(["run", "wall s", "figure", "target"], rows))
    if noise is not None:
        print(
            f"\nCUPTI: {noise['records_per_iteration']} records per measured iteration; "
            f"API records: {noise['api_records']}"
        )
    if args.json:
        write_json(args.json, {"machine": info, "noise": noise, "one_rank": one, "multi": multi})
    if missed:
        print(f"\nmissed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
