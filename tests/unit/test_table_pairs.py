"""The "ran together" line under a pattern's table: pairs of one lane are left out (they run in
turn), and a pattern of many blocks (an imported training step) prints a bounded line."""

from __future__ import annotations

import dataclasses

from userbenchmark.maestro.core.analysis.records import PairResult
from userbenchmark.maestro.core.output.table import MAX_PAIRS_SHOWN, _overlap_lines

from .test_golden_outputs import _outcomes


def _ran_together(outcome) -> str:
    lines = [line for line in _overlap_lines(outcome, "us", 2) if line.startswith("ran together")]
    return lines[0] if lines else ""


def _golden_overlap():
    return next(o for p, o, _ in _outcomes() if p.name == "overlap")


def test_pairs_of_one_lane_are_left_out():
    outcome = _golden_overlap()
    first, second = outcome.blocks[:2]
    assert first.block + "∩" + second.block in _ran_together(outcome)
    same = dataclasses.replace(second, lane=first.lane)
    one_lane = dataclasses.replace(outcome, blocks=(first, same, *outcome.blocks[2:]))
    line = _ran_together(one_lane)
    assert first.block + "∩" + second.block not in line
    assert f"{first.block}∩{outcome.blocks[2].block}" in line
    every_lane = tuple(dataclasses.replace(b, lane="one") for b in outcome.blocks)
    assert _ran_together(dataclasses.replace(outcome, blocks=every_lane)) == ""


def test_many_pairs_print_those_that_ran_together_most_and_a_count():
    outcome = _golden_overlap()
    a, b = outcome.blocks[0].block, outcome.blocks[1].block
    template = outcome.pairs[0]
    pairs = tuple(
        dataclasses.replace(template, blocks=(a, b), pairwise_overlap=i / 100)
        for i in range(MAX_PAIRS_SHOWN + 5)
    )
    assert all(isinstance(p, PairResult) for p in pairs)
    line = _ran_together(dataclasses.replace(outcome, pairs=pairs))
    assert line.count("∩") == MAX_PAIRS_SHOWN
    assert line.endswith("; 5 more pairs in pairs.json")
    assert f"{a}∩{b} {(MAX_PAIRS_SHOWN + 4) / 100:.2f}" in line  # the largest first
