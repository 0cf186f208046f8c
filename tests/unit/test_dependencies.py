"""``after:`` dependencies: the critical path, the loader's checks, the CPU lanes' waits and
the CUDA issue order; and the ``busy`` op's arithmetic and CPU loop."""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import numpy as np
import pytest

from bench.aggregate_scale import simulate_ranks
from userbenchmark.maestro.blocks.compute import BUSY_CPU_ELEMS, Busy
from userbenchmark.maestro.blocks.registry import registered_ops
from userbenchmark.maestro.core.analysis.aggregate import local_summary
from userbenchmark.maestro.core.analysis.intervals import WindowTimings
from userbenchmark.maestro.core.analysis.outcome import Isolated, build_outcome
from userbenchmark.maestro.core.analysis.overlap import critical_path
from userbenchmark.maestro.core.config.blocks import find_cycle
from userbenchmark.maestro.core.config.loader import load_suite_text
from userbenchmark.maestro.core.config.options import apply_max_size
from userbenchmark.maestro.core.config.spec import issue_order, predecessors
from userbenchmark.maestro.core.config.summary import suite_summary
from userbenchmark.maestro.core.measure.lanes import CpuLanes, Lane, issue_runs
from userbenchmark.maestro.core.profilers.profiler import Profiler
from userbenchmark.maestro.errors import ConfigError, RunError


# ---- the critical path ----
def test_without_dependencies_the_critical_path_is_the_longest_block():
    assert critical_path([3.0, 7.0, 5.0], [(), (), ()]) == 7.0


def test_a_chain_adds_up_and_a_diamond_takes_its_longer_branch():
    assert critical_path([1.0, 2.0, 4.0], [(), (0,), (1,)]) == 7.0
    # 4 -> 0 -> {1, 2} -> 3, with 2 the longer branch (through 1: 9); predecessors may come
    # later in the list.
    assert critical_path([5.0, 1.0, 10.0, 2.0, 1.0], [(4,), (0,), (0,), (1, 2), ()]) == 18.0


def test_critical_path_of_unmeasured_blocks_is_nan_and_a_cycle_is_an_error():
    assert math.isnan(critical_path([1.0, math.nan], [(), ()]))
    with pytest.raises(ValueError, match="cycle"):
        critical_path([1.0, 1.0], [(1,), (0,)])


# ---- the loader ----
HEAD = "name: t\nworld_size: 2\naxes: {x: {like: world}}\npatterns:\n"


def _pattern(*blocks: str, name: str = "p", extra: str = "") -> str:
    return f"  - name: {name}\n{extra}    blocks:\n" + "".join(f"      - {b}\n" for b in blocks)


def _issues(text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        load_suite_text(HEAD + text, file="bad.yaml")
    return [(i.path, i.message) for i in info.value.issues]


A = "{name: a, op: sleep, axis: x, duration_us: 10}"


def test_after_takes_a_name_or_a_list_and_the_summary_shows_it():
    suite = load_suite_text(
        HEAD
        + _pattern(
            A,
            "{name: b, op: sleep, lane: l2, duration_us: 10, after: a}",
            "{name: c, op: sleep, lane: l3, duration_us: 10, after: [a, b, a]}",
        ),
        file="ok.yaml",
    )
    blocks = suite.patterns[0].blocks
    assert [b.after for b in blocks] == [(), ("a",), ("a", "b")]
    assert "each iteration: b after a; c after a, b" in suite_summary(suite)
    # --max-size keeps the dependencies (a sleep has nothing to cap).
    assert apply_max_size(suite, 1024).patterns[0].blocks[2].after == ("a", "b")


def test_unknown_names_get_a_suggestion_and_the_pattern_blocks():
    issues = _issues(_pattern(A, "{name: b, op: sleep, lane: l, duration_us: 10, after: [aa]}"))
    assert issues == [
        (
            "patterns[0].blocks[1].after",
            "unknown block 'aa' (did you mean 'a'?); blocks of this pattern: a, b",
        )
    ]


def test_waiting_for_itself_another_pattern_or_a_sweep_point_is_refused():
    issues = _issues(
        _pattern(A, "{name: b, op: sleep, lane: l, duration_us: 10, after: [b, c, 'q[n=1]']}")
        + _pattern("{name: c, op: sleep, duration_us: 10}", name="q")
    )
    messages = [m for p, m in issues if p == "patterns[0].blocks[1].after"]
    assert messages == [
        "block 'b' waits for itself; after names other blocks",
        "block 'c' is in pattern 'q', not in this one; a block waits only for blocks of its "
        "own pattern (patterns run one after another)",
        "'q[n=1]' is a sweep point's name; name the block as written in this pattern (each "
        "sweep point's blocks wait for blocks of the same point)",
    ]


def test_after_must_be_names():
    issues = _issues(_pattern(A, "{name: b, op: sleep, lane: l, duration_us: 10, after: {a: 1}}"))
    assert issues[0][0] == "patterns[0].blocks[1].after"
    assert issues[0][1].startswith("after must be a block name or a list of block names, got")


def test_a_cycle_through_lane_order_is_named_with_its_blocks():
    # b (lane x, after a) waits for c, which waits for a on lane l; a is before b on lane x.
    issues = _issues(
        _pattern(
            A,
            "{name: b, op: sleep, axis: x, duration_us: 10, after: c}",
            "{name: c, op: sleep, lane: l, duration_us: 10, after: b}",
        )
    )
    assert issues == [
        (
            "patterns[0].blocks[1].after",
            "blocks 'b', 'c' wait for each other in a cycle: 'b' waits for 'c' (after); 'c' "
            "waits for 'b' (after); none of them could ever start (blocks of one lane run in "
            "the order written)",
        )
    ]
    issues = _issues(
        _pattern(
            "{name: a, op: sleep, axis: x, duration_us: 10, after: b}",
            "{name: b, op: sleep, axis: x, duration_us: 10}",
        )
    )
    assert "'b' waits for 'a' (before it on lane 'x')" in issues[0][1]


def test_sweep_points_wait_for_blocks_of_their_own_point():
    text = _pattern(
        '{name: "a_${n}", op: sleep, axis: x, duration_us: 10}',
        '{name: b, op: sleep, lane: l, duration_us: 10, after: "a_${n}"}',
        extra="    sweep: {n: [1, 2]}\n",
    )
    suite = load_suite_text(HEAD + text, file="ok.yaml")
    assert [p.blocks[1].after for p in suite.patterns] == [("a_1",), ("a_2",)]
    issues = _issues(text.replace('after: "a_${n}"', "after: a_1"))
    assert issues == [
        (
            "patterns[0].blocks[1].after",
            "unknown block 'a_1' (did you mean 'a_2'?); blocks of this pattern: a_2, b (at sweep "
            "point n=2)",
        )
    ]


def test_predecessors_are_after_names_and_lane_order_and_find_cycle_follows_them():
    suite = load_suite_text(
        HEAD
        + _pattern(
            A,
            "{name: b, op: sleep, axis: x, duration_us: 10}",
            "{name: c, op: sleep, lane: l, duration_us: 10, after: [b]}",
        ),
        file="ok.yaml",
    )
    blocks = suite.patterns[0].blocks
    assert predecessors(blocks) == ((), (0,), (1,))
    assert find_cycle(blocks) is None
    ring = [
        dataclasses.replace(b, lane=b.name, after=(a,)) for b, a in zip(blocks, "bca", strict=True)
    ]
    assert find_cycle(ring) == [0, 1, 2] and issue_order(ring) == ()


# ---- ideal in the records ----
def test_ideal_is_the_critical_path_over_after_and_lane_order():
    text = _pattern(
        "{name: ag, op: all_gather, axis: x, size: 64K}",
        "{name: mm, op: gemm, lane: compute, m: 64, n: 64, k: 64}",
        "{name: mm_next, op: gemm, lane: compute, m: 64, n: 64, k: 64, after: ag}",
    )
    suite = load_suite_text(HEAD + text, file="ok.yaml")
    pattern = suite.patterns[0]
    starts = np.zeros((3, 2))
    ends = np.array([[300e3, 300e3], [100e3, 100e3], [500e3, 500e3]])
    starts[2] = 300e3
    timings = WindowTimings(
        starts_ns=starts.astype(np.int64),
        ends_ns=ends.astype(np.int64),
        present=np.ones(3, dtype=bool),
        clock="perf_counter",
    )
    agg = simulate_ranks(
        [
            local_summary(
                timings,
                lane_of_block=[0, 1, -1],
                is_comm=np.array([True, False, False]),
                is_compute=np.array([False, True, True]),
            )
        ]
    )
    iso = Isolated(latency_ns=np.repeat([[300e3], [100e3], [200e3]], 2, axis=1))
    ops = registered_ops()
    out = build_outcome(
        suite,
        pattern,
        [ops["all_gather"], ops["gemm"], ops["gemm"]],
        agg,
        iso,
        None,
        None,
        profiler="host",
        team_sizes=[2, 2, 2],
    )
    p = out.pattern
    # ag (300) then mm_next (200) is longer than mm (100) then mm_next: ideal 500, not 300.
    assert p.ideal_us == pytest.approx(500.0) and p.serial_us == pytest.approx(600.0)
    assert p.makespan_avg_us == pytest.approx(500.0)
    assert p.overlap_efficiency == pytest.approx(1.0)


# ---- the CPU lanes ----
class _Log(Profiler):
    """Records the order of every block's start and end (the profiler's hooks)."""

    name = "log"

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()

    def begin_window(self, window_id, num_blocks, num_iters, present) -> None:
        pass

    def before(self, block: int, iteration: int) -> None:
        with self._lock:
            self.events.append(("start", block, iteration))

    def after(self, block: int, iteration: int) -> None:
        with self._lock:
            self.events.append(("end", block, iteration))


class _Fake:
    def __init__(self, nap_s: float = 0.0, fail: bool = False) -> None:
        self.nap_s, self.fail = nap_s, fail

    def launch(self) -> None:
        time.sleep(self.nap_s)
        if self.fail:
            raise ValueError("broken block")


def _cpu(timeout_s: float = 30.0) -> CpuLanes:
    return CpuLanes(barrier=lambda: None, agree_start=None, timeout_s=timeout_s)


def test_a_waiting_block_starts_after_its_predecessors_end_in_every_iteration():
    # Lane 0: block 0 (slow); lane 1: block 1 waits for 0; lane 2: block 2 waits for 0 and 1.
    lanes = [
        Lane(name="a", blocks=[(0, _Fake(0.002))]),
        Lane(name="b", blocks=[(1, _Fake())], after={1: (0,)}),
        Lane(name="c", blocks=[(2, _Fake())], after={2: (0, 1)}),
    ]
    log = _Log()
    _cpu().run_window(lanes, 5, log, sync="barrier-only", block_names=["a0", "b1", "c2"])
    at = {event: n for n, event in enumerate(log.events)}
    for it in range(5):
        assert at[("start", 1, it)] > at[("end", 0, it)]
        assert at[("start", 2, it)] > max(at[("end", 0, it)], at[("end", 1, it)])


def test_a_failing_predecessor_releases_its_waiters_and_is_reported():
    lanes = [
        Lane(name="a", blocks=[(0, _Fake(fail=True))]),
        Lane(name="b", blocks=[(1, _Fake())], after={1: (0,)}),
    ]
    with pytest.raises(RunError, match="broken block") as info:
        _cpu().run_window(lanes, 3, _Log(), sync="barrier-only", block_names=["a0", "b1"])
    assert info.value.block == "a0"


def test_a_stuck_predecessor_is_the_block_reported_not_its_waiter():
    lanes = [
        Lane(name="a", blocks=[(0, _Fake(3.0))]),
        Lane(name="b", blocks=[(1, _Fake())], after={1: (0,)}),
    ]
    with pytest.raises(RunError, match="did not return within timeout_s") as info:
        _cpu(timeout_s=0.5).run_window(
            lanes, 1, _Log(), sync="barrier-only", block_names=["a0", "b1"]
        )
    assert info.value.block == "a0"


def test_issue_order_puts_every_block_after_what_it_waits_for_the_same_on_every_rank():
    # Lane x: a, b (after d); lane l: c (after a), d. Lane by lane as far as each can go.
    suite = load_suite_text(
        HEAD
        + _pattern(
            A,
            "{name: b, op: sleep, axis: x, duration_us: 10, after: d}",
            "{name: c, op: sleep, lane: l, duration_us: 10, after: a}",
            "{name: d, op: sleep, lane: l, duration_us: 10}",
        ),
        file="ok.yaml",
    )
    order = issue_order(suite.patterns[0].blocks)
    assert order == (0, 2, 3, 1)
    lanes = [
        Lane(name="x", blocks=[(0, "a"), (1, "b")], after={1: (3,)}),
        Lane(name="l", blocks=[(2, "c"), (3, "d")], after={2: (0,)}),
    ]
    runs = [(li, [i for i, _ in run]) for li, run in issue_runs(lanes, order)]
    assert runs == [(0, [0]), (1, [2, 3]), (0, [1])]
    # A rank without a (another axis) keeps the order of what it runs: c, d, then b.
    lanes = [Lane(name="x", blocks=[(1, "b")]), Lane(name="l", blocks=[(2, "c"), (3, "d")])]
    assert [li for li, _ in issue_runs(lanes, order)] == [1, 0]
    # Without an order: lane by lane, as before dependencies existed.
    assert [(li, len(run)) for li, run in issue_runs(lanes, ())] == [(0, 1), (1, 2)]


# ---- busy ----
def test_busy_is_registered_validated_and_sized():
    assert registered_ops()["busy"] is Busy
    assert Busy.category == "compute"
    assert Busy.check_params({"duration_us": 0.0}, dtype="fp32", team_size=1)
    # One kernel moves at most BUSY_KERNEL_US x BUSY_PEAK_GBPS bytes: 50 µs at 5 TB/s.
    assert Busy.buffer_bytes({"duration_us": 1e5}, dtype="fp32", team_size=1) == 3 * 20833334 * 4
    assert Busy.buffer_bytes({"duration_us": 10.0}, dtype="bf16", team_size=1) == 3 * 8333334 * 2
    issues = _issues(_pattern("{name: b, op: busy, duration_us: 0}"))
    assert issues == [
        ("patterns[0].blocks[0].duration_us", "busy needs a positive duration_us, got 0")
    ]


def test_busy_on_cpu_works_at_least_its_duration():
    import torch

    from userbenchmark.maestro.blocks.base import BlockContext

    suite = load_suite_text(HEAD + _pattern("{name: b, op: busy, duration_us: 2000}"), file="ok")
    ctx = BlockContext(rank=0, device=torch.device("cpu"), dtype=torch.float32, team=(0,))
    block = Busy(suite.patterns[0].blocks[0], ctx)
    block.setup()
    assert block.a.numel() == BUSY_CPU_ELEMS and block.setup_notes() == ()
    t0 = time.perf_counter()
    block.launch()
    assert time.perf_counter() - t0 >= 2000e-6  # a deadline loop: never shorter
