"""Importing a large trace: wall time and peak memory of ``import-trace`` on a ~200 MB file.

The file is built from a real one-rank-sized trace by repeating its events: copy k has its
times shifted past copy k-1, its correlation and External ids offset, and its profiler step
renamed ``ProfilerStep#(3+k)``, so the importer walks as many events as a 200 MB trace of a
long job holds and imports the last step. The source is a rank of the DDP trace in
``tests/data/traces`` made a one-rank world (so one file is the whole import); each import runs
in a fresh process (``python -m userbenchmark.maestro import-trace``) and its peak resident
memory is the child's ``ru_maxrss``. For comparison, ``json.load`` of the same file is measured
the same way.

Run from the repository root: ``python -m bench.import_trace [--size-mb 200] [--repeats 3]
[--json out.json]``. Target on a 2-core machine: under 30 s and under 4 GB.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._common import (
    REPO_ROOT,
    machine_info,
    machine_lines,
    maestro_env,
    markdown_table,
    median_spread,
    write_json,
)

SOURCE = REPO_ROOT / "tests" / "data" / "traces" / "ddp" / "rank0.json.gz"
TARGET_S = 30.0
TARGET_MB = 4096.0
ID_KEYS = ("correlation", "External id")


def _one_rank(doc: dict[str, Any]) -> dict[str, Any]:
    """The trace as a one-rank world's: one file is then a whole import."""
    info = dict(doc.get("distributedInfo") or {})
    if info:
        info.update(rank=0, world_size=1)
        info["pg_config"] = [{**g, "ranks": [0], "pg_size": 1} for g in info.get("pg_config", [])]
        doc = {**doc, "distributedInfo": info}
    return doc


def _shifted(event: dict[str, Any], k: int, period_us: float, id_step: int) -> dict[str, Any]:
    out = dict(event)
    if isinstance(out.get("ts"), int | float):
        out["ts"] = out["ts"] + k * period_us
    if out.get("ph") in ("s", "f") and isinstance(out.get("id"), int):
        out["id"] = out["id"] + k * id_step
    name = out.get("name")
    if isinstance(name, str) and name.startswith("ProfilerStep#"):
        out["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k}"
    args = out.get("args")
    if isinstance(args, dict) and any(key in args for key in ID_KEYS):
        out["args"] = {
            key: value + k * id_step if key in ID_KEYS and isinstance(value, int) else value
            for key, value in args.items()
        }
    return out


def build_trace(source: Path, target: Path, size_mb: float) -> dict[str, Any]:
    """Write a trace of about ``size_mb`` MB repeating ``source``'s events; returns its facts."""
    doc = _one_rank(json.loads(gzip.decompress(source.read_bytes())))
    events = doc.pop("traceEvents")
    stamps = [e["ts"] for e in events if isinstance(e.get("ts"), int | float)]
    period_us = max(stamps) - min(stamps) + 1000.0
    id_step = 1 + max(
        (
            e["args"][key]
            for e in events
            for key in ID_KEYS
            if isinstance(e.get("args"), dict) and isinstance(e["args"].get(key), int)
        ),
        default=0,
    )
    one_copy = sum(len(json.dumps(e)) + 2 for e in events)
    copies = max(1, math.ceil(size_mb * 1e6 / one_copy))
    with open(target, "w", encoding="utf-8") as out:
        head = json.dumps(doc)[:-1]  # the other top-level keys, then the events
        out.write(head + ', "traceEvents": [\n')
        for k in range(copies):
            text = ",\n".join(json.dumps(_shifted(e, k, period_us, id_step)) for e in events)
            out.write(("" if k == 0 else ",\n") + text)
        out.write("\n]}\n")
    return {"copies": copies, "events": copies * len(events), "mb": target.stat().st_size / 1e6}


_MEASURED = """\
import resource, runpy, sys, time
argv = sys.argv[1:]
start = time.perf_counter()
if argv[0] == "json.load":
    import json
    with open(argv[1], encoding="utf-8") as handle:
        json.load(handle)
    status = 0
else:
    sys.argv = ["maestro", *argv]
    try:
        runpy.run_module("userbenchmark.maestro", run_name="__main__")
        status = 0
    except SystemExit as done:
        status = done.code or 0
wall = time.perf_counter() - start
print("MEASURED", status, wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _child(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of ``argv`` run in a fresh Python process, measured by
    that process itself (its start-up excluded from the wall time)."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURED, *argv],
        cwd=REPO_ROOT,
        env=maestro_env(),
        capture_output=True,
        text=True,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("MEASURED ")), None)
    if done.returncode != 0 or line is None or line.split()[1] != "0":
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
    _, _, wall, peak_kb = line.split()
    return float(wall), float(peak_kb) / 1024.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "big.json"
        facts = build_trace(args.source, trace, args.size_mb)
        out = Path(tmp) / "big.yaml"
        runs = [_child(["import-trace", str(trace), "-o", str(out)]) for _ in range(args.repeats)]
        json_wall, json_peak = _child(["json.load", str(trace)])
    walls = [w for w, _ in runs]
    peak = max(p for _, p in runs)
    rows = [
        [
            "import-trace",
            f"{facts['mb']:.0f}",
            facts["events"],
            f"{median_spread(walls)['median']:.2f}",
            f"{peak:.0f}",
            "yes" if max(walls) < TARGET_S and peak < TARGET_MB else "NO",
        ],
        [
            "json.load (for comparison)",
            f"{facts['mb']:.0f}",
            facts["events"],
            f"{json_wall:.2f}",
            f"{json_peak:.0f}",
            "-",
        ],
    ]
    print(machine_lines(machine_info()))
    print()
    print(
        markdown_table(
            [
                "what",
                "MB",
                "events",
                "wall s (median)",
                "peak RSS MB",
                f"under {TARGET_S:.0f} s and {TARGET_MB / 1024:.0f} GB",
            ],
            rows,
        )
    )
    write_json(
        args.json,
        {
            "benchmark": "import_trace",
            "machine": machine_info(),
            "trace": facts,
            "import_wall_s": walls,
            "import_peak_mb": peak,
            "json_load_wall_s": json_wall,
            "json_load_peak_mb": json_peak,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
