"""Test-only custom blocks that fail on purpose (named in YAML as module:Class).

When ``MAESTRO_TEST_FAULT_MARK`` names a folder, the failing rank writes the moment of its
fault there (``fault-<rank>``: ``time.monotonic()``, one clock for every process of a host),
so a test can time every process's end from the fault itself. ``how: remove_output`` removes
the folder ``MAESTRO_TEST_OUTPUT`` names.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from userbenchmark.maestro.blocks.base import Block, Param

MARK_VARIABLE = "MAESTRO_TEST_FAULT_MARK"
OUTPUT_VARIABLE = "MAESTRO_TEST_OUTPUT"


def fault_moment(folder: Path, rank: int) -> float | None:
    """When rank ``rank`` failed (``time.monotonic()``), or None if it has not yet."""
    try:
        return float((folder / f"fault-{rank}").read_text())
    except (OSError, ValueError):
        return None


class FailOnRank(Block):
    """Raises, kills or stops its process, hangs, leaves (sys.exit, os._exit) or leaves things
    behind, on one rank or every rank, in setup, launch or teardown."""

    category = "other"
    params = (
        Param(name="rank", kind="int", minimum=-1, doc="global rank that fails; -1: every rank"),
        Param(
            name="when",
            kind="str",
            default="launch",
            choices=("setup", "launch", "teardown"),
            doc="phase in which it fails",
        ),
        Param(
            name="how",
            kind="str",
            default="raise",
            choices=(
                "raise",
                "kill",
                "stop",
                "hang",
                "exit",
                "os_exit",
                "leave_behind",
                "remove_output",
            ),
            doc="raise an exception, SIGKILL or SIGSTOP the process, never return, "
            "sys.exit(0), os._exit(0), start a child, a forked copy and a thread that never "
            "end, or remove the output folder",
        ),
        Param(
            name="after_launches",
            kind="int",
            default=0,
            minimum=0,
            doc="launches that succeed before the failure",
        ),
    )

    def _mark(self) -> None:
        folder = os.environ.get(MARK_VARIABLE)
        if folder:
            path = Path(folder) / f"fault-{self.ctx.rank}"
            temporary = path.with_suffix(".tmp")
            temporary.write_text(repr(time.monotonic()))
            os.replace(temporary, path)

    def _fail(self) -> None:
        if self.spec.params["rank"] not in (-1, self.ctx.rank):
            return
        self._mark()
        how = self.spec.params["how"]
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)  # every thread stops until a SIGCONT
            return
        if how == "hang":
            while True:  # a block that never returns; only the end of its process stops it
                time.sleep(3600)
        if how == "exit":
            sys.exit(0)
        if how == "os_exit":
            os._exit(0)
        if how == "leave_behind":
            subprocess.Popen(["sleep", "3000"], stdin=subprocess.DEVNULL)
            if os.fork() == 0:  # a copy of this process, holding every descriptor it had
                time.sleep(3000)
                os._exit(0)
            threading.Thread(target=time.sleep, args=(3000,), name="left-behind").start()
            return
        if how == "remove_output":
            shutil.rmtree(os.environ[OUTPUT_VARIABLE])
            return
        raise RuntimeError(f"injected failure on rank {self.ctx.rank}")

    def setup(self) -> None:
        self.calls = 0
        if self.spec.params["when"] == "setup":
            self._fail()

    def teardown(self) -> None:
        if self.spec.params["when"] == "teardown":
            self._fail()

    def launch(self) -> None:
        self.calls += 1
        if self.spec.params["when"] == "launch" and self.calls > self.spec.params["after_launches"]:
            self._fail()
        if self.ctx.device.type == "cuda":  # on CUDA every timed block owns device work
            import torch

            torch.cuda._sleep(1000)
