"""install.py: the dry run prints exactly the commands a real run executes, runnable as printed."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from userbenchmark.maestro import install


@pytest.fixture
def cuda_13(monkeypatch):
    monkeypatch.setattr(install, "torch_cuda_version", lambda: "13.0")
    monkeypatch.setattr(install, "numpy_constraint", lambda: "numpy==1.26.4")


def _executed(monkeypatch) -> list[list[str]]:
    ran: list[list[str]] = []

    def fake_run(command, check):
        ran.append(list(command))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(install.subprocess, "run", fake_run)
    assert install.main([]) == 0
    return ran


def test_the_dry_run_prints_what_a_run_executes_and_it_can_be_run_again(
    cuda_13, monkeypatch, capsys
):
    assert install.main(["--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    printed = [shlex.split(line) for line in lines]
    assert printed == _executed(monkeypatch)
    assert printed[0][-3:] == ["numpy==1.26.4", "-r", str(install.REQUIREMENTS)]
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
        ["-m", "pip", "install", "-r", str(install.REQUIREMENTS)]
    ]
