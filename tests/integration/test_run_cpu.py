"""One end-to-end run of four gloo ranks through the real launcher: every op checked under
overlap, meshes, sweeps, the isolated baseline, then a rank failing, which ends the run with
what was measured before it saved."""

from __future__ import annotations

import json

import pytest

from userbenchmark.maestro.core.output.metric_keys import parse_metric_key

from .helpers import (
    NCCL_TESTS_BUS_FACTOR,
    by_block,
    read_records,
    run_pattern,
)

pytestmark = pytest.mark.integration

FOUR_RANKS = """
name: four_ranks
world_size: 4
defaults: {dtype: fp32, warmup_iters: 1, iters: 6, baseline: false}
mesh: {dp: 2, tp: 2}
axes:
  dp_rs: {like: dp}
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
    warmup_iters: 2
    iters: 12
    check: true
    blocks:
      - {name: ar, op: all_reduce, axis: world, size: 64K}
      - {name: ag, op: all_gather, axis: a2, size: 64K}
      - {name: rs, op: reduce_scatter, axis: a3, size: 64K}
      - {name: a2a, op: all_to_all, axis: a4, size: 64K}
      - {name: bc, op: broadcast, axis: a5, size: 64K, root: 1}
      - {name: rd, op: reduce, axis: a6, size: 64K, root: 2}
      - {name: sr, op: send_recv, axis: a7, size: 64K}
      - {name: mm, op: gemm, axis: c, m: 64, n: 32, k: 128}
      - {name: nap, op: sleep, axis: s, duration_us: 500}
  - name: fsdp
    dtype: bf16
    baseline: true
    blocks:
      - {name: ag, op: all_gather, axis: dp, size: 32K}
      - {name: rs, op: reduce_scatter, axis: dp_rs, size: 32K}
      - {name: mm, op: gemm, axis: tp, m: 32, n: 32, k: 32}
  - name: ar_sweep
    sweep: {size: [4K, 16K]}
    blocks:
      - {name: ar, op: all_reduce, axis: tp, size: "${size}"}
  - name: boom
    blocks:
      - {name: ar, op: all_reduce, axis: world, size: 4K}
      - {name: bad, op: "tests.integration.fault_blocks:FailOnRank", axis: world, rank: 1,
         when: setup}
"""
MEASURED = {"all", "fsdp", "ar_sweep[size=4K]", "ar_sweep[size=16K]"}
"""The patterns before the failing one."""


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """(run folder, output folder, process) of FOUR_RANKS run on 4 gloo ranks."""
    tmp = tmp_path_factory.mktemp("four_ranks")
    proc, out = run_pattern(tmp, FOUR_RANKS, nproc=4)
    assert "== four_ranks / all" in proc.stdout, proc.stderr[-3000:]
    return tmp, out, proc


def _check_sane(rec: dict) -> None:
    assert rec["latency_min_us"] > 0
    assert rec["latency_max_us"] >= rec["latency_p50_us"] >= rec["latency_min_us"]
    assert rec["latency_p99_us"] is None  # fewer than 100 iterations: p99 is the max
    assert rec["latency_min_us"] <= rec["latency_avg_us"] <= rec["latency_max_us"]
    for name in ("latency_avg_us", "latency_p50_us"):  # each figure inside its interval
        assert rec[f"{name}_ci_low"] <= rec[name] <= rec[f"{name}_ci_high"]


def test_every_op_runs_checked_under_overlap_with_sane_numbers(four_ranks):
    # Every op on a lane of its own, so they all run at once; 4 ranks, where every bus factor
    # differs from 1 and the roots are not rank 0.
    tmp, out, _ = four_ranks
    nproc = 4
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
    patterns = {p["pattern"]: p for p in read_records(out, "patterns.json")}
    # A rank's makespan holds each of its blocks' durations (1e-9: rounding).
    longest = max(r["latency_avg_us"] for r in blocks.values())
    assert patterns["all"]["makespan_avg_us"] >= longest * (1 - 1e-9)
    metrics_files = list((tmp / "metrics").glob("metrics-*.json"))
    assert len(metrics_files) == 1
    doc = json.loads(metrics_files[0].read_text())
    assert doc["name"] == "maestro"
    assert doc["metrics"] and all(isinstance(v, float) for v in doc["metrics"].values())
    for key in doc["metrics"]:
        parse_metric_key(key)
    assert doc["metrics"]["four_ranks/all/ar/busbw_gbps"] == pytest.approx(
        blocks["ar"]["busbw_gbps"]
    )


def test_mesh_like_axis_and_sweep_on_four_ranks(four_ranks):
    _, out, _ = four_ranks
    records = [r for r in read_records(out) if r["pattern"] != "all"]
    names = sorted({r["pattern"] for r in records})
    assert names == ["ar_sweep[size=16K]", "ar_sweep[size=4K]", "fsdp"]
    fsdp = by_block(records, "fsdp")
    assert fsdp["ag"]["team_size"] == 2 and fsdp["rs"]["axis"] == "dp_rs"
    assert {r["dtype"] for r in fsdp.values()} == {"bf16"}
    for rec in fsdp.values():
        _check_sane(rec)
        assert rec["isolated_latency_avg_us"] > 0
        assert rec["slowdown"] == pytest.approx(
            rec["latency_avg_us"] / rec["isolated_latency_avg_us"], rel=1e-9
        )
    sizes = {r["pattern"]: r["size_bytes"] for r in records if r["block"] == "ar"}
    assert sizes == {"ar_sweep[size=4K]": 4096, "ar_sweep[size=16K]": 16384}
    patterns = {p["pattern"]: p for p in read_records(out, "patterns.json")}
    assert set(names) <= set(patterns)
    fsdp_p = patterns["fsdp"]
    assert fsdp_p["serial_us"] == pytest.approx(
        sum(r["isolated_latency_avg_us"] for r in fsdp.values()), rel=1e-9
    )


def test_runtime_error_on_one_rank_ends_every_rank(four_ranks):
    # Under the --nproc launcher; a failure in setup, so that no rank waits out a collective
    # (tests/integration/test_faults.py fails every phase, under every launcher).
    _, out, proc = four_ranks
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rank 1" in proc.stderr and "'bad'" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    # The patterns that finished before the failure are saved.
    assert {r["pattern"] for r in read_records(out)} == MEASURED
    assert [f["pattern"] for f in read_records(out, "failures.json")] == ["boom"]
