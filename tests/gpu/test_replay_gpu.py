"""A real one-rank training step (tests/data/traces/onerank) imported and replayed on one GPU,
eager and under CUDA graphs: every block's device work is attributed to it (CUPTI), the same
in both modes, and every block, the step and the rank get their replay figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from tests.integration.helpers import read_records, run_maestro  # noqa: E402

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "onerank"
MODES = {"eager": (), "graph": ("--graph",)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("cupti")
    folder = tmp_path_factory.mktemp("replay")
    step = folder / "step.yaml"
    proc = run_maestro(["import-trace", str(TRACE), "-o", str(step)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outs = {}
    for mode, extra in MODES.items():
        outs[mode] = folder / mode
        proc = run_maestro(
            ["run", "-c", str(step), "--profiler", "cupti", "--iters", "20", "--no-baseline",
             "--output-dir", str(outs[mode]), "--no-metrics", *extra],
            timeout=400,
        )  # fmt: skip
        print(proc.stdout[-6000:], proc.stderr[-3000:])
        assert proc.returncode == 0, proc.stderr[-3000:]
    return outs


@pytest.mark.parametrize("mode", MODES)
def test_every_block_has_its_device_work_and_its_replay_figures(runs, mode):
    blocks = read_records(runs[mode])
    assert len(blocks) == 42  # 24 GEMMs and 18 busy stand-ins (test_replay_real.py)
    for b in blocks:
        assert float(b["activities_per_iter"]).is_integer() and b["activities_per_iter"] >= 1, b
        assert b["traced_us"] > 0 and b["latency_avg_us"] > 0, b
        assert b["replay_ratio"] == pytest.approx(b["latency_avg_us"] / b["traced_us"])
        assert b["replay_ratio_ci_low"] <= b["replay_ratio"] <= b["replay_ratio_ci_high"], b
        if b["op"] == "gemm":  # the traced shapes: far from 1 would mean the wrong GEMM
            assert 0.75 < b["replay_ratio"] < 1.33, b
    (step,) = read_records(runs[mode], "patterns.json")
    assert step["graph"] is (mode == "graph")
    assert step["replay_ratio"] == pytest.approx(step["makespan_avg_us"] / step["traced_us"])
    (rank,) = json.loads(step["replay_by_rank"])
    assert rank["rank"] == 0 and rank["traced_us"] == pytest.approx(step["traced_us"])
    assert rank["ci_low"] <= rank["ratio"] <= rank["ci_high"]


def test_graphs_attribute_the_same_device_work_as_eager(runs):
    eager, graph = ({b["block"]: b for b in read_records(runs[m])} for m in MODES)
    assert eager.keys() == graph.keys()
    for name, rec in eager.items():
        assert graph[name]["activities_per_iter"] == rec["activities_per_iter"], name
