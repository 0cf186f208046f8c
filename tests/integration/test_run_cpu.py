"""End-to-end runs on gloo through the real launcher: every op, meshes, sweeps, known times."""

from __future__ import annotations

import json
import math

import pytest

from userbenchmark.maestro.core.output.metric_keys import parse_metric_key

from .helpers import (
    NCCL_TESTS_BUS_FACTOR,
    QUICK_HANG_S,
    REPO_ROOT,
    RUN_HANG_S,
    by_block,
    read_records,
    run_maestro,
    run_pattern,
)

pytestmark = pytest.mark.integration

EVERY_OP = """
name: every_op
defaults: {dtype: fp32, warmup_iters: 2, iters: 12, baseline: false, check: true}
axes:
  a2: {like: world}
  a3: {like: world}
  a4: {like: world}
  a5: {like: world}
  a6: {like: world}
  a7: {like: world}
  c: {like: world}
  s: {like: world}
patterns:
  - name: all
    blocks:
      - {name: ar, op: all_reduce, axis: world, size: 64K}
      - {name: ag, op: all_gather, axis: a2, size: 64K}
      - {name: rs, op: reduce_scatter, axis: a3, size: 64K}
      - {name: a2a, op: all_to_all, axis: a4, size: 64K}
      - {name: bc, op: broadcast, axis: a5, size: 64K, root: 1}
      - {name: rd, op: reduce, axis: a6, size: 64K}
      - {name: sr, op: send_recv, axis: a7, size: 64K}
      - {name: mm, op: gemm, axis: c, m: 64, n: 32, k: 128}
      - {name: nap, op: sleep, axis: s, duration_us: 500}
"""


def _check_sane(rec: dict) -> None:
    assert rec["latency_min_us"] > 0
    assert rec["latency_max_us"] >= rec["latency_p50_us"] >= rec["latency_min_us"]
    assert rec["latency_p99_us"] is None  # fewer than 100 iterations: p99 is the max
    assert rec["latency_min_us"] <= rec["latency_avg_us"] <= rec["latency_max_us"]
    for name in ("latency_avg_us", "latency_p50_us"):  # each figure inside its interval
        assert rec[f"{name}_ci_low"] <= rec[name] <= rec[f"{name}_ci_high"]


@pytest.mark.parametrize("nproc", [2, 4])
def test_every_op_runs_with_sane_numbers(tmp_path, nproc):
    proc, out = run_pattern(tmp_path, EVERY_OP, nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== every_op / all" in proc.stdout
    blocks = by_block(read_records(out), "all")
    assert set(blocks) == {"ar", "ag", "rs", "a2a", "bc", "rd", "sr", "mm", "nap"}
    for name, rec in blocks.items():
        _check_sane(rec)
        assert rec["iters"] == 12
        assert rec["team_size"] == nproc
        if rec["op"] in NCCL_TESTS_BUS_FACTOR:
            assert rec["wrong_elements"] == 0, name
            seconds = rec["latency_avg_us"] * 1e-6
            assert rec["algbw_gbps"] == pytest.approx(rec["size_bytes"] / seconds / 1e9, rel=1e-9)
            assert rec["busbw_gbps"] == pytest.approx(
                rec["algbw_gbps"] * NCCL_TESTS_BUS_FACTOR[rec["op"]](nproc), rel=1e-9
            )
            assert rec["tflops"] is None
    mm = blocks["mm"]
    assert mm["tflops"] == pytest.approx(
        2 * 64 * 32 * 128 / (mm["latency_avg_us"] * 1e-6) / 1e12, rel=1e-9
    )
    assert mm["busbw_gbps"] is None and mm["size_bytes"] is None
    assert blocks["nap"]["latency_min_us"] >= 500
    patterns = read_records(out, "patterns.json")
    assert [p["pattern"] for p in patterns] == ["all"]
    assert patterns[0]["makespan_avg_us"] >= max(r["latency_avg_us"] for r in blocks.values()) * 0.5
    metrics_files = list((tmp_path / "metrics").glob("metrics-*.json"))
    assert len(metrics_files) == 1
    doc = json.loads(metrics_files[0].read_text())
    assert doc["name"] == "maestro"
    assert doc["metrics"] and all(isinstance(v, float) for v in doc["metrics"].values())
    for key in doc["metrics"]:
        parse_metric_key(key)
    assert doc["metrics"]["every_op/all/ar/busbw_gbps"] == pytest.approx(blocks["ar"]["busbw_gbps"])


MESH_SWEEP = """
name: mesh_sweep
world_size: 4
defaults: {dtype: bf16, warmup_iters: 1, iters: 6, baseline: true}
mesh: {dp: 2, tp: 2}
axes:
  dp_rs: {like: dp}
patterns:
  - name: fsdp
    blocks:
      - {name: ag, op: all_gather, axis: dp, size: 32K}
      - {name: rs, op: reduce_scatter, axis: dp_rs, size: 32K}
      - {name: mm, op: gemm, axis: tp, m: 32, n: 32, k: 32}
  - name: ar_sweep
    sweep: {size: [4K, 16K]}
    blocks:
      - {name: ar, op: all_reduce, axis: tp, size: "${size}"}
"""


def test_mesh_like_axis_and_sweep_on_four_ranks(tmp_path):
    proc, out = run_pattern(tmp_path, MESH_SWEEP, nproc=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_records(out)
    names = sorted({r["pattern"] for r in records})
    assert names == ["ar_sweep[size=16K]", "ar_sweep[size=4K]", "fsdp"]
    fsdp = by_block(records, "fsdp")
    assert fsdp["ag"]["team_size"] == 2 and fsdp["rs"]["axis"] == "dp_rs"
    for rec in fsdp.values():
        _check_sane(rec)
        assert rec["isolated_latency_avg_us"] > 0
        assert rec["slowdown"] == pytest.approx(
            rec["latency_avg_us"] / rec["isolated_latency_avg_us"], rel=1e-9
        )
    sizes = {r["pattern"]: r["size_bytes"] for r in records if r["block"] == "ar"}
    assert sizes == {"ar_sweep[size=4K]": 4096, "ar_sweep[size=16K]": 16384}
    patterns = {p["pattern"]: p for p in read_records(out, "patterns.json")}
    assert set(patterns) == set(names)
    fsdp_p = patterns["fsdp"]
    assert fsdp_p["serial_us"] == pytest.approx(
        sum(r["isolated_latency_avg_us"] for r in fsdp.values()), rel=1e-9
    )


def test_quickstart_through_run_benchmark_writes_metrics(tmp_path):
    """The README's main job: ``python run_benchmark.py maestro -c quickstart --nproc 2``."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run(
        [
            sys.executable,
            "run_benchmark.py",
            "maestro",
            "-c",
            "quickstart",
            "--nproc",
            "2",
            "--metrics-dir",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_HANG_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== quickstart" in proc.stdout
    files = list(tmp_path.glob("metrics-*.json"))
    assert len(files) == 1
    metrics = json.loads(files[0].read_text())["metrics"]
    assert metrics and all(math.isfinite(v) for v in metrics.values())


def test_config_error_exits_2_before_any_worker(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(
        "name: bad\npatterns:\n  - name: p\n    blocks:\n"
        "      - {name: a, op: all_reduce, size: -4M}\n"
    )
    proc = run_maestro(["run", "-c", str(config), "--nproc", "2"], timeout=QUICK_HANG_S)
    assert proc.returncode == 2
    assert "patterns[0].blocks[0].size" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("invalid configuration") == 1


FAILING = """
name: failing
world_size: 2
timeout_s: 20
defaults: {warmup_iters: 1, iters: 5, baseline: false}
patterns:
  - name: ok_first
    blocks:
      - {name: ar, op: all_reduce, axis: world, size: 4K}
  - name: boom
    blocks:
      - {name: ar, op: all_reduce, axis: world, size: 4K}
      - {name: bad, op: "tests.integration.fault_blocks:FailOnRank", axis: world, rank: 1,
         when: launch}
"""


def test_runtime_error_on_one_rank_ends_every_rank(tmp_path):
    proc, out = run_pattern(tmp_path, FAILING, nproc=2, timeout=RUN_HANG_S)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rank 1" in proc.stderr and "'bad'" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    # The pattern that finished before the failure is saved.
    assert {r["pattern"] for r in read_records(out)} == {"ok_first"}


GRAPH = """
name: graphs
world_size: 2
defaults: {warmup_iters: 1, iters: 3}
patterns:
  - name: eager
    blocks:
      - {name: ar, op: all_reduce, size: 4K}
  - name: captured
    graph: true
    blocks:
      - {name: ar, op: all_reduce, size: 4K}
"""


def test_cuda_graphs_on_the_cpu_are_refused_before_any_worker(tmp_path):
    # No CUDA graphs on gloo: the file is refused at once (exit 2, no worker, no traceback),
    # and --graph on the command line likewise.
    config = tmp_path / "graphs.yaml"
    config.write_text(GRAPH)
    proc = run_maestro(
        ["run", "-c", str(config), "--nproc", "2", "--backend", "gloo"], timeout=RUN_HANG_S
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "captured" in proc.stderr and "CUDA graphs" in proc.stderr and "gloo" in proc.stderr
    assert "Traceback" not in proc.stderr
    quick = tmp_path / "quick.yaml"
    quick.write_text(GRAPH.split("  - name: captured")[0])
    proc = run_maestro(["run", "-c", str(quick), "--nproc", "2", "--graph", "--backend", "gloo"])
    assert proc.returncode == 2 and "CUDA graphs" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
