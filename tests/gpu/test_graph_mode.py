"""CUDA-graph mode on one GPU: attribution stays exact, results stay right, host cost goes.

Each pattern of graph_modes.yaml runs eagerly and under graphs in the same run.
"""

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

CONFIG = str(Path(__file__).with_name("graph_modes.yaml"))


@pytest.fixture(scope="module")
def graph_out(tmp_path_factory):
    pytest.importorskip("cupti")
    out = tmp_path_factory.mktemp("graph")
    proc = run_maestro(
        [
            "run",
            "-c",
            CONFIG,
            "--profiler",
            "cupti",
            "--output-dir",
            str(out),
            "--no-metrics",
            "--trace",
        ],
        timeout=400,
    )
    print(proc.stdout)
    print(proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _by_mode(out: Path, base: str) -> dict[bool, dict[str, dict]]:
    blocks: dict[bool, dict[str, dict]] = {False: {}, True: {}}
    for rec in read_records(out):
        if rec["pattern"].startswith(base + "["):
            blocks["mode=true" in rec["pattern"]][rec["block"]] = rec
    return blocks


def _patterns(out: Path) -> dict[str, dict]:
    return {p["pattern"]: p for p in read_records(out, "patterns.json")}


def test_graph_mode_is_recorded(graph_out):
    patterns = _patterns(graph_out)
    assert patterns["small[mode=true]"]["graph"] is True
    assert patterns["small[mode=false]"]["graph"] is False


def test_every_activity_attributed_once_under_graphs(graph_out):
    # The same device work per block and iteration in both modes: nothing lost to the capture,
    # nothing counted twice, warmup and capture outside the window (a whole number per iter).
    blocks = _by_mode(graph_out, "small")
    for name in ("mm", "ag", "nap"):
        eager, graph = blocks[False][name], blocks[True][name]
        assert graph["activities_per_iter"] == eager["activities_per_iter"], name
        assert float(graph["activities_per_iter"]).is_integer(), graph
        assert graph["latency_avg_us"] > 0


def _device_work(out: Path, pattern: str) -> dict[str, dict[int, list[str]]]:
    """{block: {iteration: names of the device activities attributed to it}} on rank 0."""
    doc = json.loads((out / "traces" / "rank0.json").read_text())
    found: dict[str, dict[int, list[str]]] = {}
    for e in doc["traceEvents"]:
        args = e.get("args", {})
        if e.get("ph") == "X" and "stream" in args and args.get("pattern") == pattern:
            found.setdefault(args["block"], {}).setdefault(args["pattern_iteration"], [])
            found[args["block"]][args["pattern_iteration"]].append(e["name"])
    return found


KERNELS = {
    "mm": lambda n: "nccl" not in n and not n.startswith("Memcpy") and "spin_kernel" not in n,
    "ag": lambda n: n.startswith("Memcpy DtoD"),  # a 1-rank all_gather is a device copy
    "nap": lambda n: "spin_kernel" in n,  # torch.cuda._sleep
}


def test_each_block_gets_its_own_kernels_in_every_iteration_eager_and_under_graphs(graph_out):
    # Not only equal counts: in both modes every iteration of every block holds the same
    # device work, of the block's own kind (a GEMM kernel, the copy, the spin), and nothing of
    # another block's.
    blocks = _by_mode(graph_out, "small")
    names = {}
    for mode in (False, True):
        work = _device_work(graph_out, f"small[mode={str(mode).lower()}]")
        assert set(work) == set(KERNELS), work.keys()
        for name, looks_like in KERNELS.items():
            rec, per_iter = blocks[mode][name], work[name]
            assert sorted(per_iter) == list(range(rec["iters"])), (mode, name)
            assert {len(v) for v in per_iter.values()} == {rec["activities_per_iter"]}, rec
            kinds = {tuple(sorted(v)) for v in per_iter.values()}
            assert len(kinds) == 1, (mode, name, kinds)  # the same work every iteration
            (kernels,) = kinds
            assert all(looks_like(k) or k.startswith("Memset") for k in kernels), kernels
            names[mode, name] = {k for k in kernels if not k.startswith("Memset")}
    for name in KERNELS:  # a replay runs what the eager launch ran
        assert names[False, name] == names[True, name] and names[True, name], name


def test_check_is_clean_under_graphs(graph_out):
    for rec in read_records(graph_out):
        if rec["op"] in ("all_gather",):
            assert rec["wrong_elements"] == 0, rec


def test_graphs_remove_the_launch_cost(graph_out):
    # A replay is one launch on the host; the eager launch of a GEMM or a collective costs more.
    blocks = _by_mode(graph_out, "small")
    patterns = _patterns(graph_out)
    for name in ("mm", "ag"):
        assert blocks[True][name]["enqueue_avg_us"] < blocks[False][name]["enqueue_avg_us"], name
    assert patterns["small[mode=true]"]["host_late_iters"] == 0
    print(json.dumps({m: patterns[f"small[mode={m}]"] for m in ("false", "true")}, indent=1))


def test_a_long_kernel_takes_as_long_under_graphs(graph_out):
    blocks = _by_mode(graph_out, "big")
    eager, graph = blocks[False]["mm"], blocks[True]["mm"]
    assert graph["latency_avg_us"] == pytest.approx(eager["latency_avg_us"], rel=0.05)


SEVERAL_RANKS = """
name: graph_several_ranks
world_size: {world}
defaults: {{dtype: bf16, warmup_iters: 3, iters: 10, baseline: false, check: true}}
axes:
  rs: {{like: world}}
patterns:
  - name: fsdp_like
    sweep: {{mode: [false, true]}}
    graph: "${{mode}}"
    blocks:
      - {{name: ag, op: all_gather, axis: world, size: 4M}}
      - {{name: rs, op: reduce_scatter, axis: rs, size: 4M}}
      - {{name: mm, op: gemm, axis: world, lane: compute, m: 1024, n: 1024, k: 1024}}
"""


@pytest.mark.parametrize("world", [2, 4])
def test_graph_mode_at_several_ranks_attributes_and_checks(tmp_path, world):
    # Ranks may share the GPU here (correctness only): captured NCCL collectives replay with
    # their block's id and give the right results, eager and captured alike.
    from tests.gpu.test_multi_gpu import runnable

    if not runnable(world):
        pytest.skip(f"needs {world} GPUs, or {world} ranks sharing one GPU")
    pytest.importorskip("cupti")
    config = tmp_path / "several.yaml"
    config.write_text(SEVERAL_RANKS.format(world=world))
    out = tmp_path / "out"
    proc = run_maestro(
        ["run", "-c", str(config), "--nproc", str(world), "--profiler", "cupti", "--output-dir",
         str(out), "--no-metrics"],
        timeout=400,
    )  # fmt: skip
    print(proc.stdout, proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_records(out)
    assert {r["pattern"] for r in records} == {"fsdp_like[mode=false]", "fsdp_like[mode=true]"}
    for rec in records:
        assert rec["block"] in ("ag", "rs", "mm")
        assert float(rec["activities_per_iter"]).is_integer() and rec["activities_per_iter"] >= 1
        assert rec["latency_avg_us"] > 0 and rec["team_size"] == world
        if rec["op"] != "gemm":
            assert rec["wrong_elements"] == 0, rec
    modes = {p["pattern"]: p["graph"] for p in read_records(out, "patterns.json")}
    assert modes == {"fsdp_like[mode=false]": False, "fsdp_like[mode=true]": True}
