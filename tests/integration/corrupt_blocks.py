"""Test-only block that scribbles over another block's output (check mode must catch it)."""

from __future__ import annotations

import gc
import warnings

from userbenchmark.maestro.blocks.base import Block, Param


class Scribbler(Block):
    """After ``target`` on the same lane, overwrite the target's output with 1000.

    Check values are integers in [-8, 8], so every overwritten element is wrong.
    """

    category = "other"
    params = (
        Param(name="target", kind="str", doc="name of the block whose buffer gets overwritten"),
        Param(name="attr", kind="str", default="out", doc="the target's buffer attribute"),
    )

    def setup(self) -> None:
        # Blocks never share memory by design: find the victim the hard way, as a bug would.
        name, attr = self.spec.params["target"], self.spec.params["attr"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance() on deprecated torch objects warns
            victims = [
                o
                for o in gc.get_objects()
                if isinstance(o, Block)
                and o is not self
                and o.spec.name == name
                and hasattr(o, attr)
            ]
        if len(victims) != 1:
            raise RuntimeError(f"found {len(victims)} live blocks named {name!r} with .{attr}")
        self.victim_buffer = getattr(victims[0], attr)

    def launch(self) -> None:
        self.victim_buffer.fill_(1000)
