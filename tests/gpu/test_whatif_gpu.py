"""What-if rounds on one GPU under CUPTI, eager and in CUDA-graph mode: every round's window
attributed exactly, a variant's change found, the pattern against itself within a few %."""

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

CONFIG = str(Path(__file__).with_name("whatif_gemm.yaml"))
ROUNDS = 4


@pytest.fixture(scope="module", params=["eager", "graph"])
def whatif_out(request, tmp_path_factory):
    pytest.importorskip("cupti")
    out = tmp_path_factory.mktemp(request.param)
    args = ["run", "-c", CONFIG, "--profiler", "cupti", "--rounds", str(ROUNDS)]
    args += ["--output-dir", str(out), "--no-metrics"]
    proc = run_maestro(args + (["--graph"] if request.param == "graph" else []), timeout=400)
    print(proc.stdout)
    print(proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_each_variant_is_judged_over_every_round(whatif_out):
    found = {r["variant"]: r for r in read_records(whatif_out, "whatif.json")}
    assert set(found) == {"same", "gemm_2x"}
    assert {r["rounds"] for r in found.values()} == {ROUNDS}
    twice = found["gemm_2x"]
    assert twice["verdict"] == "slower" and twice["block"] == "gemm", twice
    assert twice["block_change_pct"] > 50, twice  # twice the FLOPs
    assert abs(found["same"]["change_pct"]) < 5, found["same"]
    print(json.dumps(found, indent=1))


def test_every_rounds_window_is_attributed_exactly(whatif_out):
    # The same device work per block and iteration in the pattern and in each variant, over
    # all of its rounds' iterations: no window's records lost or counted in another.
    rows = read_records(whatif_out)
    activities = {(r["pattern"], r["block"]): r["activities_per_iter"] for r in rows}
    for r in rows:
        assert r["iters"] == ROUNDS * 20, r
        assert float(r["activities_per_iter"]).is_integer(), r
        assert r["activities_per_iter"] == activities["step", r["block"]], r


def test_under_cuda_events_the_rounds_follow_one_another(tmp_path):
    # Events time each round's window from its own start. Joined, the rounds must follow one
    # another: laid over each other, one round's all_gather would read as hidden under another
    # round's GEMM. Here the all_gather waits for the GEMM: nothing is hidden in any round.
    config = tmp_path / "chain.yaml"
    text = Path(CONFIG).read_text().replace("size: 16M}", "size: 16M, after: [gemm]}")
    config.write_text(text)
    args = ["run", "-c", str(config), "--profiler", "events", "--rounds", str(ROUNDS)]
    proc = run_maestro([*args, "--output-dir", str(tmp_path / "out"), "--no-metrics"], timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    overlap = {
        p["pattern"]: p["comm_compute_overlap"]
        for p in read_records(tmp_path / "out", "patterns.json")
    }
    assert len(overlap) == 3 and max(overlap.values()) < 0.02, overlap
