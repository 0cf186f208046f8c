"""One measured window, run again and again: windows joined as one, the what-if rounds' order
and per-round values, a variant's blocks shared with its pattern's, and a whole run of a pattern
with a variant in one process (one rank)."""

from __future__ import annotations

import dataclasses
import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from userbenchmark.maestro.core.analysis.aggregate import local_summary
from userbenchmark.maestro.core.analysis.intervals import HostTimings, WindowTimings
from userbenchmark.maestro.core.config.loader import load_suite_text
from userbenchmark.maestro.core.config.options import RunOptions
from userbenchmark.maestro.core.measure import pattern
from userbenchmark.maestro.core.measure.pattern import Window, joined
from userbenchmark.maestro.core.measure.prepare import Allocated, make_plan, setup
from userbenchmark.maestro.core.profilers.profiler import EventProfiler
from userbenchmark.maestro.errors import OptionError

TEXT = """\
name: rounds
defaults: {warmup_iters: 1, iters: 3}
axes:
  side: {like: world}
patterns:
  - name: two_lanes
    blocks:
      - {name: long, op: sleep, axis: world, duration_us: 400}
      - {name: short, op: sleep, axis: side, duration_us: 200}
"""


def _suite(**variants: dict[str, float]):
    """The suite of TEXT, its pattern with a variant per keyword: {block: duration_us}."""
    suite = load_suite_text(TEXT, world_size=1)
    base = suite.patterns[0]

    def variant(name: str, durations: dict[str, float]):
        blocks = tuple(
            dataclasses.replace(b, params={**b.params, "duration_us": durations[b.name]})
            if b.name in durations
            else b
            for b in base.blocks
        )
        return dataclasses.replace(base, variant=name, blocks=blocks)

    found = tuple(variant(name, durations) for name, durations in variants.items())
    return dataclasses.replace(suite, patterns=(dataclasses.replace(base, variants=found),))


def _window(starts, ends, *, counts, agree) -> Window:
    timings = WindowTimings(
        starts_ns=np.array(starts, dtype=np.int64),
        ends_ns=np.array(ends, dtype=np.int64),
        present=np.ones(len(starts), dtype=bool),
        clock="perf_counter",
        activity_counts=np.array(counts),
    )
    host = HostTimings(agree_ns=np.array(agree, dtype=np.int64), gate_us=5.0)
    return Window(timings=timings, host=host, agg=None)


def test_joined_windows_read_as_one_window_of_all_their_iterations():
    a = _window([[0, 10], [1, 11]], [[5, 15], [4, 12]], counts=[2, 2], agree=[7, 8])
    b = _window([[100, 110], [101, 111]], [[108, 113], [104, 112]], counts=[3, 2], agree=[9, 6])
    timings, host = joined([a, b])
    assert timings.starts_ns.tolist() == [[0, 10, 100, 110], [1, 11, 101, 111]]
    assert timings.ends_ns[0].tolist() == [5, 15, 108, 113]
    assert timings.activity_counts.tolist() == [5, 4]  # counted over every iteration
    assert host.agree_ns.tolist() == [7, 8, 9, 6] and host.gate_us == 5.0
    flags = {"lane_of_block": [0, 1], "is_comm": np.zeros(2, bool), "is_compute": np.ones(2, bool)}
    both = local_summary(timings, **flags).latency_ns
    apart = [local_summary(w.timings, **flags).latency_ns for w in (a, b)]
    assert np.array_equal(both, np.concatenate(apart, axis=1))
    assert joined([a]) == (a.timings, a.host)  # one window: itself


def test_each_round_rotates_the_order_and_is_a_phase_of_its_own(monkeypatch):
    suite = _suite(slow={"long": 480.0}, same={})
    sides = (suite.patterns[0], *suite.patterns[0].variants)
    warms = [SimpleNamespace(plan=SimpleNamespace(pattern=p)) for p in sides]
    ran, phases = [], []
    monkeypatch.setattr(pattern, "measure_window", lambda rig, w: ran.append(warms.index(w)) or w)

    def step(phase, label, work):
        phases.append((phase, label))
        return work()

    got = pattern.interleaved(None, warms, step, 4)
    assert ran == [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]
    assert [len(windows) for windows in got] == [4, 4, 4]
    assert phases[:2] == [
        ("measure, round 1 of 4", "two_lanes"),
        ("measure, round 1 of 4", "two_lanes[whatif=slow]"),
    ]
    assert phases[-1] == ("measure, round 4 of 4", "two_lanes[whatif=same]")


def test_per_round_values_are_each_windows_averages():
    def window(makespans, latencies):
        agg = SimpleNamespace(makespan_ns=np.array(makespans), latency_ns=np.array(latencies))
        return SimpleNamespace(agg=agg)

    makespan, blocks = pattern.per_round(
        [
            window([10.0, 20.0], [[1.0, 3.0], [np.nan] * 2]),
            window([30.0, 50.0], [[5.0, 7.0], [np.nan] * 2]),
        ]
    )
    assert makespan.tolist() == [15.0, 40.0]
    assert blocks.shape == (2, 2) and blocks[0].tolist() == [2.0, 6.0]
    assert np.isnan(blocks[1]).all()  # untimed: NaN in every round


def test_a_variant_runs_its_patterns_blocks_where_it_changes_nothing_of_their_work():
    suite = _suite(slow={"long": 480.0})
    axes = dict(suite.axes)
    rig = SimpleNamespace(
        place=SimpleNamespace(
            is_cuda=False, rank=0, device=torch.device("cpu"), backend="gloo", hosts=()
        ),
        comms=SimpleNamespace(
            team=lambda axis: (0,), group=lambda axis: None, axis=lambda axis: axes[axis]
        ),
        seed=0,
        calibration={},
        wedged=False,
    )
    base = suite.patterns[0]
    held = Allocated(rig, base.name)
    ours, theirs = setup(rig, [make_plan(rig, p) for p in (base, *base.variants)], held)
    assert theirs.blocks[1] is ours.blocks[1]  # short: the same object and buffers
    assert theirs.blocks[0] is not ours.blocks[0]  # long changed: its own
    assert theirs.blocks[0].spec.params["duration_us"] == 480.0
    assert len(held.blocks) == 3
    held.teardown(failed=False, drain_s=1.0)
    assert held.blocks == []


class _Sink:
    """Rank 0's sink of a run in this process: what it was told, in order."""

    def __init__(self) -> None:
        self.told: list[tuple] = []

    def __call__(self, suite, options, *, guard):
        return self

    def check(self, options) -> None:
        pass

    def start(self, place, profiler, calibration) -> None:
        pass

    def note(self, doing, step=0, steps=0) -> None:
        self.told.append(("note", doing))

    def finished(self, spec, outcome, run_info) -> None:
        self.told.append(("finished", spec.variant, outcome))

    def whatif_finished(self, spec, results) -> None:
        self.told.append(("whatif", spec.name, results))

    def failed(self, name, message) -> None:
        self.told.append(("failed", name, message))

    def close(self, status) -> None:
        pass


def test_a_pattern_and_its_variant_run_in_rounds_and_reach_the_sink(cli_here):
    from userbenchmark.maestro.core.runtime.phases import run_worker

    sink = _Sink()
    suite = _suite(slow={"long": 480.0})
    assert run_worker(suite, RunOptions(backend="gloo", rounds=2), sink) == 0
    finished = [t for t in sink.told if t[0] == "finished"]
    assert [variant for _, variant, _ in finished] == [None, "slow"]
    base, slow = (outcome for _, _, outcome in finished)
    for outcome in (base, slow):  # both rounds' iterations behind every figure
        assert [b.iters for b in outcome.blocks] == [6, 6] and outcome.pattern.iters == 6
    assert slow.blocks[0].latency_avg_us > 480.0 > base.blocks[0].latency_avg_us > 400.0
    assert base.blocks[0].isolated_latency_avg_us > 400.0  # the baseline: the pattern's own
    assert np.isnan(slow.blocks[0].isolated_latency_avg_us)
    assert pattern.BASE_ONLY_NOTE in slow.pattern.notes
    assert pattern.BASE_ONLY_NOTE not in base.pattern.notes
    told, name, (result,) = sink.told[-1]
    assert (told, name, result.variant, result.rounds) == ("whatif", "two_lanes", "slow", 2)
    assert result.base_makespan_avg_us > 400.0 and result.makespan_avg_us > 480.0
    notes = [t[1] for t in sink.told if t[0] == "note"]
    assert "two_lanes[whatif=slow]: measure, round 2 of 2" in notes
    assert notes.index("two_lanes: baseline") > notes.index("two_lanes: measure, round 2 of 2")


def test_rounds_must_be_two_or_more():
    with pytest.raises(OptionError, match="--rounds must be at least 2, got 1"):
        RunOptions(rounds=1)


FAULTY = """\
name: faulty
defaults: {warmup_iters: 1, iters: 2, baseline: false}
patterns:
  - name: first
    blocks:
      - {name: nap, op: sleep, duration_us: 100}
  - name: second
    blocks:
      - {name: bad, op: "tests.integration.fault_blocks:FailOnRank", rank: 7, after_launches: 3}
"""


def test_a_variant_that_fails_ends_the_run_as_its_pattern_would(cli_here):
    from userbenchmark.maestro.core.runtime.phases import run_worker

    suite = load_suite_text(FAULTY, world_size=1)
    first, second = suite.patterns
    (block,) = second.blocks
    failing = dataclasses.replace(block, params={**block.params, "rank": 0})
    variant = dataclasses.replace(second, variant="fails", blocks=(failing,))
    second = dataclasses.replace(second, variants=(variant,))
    sink = _Sink()
    options = RunOptions(backend="gloo", rounds=3)
    assert run_worker(dataclasses.replace(suite, patterns=(first, second)), options, sink) == 1
    told = [t[:2] for t in sink.told if t[0] != "note"]
    assert told == [("finished", None), ("failed", "second")]  # the first pattern's kept
    message = sink.told[-1][2]
    # Its warmup and first round's window ran (3 launches): the 4th, round 2's first, fails.
    assert "phase measure, round 2 of 3, pattern 'second[whatif=fails]', block 'bad'" in message


def test_event_timed_windows_lie_one_after_another_on_one_time_line(monkeypatch):
    # CUDA events time a window from its own reference event. Rounds joined as one window must
    # follow one another: laid over each other, one round's comm would count as hidden under
    # another round's compute.
    clock_ns = itertools.count(0, 1000)  # the device reaches each event 1 µs after the last

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            self.at_ns = -1

        def record(self) -> None:
            self.at_ns = next(clock_ns)

        def elapsed_time(self, end: Event) -> float:  # ms, as CUDA's
            return (end.at_ns - self.at_ns) / 1e6

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    profiler = EventProfiler()
    windows = []
    for window_id in range(2):
        profiler.begin_window(window_id, 1, 2, np.ones(1, dtype=bool))
        for it in range(2):
            profiler.before(0, it)
            profiler.after(0, it)
        windows.append(profiler.end_window())
    first, second = windows
    assert first.starts_ns.tolist() == [[1000, 3000]] and first.ends_ns.tolist() == [[2000, 4000]]
    assert second.starts_ns.tolist() == [[6000, 8000]]  # its reference 5 µs after the first's
    assert second.ends_ns.tolist() == [[7000, 9000]] and not second.host_clock
