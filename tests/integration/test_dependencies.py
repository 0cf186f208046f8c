"""Blocks that wait for blocks (``after:``) end to end on gloo: a chain across two lanes runs
one block after the other, each block's latency is its own run, and a file whose dependencies
cannot hold is refused before any worker starts (through the command line's entry point, in
this process: a refusal starts no process)."""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import pair_overlaps, read_records, run_pattern
from userbenchmark.maestro import cli

pytestmark = pytest.mark.integration

CHAIN = """
name: chain
world_size: 2
defaults: {warmup_iters: 2, iters: 8, baseline: true}
axes:
  x: {teams: [[0]]}
patterns:
  - name: chain
    blocks:
      - {name: first, op: sleep, axis: x, duration_us: 10000}
      - {name: second, op: sleep, axis: x, lane: other, duration_us: 10000, after: first}
  - name: solo
    warmup_iters: 1
    iters: 4
    baseline: false
    blocks:
      - {name: a, op: sleep, axis: x, duration_us: 5000}
      - {name: b, op: sleep, lane: other, duration_us: 1000, after: a}
"""
"""Two ranks; rank 0 alone runs the chain (rank 1 is in no team of ``x``), and in ``solo``
rank 1 runs b without a."""


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The output folder of CHAIN run on 2 ranks with --trace."""
    proc, out = run_pattern(tmp_path_factory.mktemp("chain"), CHAIN, nproc=2, extra=["--trace"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_a_chain_across_two_lanes_runs_in_order_and_each_latency_is_its_own(chain):
    pattern = next(p for p in read_records(chain, "patterns.json") if p["pattern"] == "chain")
    blocks = {r["block"]: r for r in read_records(chain) if r["pattern"] == "chain"}
    first, second = blocks["first"]["latency_avg_us"], blocks["second"]["latency_avg_us"]
    # Every sleep lasts at least its duration, and second starts when first has ended: the
    # makespan holds both. Were the wait inside second's latency, second alone would span
    # nearly the whole makespan and the two latencies would add up to more than it.
    assert first >= 10000 and second >= 10000
    assert pattern["makespan_avg_us"] >= first + second
    assert pair_overlaps(chain)[("chain", "first", "second")] == 0
    # Ideal is the critical path: both blocks, one after the other; nothing can overlap.
    assert pattern["ideal_us"] == pytest.approx(pattern["serial_us"])
    assert pattern["overlap_efficiency"] is None
    assert pattern["lane_skew_p50_us"] is None  # one lane starts at the gate, the other waits


@pytest.mark.parametrize(
    ("after", "message"),
    [
        (
            "[secnd]",
            "patterns[0].blocks[0].after: unknown block 'secnd' (did you mean 'second'?); "
            "blocks of this pattern: first, second",
        ),
        (
            "second",
            "patterns[0].blocks[0].after: blocks 'first', 'second' wait for each other in a "
            "cycle: 'first' waits for 'second' (after); 'second' waits for 'first' (after)",
        ),
    ],
    ids=["unknown", "cycle"],
)
def test_an_unknown_name_and_a_cycle_are_refused_with_exit_2(
    tmp_path, after, message, capsys, cli_here
):
    config = tmp_path / "bad.yaml"
    config.write_text(
        CHAIN.replace("duration_us: 10000}", f"duration_us: 10000, after: {after}}}", 1)
    )
    for args in (["validate", str(config)], ["run", "-c", str(config), "--nproc", "2"]):
        assert cli.main(args) == 2
        stderr = capsys.readouterr().err
        assert f"bad.yaml:10: {message}" in stderr
        assert "Traceback" not in stderr


def test_graph_mode_with_dependencies_is_refused_on_the_cpu_as_without(tmp_path, capsys, cli_here):
    config = tmp_path / "graph.yaml"
    config.write_text(CHAIN.replace("baseline: true}", "baseline: true, graph: true}"))
    assert cli.main(["run", "-c", str(config), "--nproc", "2"]) == 2
    stderr = capsys.readouterr().err
    assert "CUDA graphs" in stderr and "gloo" in stderr


def test_a_rank_that_does_not_run_the_awaited_block_does_not_wait_for_it(chain):
    # Rank 1 is in no team of `x`: it runs b without a (each rank waits for its own work).
    spans = {}
    for rank in (0, 1):
        doc = json.loads((chain / "traces" / f"rank{rank}.json").read_text())
        for e in doc["traceEvents"]:
            args = e.get("args", {})
            if e["ph"] == "X" and args.get("op") == "sleep" and args["pattern"] == "solo":
                spans[(rank, e["name"], args["pattern_iteration"])] = (e["ts"], e["ts"] + e["dur"])
    for it in range(4):
        assert spans[(0, "b", it)][0] >= spans[(0, "a", it)][1]
        assert (1, "b", it) in spans and (1, "a", it) not in spans
