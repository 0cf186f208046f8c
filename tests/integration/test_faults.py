"""Fault injection on gloo: every rank stops, promptly, with one message; finished work stays saved.

Most cases start the ranks the way srun or a hand-written launcher would (one process per rank,
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT in the environment), so the exit status and the time of
every rank can be checked, not only the launcher's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from userbenchmark.maestro.core.runtime.distributed import free_port

from .helpers import REPO_ROOT, read_records, run_pattern

pytestmark = pytest.mark.integration

EXIT_DEADLINE_S = 90.0
"""Every rank must have exited this long after the start, whatever failed."""

FAULT = "tests.integration.fault_blocks:FailOnRank"


def suite(fault: str, *, extra_patterns: str = "") -> str:
    """Two ranks; pattern ``first`` is clean, ``second`` carries ``fault``, ``third`` is clean."""
    return f"""
name: faults
timeout_s: 3
defaults: {{warmup_iters: 1, iters: 4, baseline: false}}
patterns:
  - name: first
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
  - name: second
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: bad, op: "{FAULT}", axis: world, {fault}}}
  - name: third
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
{extra_patterns}"""


@dataclass
class Rank:
    rank: int
    returncode: int
    stderr: str
    elapsed_s: float


def _env(rank: int, world_size: int, port: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        and not k.startswith("TORCHELASTIC")
    }
    extra = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + extra if extra else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    return env


def start_ranks(
    tmp_path: Path, yaml_text: str, world_sizes: list[int], *, entry: tuple[str, ...] = ()
) -> tuple[list[subprocess.Popen], float]:
    """One process per rank; ``world_sizes[r]`` is the WORLD_SIZE rank ``r`` is started with.

    ``entry``: the module and its leading arguments, if not maestro's own command line.
    """
    config = tmp_path / "pattern.yaml"
    config.write_text(yaml_text)
    port = free_port()
    args = [
        sys.executable,
        "-m",
        *(entry or ("userbenchmark.maestro",)),
        "run",
        "-c",
        str(config),
        "--output-dir",
        str(tmp_path / "out"),
        "--metrics-dir",
        str(tmp_path / "metrics"),
    ]
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            env=_env(rank, ws, port),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, ws in enumerate(world_sizes)
    ]
    return procs, start


def wait_ranks(procs: list[subprocess.Popen], start: float) -> list[Rank]:
    """Wait for every rank; one still running after the deadline fails the test (and is killed)."""
    ranks = []
    try:
        for rank, proc in enumerate(procs):
            left = max(0.1, EXIT_DEADLINE_S - (time.monotonic() - start))
            try:
                _, err = proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {rank} still running {EXIT_DEADLINE_S:.0f} s after the start")
            ranks.append(Rank(rank, proc.returncode, err, time.monotonic() - start))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return ranks


def run_ranks(tmp_path: Path, yaml_text: str, world_sizes: list[int]) -> list[Rank]:
    return wait_ranks(*start_ranks(tmp_path, yaml_text, world_sizes))


def assert_first_saved(tmp_path: Path) -> None:
    """The files hold exactly the pattern that finished before the fault, and no temp file."""
    out = tmp_path / "out"
    records = read_records(out)
    assert {r["pattern"] for r in records} == {"first"}
    assert all(r["latency_avg_us"] > 0 for r in records)
    assert [p["pattern"] for p in read_records(out, "patterns.json")] == ["first"]
    (metrics_file,) = (tmp_path / "metrics").glob("metrics-*.json")
    metrics = json.loads(metrics_file.read_text())["metrics"]
    assert metrics and all(key.startswith("faults/first/") for key in metrics)
    leftovers = [p.name for d in (out, tmp_path / "metrics") for p in d.iterdir()]
    assert not [n for n in leftovers if n.endswith(".tmp")], leftovers


def assert_all_failed(ranks: list[Rank], *, phase: str, failing: int = 1) -> None:
    for r in ranks:
        assert r.returncode != 0, f"rank {r.rank} exited 0:\n{r.stderr[-2000:]}"
        assert r.elapsed_s < EXIT_DEADLINE_S
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
    msg = ranks[0].stderr
    assert f"rank {failing}" in msg and f"phase {phase}" in msg, msg[-3000:]
    assert "pattern 'second'" in msg, msg[-3000:]


def test_raise_in_setup_on_one_rank(tmp_path):
    ranks = run_ranks(tmp_path, suite("rank: 1, when: setup"), [2, 2])
    assert_all_failed(ranks, phase="setup")
    assert "injected failure on rank 1" in ranks[0].stderr
    # Contained failure with stop_on_error (the default) on: nothing after it ran.
    assert_first_saved(tmp_path)
    # Setup failures need no collective timeout: every rank learns it at the agreement.
    assert max(r.elapsed_s for r in ranks) < 45, [r.elapsed_s for r in ranks]


def test_raise_in_launch_mid_measurement(tmp_path):
    ranks = run_ranks(tmp_path, suite("rank: 1, when: launch, after: 3"), [2, 2])
    assert_all_failed(ranks, phase="measure")
    assert "block 'bad'" in ranks[0].stderr and "injected failure" in ranks[0].stderr
    assert_first_saved(tmp_path)


def test_sigkill_mid_pattern_on_three_ranks(tmp_path):
    ranks = run_ranks(tmp_path, suite("rank: 1, when: launch, how: kill, after: 3"), [3, 3, 3])
    assert ranks[1].returncode == -signal.SIGKILL
    assert_all_failed(ranks, phase="measure")
    assert "did not reach" in ranks[0].stderr, ranks[0].stderr[-3000:]
    assert "rank 1 " in ranks[2].stderr or ranks[2].returncode != 0
    assert_first_saved(tmp_path)


def test_ranks_started_with_different_world_sizes(tmp_path):
    ranks = run_ranks(tmp_path, suite("rank: 1"), [2, 3])
    for r in ranks:
        assert r.returncode != 0 and r.elapsed_s < 45, (r.rank, r.elapsed_s, r.stderr[-2000:])
        assert "WORLD_SIZE" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "rank 1 was started with WORLD_SIZE=3" in ranks[0].stderr, ranks[0].stderr[-2000:]
    assert not (tmp_path / "out" / "results.json").exists()


def test_config_world_size_not_matching_the_launch(tmp_path):
    proc, out = run_pattern(tmp_path, "world_size: 4\n" + suite("rank: 1"), nproc=2, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "world_size" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


SWEEP = """
name: faults
timeout_s: 3
defaults: {warmup_iters: 0, iters: 3, baseline: false}
patterns:
  - name: long
    sweep: {ms: [SIZES]}
    blocks:
      - {name: ar, op: all_reduce, axis: world, size: 4K}
      - {name: nap, op: sleep, axis: world, duration_us: "${ms}"}
""".replace("SIZES", ", ".join(str(40000 + i) for i in range(200)))


def test_sigint_on_rank_zero_ends_a_long_sweep_cleanly(tmp_path):
    procs, start = start_ranks(tmp_path, SWEEP, [2, 2])
    results = tmp_path / "out" / "results.json"
    while not results.exists() and time.monotonic() - start < 60:
        time.sleep(0.1)  # poll: the first sweep point is saved
    assert results.exists(), "no sweep point finished within 60 s"
    time.sleep(0.5)  # land the signal inside a later point, not between two
    procs[0].send_signal(signal.SIGINT)
    sent = time.monotonic()
    ranks = wait_ranks(procs, start)
    for r in ranks:
        assert r.returncode != 0, r.stderr[-2000:]
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        # Within the collective timeout plus the agreement's grace, not the 90 s deadline.
        assert r.elapsed_s - (sent - start) < 30, r.elapsed_s
    assert "interrupted" in ranks[0].stderr, ranks[0].stderr[-2000:]
    finished = {r["pattern"] for r in read_records(tmp_path / "out")}
    assert 1 <= len(finished) < 200
    patterns = read_records(tmp_path / "out", "patterns.json")
    assert {p["pattern"] for p in patterns} == finished
    assert not [p.name for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


THREE = """
name: faults
timeout_s: 3
defaults: {warmup_iters: 0, iters: 2, baseline: false}
patterns:
  - {name: a, blocks: [{name: ar, op: all_reduce, axis: world, size: 4K}]}
  - {name: b, blocks: [{name: ar, op: all_reduce, axis: world, size: 4K}]}
  - {name: c, blocks: [{name: ar, op: all_reduce, axis: world, size: 4K}]}
"""


@pytest.mark.parametrize("update", [1, 3])
def test_signals_while_rank_zero_saves_leave_files_that_agree(tmp_path, update):
    # Update 1: the signals wait until the next pattern, which every rank then stops at, through
    # the agreement. Update 3 (the last pattern): nothing is left to stop; rank 0 says it was
    # interrupted, and rank 1, which finished everything, exits 0.
    entry = ("tests.integration.signal_driver", str(update))
    ranks = wait_ranks(*start_ranks(tmp_path, THREE, [2, 2], entry=entry))
    for r in ranks:
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        assert r.elapsed_s < 30, (r.rank, r.elapsed_s, r.stderr[-2000:])  # no collective timeout
    assert ranks[0].returncode == 130, ranks[0].stderr[-2000:]
    assert "interrupted" in ranks[0].stderr
    out = tmp_path / "out"
    expected = ["a", "b", "c"][:update]
    assert sorted({r["pattern"] for r in read_records(out)}) == expected
    assert [p["pattern"] for p in read_records(out, "patterns.json")] == expected
    (metrics_file,) = (tmp_path / "metrics").glob("metrics-*.json")
    metrics = json.loads(metrics_file.read_text())["metrics"]
    assert sorted({key.split("/")[1] for key in metrics}) == expected
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    if update == 1:
        assert ranks[1].returncode == 130, ranks[1].stderr[-2000:]
        assert "interrupted" in ranks[1].stderr or "rank 0" in ranks[0].stderr
        failed = read_records(out, "failures.json")
        assert [f["pattern"] for f in failed] == ["b"] and "interrupted" in failed[0]["error"]
    else:
        assert ranks[1].returncode == 0, ranks[1].stderr[-2000:]
        assert not (out / "failures.json").exists()


GO_ON = f"""
name: go_on
timeout_s: 3
stop_on_error: false
defaults: {{warmup_iters: 1, iters: 3, baseline: false}}
patterns:
  - name: first
    blocks: [{{name: ar, op: all_reduce, axis: world, size: 4K}}]
  - name: setup_fail
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: bad, op: "{FAULT}", axis: world, rank: 1, when: setup}}
  - name: mid
    blocks: [{{name: ar, op: all_reduce, axis: world, size: 4K}}]
  - name: all_fail
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: bad, op: "{FAULT}", axis: world, rank: -1, when: launch, after: 2}}
  - name: late
    blocks: [{{name: ar, op: all_reduce, axis: world, size: 4K}}]
  - name: one_fail
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: bad, op: "{FAULT}", axis: world, rank: 1, when: launch, after: 2}}
  - name: never
    blocks: [{{name: ar, op: all_reduce, axis: world, size: 4K}}]
"""


def test_stop_on_error_false_goes_on_only_after_contained_failures(tmp_path):
    start = time.monotonic()
    proc, out = run_pattern(tmp_path, GO_ON, nproc=2, timeout=EXIT_DEADLINE_S)
    assert time.monotonic() - start < EXIT_DEADLINE_S
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [p["pattern"] for p in read_records(out, "patterns.json")] == ["first", "mid", "late"]
    failures = json.loads((out / "failures.json").read_text())
    assert [f["pattern"] for f in failures] == ["setup_fail", "all_fail", "one_fail"]
    assert "rank 1" in failures[0]["error"] and "phase setup" in failures[0]["error"]
    assert "phase measure" in failures[2]["error"]
    # Half-issued collectives cannot be contained: the run stops there.
    assert "never" not in proc.stdout
