"""Every multi-rank trace of tests/data/traces, imported and replayed at its world size on CPU
with --max-size 64K (as docs/replay.md runs it): each run finishes and reports every rank's
step; the cap changed the step, so none is set against the trace. A 4-rank TP x DP step once
refused to start: its busy stand-ins were counted at their CUDA size by the host-memory check."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from userbenchmark.maestro import cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("cli_here")]

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
MULTI_RANK = {"ddp": 2, "fsdp2_2ranks": 2, "moe": 4, "pipeline": 4, "tp_dp_4ranks": 4}


@pytest.mark.parametrize("folder", sorted(MULTI_RANK))
def test_a_multi_rank_trace_replays_at_its_world_size_on_cpu(tmp_path, capfd, folder):
    step = tmp_path / "step.yaml"
    assert cli.main(["import-trace", str(DATA / folder), "-o", str(step)]) == 0
    world = MULTI_RANK[folder]
    argv = ["run", "-c", str(step), "--nproc", str(world), "--max-size", "64K", "--iters", "2"]
    argv += ["--warmup-iters", "1", "--no-baseline", "--no-metrics"]
    assert cli.main([*argv, "--output-dir", str(tmp_path / "out")]) == 0, capfd.readouterr()
    out = capfd.readouterr().out
    assert all(f"step, rank {r} " in out for r in range(world))
    (pattern,) = json.loads((tmp_path / "out" / "patterns.json").read_text())
    ranks = json.loads(pattern["replay_by_rank"])
    assert [r["rank"] for r in ranks] == list(range(world))
    assert all(r["replayed_us"] > 0 and r["traced_us"] is None for r in ranks)


def test_a_trace_made_elsewhere_replays_on_cpu(tmp_path, capfd):
    """The MI250 (ROCm) trace of tests/data/corpus, as a user would run it (skipped where the
    corpus file is not in the checkout)."""
    corpus = Path(os.environ.get("MAESTRO_TRACE_CORPUS", DATA.parent / "corpus"))
    trace = corpus / "mi250_rocm6_2_toy_train.json.gz"
    if not trace.is_file():
        pytest.skip(f"{trace.name} is not in this checkout (tests/data/corpus/README.md)")
    step = tmp_path / "step.yaml"
    assert cli.main(["import-trace", str(trace), "-o", str(step)]) == 0
    argv = ["run", "-c", str(step), "--max-size", "64K", "--iters", "2", "--warmup-iters", "1"]
    assert cli.main([*argv, "--no-baseline", "--no-metrics", "--output-dir", str(tmp_path)]) == 0
    out = capfd.readouterr().out
    assert "replayed against the trace" in out and "step, rank 0 " in out
