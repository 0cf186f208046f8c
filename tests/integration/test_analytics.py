"""Overlap analytics end to end on gloo (one run of sleeps, with every optional file), and the
check catching a block that corrupts another's buffer (two more patterns of the same run, after
the sleeps: a launch costs more than its patterns).

Only what holds whatever the machine's load is asserted: a sleep lasts at least its duration,
blocks on one lane run one after the other, blocks on two lanes run at the same time in some
iteration. The formulas themselves are unit-tested on injected timings
(tests/unit/test_overlap.py, test_golden_outputs.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.hta_support import load_traces
from tests.integration.helpers import (
    QUICK_HANG_S,
    REPO_ROOT,
    pair_overlaps,
    read_records,
    run_pattern,
)

pytestmark = pytest.mark.integration

NAP_US = 5000
"""Every sleep's duration."""
CHECKED = "dtype: fp32, warmup_iters: 1, iters: 2, baseline: false, check: true"
CORRUPTED = f"""
  - {{name: clean, {CHECKED}, blocks: [{{name: ag, op: all_gather, axis: world, size: 64K}}]}}
  - {{name: scribbled, {CHECKED}, blocks: [
      {{name: ag, op: all_gather, axis: world, lane: shared, size: 64K}},
      {{name: rs, op: reduce_scatter, axis: other, size: 64K}},
      {{name: bad, op: "tests.integration.corrupt_blocks:Scribbler", axis: world,
        lane: shared, target: ag}}]}}
"""
"""The check's patterns: an all_gather alone, then one whose output another block overwrites."""
SLEEPS = (
    """
name: sleeps
world_size: 2
defaults: {warmup_iters: 2, iters: 8, baseline: true}
axes:
  x: {like: world}
  y: {like: world}
  other: {like: world}
patterns:
  - name: apart
    blocks:
      - {name: s1, op: sleep, axis: x, duration_us: NAP_US}
      - {name: s2, op: sleep, axis: y, duration_us: NAP_US}
  - name: together
    blocks:
      - {name: s1, op: sleep, axis: x, duration_us: NAP_US}
      - {name: s2, op: sleep, axis: x, duration_us: NAP_US}
""".replace("NAP_US", str(NAP_US))
    + CORRUPTED
)
SLEEP_PATTERNS = ("apart", "together")


@pytest.fixture(scope="module")
def sleeps_run(tmp_path_factory):
    """(outcome, output folder) of SLEEPS run on 2 ranks with --trace and --plot."""
    return run_pattern(
        tmp_path_factory.mktemp("sleeps"), SLEEPS, nproc=2, extra=["--trace", "--plot"]
    )


@pytest.fixture(scope="module")
def sleeps(sleeps_run):
    """The output folder of SLEEPS' run, which failed only for the check's wrong results."""
    proc, out = sleeps_run
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert not (out / "failures.json").exists(), proc.stderr[-3000:]
    return out


def test_sleeps_on_two_axes_overlap_and_on_one_axis_run_in_turn(sleeps):
    patterns = {p["pattern"]: p for p in read_records(sleeps, "patterns.json")}
    blocks = {
        (r["pattern"], r["block"]): r
        for r in read_records(sleeps)
        if r["pattern"] in SLEEP_PATTERNS
    }
    apart, together = patterns["apart"], patterns["together"]
    for rec in blocks.values():
        assert rec["latency_min_us"] >= NAP_US, rec
        assert rec["isolated_latency_avg_us"] >= NAP_US, rec
    assert apart["makespan_avg_us"] >= NAP_US
    assert together["makespan_avg_us"] >= 2 * NAP_US  # one lane: one sleep after the other
    assert apart["serial_us"] >= 2 * NAP_US and apart["ideal_us"] >= NAP_US
    # One lane runs its blocks in order: the critical path is both, so no overlap is possible.
    assert together["ideal_us"] == together["serial_us"]
    assert together["overlap_efficiency"] is None
    pairs = pair_overlaps(sleeps)
    assert pairs[("together", "s1", "s2")] == 0.0
    assert pairs[("apart", "s1", "s2")] > 0.0


def test_trace_and_plot_files_of_a_run(sleeps):
    slices = []
    for rank in (0, 1):
        trace = json.loads((sleeps / "traces" / f"rank{rank}.json").read_text())
        events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        slices += [e for e in events if e["args"].get("op") == "sleep"]
    # 2 patterns x 2 blocks x 8 iterations x 2 ranks, one slice each.
    assert len(slices) == 2 * 2 * 8 * 2
    assert {e["pid"] for e in slices} == {1, 2}  # a process per rank
    assert all(e["dur"] >= NAP_US for e in slices)
    pngs = sorted(p.name for p in sleeps.glob("plot-*.png"))
    assert pngs == ["plot-apart.png", "plot-clean.png", "plot-scribbled.png", "plot-together.png"]
    for name in pngs:
        assert (sleeps / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rank_traces_of_a_cpu_run_load_in_hta(sleeps, tmp_path):
    traces = sleeps / "traces"
    assert sorted(p.name for p in traces.iterdir()) == ["rank0.json", "rank1.json"]
    docs = {r: json.loads((traces / f"rank{r}.json").read_text()) for r in (0, 1)}
    num_steps = 2 * 8 + 2 * 2  # two patterns of 8 iterations, two of 2
    for rank, doc in docs.items():
        assert doc["distributedInfo"] == {"backend": "gloo", "rank": rank, "world_size": 2}
        assert [p["first_step"] for p in doc["maestroPatterns"]] == [0, 8, 16, 18]
        events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        assert not any("stream" in e["args"] for e in events)  # nothing is GPU work
        blocks = [e for e in events if "block" in e["args"]]
        assert len(blocks) == (2 + 2) * 8 + (1 + 3) * 2
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
    (tmp_path / "out").symlink_to(sleeps)
    done = subprocess.run(
        [sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
        timeout=QUICK_HANG_S, env={**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_check_catches_a_block_writing_into_another_blocks_buffer(sleeps_run):
    proc, out = sleeps_run
    # Wrong results are a failed run (its only failure), with every number still written.
    assert proc.returncode == 1, proc.stderr[-3000:]
    blocks = {(r["pattern"], r["block"]): r for r in read_records(out)}
    assert blocks[("clean", "ag")]["wrong_elements"] == 0
    # 64 KiB of fp32 gathered = 16384 elements per rank, all overwritten, on 2 ranks.
    assert blocks[("scribbled", "ag")]["wrong_elements"] == 2 * 16384
    assert blocks[("scribbled", "rs")]["wrong_elements"] == 0
    assert "wrong" in proc.stderr and "ag" in proc.stderr
