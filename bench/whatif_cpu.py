"""What-if variants measured in rounds inside one launch: do they find a change, and hold still.

CPU (default): 2 gloo ranks, a step of two lanes from the gate, a 2000 µs sleep (``critical``)
and a 1000 µs one (``other``), and three variants: ``same`` (nothing changed), ``longer_critical``
(the critical sleep 20 % longer: the step about 20 % slower) and ``longer_other`` (the other
sleep 20 % longer: the step unchanged, that lane still the shorter). Each run is one ``run`` of
the file with ``--rounds R``; its ``whatif.json`` gives each variant's change of the makespan,
95 % interval and verdict. Targets: ``longer_critical`` slower with its interval holding +20 %,
``longer_other`` and ``same`` within noise, ``same`` within noise in at least 19 of 20 runs.
Beside +20 %, the change the sleeps ask for: +400 µs over the pattern's measured makespan (the
makespan holds a fixed cost of the lanes' start and the sleeps' wake-up that the change does not
scale).

The baseline, measured in the same bench run: each question asked the way it was asked before
what-ifs, as separate processes compared with ``compare`` (the library call behind
``python -m userbenchmark.maestro compare A B --force``): the pattern alone, then the pattern
with the change (and alone again for ``same``), each with as many iterations as a what-if run
gives each side (rounds x iters); its verdict on the makespan.

``--gpu``: one rank on the GPU (figures in BENCHMARKS.md): an 8192x4096x4096
bf16 GEMM step, variants ``same`` and ``gemm_2pct`` (``m: x1.02``). Targets: ``gemm_2pct``
slower in at least 19 of 20 runs, ``same`` within noise in at least 19 of 20.

Several ``--rounds`` values each get ``--runs`` runs, taken in turns (run k of each value, the
order rotated, then run k + 1): the interval's width, the verdicts and the time per run, from
which ``run``'s default was chosen, each value under the same load. The machine's 1-minute load
average is kept beside each run: sleeps on a busy 2-core host wake late by milliseconds, which no
pairing removes. Run from the repository root::

    python -m bench.whatif_cpu [--runs 20] [--rounds 10] [--iters 20] [--json out.json]
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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import machine_info, machine_lines, maestro_env, markdown_table, write_json

HEADER = """\
name: whatif_bench
defaults: {{dtype: {dtype}, warmup_iters: {warmup}, iters: {iters}, baseline: false}}
patterns:
  - name: step
    blocks:
"""
CPU_BLOCKS = """\
      - {{name: critical, op: sleep, lane: a, duration_us: {critical}}}
      - {{name: other, op: sleep, lane: b, duration_us: {other}}}
"""
GPU_BLOCKS = """\
      - {{name: gemm, op: gemm, m: {m}, n: 4096, k: 4096}}
"""


@dataclass(frozen=True, kw_only=True)
class Variant:
    name: str
    whatif: str
    """The variant as the pattern's ``whatif:`` writes it."""
    changed: dict[str, float]
    """The block parameters of a file with the change applied (the baseline's B side)."""
    expected: str
    """The verdict a correct what-if gives."""
    asked_us: float = 0.0
    """How much longer the change makes the step by what it asks for (µs)."""


@dataclass(frozen=True, kw_only=True)
class Setup:
    blocks: str
    base: dict[str, float]
    variants: tuple[Variant, ...]
    nproc: int
    backend: str
    dtype: str


CPU = Setup(
    blocks=CPU_BLOCKS,
    base={"critical": 2000, "other": 1000},
    variants=(
        Variant(name="same", whatif="{}", changed={}, expected="within noise"),
        Variant(
            name="longer_critical",
            whatif="{critical: {duration_us: x1.2}}",
            changed={"critical": 2400},
            expected="slower",
            asked_us=400.0,
        ),
        Variant(
            name="longer_other",
            whatif="{other: {duration_us: x1.2}}",
            changed={"other": 1200},
            expected="within noise",
        ),
    ),
    nproc=2,
    backend="gloo",
    dtype="fp32",
)
GPU = Setup(
    blocks=GPU_BLOCKS,
    base={"m": 8192},
    variants=(
        Variant(name="same", whatif="{}", changed={}, expected="within noise"),
        Variant(
            name="gemm_2pct", whatif="{gemm: {m: x1.02}}", changed={"m": 8356}, expected="slower"
        ),
    ),
    nproc=1,
    backend="nccl",
    dtype="bf16",
)


def pattern_text(
    setup: Setup, args: argparse.Namespace, *, iters: int, whatif: bool, **changed: float
) -> str:
    """The step with ``changed`` block parameters, and with its ``whatif:`` variants."""
    text = HEADER.format(dtype=setup.dtype, warmup=args.warmup, iters=iters)
    text += setup.blocks.format(**setup.base | changed)
    if whatif:
        text += "    whatif:\n" + "".join(f"      {v.name}: {v.whatif}\n" for v in setup.variants)
    return text


def maestro_run(setup: Setup, text: str, folder: Path, extra: list[str]) -> Path:
    """One ``run`` of ``text`` into ``folder/out``; its --output-dir."""
    folder.mkdir(parents=True)
    config = folder / "step.yaml"
    config.write_text(text)
    command = [sys.executable, "-m", "userbenchmark.maestro", "run", "-c", str(config)]
    command += ["--nproc", str(setup.nproc), "--backend", setup.backend]
    command += ["--output-dir", str(folder / "out"), "--no-metrics", *extra]
    proc = subprocess.run(command, env=maestro_env(), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"maestro exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return folder / "out"


def whatif_run(setup: Setup, args: argparse.Namespace, rounds: int, folder: Path) -> dict:
    """One what-if run: {variant: its whatif.json record}, the pattern's makespan, wall time."""
    start, load = time.monotonic(), os.getloadavg()[0]
    text = pattern_text(setup, args, iters=args.iters, whatif=True)
    out = maestro_run(setup, text, folder, ["--rounds", str(rounds)])
    records = {r["variant"]: r for r in json.loads((out / "whatif.json").read_text())}
    return {"records": records, "wall_s": time.monotonic() - start, "load": load}


def baseline_run(setup: Setup, args: argparse.Namespace, rounds: int, folder: Path) -> dict:
    """Each change asked across processes: {variant: compare's verdict on the makespan}."""
    from userbenchmark.maestro.core.output.compare import compare_files

    iters = rounds * args.iters  # as many iterations as a what-if run gives each side
    text = pattern_text(setup, args, iters=iters, whatif=False)
    base = maestro_run(setup, text, folder / "base", [])
    verdicts = {}
    for v in setup.variants:
        text = pattern_text(setup, args, iters=iters, whatif=False, **v.changed)
        other = maestro_run(setup, text, folder / v.name, [])
        result = compare_files(base, other, force=True)
        (j,) = [j for j in result.judgements if j.key.endswith("/step/makespan_avg_us")]
        verdicts[v.name] = (
            "within noise" if j.verdict not in ("regressed", "improved") else j.verdict
        )
    return verdicts


def summarize(setup: Setup, rounds: int, runs: list[dict]) -> list[list[Any]]:
    """One table row per variant: verdicts, median change and interval width, targets met."""
    rows = []
    for v in setup.variants:
        got = [r["records"][v.name] for r in runs]
        verdicts = Counter(g["verdict"] for g in got)
        width = [g["change_ci_high_pct"] - g["change_ci_low_pct"] for g in got]
        holds20 = sum(g["change_ci_low_pct"] <= 20.0 <= g["change_ci_high_pct"] for g in got)
        asked = [100.0 * v.asked_us / g["base_makespan_avg_us"] for g in got]
        holds_asked = sum(
            g["change_ci_low_pct"] <= a <= g["change_ci_high_pct"]
            for g, a in zip(got, asked, strict=True)
        )
        baseline = Counter(r["baseline"][v.name] for r in runs if r.get("baseline"))
        rows.append(
            [
                rounds,
                v.name,
                f"{verdicts[v.expected]}/{len(got)} {v.expected}",
                ", ".join(f"{k} {n}" for k, n in sorted(verdicts.items())),
                statistics.median(g["change_pct"] for g in got),
                statistics.median(width),
                f"{holds20}/{len(got)}" if v.asked_us else "-",
                f"{holds_asked}/{len(got)} ({statistics.median(asked):.1f} %)"
                if v.asked_us
                else "-",
                ", ".join(f"{k} {n}" for k, n in sorted(baseline.items())) or "-",
                statistics.median(r["wall_s"] for r in runs),
                statistics.median(r["load"] for r in runs),
            ]
        )
    return rows


HEADERS = [
    "rounds",
    "variant",
    "expected verdict",
    "what-if verdicts",
    "median change %",
    "median 95 % interval width (points)",
    "interval holds +20 %",
    "interval holds the asked change (its median)",
    "baseline: separate processes, compare's verdicts",
    "wall s per what-if run",
    "load average (median)",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="what-if runs per rounds value")
    parser.add_argument("--rounds", type=int, nargs="+", default=[10])
    parser.add_argument("--iters", type=int, default=20, help="iterations per window")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="the GEMM step, one rank on the GPU")
    parser.add_argument("--no-baseline", action="store_true", help="skip the separate processes")
    parser.add_argument("--json", default=None, help="also write every run's records here")
    args = parser.parse_args(argv)
    setup = GPU if args.gpu else CPU
    results: dict[str, Any] = {"benchmark": "whatif_cpu", "machine": machine_info()}
    results |= {"args": vars(args), "rounds": {}}
    rows = []
    runs: dict[int, list[dict]] = {rounds: [] for rounds in args.rounds}
    with tempfile.TemporaryDirectory(prefix="maestro-whatif-") as tmp:
        for k in range(args.runs):
            for i in range(len(args.rounds)):
                rounds = args.rounds[(k + i) % len(args.rounds)]
                folder = Path(tmp) / f"r{rounds}-{k}"
                run = whatif_run(setup, args, rounds, folder / "whatif")
                if not args.no_baseline:
                    run["baseline"] = baseline_run(setup, args, rounds, folder / "baseline")
                runs[rounds].append(run)
                verdicts = ", ".join(
                    f"{name} {r['verdict']} {r['change_pct']:+.2f} %"
                    for name, r in run["records"].items()
                )
                # Each run's verdicts as it ends: a bench stopped by a time limit still says them.
                print(f"run {k + 1} of {args.runs}, rounds {rounds}: {verdicts}", file=sys.stderr)
    for rounds, done in runs.items():
        results["rounds"][str(rounds)] = done
        rows += summarize(setup, rounds, done)
    print(machine_lines(results["machine"]))
    print(f"- command: python -m bench.whatif_cpu {' '.join(argv or sys.argv[1:])}\n")
    print(markdown_table(HEADERS, rows))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
