"""Pairs of blocks: the "ran together" line under a pattern's table leaves out pairs of one lane
(they run in turn) and prints a bounded line; a pattern past MAX_PAIR_BLOCKS (an imported step
of thousands of blocks) records no pairs, says why, and builds nothing of blocks squared."""

from __future__ import annotations

import dataclasses

from userbenchmark.maestro.core.analysis import overlap
from userbenchmark.maestro.core.analysis.aggregate import MAX_PAIR_BLOCKS, WindowAggregate
from userbenchmark.maestro.core.analysis.records import PairResult
from userbenchmark.maestro.core.output.table import MAX_PAIRS_SHOWN, _overlap_lines, format_pattern

from .test_flagged_figures import _outcome
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


def _sleeps(num_blocks: int):
    """An outcome of ``num_blocks`` sleeps, each on its own lane."""
    sleep = ("sleep", {"duration_us": 10.0})
    return _outcome([sleep] * num_blocks, [[10.0] * 4] * num_blocks, [[10.0] * 4] * num_blocks)


def test_pairs_are_recorded_up_to_the_bound_and_left_out_past_it_with_a_note():
    n = MAX_PAIR_BLOCKS
    at_the_bound = _sleeps(n)
    assert len(at_the_bound.pairs) == n * (n - 1) // 2 and "pairs" not in at_the_bound.pattern.notes
    past = _sleeps(n + 1)
    assert past.pairs == () and _ran_together(past) == ""
    note = f"no pairs of blocks recorded (pairs.*, ran together): {n + 1} blocks make 5,050 pairs"
    assert note in past.pattern.notes and f"note: {note}" in format_pattern(past)


def test_past_the_bound_no_rank_figures_the_pairs(monkeypatch):
    figured = []
    monkeypatch.setattr(overlap, "pairwise_overlap_mean", lambda *a: figured.append(a))
    _sleeps(MAX_PAIR_BLOCKS + 1)
    assert figured == []  # local_summary never made a (blocks, blocks) matrix


def test_the_pair_matrix_is_read_once(monkeypatch):
    reads = []
    matrix = WindowAggregate.pairwise_overlap.fget
    counted = property(lambda agg: reads.append(1) or matrix(agg))
    monkeypatch.setattr(WindowAggregate, "pairwise_overlap", counted)
    assert len(_sleeps(6).pairs) == 15 and len(reads) == 1
