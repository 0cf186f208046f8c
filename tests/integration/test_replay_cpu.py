"""Every multi-rank trace of tests/data/traces, imported and replayed at its world size on CPU
with --max-size 64K (as docs/replay.md runs it): each run finishes and reports every rank's
step; the cap changed the step, so none is set against the trace. A 4-rank TP x DP step once
refused to start: its busy stand-ins were counted at their CUDA size by the host-memory check.

The steps of one world size run in one launch: the patterns ``import-trace`` wrote, each
renamed after its trace, in one file with the axes and the mesh of all of them (a launch costs
more than a step at CPU sizes; each step still runs at its own world size, on its own axes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from userbenchmark.maestro import cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("cli_here")]

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
MULTI_RANK = {"ddp": 2, "fsdp2_2ranks": 2, "moe": 4, "pipeline": 4, "tp_dp_4ranks": 4}


def merged_steps(folders: list[str], world: int, tmp_path: Path) -> dict:
    """One pattern file holding the step ``import-trace`` writes from each folder, named after
    it: its patterns, axes and mesh, which must not clash, at world size ``world``."""
    merged: dict = {"name": "replays", "world_size": world, "patterns": []}
    for folder in folders:
        step = tmp_path / f"{folder}.yaml"
        assert cli.main(["import-trace", str(DATA / folder), "-o", str(step)]) == 0
        doc = yaml.safe_load(step.read_text())
        assert doc["world_size"] == world
        assert set(doc) <= {"name", "world_size", "defaults", "mesh", "axes", "patterns"}, doc
        (pattern,) = doc["patterns"]
        merged["patterns"].append({**pattern, "name": folder})
        for key in ("defaults", "mesh"):
            if key in doc:
                assert merged.setdefault(key, doc[key]) == doc[key], (folder, key)
        axes = merged.setdefault("axes", {})
        assert not set(axes) & set(doc.get("axes", {})), (folder, axes)
        axes.update(doc.get("axes", {}))
    return merged


@pytest.mark.parametrize("world", sorted(set(MULTI_RANK.values())))
def test_the_multi_rank_traces_replay_at_their_world_size_on_cpu(tmp_path, capfd, world):
    folders = sorted(f for f, w in MULTI_RANK.items() if w == world)
    config = tmp_path / "steps.yaml"
    config.write_text(yaml.safe_dump(merged_steps(folders, world, tmp_path), sort_keys=False))
    argv = ["run", "-c", str(config), "--nproc", str(world), "--max-size", "64K", "--iters", "2"]
    argv += ["--warmup-iters", "1", "--no-baseline", "--no-metrics"]
    assert cli.main([*argv, "--output-dir", str(tmp_path / "out")]) == 0, capfd.readouterr()
    out = capfd.readouterr().out
    # Each step reports every rank's step, in a table of its own.
    assert all(out.count(f"step, rank {r} ") == len(folders) for r in range(world)), out
    patterns = {
        p["pattern"]: p for p in json.loads((tmp_path / "out" / "patterns.json").read_text())
    }
    assert sorted(patterns) == folders
    for folder in folders:
        ranks = json.loads(patterns[folder]["replay_by_rank"])
        assert [r["rank"] for r in ranks] == list(range(world)), folder
        assert all(r["replayed_us"] > 0 and r["traced_us"] is None for r in ranks), folder


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
