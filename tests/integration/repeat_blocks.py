"""Test-only block for runs of several processes: a sleep that fails in every process after
the first (the first leaves a marker file, ``$MAESTRO_TEST_MARKER``, the later ones find it)."""

from __future__ import annotations

import os
from pathlib import Path

from userbenchmark.maestro.blocks.compute import Sleep

MARKER_VARIABLE = "MAESTRO_TEST_MARKER"


class FailsAfterTheFirstProcess(Sleep):
    """``sleep`` whose setup raises once ``$MAESTRO_TEST_MARKER`` exists, and creates it."""

    def setup(self) -> None:
        super().setup()
        marker = Path(os.environ[MARKER_VARIABLE])
        if marker.exists():
            raise RuntimeError("a later process: failing on purpose")
        marker.write_text("first process")
