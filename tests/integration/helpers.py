"""Run maestro as a user would (a subprocess through the real launcher) and read its files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# Limits on subprocesses catch hangs, never slowness: each is many times what the command takes
# on a loaded 2-core machine (load 5-15), so a slow machine never fails a test on time alone.
QUICK_HANG_S = 300
"""A command that starts no worker (validate, compare, a refused option): 2-15 s loaded."""
RUN_HANG_S = 900
"""A run through the launcher (a few gloo ranks, small sizes): 10-90 s loaded."""


def run_maestro(
    args: list[str],
    *,
    timeout: float = RUN_HANG_S,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m userbenchmark.maestro ARGS`` from the repo root; output captured."""
    full_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    extra = os.environ.get("PYTHONPATH")
    full_env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + extra if extra else "")
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "userbenchmark.maestro", *args],
        cwd=cwd or REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def run_pattern(
    tmp_path: Path,
    yaml_text: str,
    *,
    nproc: int,
    extra: list[str] | None = None,
    timeout: float = RUN_HANG_S,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Write ``yaml_text`` to a file, run it on ``nproc`` gloo ranks, return (process, out dir)."""
    config = tmp_path / "pattern.yaml"
    config.write_text(yaml_text)
    out = tmp_path / "out"
    proc = run_maestro(
        [
            "run",
            "-c",
            str(config),
            "--nproc",
            str(nproc),
            "--output-dir",
            str(out),
            "--metrics-dir",
            str(tmp_path / "metrics"),
            *(extra or []),
        ],
        timeout=timeout,
    )
    return proc, out


def read_records(out: Path, name: str = "results.json") -> list[dict]:
    return json.loads((out / name).read_text())


def pair_overlaps(out: Path) -> dict[tuple[str, str, str], float | None]:
    """pairs.json as {(pattern, block_a, block_b): pairwise_overlap}."""
    return {
        (r["pattern"], r["block_a"], r["block_b"]): r["pairwise_overlap"]
        for r in read_records(out, "pairs.json")
    }


def by_block(records: list[dict], pattern: str) -> dict[str, dict]:
    return {r["block"]: r for r in records if r["pattern"] == pattern}
