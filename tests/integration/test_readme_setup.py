"""README.md's set-up and test commands, run as written in fresh virtual environments.

The commands are read from the README, so the page cannot drift from what works. "Set-up in two
commands": the first installs everything (torch too, the CPU build here: this machine has no
NVIDIA driver), the second runs the bundled quickstart pattern on two gloo ranks and writes the
metrics file. "Tests": the requirements, then pytest, in an environment whose own ``python`` and
``torchrun`` are the ones the doc-command tests must use.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from userbenchmark.maestro import __version__ as maestro_version
from userbenchmark.maestro.install import nvidia_driver_present

from ..docblocks import ROOT, bash_blocks, run_documented, user_checkout

pytestmark = pytest.mark.integration

README = ROOT / "README.md"
# Hang limits, not speed checks: the set-up unpacks torch and resolves from the package index.
SETUP_HANG_S = 1800
RUN_HANG_S = 900
# pip's own settings for the set-up (a user's pip configuration may hold the same): no byte-code
# compiled at install time (Python compiles what it imports, and caches it; compiling all of
# torch, sympy and pandas up front costs more than the run's imports), and no retry of an index
# that cannot be reached (pip then takes torch from the wheel folders and mirrors of its
# configuration, as the README says). PIP_NO_COMPILE is pip's --no-compile, whose value is
# inverted: "0" turns compiling off. Neither changes what is installed.
PIP_SETTINGS = {"PIP_NO_COMPILE": "0", "PIP_RETRIES": "0"}
# Python's own default in a user's shell: byte-code cached as it is imported (a test machine
# may turn that off, which makes every process of the set-up compile torch again).
NOT_A_USERS_DEFAULT = ("PYTHONDONTWRITEBYTECODE",)
# The environment is written to memory where the machine has room: torch unpacks to about 1 GB
# of small files, which a slow disk takes several times as long to write.
MEMORY_FS = Path("/dev/shm")
MEMORY_FS_MIN_FREE_BYTES = 4 * 1024**3


def readme_commands(heading: str) -> tuple[str, ...]:
    """The commands of the first bash block after a heading of the README."""
    line = README.read_text().splitlines().index(heading) + 1
    return next(b for b in bash_blocks(README) if b.line > line).commands


def fresh_venv(path: Path, *, inherit: bool = False, pip: bool | None = None) -> dict[str, str]:
    """A new virtual environment at ``path``; returns the variables of a shell that activated
    it (``source path/bin/activate``), without inherited launcher variables.

    ``inherit``: a ``.pth`` file puts this environment's packages after its own, so it takes a
    second and installs nothing, and its ``python`` is still a virtual environment's, which
    only finds those packages when started by its own path; no pip of its own unless ``pip``.
    """
    command = [sys.executable, "-m", "venv", str(path)]
    with_pip = not inherit if pip is None else pip
    subprocess.run(
        command if with_pip else [*command, "--without-pip"], check=True, timeout=RUN_HANG_S
    )
    if inherit:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        paths = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
        (path / "lib" / version / "site-packages" / "outer.pth").write_text("\n".join(paths))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RANK", "WORLD_SIZE")
        and not k.startswith(("MASTER_", "LOCAL_", "TORCHELASTIC_", "SLURM_", "PYTEST_"))
    }
    env["PATH"] = f"{path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(path)
    return env


def run_commands(commands: tuple[str, ...], cwd: Path, env: dict[str, str], hang_s: float):
    """Each command as the README gives it, in order; their outputs."""
    where = README.name
    return [
        run_documented(c, cwd=cwd, env=env, hang_s=hang_s, where=where).stdout for c in commands
    ]


@pytest.fixture
def scratch(tmp_path) -> Iterator[Path]:
    """An empty folder for a checkout and a virtual environment: in memory where there is room,
    else ``tmp_path``."""
    try:
        roomy = shutil.disk_usage(MEMORY_FS).free >= MEMORY_FS_MIN_FREE_BYTES
    except OSError:
        roomy = False
    if not (roomy and os.access(MEMORY_FS, os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="maestro-setup-", dir=MEMORY_FS) as folder:
        yield Path(folder)


def test_the_readme_sets_up_in_two_commands():
    commands = readme_commands("## Set-up in two commands")
    assert len(commands) == 2, commands
    assert commands[1].startswith("python run_benchmark.py maestro -c quickstart --nproc 2")


@pytest.mark.skipif(
    nvidia_driver_present(),
    reason="with an NVIDIA driver the set-up installs a CUDA build of torch (GBs); this test "
    "runs the CPU path",
)
@pytest.mark.timeout(SETUP_HANG_S + 2 * RUN_HANG_S)  # its own steps' hang limits decide
def test_readme_setup_from_a_fresh_virtual_environment(scratch):
    # A checkout of the files a user runs, outside this repository: the run writes
    # .userbenchmark/ beside run_benchmark.py.
    checkout = user_checkout(scratch / "maestro", "run_benchmark.py")
    env = fresh_venv(scratch / "venv") | PIP_SETTINGS
    for name in NOT_A_USERS_DEFAULT:
        env.pop(name, None)
    setup, main_job = readme_commands("## Set-up in two commands")
    run_commands((setup,), checkout, env, SETUP_HANG_S)

    # The environment got a CPU build of torch (no NVIDIA driver here) and no cupti-python.
    probe = (
        "import importlib.util, torch, yaml, tabulate, pandas, numpy, click; "
        "print(torch.version.cuda, importlib.util.find_spec('cupti') is not None)"
    )
    (found,) = run_commands((f'python -c "{probe}"',), checkout, env, RUN_HANG_S)
    assert found.split() == ["None", "False"], found

    (out,) = run_commands((main_job,), checkout, env, RUN_HANG_S)
    assert "== quickstart / ag_rs" in out
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


def test_readme_test_commands_pass_in_a_virtual_environment(tmp_path):
    # The suite runs this test, so the README's `python -m pytest` runs, through
    # PYTEST_ADDOPTS, the tests that start the environment's own `python` (a symlink to it
    # loses the environment): the check of that `python`, and one block of doc commands that
    # needs no launcher (the suite itself runs every block).
    commands = readme_commands("## Tests")
    assert commands[-1] == "python -m pytest", commands
    env = fresh_venv(tmp_path / "venv", inherit=True)
    env["PYTEST_ADDOPTS"] = (
        "-p no:cacheprovider -q tests/integration/test_doc_commands.py "
        "-k 'environments_python or run_as_written and pattern-format.md:7]'"
    )
    *_, out = run_commands(commands, ROOT, env, RUN_HANG_S)
    assert " passed" in out and "failed" not in out and "deselected" in out, out[-3000:]


def test_readme_package_install_runs_maestro_and_load_results_from_any_folder(tmp_path):
    install, run, load = readme_commands("## Installed as a package")
    checkout = user_checkout(tmp_path / "maestro", "pyproject.toml")
    env = fresh_venv(tmp_path / "venv", inherit=True, pip=True) | PIP_SETTINGS
    run_commands((install,), checkout, env, SETUP_HANG_S)
    elsewhere = tmp_path / "elsewhere"  # no checkout here: the installed package runs
    elsewhere.mkdir()
    *_, out = run_commands((run, load), elsewhere, env, RUN_HANG_S)
    assert "allgather" in out and "reduce_scatter" in out, out
    assert (elsewhere / "quickstart-results" / "results.json").exists()
    assert list((checkout / ".userbenchmark" / "maestro").glob("metrics-*.json"))
