"""``abtest``: one pattern file under two Python environments (two torch or NCCL builds) in
alternating rounds of fresh processes, each metric's change paired by round (judge_paired), each
side gathered as a ``run --repeat`` is, and a summary, ``abtest.json``, in the output folder."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import pandas as pd

from ...errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, say
from .compare import verdict_table
from .locations import atomic_write_bytes
from .metric_keys import Judgement, judge_paired, split_bound
from .processes import gather_processes, process_dir
from .reporter import stack_line
from .results import load_results, metrics_from_results, read_json_file, records_of

SIDES: Final = ("a", "b")
SUMMARY: Final = "abtest"  # abtest.json, abtest-a/, abtest-b/
# The folder holding the userbenchmark package: each side runs `-m userbenchmark.maestro` there.
_ROOT: Final = Path(__file__).resolve().parents[4]
_LAUNCH_VARIABLES: Final = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")


def side_dir(output_dir: Path, side: str) -> Path:
    """Where a side's rounds are gathered: ``abtest-a``, ``abtest-b``."""
    return output_dir / f"{SUMMARY}-{side}"


def round_order(rounds: int) -> list[tuple[int, str]]:
    """(round, side) in the order they run: A B, then B A, then A B... (each side first in half
    the rounds, so a drift over the test moves both alike)."""
    return [(k, side) for k in range(rounds) for side in (SIDES if k % 2 == 0 else SIDES[::-1])]


def run_abtest(
    config: str,
    pythons: Mapping[str, str],
    *,
    rounds: int,
    run_args: Sequence[str],
    output_dir: Path,
    show_all: bool = False,
) -> int:
    """Run the rounds (each side gathered after each of its runs, its metrics file in its
    folder), then print B judged against A; the exit status: 0, 1 a metric regressed or a
    side's run failed, 2 a side refused its input, 130 interrupted."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(_ROOT), env.get("PYTHONPATH"))))
    folders: dict[str, list[Path]] = {side: [] for side in SIDES}
    say(f"maestro: abtest: {2 * rounds} runs, A B then B A, ...")
    for k, side in round_order(rounds):
        folder = process_dir(side_dir(output_dir, side), k)
        command = [pythons[side], "-m", "userbenchmark.maestro", "run", "-c", config]
        command += ["--output-dir", str(folder), "--no-metrics", *run_args]
        started = time.monotonic()
        done = subprocess.run(command, cwd=_ROOT, env=env, capture_output=True, text=True)
        folders[side].append(folder)
        gather_processes(folders[side], side_dir(output_dir, side), _metrics(output_dir, side))
        say(f"round {k + 1} of {rounds}: {side.upper()} {time.monotonic() - started:.1f} s")
        if done.returncode != EXIT_OK:
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            say(f"maestro: abtest: {side.upper()} ({pythons[side]}) exited {done.returncode}:")
            say(tail)
            failed = done.returncode in (EXIT_USAGE, EXIT_INTERRUPTED)
            return done.returncode if failed else EXIT_FAILED
    judgements = judge_paired(_rounds(folders["a"]), _rounds(folders["b"]))
    _write_summary(output_dir, judgements, pythons, rounds)
    for side, python in pythons.items():
        environ = read_json_file(side_dir(output_dir, side) / "run.json")
        print(f"{side.upper()}: {python} ({stack_line(environ)})")
    print(verdict_table(judgements, show_all=show_all), flush=True)
    return int(any(j.verdict == "regressed" and j.decides for j in judgements))


def _metrics(output_dir: Path, side: str) -> Path:
    """A side's TorchBench metrics file: its rounds' means, with the interval between them."""
    return side_dir(output_dir, side) / "metrics.json"


def _rounds(folders: Sequence[Path]) -> dict[str, list[float]]:
    """Each metric's value in each round (keys every round holds; no interval bounds)."""
    values = [metrics_from_results(load_results(folder)) for folder in folders]
    common = set.intersection(*(set(v) for v in values))
    keys = [k for k in values[0] if k in common and split_bound(k)[1] is None]
    return {key: [v[key] for v in values] for key in keys}


def _write_summary(
    output_dir: Path, judgements: Sequence[Judgement], pythons: Mapping[str, str], rounds: int
) -> None:
    """abtest.json: both sides, the rounds, and each metric's means and change, B / A - 1 (a
    difference when ``absolute``) with its interval (null where not judged)."""
    frame = pd.DataFrame(
        {
            "key": [j.key for j in judgements],
            "a": [j.control.value for j in judgements],
            "b": [j.treatment.value for j in judgements],
            "change": [j.change for j in judgements],
            "change_ci_low": [j.low for j in judgements],
            "change_ci_high": [j.high for j in judgements],
            "floor": [math.nan if j.floor is None else j.floor for j in judgements],
            "absolute": [j.absolute for j in judgements],
            "verdict": [j.verdict for j in judgements],
            "decides": [j.decides for j in judgements],
        }
    )
    sides = {s: {"python": pythons[s], "metrics": str(_metrics(output_dir, s))} for s in SIDES}
    doc = {"rounds": rounds, **sides, "changes": records_of(frame)}
    atomic_write_bytes(output_dir / f"{SUMMARY}.json", (json.dumps(doc, indent=1) + "\n").encode())
