"""False alarms of ``abtest`` with the same Python environment on both sides.

Runs ``python -m userbenchmark.maestro abtest CONFIG --a PYTHON --b PYTHON`` N times (this
interpreter on both sides, so nothing differs but the processes): an abtest in which any metric
that decides was called regressed, improved or changed is a false alarm. Prints a markdown
table. On CPU the blocks run on gloo; on a machine with a GPU the same command measures the GPU
(``--profiler`` and the other run options pass through ``--run``). Run from the repository
root::

    python -m bench.abtest_noise [--tests 10] [--rounds 6] [--config quickstart]
        [--run="--nproc 1 --iters 100"] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench._common import machine_info, machine_lines, maestro_env, markdown_table, write_json

FLAGGED = ("regressed", "improved", "changed")


def one_abtest(config: str, rounds: int, run: Sequence[str], folder: Path) -> dict:
    """One abtest of this interpreter against itself; its abtest.json."""
    command = [sys.executable, "-m", "userbenchmark.maestro", "abtest", config]
    command += ["--a", sys.executable, "--b", sys.executable, "--rounds", str(rounds)]
    command += ["--output-dir", str(folder), *run]
    proc = subprocess.run(command, env=maestro_env(), capture_output=True, text=True, timeout=3600)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"abtest exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads((folder / "abtest.json").read_text())


def _change(change: dict) -> str:
    """B against A with its interval: relative (in %) unless the metric is a difference."""
    scale, unit = (1.0, "") if change["absolute"] else (100.0, " %")
    low, high = (scale * change[k] for k in ("change_ci_low", "change_ci_high"))
    return f"{scale * change['change']:+.2f}{unit} [{low:+.2f}, {high:+.2f}]"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=10, help="abtests to run")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each abtest")
    parser.add_argument("--config", default="quickstart", help="pattern file or shipped name")
    parser.add_argument("--run", default="--nproc 1", help="run options for both sides")
    parser.add_argument("--json", help="also write the counts to this JSON file")
    args = parser.parse_args(argv)
    alarms, judged, flagged = 0, [], collections.Counter()
    with tempfile.TemporaryDirectory(prefix="maestro-abtest-") as tmp:
        for index in range(args.tests):
            doc = one_abtest(
                args.config, args.rounds, shlex.split(args.run), Path(tmp) / str(index)
            )
            changes = [c for c in doc["changes"] if c["decides"]]
            called = [c for c in changes if c["verdict"] in FLAGGED]
            alarms += bool(called)
            judged.append(sum(c["verdict"] not in ("not judged", "unchanged") for c in changes))
            flagged.update(c["key"] for c in called)
            said = [f"{c['key']} {c['verdict']} {_change(c)}" for c in called]
            print(f"abtest {index + 1}/{args.tests}: {', '.join(said) or 'clean'}", file=sys.stderr)
    common = ", ".join(f"{k.split('/', 1)[1]} ({n})" for k, n in flagged.most_common(2))
    row = [args.config, args.run, args.rounds, args.tests, sorted(judged)[len(judged) // 2]]
    row += [f"{alarms}/{args.tests}", common or "-"]
    headers = ["config", "run options", "rounds", "abtests", "metrics judged (median)"]
    headers += ["false alarms", "most flagged"]
    print(
        "maestro abtest, the same environment on both sides\n\n"
        + machine_lines(machine_info())
        + "\n\n"
        + markdown_table(headers, [row])
    )
    write_json(
        args.json,
        {"benchmark": "abtest_noise", "machine": machine_info(), "false_alarms": alarms,
         "tests": args.tests, "rounds": args.rounds, "flagged": dict(flagged)},
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
