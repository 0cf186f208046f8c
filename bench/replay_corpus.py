"""Every trace of the corpus of traces made elsewhere, imported and run on CPU.

For each file of ``tests/data/corpus/corpus.json`` found in the corpus folder: ``import-trace``
with the options the manifest names (a subset's ``--world-size`` capped at ``--max-world``, to
fit a small machine), then ``run`` of the written file with ``--nproc`` its world size,
``--max-size 64K --iters 2 --warmup-iters 1 --no-baseline``, each in a fresh process; prints a
markdown table of the import's and the run's wall time, blocks and exit status. Target: each
run under 60 s on a 2-core machine.

Run from the repository root: ``python -m bench.replay_corpus [--corpus DIR] [--max-world 2]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._common import REPO_ROOT, machine_info, machine_lines, maestro_env, markdown_table, write_json

MANIFEST = REPO_ROOT / "tests" / "data" / "corpus" / "corpus.json"
TARGET_S = 60.0
RUN_TIMEOUT_S = 600


def _timed(args: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "userbenchmark.maestro", *args], cwd=REPO_ROOT,
        env=maestro_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    return proc, time.monotonic() - began


def one(entry: dict, path: Path, folder: Path, max_world: int) -> dict:
    """Import ``path`` as the manifest says, then run it on CPU: the figures of both."""
    world = min(entry["options"].get("world_size", 1), max_world)
    step = folder / (path.name.split(".")[0] + ".yaml")
    options = ["--world-size", str(world)] if "world_size" in entry["options"] else []
    imported, import_s = _timed(["import-trace", str(path), "-o", str(step), *options])
    row = {"file": path.name, "world": world, "import_s": import_s, "imported": imported.stdout}
    if imported.returncode != 0:
        return row | {"status": f"import: {imported.stderr.strip()[:120]}"}
    run = ["run", "-c", str(step), "--nproc", str(world), "--max-size", "64K", "--iters", "2"]
    run += ["--warmup-iters", "1", "--no-baseline", "--no-metrics"]
    ran, run_s = _timed([*run, "--output-dir", str(folder / path.name.split(".")[0])])
    return row | {"run_s": run_s, "status": f"exit {ran.returncode}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=MANIFEST.parent)
    parser.add_argument("--max-world", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    info = machine_info()
    print(machine_lines(info) + "\n")
    rows, ok = [], True
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for entry in json.loads(MANIFEST.read_text()):
            path = args.corpus / entry["file"]
            if not path.is_file():
                print(f"replay_corpus: {path}: not here; skipped", file=sys.stderr)
                continue
            r = one(entry, path, Path(tmp), args.max_world)
            results.append(r)
            refused = "refused" in entry["expect"]
            fine = refused or (r["status"] == "exit 0" and r["run_s"] < TARGET_S)
            ok = ok and fine
            blocks = r["imported"].split(" as ")[1].split(" blocks")[0] if r["imported"] else "-"
            run_s = f"{r['run_s']:.1f}" if "run_s" in r else "-"
            status = "refused, as expected" if refused and not r["imported"] else r["status"]
            rows.append([entry["file"], r["world"], f"{r['import_s']:.1f}", blocks, run_s, status])
            rows[-1].append("yes" if fine else "no")
    headers = ["file", "ranks", "import s", "blocks", "run s", "status", f"under {TARGET_S:g} s"]
    print(markdown_table(headers, rows))
    write_json(args.json, {"machine": info, "results": results})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
