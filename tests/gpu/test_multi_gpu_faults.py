"""Faults under NCCL at 4 ranks: every process gone in time, one message, finished work saved.

The CPU versions are tests/integration/test_faults.py; these run the same faults with the NCCL
backend, on 4 GPUs or 4 ranks sharing one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1). Each case's
time to all-gone and exit statuses are appended to $MAESTRO_GPU_OUT/faults.json when set (the
fault table of docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from bench.fault_table import append_row  # noqa: E402
from tests.gpu.test_multi_gpu import runnable  # noqa: E402
from tests.integration.fault_blocks import fault_moment  # noqa: E402
from tests.integration.helpers import REPO_ROOT, subprocess_env  # noqa: E402
from tests.integration.test_faults import (  # noqa: E402
    EXIT_DEADLINE_S,
    LocalRun,
    assert_all_failed,
    assert_first_saved,
    run_ranks,
    start_ranks,
    suite,
    wait_ranks,
)
from userbenchmark.maestro.core.runtime.agreement import grace_s  # noqa: E402
from userbenchmark.maestro.core.runtime.supervision import EXIT_GRACE_S  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not runnable(4), reason="needs 4 ranks (GPUs or a shared GPU)"),
]
WORLD = 4
KEEP = os.environ.get("MAESTRO_GPU_OUT")


def _record(
    case: str, launcher: str, elapsed_s: float, statuses: list[int], limit_s: float | None = None
) -> None:
    print(f"{case}: {launcher}, all gone after {elapsed_s:.1f} s, exit statuses {statuses}")
    if KEEP:
        row = {
            "fault": case,
            "launcher": launcher,
            "backend": "nccl",
            "timeout_s": NCCL_TIMEOUT_S,
            "all_gone_s": elapsed_s,
            "limit_s": EXIT_DEADLINE_S if limit_s is None else limit_s,
            "exit": statuses,
        }
        append_row(Path(KEEP) / "faults.json", row, torch.cuda.get_device_name(0))


NCCL_TIMEOUT_S = 20.0
"""Generous collective timeout: NCCL communicators of ranks sharing a GPU start slowly."""
GONE_LIMIT_S = NCCL_TIMEOUT_S + grace_s(NCCL_TIMEOUT_S) + EXIT_GRACE_S
"""The documented deadline (docs/reliability.md) at this timeout_s."""


def _nccl(text: str) -> str:
    return text.replace("timeout_s: 3", f"timeout_s: {NCCL_TIMEOUT_S:g}")


def _no_watchdog_only(stderr: str) -> None:
    # The rank names the failure in maestro's words, not only in an NCCL watchdog dump.
    assert "maestro:" in stderr, stderr[-3000:]


def test_raise_in_setup(tmp_path):
    ranks = run_ranks(tmp_path, _nccl(suite("rank: 1, when: setup")), [WORLD] * WORLD)
    assert_all_failed(ranks, phase="setup")
    assert_first_saved(tmp_path)
    _no_watchdog_only(ranks[0].stderr)
    _record("raise in setup", "per-rank processes", max(r.elapsed_s for r in ranks),
            [r.returncode for r in ranks])  # fmt: skip


def test_raise_mid_block(tmp_path):
    text = _nccl(suite("rank: 1, when: launch, after_launches: 3"))
    ranks = run_ranks(tmp_path, text, [WORLD] * WORLD)
    assert_all_failed(ranks, phase="measure")
    assert_first_saved(tmp_path)
    _no_watchdog_only(ranks[0].stderr)
    _record("raise mid-block", "per-rank processes", max(r.elapsed_s for r in ranks),
            [r.returncode for r in ranks])  # fmt: skip


def test_sigkill_of_a_rank_mid_pattern(tmp_path):
    text = _nccl(suite("rank: 1, when: launch, how: kill, after_launches: 3"))
    ranks = run_ranks(tmp_path, text, [WORLD] * WORLD)
    assert ranks[1].returncode == -signal.SIGKILL
    assert_all_failed(ranks, phase="measure")
    assert_first_saved(tmp_path)
    _no_watchdog_only(ranks[0].stderr)
    _record("SIGKILL of rank 1", "per-rank processes", max(r.elapsed_s for r in ranks),
            [r.returncode for r in ranks])  # fmt: skip


LONG = """
name: long
world_size: 4
timeout_s: 20
defaults: {warmup_iters: 2, iters: 200, baseline: false}
patterns:
  - name: p
    sweep: {i: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}
    blocks:
      - {name: "ar_${i}", op: all_reduce, size: 64M}
      - {name: mm, op: gemm, lane: compute, m: 4096, n: 4096, k: 4096}
"""


def _processes_with(marker: str) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split(None, 1)[0]) for line in out.splitlines() if marker in line]


def test_sigint_to_the_launcher(tmp_path):
    config = tmp_path / "long.yaml"
    config.write_text(LONG)
    out = tmp_path / "out"
    env = subprocess_env()
    cmd = [sys.executable, "-m", "userbenchmark.maestro", "run", "-c", str(config)]
    cmd += ["--nproc", str(WORLD), "--output-dir", str(out), "--no-metrics"]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        while not (out / "results.json").exists():  # the first pattern is saved
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() - start < 300, "no pattern finished in 300 s"
            time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=EXIT_DEADLINE_S)
        while _processes_with(str(config)) and time.monotonic() - sent < EXIT_DEADLINE_S:
            time.sleep(0.5)
        gone = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _processes_with(str(config)):
            os.kill(pid, signal.SIGKILL)
    assert not _processes_with(str(config)), "workers outlived the launcher"
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "interrupted" in err
    records = json.loads((out / "results.json").read_text())
    assert records and all(r["pattern"].startswith("p[") for r in records)
    _record("SIGINT to the launcher", "--nproc", gone, [proc.returncode])


def test_a_frozen_store_host(tmp_path):
    """Rank 0 hosts the rendezvous store and stops (SIGSTOP) mid-collective: every other rank
    ends with status 1 naming it, within the deadline; rank 0 is then killed."""
    procs, start = start_ranks(
        tmp_path, _nccl(suite("rank: 0, how: stop, after_launches: 3")), [WORLD] * WORLD
    )
    try:
        others = wait_ranks(procs[1:], start)
        fault = fault_moment(tmp_path / "marks", 0)
        assert fault is not None, others[0].stderr[-3000:]
        for r in others:
            assert r.returncode == 1, r.stderr[-3000:]
            assert "which hosts the rendezvous store, stopped answering" in r.stderr, r.stderr
        gone = max(r.ended_at for r in others) - fault
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    _record(
        "SIGSTOP of rank 0, the store's host (the others)",
        "per-rank processes",
        round(gone, 1),
        [r.returncode for r in others],
        GONE_LIMIT_S,
    )
    assert gone <= GONE_LIMIT_S


def test_sigstop_of_a_worker(tmp_path):
    run = LocalRun(
        tmp_path, _nccl(suite("rank: 1, when: launch, how: stop, after_launches: 3")), nproc=WORLD,
        backend="nccl",
    )  # fmt: skip
    fault = run.fault_at(1)
    gone = run.all_gone() - fault
    err = run.stderr()
    assert run.proc.returncode == 1, err[-3000:]
    assert "rank 1 did not reach the run's agreement step (stopped or hung)" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert_first_saved(tmp_path)
    _record("SIGSTOP of rank 1", "--nproc", round(gone, 1), [run.proc.returncode], GONE_LIMIT_S)
    assert gone <= GONE_LIMIT_S
