"""install.py: the dry run prints exactly the commands a real run executes, runnable as printed;
torch is installed only where it is missing, the CPU build where there is no NVIDIA driver."""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from userbenchmark.maestro import install

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def torch_present(monkeypatch):
    monkeypatch.setattr(install, "torch_installed", lambda: True)


@pytest.fixture
def cuda_13(monkeypatch):
    monkeypatch.setattr(install, "torch_cuda_version", lambda: "13.0")
    monkeypatch.setattr(install, "numpy_constraint", lambda: "numpy==1.26.4")


def _executed(monkeypatch, argv=(), status=0) -> list[list[str]]:
    ran: list[list[str]] = []

    def fake_run(command, check):
        ran.append(list(command))
        return subprocess.CompletedProcess(command, status)

    monkeypatch.setattr(install.subprocess, "run", fake_run)
    assert install.main(list(argv)) == status
    return ran


def test_the_dry_run_prints_what_a_run_executes_and_it_can_be_run_again(
    cuda_13, monkeypatch, capsys
):
    assert install.main(["--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    printed = [shlex.split(line) for line in lines]
    assert printed == _executed(monkeypatch)
    assert printed[0][-4:] == ["numpy==1.26.4", "-r", str(install.REQUIREMENTS), "matplotlib>=3.6"]
    assert printed[1][-2:] == ["numpy==1.26.4", "cupti-python>=13,<14"]
    for command in printed:
        assert "-c" not in command  # no constraints file that is gone once the dry run ends
        for token in command:
            if token.startswith("/"):
                assert install.Path(token).exists(), token  # every file it names still exists


def test_a_shell_reads_the_printed_lines_as_the_same_arguments(cuda_13, capsys, tmp_path):
    install.main(["--dry-run"])
    for line in capsys.readouterr().out.splitlines():
        # printf instead of pip: a shell must see the same words and redirect nothing
        # (an unquoted cupti-python>=13,<14 would write a file named =13,).
        shell = subprocess.run(
            ["sh", "-c", "printf '%s\\n' " + line.split(" ", 1)[1]],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            check=True,
        )
        assert shell.stdout.splitlines() == shlex.split(line)[1:]
    assert list(tmp_path.iterdir()) == []


def test_without_numpy_there_is_no_pin(monkeypatch, capsys):
    monkeypatch.setattr(install, "torch_cuda_version", lambda: None)
    monkeypatch.setattr(install, "numpy_constraint", lambda: None)
    install.main(["--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert [shlex.split(line)[1:] for line in lines] == [
        ["-m", "pip", "install", "-r", str(install.REQUIREMENTS), "matplotlib>=3.6"]
    ]


# --- a fresh environment: torch missing -------------------------------------------------------
@pytest.fixture
def no_torch(monkeypatch):
    monkeypatch.setattr(install, "torch_installed", lambda: False)

    def no_import():
        raise AssertionError("torch must not be imported where it is missing")

    monkeypatch.setattr(install, "torch_cuda_version", no_import)


def _dry_run(argv, capsys) -> list[list[str]]:
    assert install.main(["--dry-run", *argv]) == 0
    return [shlex.split(line) for line in capsys.readouterr().out.splitlines()]


def test_without_torch_or_a_driver_the_cpu_build_comes_from_pytorchs_cpu_index(
    no_torch, monkeypatch, capsys
):
    monkeypatch.setattr(install, "nvidia_driver_present", lambda: False)
    printed = _dry_run([], capsys)
    torch = f"torch=={install.TESTED_TORCH_VERSION}"
    assert [c[1:] for c in printed] == [
        ["-m", "pip", "install", "--no-deps", "--index-url", install.CPU_INDEX_URL, torch],
        ["-m", "pip", "install", torch],  # its dependencies, from pip's configured indexes
        [str(Path(install.__file__).resolve()), install.AFTER_TORCH],  # again, with torch
    ]
    assert printed == _executed(monkeypatch)


def test_without_torch_on_a_machine_with_a_driver_the_cuda_build_comes_from_pypi(
    no_torch, monkeypatch, capsys
):
    monkeypatch.setattr(install, "nvidia_driver_present", lambda: True)
    printed = _dry_run(["--no-cupti"], capsys)
    assert [c[1:] for c in printed] == [
        ["-m", "pip", "install", f"torch=={install.TESTED_TORCH_VERSION}"],
        # again, now with torch; the option reaches the second run
        [str(Path(install.__file__).resolve()), install.AFTER_TORCH, "--no-cupti"],
    ]
    assert printed == _executed(monkeypatch, ["--no-cupti"])


def test_torch_build_overrides_the_driver_check(no_torch, monkeypatch, capsys):
    monkeypatch.setattr(install, "nvidia_driver_present", lambda: True)
    assert install.CPU_INDEX_URL in _dry_run(["--torch-build", "cpu"], capsys)[0]
    monkeypatch.setattr(install, "nvidia_driver_present", lambda: False)
    assert install.CPU_INDEX_URL not in _dry_run(["--torch-build", "cuda"], capsys)[0]


def test_an_unreachable_cpu_index_stops_with_what_to_do(no_torch, monkeypatch, caplog):
    monkeypatch.setattr(install, "nvidia_driver_present", lambda: False)
    with caplog.at_level(logging.ERROR, logger="maestro.install"):
        ran = _executed(monkeypatch, status=1)
    assert len(ran) == 1  # nothing after the failed torch install
    assert install.CPU_INDEX_URL in caplog.text and "CPU build of torch" in caplog.text


def test_an_installed_torch_is_never_reinstalled(cuda_13, monkeypatch):
    for command in _executed(monkeypatch):
        assert not any(re.match(r"torch\b", token) for token in command), command


def test_a_fresh_environment_gets_the_torch_ci_tests():
    # .ci/run pins the torch CI tests with; a fresh environment must get that same release.
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.findall(r"torch==([0-9][0-9.]*)", ci) == [install.TESTED_TORCH_VERSION]
    # ... and the CPU build, from the index install.py takes it from.
    assert re.findall(r"CPU_INDEX_URL=(\S+)", ci) == [install.CPU_INDEX_URL]


def test_torch_still_missing_after_its_install_is_an_error_not_a_loop(no_torch, monkeypatch):
    assert _executed(monkeypatch, [install.AFTER_TORCH], status=1) == []


def test_reading_torchs_cuda_version_before_numpy_is_installed_prints_no_warning():
    # The set-up's second pass imports torch before the requirements bring numpy.
    probe = (
        "import sys; sys.modules['numpy'] = None\n"
        "from userbenchmark.maestro import install\nprint(install.torch_cuda_version())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(install.__file__).parents[2],  # the checkout, where the package is found
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr[-2000:]
    assert "Failed to initialize NumPy" not in proc.stderr, proc.stderr[-2000:]
