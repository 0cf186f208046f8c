"""How long a finished run takes to exit: the quickstart as shipped against the same run with
Python's whole-heap collection at exit put back.

The CLI and each worker freeze the heap (``gc.freeze``) once everything is written, so the
interpreter's last collection skips the objects torch and pandas made. The baseline undoes
only that: a ``sitecustomize`` on ``PYTHONPATH`` (which the spawned workers inherit) turns
``gc.freeze`` into a no-op. Rounds alternate which goes first. Per run: the wall time, and the
tail from the line ``maestro: results written`` to the exit of the last process.

Run from the repository root: ``python -m bench.exit_tail [--rounds 10] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._common import machine_info, machine_lines, maestro_env, markdown_table, write_json

RUN = [
    "run",
    "-c",
    "quickstart",
    "--nproc",
    "2",
    "--iters",
    "5",
    "--warmup-iters",
    "1",
    "--no-metrics",
]
NO_FREEZE = "import gc\ngc.freeze = lambda: None\n"
HANG_S = 300


def one_run(out: Path, env: dict[str, str]) -> dict[str, float]:
    """One quickstart run: its wall time and the tail after its last output line, in s."""
    command = [sys.executable, "-m", "userbenchmark.maestro", *RUN, "--output-dir", str(out)]
    start = time.monotonic()
    written = None
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("maestro: results written"):
                written = time.monotonic()
        status = proc.wait(timeout=HANG_S)
    end = time.monotonic()
    if status != 0 or written is None:
        raise SystemExit(f"exit_tail: the run into {out} exited {status}")
    return {"wall_s": end - start, "tail_s": end - written}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="runs of each, alternating")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    info = machine_info()
    runs: dict[str, list[dict[str, float]]] = {"shipped": [], "collected at exit": []}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(NO_FREEZE)
        shipped = maestro_env()
        baseline = shipped | {"PYTHONPATH": f"{tmp / 'site'}:{shipped['PYTHONPATH']}"}
        envs = {"shipped": shipped, "collected at exit": baseline}
        for r in range(args.rounds):
            order = list(envs) if r % 2 == 0 else list(reversed(envs))
            for name in order:
                runs[name].append(one_run(tmp / f"{name[:4]}-{r}", envs[name]))
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    rows = []
    for name, values in runs.items():
        wall = statistics.median(v["wall_s"] for v in values)
        tail = statistics.median(v["tail_s"] for v in values)
        rows.append([name, len(values), wall, tail])
    saved = rows[1][2] - rows[0][2]
    print("## Exit of a finished run: the quickstart at 2 gloo ranks\n")
    print(machine_lines(info))
    print(f"\n`{' '.join(RUN)}`, {args.rounds} rounds alternating; medians.\n")
    print(markdown_table(["run", "runs", "wall s", "results written to exit, s"], rows))
    print(f"\nwall time saved per run: {saved:.2f} s (median of each, same rounds)")
    write_json(args.json, {"machine": info, "runs": runs, "saved_wall_s": saved})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
