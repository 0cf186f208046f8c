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


LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment for a maestro subprocess that starts its own ranks: no inherited
    launcher variables (torchrun's ``TORCHELASTIC_*`` too), this repository first on
    PYTHONPATH, one OpenMP thread unless set; then ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCH_VARIABLES and not k.startswith("TORCHELASTIC_")
    }
    path = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def child_pids(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has ended: only its parent's wait is missing


def add_descendants(pid: int, seen: set[int]) -> None:
    """Add to ``seen`` every descendant of ``pid`` alive now (kept after they end, so that
    a test can wait for every process a launch ever started)."""
    todo = [pid]
    while todo:
        for child in child_pids(todo.pop()):
            if child not in seen:
                seen.add(child)
                todo.append(child)


def nap_sweep(*, name: str, timeout_s: float, iters: int, first_us: int, points: int) -> str:
    """A pattern of ``points`` sweep points, each a 4K all_reduce beside a sleep of about
    ``first_us``: a run long enough to interrupt, fail or kill between its patterns."""
    naps = ", ".join(str(first_us + i) for i in range(points))
    return f"""
name: {name}
timeout_s: {timeout_s:g}
defaults: {{warmup_iters: 0, iters: {iters}, baseline: false}}
patterns:
  - name: nap
    sweep: {{us: [{naps}]}}
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: nap, op: sleep, axis: world, duration_us: "${{us}}"}}
"""


# nccl-tests doc/PERFORMANCE.md, written out so that checks do not reuse maestro's factors.
NCCL_TESTS_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


def run_maestro(
    args: list[str],
    *,
    timeout: float = RUN_HANG_S,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m userbenchmark.maestro ARGS`` from the repo root; output captured."""
    return subprocess.run(
        [sys.executable, "-m", "userbenchmark.maestro", *args],
        cwd=cwd or REPO_ROOT,
        env=subprocess_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def run_pattern(
    tmp_path: Path, yaml_text: str, *, nproc: int, extra: list[str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Write ``yaml_text`` to a file, run it on ``nproc`` gloo ranks started from this process
    (``run_maestro_here``), return (outcome, out dir)."""
    config = tmp_path / "pattern.yaml"
    config.write_text(yaml_text)
    out = tmp_path / "out"
    args = ["run", "-c", str(config), "--nproc", str(nproc), "--output-dir", str(out)]
    proc = run_maestro_here([*args, "--metrics-dir", str(tmp_path / "metrics"), *(extra or [])])
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


def run_maestro_here(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``maestro ARGS`` through the command line's entry point in this process, as
    ``run_maestro`` gives it: the exit status and what this process and the workers it starts
    wrote to stdout and stderr. For a run whose outputs a test reads, not its processes: the
    workers start without a launcher process of its own (one import of torch fewer). In the
    environment ``subprocess_env`` gives (no launcher variables, one OpenMP thread unless set);
    the environment, the 'maestro' logger, SIGTERM and SIGHUP are as they were afterwards."""
    import io
    import logging
    import signal
    import tempfile
    from contextlib import redirect_stderr, redirect_stdout

    from userbenchmark.maestro import cli

    saved_env = dict(os.environ)
    logger = logging.getLogger("maestro")
    saved_logger = (logger.handlers[:], logger.level, logger.propagate)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for key in [k for k in os.environ if k in LAUNCH_VARIABLES or k.startswith("TORCHELASTIC_")]:
        del os.environ[key]  # as subprocess_env leaves them out
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    said = (io.StringIO(), io.StringIO())  # this process's own prints and log lines
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        saved_fds = [os.dup(1), os.dup(2)]
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(out.fileno(), 1)  # the workers', which they write to the descriptors
            os.dup2(err.fileno(), 2)
            with redirect_stdout(said[0]), redirect_stderr(said[1]):
                status = cli.main(args)
        finally:
            for fd, saved in zip((1, 2), saved_fds, strict=True):
                os.dup2(saved, fd)
                os.close(saved)
            os.environ.clear()
            os.environ.update(saved_env)
            logger.handlers[:], logger.level, logger.propagate = saved_logger
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        texts = []
        for mine, written in zip(said, (out, err), strict=True):
            written.seek(0)
            texts.append(mine.getvalue() + written.read().decode(errors="replace"))
    return subprocess.CompletedProcess(["maestro", *args], status, *texts)
