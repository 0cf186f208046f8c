"""Test-suite settings shared by every test module."""

from __future__ import annotations

import logging
import signal

import pytest
from hypothesis import settings

# Property tests check behaviour, never speed: hypothesis's per-example deadline (200 ms by
# default) fails on a loaded 2-core machine with the behaviour intact, so it is off for all.
settings.register_profile("maestro", deadline=None)
settings.load_profile("maestro")

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")


@pytest.fixture
def cli_here(monkeypatch):
    """For a test that calls maestro's command line (``cli.main``) in this process, as a user's
    shell would start it: no launcher variables; the 'maestro' logger, which a command points
    at the stderr of its call, and SIGTERM as they were afterwards."""
    for key in (*LAUNCH_VARIABLES, "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    logger = logging.getLogger("maestro")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    sigterm = signal.getsignal(signal.SIGTERM)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved
    assert signal.getsignal(signal.SIGTERM) == sigterm
