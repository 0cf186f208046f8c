"""Every command that README.md and docs/*.md show in a ``bash`` block runs, as written, with the
exit status the page gives it (tests/docblocks.py says how a block is marked otherwise).

Blocks run in a copy of the files a user runs from (``run_benchmark.py`` writes its metrics
beside itself), with ``python`` and ``torchrun`` of this interpreter's environment. Blocks
marked as needing a GPU, a cluster or a TorchBench checkout, or as run by another test, are
not run here (each marker must say why); usage lines with placeholders (synopses) have each
option they name checked against the command's ``--help`` (made in this process).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from functools import cache

import pytest

import run_benchmark
from userbenchmark.maestro import cli
from userbenchmark.maestro.core.runtime.rendezvous import free_port

from ..docblocks import (
    PAGES,
    ROOT,
    BashBlock,
    bash_blocks,
    launchers_here,
    run_documented,
    user_checkout,
    with_options,
)
from .helpers import QUICK_HANG_S, RUN_HANG_S

pytestmark = pytest.mark.integration

BLOCKS = [block for page in PAGES for block in bash_blocks(page)]
_OPTION = re.compile(r"--[a-z][a-z0-9-]*")


def _ids(blocks: list[BashBlock]) -> list[str]:
    return [block.where for block in blocks]


def _starts_a_run(command: str) -> bool:
    return "userbenchmark.maestro run" in command or "run_benchmark.py maestro" in command


def test_the_pages_have_commands_and_every_marker_says_why():
    assert len(BLOCKS) >= 15, _ids(BLOCKS)
    for block in BLOCKS:
        assert block.commands, f"{block.where}: an empty bash block"
        if block.kind in ("skip", "run with", "run by"):
            assert block.text, f"{block.where}: '{block.kind}' needs its reason or options"
        if block.kind == "run by":
            runner = ROOT / block.text
            assert runner.is_file(), f"{block.where}: no test file {block.text}"
            page = block.page.name
            assert f'"{page}"' in runner.read_text(), f"{block.text} does not read {page}"


def test_commands_run_with_this_environments_python_and_torchrun(tmp_path):
    launchers_here(tmp_path)
    for argv, expected in (
        (["python", "-c", "import sys; print(sys.prefix)"], sys.prefix),
        (["torchrun", "--help"], None),
    ):
        done = subprocess.run(
            [str(tmp_path / argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=QUICK_HANG_S,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        if expected is not None:
            assert done.stdout.strip() == expected, done.stderr[-2000:]


RUNNABLE = [b for b in BLOCKS if b.kind in ("run", "run with")]


@pytest.mark.parametrize("block", RUNNABLE, ids=_ids(RUNNABLE))
def test_documented_commands_run_as_written(block, tmp_path):
    checkout = user_checkout(tmp_path / "maestro", "run_benchmark.py")
    # `python` and `torchrun` are this interpreter, in its environment.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launchers_here(bin_dir)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
        and k != "MASTER_PORT"
        and not k.startswith(("TORCHELASTIC_", "SLURM_"))
    }
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    # torchrun's own rendezvous port (default 29500) might be taken on a shared machine.
    env["PET_MASTER_PORT"] = str(free_port())

    for command in block.commands:
        if block.kind == "run with" and _starts_a_run(command):
            command = with_options(command, block.text)
        # RUN_HANG_S: a hang, not speed (the slowest command takes under a minute).
        run_documented(command, cwd=checkout, env=env, hang_s=RUN_HANG_S, where=block.where)


@cache
def _help(*target: str) -> str:
    """The ``--help`` of ``python TARGET``: ``-m userbenchmark.maestro COMMAND``,
    ``run_benchmark.py maestro`` or ``-m torch.distributed.run``."""
    if target == ("-m", "torch.distributed.run"):
        from torch.distributed.run import get_args_parser

        return get_args_parser().format_help()
    if target[0] == "run_benchmark.py":
        call = lambda: run_benchmark.main([*target[1:], "--help"])  # noqa: E731
    else:
        assert target[:2] == ("-m", "userbenchmark.maestro"), target
        call = lambda: cli.main([*target[2:], "--help"])  # noqa: E731
    with contextlib.redirect_stdout(io.StringIO()) as out:
        status = call()
    assert status == 0, f"{' '.join(target)} --help exited {status}"
    return out.getvalue()


def synopsis_options(command: str) -> list[tuple[tuple[str, ...], list[str]]]:
    """(the command whose --help must list them, options) of one usage line."""
    words = shlex.split(command.partition(" #")[0])
    if "userbenchmark.maestro" in words:
        at = words.index("userbenchmark.maestro")
        target = ("-m", "userbenchmark.maestro", words[at + 1])
        after = words[at + 2 :]
    else:
        at = words.index("run_benchmark.py")
        assert words[at + 1] == "maestro", command
        target = ("run_benchmark.py", "maestro")
        after = words[at + 2 :]
    checks = [(target, [o for w in after for o in _OPTION.findall(w)])]
    if words[0] == "torchrun":
        launcher = [o for w in words[1:at] for o in _OPTION.findall(w)]
        checks.append((("-m", "torch.distributed.run"), launcher))
    return checks


SYNOPSES = [b for b in BLOCKS if b.kind == "synopsis"]


@pytest.mark.parametrize("block", SYNOPSES, ids=_ids(SYNOPSES))
def test_synopsis_options_exist(block):
    for command in block.commands:
        for target, options in synopsis_options(command):
            text = _help(*target)
            for option in options:
                assert option in text, f"{block.where}: {' '.join(target)} has no {option}"
