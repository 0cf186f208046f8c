"""Test-suite settings shared by every test module."""

from __future__ import annotations

import logging
import signal
from types import SimpleNamespace

import pytest
from hypothesis import settings

# Property tests check behaviour, never speed: hypothesis's per-example deadline (200 ms by
# default) fails on a loaded 2-core machine with the behaviour intact, so it is off for all.
settings.register_profile("maestro", deadline=None)
settings.load_profile("maestro")

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
SLURM_RANK_VARIABLES = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")


@pytest.fixture
def cli_here(monkeypatch):
    """For a test that calls maestro's command line (``cli.main``) in this process, as a user's
    shell would start it: no launcher variables; the 'maestro' logger, which a command points
    at the stderr of its call, and SIGTERM and SIGHUP as they were afterwards."""
    for key in (*LAUNCH_VARIABLES, "MASTER_PORT", "GLOO_SOCKET_IFNAME", *SLURM_RANK_VARIABLES):
        monkeypatch.delenv(key, raising=False)
    logger = logging.getLogger("maestro")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    logger.handlers[:], logger.level, logger.propagate = saved
    assert {s: signal.getsignal(s) for s in handlers} == handlers


@pytest.fixture(scope="session")
def shipped_run(tmp_path_factory):
    """One run that two test files read: the shipped ``fsdp`` file on 2 gloo ranks at CPU sizes
    (``--max-size 64K``, 2 iterations after 1 warmup, no baseline), into an output folder that
    holds an earlier run's files (``results.json``, ``failures.json``, ``trace.json`` reading
    "stale") and a file of the user's (``notes.txt``). test_shipped_configs.py checks what ran,
    test_run_outputs.py what became of the folders. Its workers start from this process (no
    launcher process: a run's files are what these tests read). A namespace: ``config``,
    ``nproc``, ``proc`` (the outcome, as of a process), ``out`` and ``metrics`` (the folders)."""
    from tests.integration.helpers import run_maestro_here

    tmp = tmp_path_factory.mktemp("shipped_run")
    run = SimpleNamespace(config="fsdp", nproc=2, out=tmp / "out", metrics=tmp / "metrics")
    run.out.mkdir()
    for name in ("results.json", "failures.json", "trace.json"):
        (run.out / name).write_text("stale")
    (run.out / "notes.txt").write_text("mine")
    args = ["run", "-c", run.config, "--nproc", str(run.nproc), "--max-size", "64K"]
    args += ["--iters", "2", "--warmup-iters", "1", "--no-baseline"]
    args += ["--output-dir", str(run.out), "--metrics-dir", str(run.metrics)]
    run.proc = run_maestro_here(args)
    return run
