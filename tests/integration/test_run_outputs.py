"""A run's output locations, in real processes: checked before any worker starts (exit 2 at
once, the option named), locked for the run, cleared of an earlier run's files, and a metrics
file name no other run has."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .helpers import REPO_ROOT, read_records, run_maestro
from .test_faults import EXIT_DEADLINE_S, ONE, SLOW, start_ranks, wait_ranks

pytestmark = pytest.mark.integration

QUICK = ["--iters", "2", "--warmup-iters", "0", "--no-baseline", "--pattern", "ag_rs"]


def _one_line(proc: subprocess.CompletedProcess[str], text: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("maestro: invalid option: "), proc.stderr
    assert text in lines[0], lines[0]


@pytest.mark.parametrize(
    ("option", "where", "message"),
    [
        ("--output-dir", "a_file", "is a file, expected a directory"),
        ("--metrics-dir", "a_file", "is a file, expected a directory"),
        ("--metrics-dir", "/proc/maestro", "is under /proc or /sys"),
        ("--output-dir", "a_file/below", "cannot be created"),
    ],
)
def test_unusable_output_locations_exit_2_before_any_worker(tmp_path, option, where, message):
    (tmp_path / "a_file").write_text("not a folder")
    path = where if where.startswith("/") else str(tmp_path / where)
    start = time.monotonic()
    proc = run_maestro(["run", "--nproc", "2", option, path], timeout=EXIT_DEADLINE_S)
    _one_line(proc, f"{option} {path}: {message}")
    assert time.monotonic() - start < 45  # no worker started, no timeout waited for


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_unwritable_output_dir_exits_2(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    proc = run_maestro(["run", "--nproc", "2", "--output-dir", str(folder)], timeout=60)
    _one_line(proc, f"--output-dir {folder}: is not writable")


def test_an_earlier_runs_files_are_moved_aside_and_the_metrics_name_is_reserved(tmp_path):
    out, metrics = tmp_path / "out", tmp_path / "metrics"
    out.mkdir()
    for name in ("results.json", "failures.json", "trace.json"):
        (out / name).write_text("stale")
    (out / "notes.txt").write_text("mine")
    args = ["run", "--nproc", "2", "--output-dir", str(out), "--metrics-dir", str(metrics)]
    proc = run_maestro([*args, *QUICK], timeout=EXIT_DEADLINE_S * 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (previous,) = out.glob("previous-*")
    assert sorted(p.name for p in previous.iterdir()) == [
        "failures.json",
        "results.json",
        "trace.json",
    ]
    assert all((previous / n).read_text() == "stale" for n in ("results.json", "trace.json"))
    moved = [line for line in proc.stderr.splitlines() if "of an earlier run" in line]
    assert len(moved) == 1 and "moved 3 file(s)" in moved[0], proc.stderr[-3000:]
    assert (out / "notes.txt").read_text() == "mine"  # nothing else is touched
    assert not (out / "failures.json").exists()  # no stale failure next to new results
    assert {r["pattern"] for r in read_records(out)} == {"ag_rs"}
    (metrics_file,) = metrics.glob("metrics-*.json")
    assert f"maestro: metrics written to {metrics_file}" in proc.stdout
    assert [p.name for p in metrics.iterdir() if p.name.startswith(".")] == []  # no reservation


def test_a_second_run_into_the_same_output_dir_exits_2(tmp_path):
    out = tmp_path / "out"
    config = tmp_path / "slow.yaml"
    config.write_text(SLOW)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    first = subprocess.Popen(
        [sys.executable, "-m", "userbenchmark.maestro", "run", "-c", str(config), "--nproc", "2"]
        + ["--output-dir", str(out), "--no-metrics"],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        start = time.monotonic()
        while not (out / "results.json").exists():
            assert first.poll() is None, "the first run ended early"
            assert time.monotonic() - start < EXIT_DEADLINE_S, "the first run saved nothing"
            time.sleep(0.1)
        second = run_maestro(
            ["run", "-c", str(config), "--nproc", "2", "--output-dir", str(out), "--no-metrics"],
            timeout=EXIT_DEADLINE_S,
        )
        _one_line(second, f"another maestro run is writing to {out} (pid {first.pid})")
        assert (out / "results.json").exists() and not list(out.glob("previous-*"))
    finally:
        os.killpg(first.pid, signal.SIGINT)
        first.wait(timeout=EXIT_DEADLINE_S)
    assert first.returncode == 130


def test_under_per_rank_launch_rank_0_checks_the_outputs(tmp_path):
    """Only rank 0 writes, so rank 0 checks; it exits 2 at once and the others stop at the
    rendezvous without it."""
    (tmp_path / "a_file").write_text("")
    bad = str(tmp_path / "a_file")
    procs, start = start_ranks(
        tmp_path, ONE.replace("NAME", "p"), [2, 2], extra=[["--output-dir", bad]] * 2
    )
    ranks = wait_ranks(procs, start)
    assert ranks[0].returncode == 2, ranks[0].stderr[-2000:]
    assert ranks[0].stderr.strip() == (
        f"maestro: invalid option: --output-dir {bad}: is a file, expected a directory"
    )
    assert ranks[1].returncode != 0 and "Traceback" not in ranks[1].stderr, ranks[1].stderr
    assert "rank 0" in ranks[1].stderr, ranks[1].stderr[-2000:]
