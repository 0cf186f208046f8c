"""Multi-node launch: two torchrun "nodes" on loopback meet through c10d rendezvous, and
examples/slurm.sbatch runs end to end with stand-ins for srun and scontrol."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from userbenchmark.maestro.core.runtime.rendezvous import free_port

from ..docblocks import ROOT, bash_blocks, launchers_here, with_options
from .helpers import QUICK_HANG_S, REPO_ROOT, RUN_HANG_S, read_records, subprocess_env

pytestmark = pytest.mark.integration

SBATCH = REPO_ROOT / "examples" / "slurm.sbatch"
MULTINODE_PAGE = ROOT / "docs" / "multinode.md"
QUICK = ["--iters", "2", "--warmup-iters", "1"]

# Stand-ins for SLURM's commands: `scontrol show hostnames` prints the job's node list one per
# line; `srun --ntasks-per-node=1 CMD` starts CMD once per node and fails if any copy fails.
FAKE_SCONTROL = """#!/bin/bash
echo "$SLURM_JOB_NODELIST" | tr ',' '\\n'
"""
FAKE_SRUN = """#!/bin/bash
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
    SLURM_PROCID=$i SLURM_NODEID=$i "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("SLURM_")}
    # torchrun and python from this interpreter's environment come first.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def _wait_all(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    """(exit status, output) of each process; kills every one of them past the timeout."""
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=RUN_HANG_S)
            results.append((proc.returncode, out))
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the whole session: torchrun and workers
        pytest.fail(f"multi-node run did not finish within {RUN_HANG_S} s (a hang)")
    return results


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group, so a hang can be killed as a whole
    )


def test_sbatch_script_parses():
    proc = subprocess.run(
        ["bash", "-n", str(SBATCH)], capture_output=True, text=True, timeout=QUICK_HANG_S
    )
    assert proc.returncode == 0, proc.stderr


def loopback_commands() -> list[str]:
    """The torchrun commands of docs/multinode.md's "Trying it on one machine" block."""
    (block,) = [b for b in bash_blocks(MULTINODE_PAGE) if b.kind == "run by"]
    commands = [c.removesuffix("&").strip() for c in block.commands if c != "wait"]
    assert len(commands) == 2 and all(c.startswith("torchrun ") for c in commands), commands
    return commands


def test_two_torchrun_nodes_on_loopback(tmp_path):
    # The page's commands as written, on a free port, with a run id of their own (tests may
    # run beside each other), fewer iterations and this test's folders.
    port = free_port()
    run_id = f"maestro-test-{uuid.uuid4().hex[:8]}"
    out, metrics = tmp_path / "out", tmp_path / "metrics"
    options = shlex.join(
        [
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            run_id,
            "--output-dir",
            str(out),
            "--metrics-dir",
            str(metrics),
            *QUICK,
        ]
    )
    procs = []
    for command in loopback_commands():
        argv = shlex.split(with_options(command, options))
        procs.append(_start([sys.executable, "-m", "torch.distributed.run", *argv[1:]], _env()))
    results = _wait_all(procs)
    for status, output in results:
        assert status == 0, output[-3000:]
    # Rank 0 (on whichever node c10d made first) alone printed the tables and wrote the files.
    assert sum("== quickstart / ag_rs" in output for _, output in results) == 1
    (metrics_file,) = metrics.glob("metrics-*.json")
    assert json.loads(metrics_file.read_text())["environ"]["world_size"] == "2"
    records = read_records(out)
    assert records and {r["team_size"] for r in records if r["axis"] == "world"} == {2}


def test_sbatch_script_runs_two_nodes_with_stand_ins(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launchers_here(bin_dir)  # the script's `torchrun` and `python`: this interpreter
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = _env(
        {
            "SLURM_JOB_ID": f"4242{os.getpid()}",
            "SLURM_JOB_NODELIST": "127.0.0.1,localhost",
            "SLURM_NNODES": "2",
            "SLURM_GPUS_ON_NODE": "1",
            "MASTER_PORT": str(free_port()),
            "CONFIG": "quickstart",
            "OUTPUT_DIR": str(tmp_path / "out"),
        }
    )
    env["PATH"] = str(bin_dir) + os.pathsep + env["PATH"]
    proc = _start(
        ["bash", str(SBATCH), *QUICK, "--metrics-dir", str(tmp_path / "metrics")],
        env,
    )
    ((status, output),) = _wait_all([proc])
    assert status == 0, output[-3000:]
    assert "on 2 nodes x 1 GPUs (world size 2), rendezvous 127.0.0.1:" in output
    (metrics_file,) = (tmp_path / "metrics").glob("metrics-*.json")
    assert json.loads(metrics_file.read_text())["environ"]["world_size"] == "2"
    assert {r["team_size"] for r in read_records(tmp_path / "out") if r["axis"] == "world"} == {2}


def test_sbatch_script_stops_on_a_config_that_does_not_fit(tmp_path):
    # tensor_parallel is fixed at 8 ranks: 2 nodes x 1 GPU must fail at validate, before srun.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "srun").write_text("#!/bin/bash\necho srun-was-called\nexit 99\n")
    for name in ("scontrol", "srun"):
        (bin_dir / name).chmod(0o755)
    env = _env(
        {
            "SLURM_JOB_ID": "1",
            "SLURM_JOB_NODELIST": "127.0.0.1,localhost",
            "SLURM_NNODES": "2",
            "SLURM_GPUS_ON_NODE": "1",
            "CONFIG": "tensor_parallel",
        }
    )
    env["PATH"] = str(bin_dir) + os.pathsep + env["PATH"]
    proc = subprocess.run(
        ["bash", str(SBATCH)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=QUICK_HANG_S,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "srun-was-called" not in proc.stdout
    assert "world_size" in proc.stderr


def test_sbatch_script_uses_the_slurm_rendezvous():
    text = Path(SBATCH).read_text()
    for piece in (
        'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1',
        '--nnodes "$SLURM_NNODES"',
        "--rdzv-backend c10d",
        '--rdzv-id "$SLURM_JOB_ID"',
        "-m userbenchmark.maestro run",
    ):
        assert piece in text
