"""A sleep whose duration the run's environment scales: an A/B treatment that changes code
behaviour, not a measurement setting (``compare`` and the detector refuse runs whose settings
differ). Named in YAML as ``op: bench.noise_blocks:ScaledSleep``.
"""

from __future__ import annotations

import os

from userbenchmark.maestro.blocks.compute import Sleep

FACTOR_VARIABLE = "MAESTRO_NOISE_SLEEP_FACTOR"
"""Multiplies every ScaledSleep's ``duration_us`` (1 when unset)."""


class ScaledSleep(Sleep):
    """``sleep`` with its duration multiplied by ``$MAESTRO_NOISE_SLEEP_FACTOR``."""

    def setup(self) -> None:
        super().setup()
        factor = float(os.environ.get(FACTOR_VARIABLE, "1"))
        self.duration_ns = round(self.duration_ns * factor)
        self.cycles = round(self.cycles * factor)
