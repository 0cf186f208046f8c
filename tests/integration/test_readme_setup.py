"""README.md's "Set-up in two commands", run as written in a fresh virtual environment.

The commands are read from the README, so the page cannot drift from what works: the first
installs everything (torch too, the CPU build here: this machine has no NVIDIA driver), the
second runs the bundled quickstart pattern on two gloo ranks and writes the metrics file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from userbenchmark.maestro import __version__ as maestro_version
from userbenchmark.maestro.install import nvidia_driver_present

from ..docblocks import ROOT, bash_blocks, documented_statuses

pytestmark = pytest.mark.integration

README = ROOT / "README.md"
SECTION = "## Set-up in two commands"
# Hang limits, not speed checks: the set-up takes 1-3 minutes on a loaded 2-core machine
# (unpacking torch, resolving from the package index), the quickstart run 10-45 s.
SETUP_HANG_S = 1800
RUN_HANG_S = 900


def setup_commands() -> tuple[str, ...]:
    """The commands of the first bash block after the README's set-up heading."""
    text = README.read_text()
    heading = text.splitlines().index(SECTION) + 1
    block = next(b for b in bash_blocks(README) if b.line > heading)
    return block.commands


def test_the_readme_sets_up_in_two_commands():
    commands = setup_commands()
    assert len(commands) == 2, commands
    assert commands[1].startswith("python run_benchmark.py maestro -c quickstart --nproc 2")


@pytest.mark.skipif(
    nvidia_driver_present(),
    reason="with an NVIDIA driver the set-up installs a CUDA build of torch (GBs); this test "
    "runs the CPU path",
)
def test_readme_setup_from_a_fresh_virtual_environment(tmp_path):
    # A checkout of the files a user runs, outside this repository: the run writes
    # .userbenchmark/ beside run_benchmark.py.
    checkout = tmp_path / "maestro"
    checkout.mkdir()
    shutil.copy2(ROOT / "run_benchmark.py", checkout)
    shutil.copytree(
        ROOT / "userbenchmark",
        checkout / "userbenchmark",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=SETUP_HANG_S)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RANK", "WORLD_SIZE")
        and not k.startswith(("MASTER_", "LOCAL_", "TORCHELASTIC_", "SLURM_"))
    }
    # What `source venv/bin/activate` does.
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)

    setup, main_job = setup_commands()
    done = subprocess.run(
        ["bash", "-c", setup],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=SETUP_HANG_S,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode in documented_statuses(setup), (
        f"{setup}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )

    # The environment got a CPU build of torch (no NVIDIA driver here) and no cupti-python.
    python = str(venv / "bin" / "python")
    probe = (
        "import importlib.util, torch, yaml, tabulate, pandas, numpy, click; "
        "print(torch.version.cuda, importlib.util.find_spec('cupti') is not None)"
    )
    check = subprocess.run(
        [python, "-c", probe], env=env, capture_output=True, text=True, timeout=RUN_HANG_S
    )
    assert check.returncode == 0, check.stderr[-3000:]
    assert check.stdout.split() == ["None", "False"], check.stdout

    done = subprocess.run(
        ["bash", "-c", main_job],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_HANG_S,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode in documented_statuses(main_job), (
        f"{main_job}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    assert "== quickstart / ag_rs" in done.stdout
    files = list((checkout / ".userbenchmark" / "maestro").glob("metrics-*.json"))
    assert len(files) == 1, files
    doc = json.loads(files[0].read_text())
    assert doc["name"] == "maestro"
    assert doc["environ"]["world_size"] == "2"
    assert doc["environ"]["maestro_version"] == maestro_version
    assert "quickstart/ag_rs/allgather/busbw_gbps" in doc["metrics"]
    assert all(key.startswith("quickstart/") for key in doc["metrics"])
    leftovers = {p.name for p in checkout.iterdir()} - {"run_benchmark.py", "userbenchmark"}
    assert leftovers == {".userbenchmark"}, leftovers  # nothing else written beside it
