"""Overlap analytics end to end on gloo: efficiency, slowdown, and the check under overlap."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.integration.helpers import (
    QUICK_HANG_S,
    REPO_ROOT,
    RUN_HANG_S,
    pair_overlaps,
    read_records,
    run_pattern,
)

pytestmark = pytest.mark.integration

SLEEPS = """
name: sleeps
world_size: 2
defaults: {warmup_iters: 2, iters: 8, baseline: true}
axes:
  x: {like: world}
  y: {like: world}
patterns:
  - name: apart
    blocks:
      - {name: s1, op: sleep, axis: x, duration_us: 20000}
      - {name: s2, op: sleep, axis: y, duration_us: 20000}
  - name: together
    blocks:
      - {name: s1, op: sleep, axis: x, duration_us: 20000}
      - {name: s2, op: sleep, axis: x, duration_us: 20000}
"""


def test_sleeps_on_independent_axes_overlap_fully_and_on_one_axis_not_at_all(tmp_path):
    proc, out = run_pattern(tmp_path, SLEEPS, nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    patterns = {p["pattern"]: p for p in read_records(out, "patterns.json")}
    blocks = {(r["pattern"], r["block"]): r for r in read_records(out)}
    apart, together = patterns["apart"], patterns["together"]
    for rec in blocks.values():  # known durations
        assert rec["latency_avg_us"] == pytest.approx(20000, rel=0.25), rec
    assert apart["makespan_avg_us"] == pytest.approx(20000, rel=0.25)
    assert together["makespan_avg_us"] == pytest.approx(40000, rel=0.25)
    # serial = 40 ms, ideal = 20 ms: efficiency = (40 - makespan) / 20.
    assert apart["serial_us"] == pytest.approx(40000, rel=0.15)
    assert apart["ideal_us"] == pytest.approx(20000, rel=0.15)
    assert apart["overlap_efficiency"] == pytest.approx(1.0, abs=0.2)
    # One lane runs its blocks in order: ideal is both (the critical path), no overlap possible.
    assert together["ideal_us"] == pytest.approx(40000, rel=0.15)
    assert together["overlap_efficiency"] is None
    for name in ("s1", "s2"):
        assert blocks[("apart", name)]["slowdown"] == pytest.approx(1.0, abs=0.15)
        # One lane runs them in order: each keeps its own duration, the pattern doubles.
        assert blocks[("together", name)]["slowdown"] == pytest.approx(1.0, abs=0.15)
    pairs = pair_overlaps(out)
    assert pairs[("apart", "s1", "s2")] > 0.8
    assert pairs[("together", "s1", "s2")] < 0.05


TWO_ALL_REDUCES = """
name: two_ar
world_size: 2
defaults: {dtype: fp32, warmup_iters: 2, iters: 6, baseline: true}
axes:
  a: {like: world}
  b: {like: world}
patterns:
  - name: pair
    blocks:
      - {name: ar1, op: all_reduce, axis: a, size: 32M}
      - {name: ar2, op: all_reduce, axis: b, size: 32M}
"""


def test_two_large_all_reduces_slow_each_other_down(tmp_path):
    proc, out = run_pattern(tmp_path, TWO_ALL_REDUCES, nproc=2, timeout=RUN_HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    blocks = {r["block"]: r for r in read_records(out)}
    for name in ("ar1", "ar2"):
        rec = blocks[name]
        assert rec["isolated_latency_avg_us"] > 0
        # Two 32 MiB reductions share two CPU cores and memory bandwidth.
        assert rec["slowdown"] >= 1.0, rec
    pattern = read_records(out, "patterns.json")[0]
    assert pattern["shared_busbw_gbps"] > 0


EVERY_OP_CHECKED = """
name: checked
world_size: 4
defaults: {dtype: fp32, warmup_iters: 1, iters: 3, baseline: false, check: true}
axes:
  a: {like: world}
  b: {like: world}
  c: {like: world}
  d: {like: world}
  e: {like: world}
  f: {like: world}
patterns:
  - name: all_at_once
    blocks:
      - {name: ar, op: all_reduce, axis: world, size: 256K}
      - {name: ag, op: all_gather, axis: a, size: 256K}
      - {name: rs, op: reduce_scatter, axis: b, size: 256K}
      - {name: a2a, op: all_to_all, axis: c, size: 256K}
      - {name: bc, op: broadcast, axis: d, size: 256K, root: 1}
      - {name: red, op: reduce, axis: e, size: 256K, root: 2}
      - {name: sr, op: send_recv, axis: f, size: 256K}
      - {name: mm, op: gemm, axis: world, lane: compute, m: 128, n: 128, k: 128}
"""


def test_check_passes_for_every_collective_under_overlap(tmp_path):
    proc, out = run_pattern(tmp_path, EVERY_OP_CHECKED, nproc=4, timeout=RUN_HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_records(out)
    comm = [r for r in records if r["op"] != "gemm"]
    assert len(comm) == 7
    for rec in comm:
        assert rec["wrong_elements"] == 0, rec
    pattern = read_records(out, "patterns.json")[0]
    assert pattern["lane_skew_p50_us"] is None or pattern["lane_skew_p50_us"] >= 0


CORRUPTED = """
name: corrupted
world_size: 2
defaults: {dtype: fp32, warmup_iters: 1, iters: 2, baseline: false, check: true}
axes:
  other: {like: world}
patterns:
  - name: clean
    blocks:
      - {name: ag, op: all_gather, axis: world, size: 64K}
  - name: scribbled
    blocks:
      - {name: ag, op: all_gather, axis: world, lane: shared, size: 64K}
      - {name: rs, op: reduce_scatter, axis: other, size: 64K}
      - {name: bad, op: "tests.integration.corrupt_blocks:Scribbler", axis: world,
         lane: shared, target: ag}
"""


def test_check_catches_a_block_writing_into_another_blocks_buffer(tmp_path):
    proc, out = run_pattern(tmp_path, CORRUPTED, nproc=2)
    # Wrong results are a failed run, with every number still written.
    assert proc.returncode == 1, proc.stderr[-3000:]
    blocks = {(r["pattern"], r["block"]): r for r in read_records(out)}
    assert blocks[("clean", "ag")]["wrong_elements"] == 0
    # 64 KiB of fp32 gathered = 16384 elements per rank, all overwritten, on 2 ranks.
    assert blocks[("scribbled", "ag")]["wrong_elements"] == 2 * 16384
    assert blocks[("scribbled", "rs")]["wrong_elements"] == 0
    assert "wrong" in proc.stderr and "ag" in proc.stderr


def test_trace_and_plot_files_of_a_run(tmp_path):
    proc, out = run_pattern(tmp_path, SLEEPS, nproc=2, extra=["--trace", "--plot"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    trace = json.loads((out / "trace.json").read_text())
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "sleep"]
    # 2 patterns x 2 blocks x 8 iterations x 2 ranks, one slice each.
    assert len(slices) == 2 * 2 * 8 * 2
    assert {e["pid"] for e in slices} == {1, 2}  # a process per rank
    for e in slices:
        assert e["dur"] == pytest.approx(20000, rel=0.3)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert names == {"rank 0", "rank 1"}
    pngs = sorted(p.name for p in out.glob("plot-*.png"))
    assert pngs == ["plot-apart.png", "plot-together.png"]
    for name in pngs:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_without_output_dir_is_a_usage_error(tmp_path):
    from tests.integration.helpers import run_maestro

    proc = run_maestro(["run", "-c", "quickstart", "--trace"], timeout=QUICK_HANG_S)
    assert proc.returncode == 2
    assert "--output-dir" in proc.stderr and "Traceback" not in proc.stderr


def test_rank_traces_of_a_cpu_run_load_in_hta(tmp_path):
    from tests.hta_support import load_traces
    from tests.integration.helpers import run_maestro

    out = tmp_path / "out"
    proc = run_maestro(
        ["run", "-c", "quickstart", "--nproc", "2", "--output-dir", str(out), "--trace",
         "--no-metrics"],
        timeout=RUN_HANG_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    traces = out / "traces"
    assert sorted(p.name for p in traces.iterdir()) == ["rank0.json", "rank1.json"]
    docs = {r: json.loads((traces / f"rank{r}.json").read_text()) for r in (0, 1)}
    # overlap_ar_gemm and ag_rs (2 blocks each), the ar_sweep's 3 patterns (1 block each).
    num_steps = 5 * 20
    for rank, doc in docs.items():
        assert doc["distributedInfo"] == {"backend": "gloo", "rank": rank, "world_size": 2}
        assert [p["first_step"] for p in doc["maestroPatterns"]] == [0, 20, 40, 60, 80]
        events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        assert not any("stream" in e["args"] for e in events)  # nothing is GPU work
        assert not any(e["name"].startswith("nccl") for e in events)
        blocks = [e for e in events if "block" in e["args"]]
        assert len(blocks) == (2 + 2 + 3) * 20
        assert {e["cat"] for e in blocks} == {"user_annotation"}
    analysis, warnings = load_traces(traces)
    assert warnings == []
    assert analysis.t.get_ranks() == [0, 1]
    for rank in (0, 1):
        assert analysis.t.get_iterations(rank) == list(range(num_steps))
        df = analysis.t.get_trace(rank)
        assert int((df["stream"] != -1).sum()) == 0
    table = analysis.get_comm_comp_overlap(visualize=False)
    assert list(table["rank"]) == [0, 1]  # computed; NaN, as HTA sees no GPU kernel
    # The HTA example of docs/outputs-trace-plot.md runs as written on this output.
    page = (REPO_ROOT / "docs" / "outputs-trace-plot.md").read_text()
    section = page[page.index("## `--trace`: `out/traces/rank<r>.json`") :]
    example = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert 'trace_dir="out/traces"' in example
    done = subprocess.run(
        [sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
        timeout=QUICK_HANG_S, env={**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
