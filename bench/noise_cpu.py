"""False alarms and detections of maestro's A/B verdicts on this machine (CPU, gloo).

For each case, N pairs of back-to-back runs, A then B, compared by ``compare`` (the library
call behind ``python -m userbenchmark.maestro compare A B``) and by the TorchBench detector
(``regression_detector.run`` on the two metrics files):

- identical runs of the shipped quickstart (2 ranks, and 1 rank as TorchBench's nightly run,
  also as runs of 3 processes each, ``run --repeat 3``), of two 2 ms sleeps on two lanes, and of
  an all_reduce of 1M (2 ranks): any metric called regressed or improved is a false alarm;
- two 2 ms sleeps where B's ``slow`` sleep lasts 10 % longer (a code change, not a setting:
  ``bench.noise_blocks:ScaledSleep``): detected when ``slow``'s average or median latency is
  called regressed; a false alarm when anything of the unchanged ``fast`` sleep is.

Prints a markdown table, then how far each kind of figure moved between the two processes of a
pair (comm, compute and other blocks, sleeps being other, and pattern figures): the largest
change of that kind in a pair, its median over the pairs and the 95th percentile, which is the
floor that would have left 19 of 20 pairs clean (metric_keys.PROCESS_FLOORS comes from it).
The figures need a quiet machine (nothing else running). Run from the repository root::

    python -m bench.noise_cpu [--pairs 20] [--iters 200] [--keep DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import machine_info, machine_lines, maestro_env, markdown_table, write_json
from bench.noise_blocks import FACTOR_VARIABLE
from userbenchmark.maestro import regression_detector
from userbenchmark.maestro.core.output.compare import compare_files
from userbenchmark.maestro.core.output.metric_keys import parse_metric_key, spec_of

SLEEPS = """\
name: noise_sleeps
defaults: {{warmup_iters: 20, iters: {iters}, baseline: true}}
axes:
  a: {{like: world}}
  b: {{like: world}}
patterns:
  - name: two_sleeps
    blocks:
      - {{name: fast, op: sleep, axis: a, duration_us: 2000}}
      - {{name: slow, op: "bench.noise_blocks:ScaledSleep", axis: b, duration_us: 2000}}
"""
ALL_REDUCE = """\
name: noise_all_reduce
defaults: {{dtype: fp32, warmup_iters: 20, iters: {iters}}}
patterns:
  - name: ar_1M
    blocks:
      - {{name: ar, op: all_reduce, size: 1M}}
"""
FLAGGED = ("regressed", "improved", "changed")


@dataclass(frozen=True, kw_only=True)
class Case:
    """One row of the table: what A and B run, and which keys count as detections."""

    name: str
    config: str
    """A shipped config's name, or a pattern text (formatted with ``iters``)."""
    nproc: int = 2
    repeat: int = 1
    """Processes per run (``run --repeat``)."""
    treatment_factor: float = 1.0
    target: str = ""
    """Keys containing this whose regression is a detection (empty: identical runs)."""
    watch: str = "/"
    """Only keys containing this count as false alarms (with a treatment: the unchanged block;
    the changed block's other figures and the pattern figures it moves are neither)."""


@dataclass(kw_only=True)
class Tally:
    pairs: int = 0
    compare_alarms: int = 0
    detector_alarms: int = 0
    detected: int = 0
    judged: list[int] = field(default_factory=list)
    flagged: collections.Counter[str] = field(default_factory=collections.Counter)
    moved: dict[str, list[float]] = field(default_factory=dict)
    """Each kind's largest |log(B / A)| in each pair."""


def run_once(case: Case, folder: Path, factor: float, iters: int) -> tuple[Path, dict[str, Any]]:
    """One maestro run into ``folder``: (its --output-dir, its metrics JSON's content)."""
    config = case.config
    if "\n" in config:
        path = folder.parent / f"{case.name.replace(' ', '_')}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config.format(iters=iters))
        config = str(path)
    kept = sorted((folder / "metrics").glob("metrics-*.json"))
    if kept and (folder / "out" / "results.json").exists():  # a run --keep holds: judged again
        return folder / "out", json.loads(kept[-1].read_text())
    env = {**maestro_env(), FACTOR_VARIABLE: str(factor)}
    command = [sys.executable, "-m", "userbenchmark.maestro", "run", "-c", config]
    command += ["--nproc", str(case.nproc), "--repeat", str(case.repeat)]
    command += ["--output-dir", str(folder / "out")]
    command += ["--metrics-dir", str(folder / "metrics")]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{case.name}: maestro exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    metrics = json.loads(next((folder / "metrics").glob("metrics-*.json")).read_text())
    return folder / "out", metrics


def judge_pair(case: Case, a: tuple[Path, dict], b: tuple[Path, dict], tally: Tally) -> set[str]:
    """Compare one pair both ways maestro offers and count what they called; the keys
    ``compare`` flagged."""
    result = compare_files(a[0], b[0])
    flagged = {j.key for j in result.judgements if j.verdict in FLAGGED and j.decides}
    detector = regression_detector.run(a[1], b[1])
    tally.pairs += 1
    tally.judged.append(
        sum(j.verdict not in ("not judged", "unchanged") for j in result.judgements)
    )
    tally.flagged.update(flagged)
    tally.compare_alarms += bool(
        any(case.watch in k for k in flagged) or result.missing or result.failures
    )
    tally.detector_alarms += any(case.watch in k for k in detector.details)
    if case.target:
        tally.detected += any(
            case.target in j.key and j.verdict == "regressed" for j in result.judgements
        )
    for kind, moved in moves(a[1], b[1]).items():
        tally.moved.setdefault(kind, []).append(moved)
    return flagged


def moves(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """The largest change of each kind of judged figure between two metrics files: |log(B / A)|
    of a relative one, by its block's category (``comm``, ``compute``, ``other``) or
    ``pattern``; |B - A| of an ``absolute`` one (overlap fractions and efficiency)."""
    out: dict[str, float] = {}
    for key, value in a["metrics"].items():
        other = b["metrics"].get(key)
        parsed = parse_metric_key(key)
        spec = spec_of(parsed.metric)
        if other is None or f"{key}_ci_low" not in a["metrics"] or spec.harness:
            continue
        unit = f"category.{parsed.pattern}/{parsed.block}"
        kind = a["environ"].get(unit, "?") if parsed.block else "pattern"
        kind = "absolute" if spec.absolute else kind
        moved = abs(other - value) if spec.absolute else abs(math.log(other / value))
        out[kind] = max(out.get(kind, 0.0), moved)
    return out


def measure(
    cases: Sequence[Case], pairs: int, iters: int, log: Callable[[str], None], keep: str | None
) -> dict:
    tallies = {}
    with tempfile.TemporaryDirectory(prefix="maestro-noise-") as scratch:
        tmp = keep or scratch
        for case in cases:
            tally = tallies[case.name] = Tally()
            for index in range(pairs):
                base = Path(tmp) / case.name.replace(" ", "_") / str(index)
                a = run_once(case, base / "a", 1.0, iters)
                b = run_once(case, base / "b", case.treatment_factor, iters)
                flagged = judge_pair(case, a, b, tally)
                log(
                    f"{case.name}: pair {index + 1}/{pairs}: "
                    f"{tally.compare_alarms} false alarms, {tally.detected} detected"
                    + (f" (flagged: {', '.join(sorted(flagged))})" if flagged else "")
                )
    return tallies


def report(cases: Sequence[Case], tallies: dict[str, Tally], iters: int) -> str:
    rows = []
    for case in cases:
        t = tallies[case.name]
        judged = sorted(t.judged)[len(t.judged) // 2] if t.judged else 0
        common = ", ".join(f"{k.split('/', 1)[1]} ({n})" for k, n in t.flagged.most_common(2))
        rows.append(
            [
                case.name,
                t.pairs,
                judged,
                f"{t.compare_alarms}/{t.pairs}",
                f"{t.detector_alarms}/{t.pairs}",
                f"{t.detected}/{t.pairs}" if case.target else "-",
                common or "-",
            ]
        )
    headers = ["case", "pairs", "metrics judged (median)", "false alarms: compare"]
    headers += ["false alarms: detector", "detected", "most flagged"]
    spread = [
        [case.name, kind, len(moved), *(shown(kind, q) for q in quantiles(moved))]
        for case in cases
        if case.repeat == 1 and case.target == ""
        for kind, moved in sorted(tallies[case.name].moved.items())
    ]
    kinds = ["case", "kind", "pairs", "largest change in a pair: median", "95th percentile"]
    return (
        f"maestro A/B noise on CPU (gloo), {iters} iterations where the case sets them\n\n"
        + machine_lines(machine_info())
        + "\n\n"
        + markdown_table(headers, rows)
        + "\n\nBetween the processes of a pair, by kind of figure\n\n"
        + markdown_table(kinds, spread)
    )


def shown(kind: str, moved: float) -> str:
    """A relative move as a percentage, an absolute one in its unit."""
    return f"{moved:.3f}" if kind == "absolute" else f"{math.expm1(moved) * 100:.1f} %"


def quantiles(moved: list[float]) -> tuple[float, float]:
    """Median and 95th percentile (nearest rank) of a kind's largest moves."""
    ranked = sorted(moved)
    return ranked[(len(ranked) - 1) // 2], ranked[math.ceil(0.95 * len(ranked)) - 1]


def cases_for(args: argparse.Namespace) -> list[Case]:
    cases = [
        Case(name="quickstart 2 ranks", config="quickstart", nproc=2),
        Case(name="quickstart 1 rank", config="quickstart", nproc=1),
        Case(name="quickstart 1 rank, 3 processes", config="quickstart", nproc=1, repeat=3),
        Case(name="two sleeps", config=SLEEPS),
        Case(name="all_reduce 1M", config=ALL_REDUCE),
        Case(
            name="sleep +10%",
            config=SLEEPS,
            treatment_factor=1.10,
            target="/slow/latency_",
            watch="/fast/",
        ),
    ]
    return [c for c in cases if not args.only or any(o in c.name for o in args.only)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20, help="pairs of runs per case")
    parser.add_argument(
        "--iters", type=int, default=200, help="iterations of the sleep and all_reduce patterns"
    )
    parser.add_argument("--only", action="append", help="run only cases whose name contains this")
    parser.add_argument("--json", help="also write the counts to this JSON file")
    parser.add_argument(
        "--keep", help="keep every run's files in this folder; runs it holds are judged again"
    )
    args = parser.parse_args(argv)
    cases = cases_for(args)
    tallies = measure(
        cases, args.pairs, args.iters, lambda line: print(line, file=sys.stderr), args.keep
    )
    print(report(cases, tallies, args.iters))
    write_json(
        args.json,
        {
            "machine": machine_info(),
            "cases": {
                name: {k: v for k, v in vars(t).items() if k != "flagged"}
                | {"flagged": dict(t.flagged)}
                for name, t in tallies.items()
            },
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
