"""Test-only custom blocks that fail on purpose (named in YAML as module:Class)."""

from __future__ import annotations

import os
import signal

from userbenchmark.maestro.blocks.base import Block, Param


class FailOnRank(Block):
    """Raises (or kills its process) on one rank or every rank, in setup or in launch."""

    category = "other"
    params = (
        Param(name="rank", kind="int", minimum=-1, doc="global rank that fails; -1: every rank"),
        Param(
            name="when",
            kind="str",
            default="launch",
            choices=("setup", "launch"),
            doc="phase in which it fails",
        ),
        Param(
            name="how",
            kind="str",
            default="raise",
            choices=("raise", "kill"),
            doc="raise an exception, or SIGKILL the process",
        ),
        Param(
            name="after",
            kind="int",
            default=0,
            minimum=0,
            doc="launches that succeed before the failure",
        ),
    )

    def _fail(self) -> None:
        if self.spec.params["rank"] not in (-1, self.ctx.rank):
            return
        if self.spec.params["how"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected failure on rank {self.ctx.rank}")

    def setup(self) -> None:
        self.calls = 0
        if self.spec.params["when"] == "setup":
            self._fail()

    def launch(self) -> None:
        self.calls += 1
        if self.spec.params["when"] == "launch" and self.calls > self.spec.params["after"]:
            self._fail()
        if self.ctx.device.type == "cuda":  # on CUDA every timed block owns device work
            import torch

            torch.cuda._sleep(1000)
