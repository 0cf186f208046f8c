"""The local launcher on the torch releases maestro supports: torch 2.11's ``LaunchConfig`` has
no ``shutdown_timeout`` (torch 2.12 added it); ``--nproc`` must start there too."""

from __future__ import annotations

import inspect
import json

import pytest
import torch.distributed.launcher.api as launcher_api

from userbenchmark.maestro import cli
from userbenchmark.maestro.core.runtime import launcher

pytestmark = pytest.mark.integration

PATTERN = """
name: torch_range
defaults: {warmup_iters: 1, iters: 3, baseline: false}
patterns:
  - name: nap
    blocks:
      - {name: nap, op: sleep, axis: world, duration_us: 200}
"""


class LaunchConfigWithoutShutdownTimeout(launcher_api.LaunchConfig):
    """torch 2.11's signature: ``shutdown_timeout`` is refused as an unexpected keyword, and the
    agent falls back to its fixed 30 s, as torch 2.11's does."""

    def __init__(self, **kwargs):
        if "shutdown_timeout" in kwargs:
            raise TypeError(
                "LaunchConfig.__init__() got an unexpected keyword argument 'shutdown_timeout'"
            )
        super().__init__(**kwargs)
        self.shutdown_timeout = launcher.TORCH_SHUTDOWN_DEFAULT_S


def test_the_stand_in_has_torch_2_11s_signature():
    assert (
        "shutdown_timeout" not in inspect.signature(LaunchConfigWithoutShutdownTimeout).parameters
    )
    assert launcher._shutdown_timeout_kwargs(LaunchConfigWithoutShutdownTimeout, 95.0) == {}
    assert launcher._shutdown_timeout_kwargs(launcher_api.LaunchConfig, 94.2) == {
        "shutdown_timeout": 95
    }


def test_nproc_runs_with_torch_2_11s_launch_config(tmp_path, monkeypatch, cli_here):
    monkeypatch.setattr(launcher_api, "LaunchConfig", LaunchConfigWithoutShutdownTimeout)
    config = tmp_path / "p.yaml"
    config.write_text(PATTERN)
    out = tmp_path / "out"
    status = cli.main(
        ["run", "-c", str(config), "--nproc", "2", "--output-dir", str(out)]
        + ["--metrics-dir", str(tmp_path / "metrics")]
    )
    assert status == 0
    records = json.loads((out / "results.json").read_text())
    assert {r["block"] for r in records} == {"nap"}
