"""Unit tests for per-rank overlap metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from userbenchmark.maestro.core.analysis.overlap import (
    comm_hidden_under_compute_ns,
    makespan_ns,
    overlap_efficiency,
    pairwise_overlap_mean,
    shared_busbw_gbps,
    slowdown,
    union_intersection_ns,
    union_length_ns,
)


def arr(rows):
    """(num_blocks, num_iters) int64 array from nested lists."""
    return np.array(rows, dtype=np.int64)


# --- simple reference implementations (per-element Python loops) ----------------------------


def ref_union(intervals):
    """Union length of a list of (start, end) pairs by merging."""
    total = 0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def ref_union_intersection(a, b):
    """|U(a) ∩ U(b)| by brute force over elementary segments."""
    points = sorted({p for iv in a + b for p in iv})
    total = 0
    for lo, hi in zip(points, points[1:], strict=False):
        mid = (lo + hi) / 2
        in_a = any(s <= mid <= e for s, e in a)
        in_b = any(s <= mid <= e for s, e in b)
        if in_a and in_b:
            total += hi - lo
    return total


def random_intervals(rng, num_blocks, num_iters, span=1000):
    starts = rng.integers(0, span, size=(num_blocks, num_iters))
    lengths = rng.integers(0, span // 3, size=(num_blocks, num_iters))
    # some zero-length intervals on purpose
    lengths[rng.random(lengths.shape) < 0.05] = 0
    return starts.astype(np.int64), (starts + lengths).astype(np.int64)


# --- the intersection of two intervals, as pairwise_overlap_mean reads it -----------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((0, 10), (5, 15), 5),  # partial
        ((0, 10), (10, 20), 0),  # touching
        ((0, 10), (20, 30), 0),  # disjoint
        ((0, 100), (20, 30), 10),  # nested
        ((20, 30), (0, 100), 10),  # nested, swapped
        ((3, 9), (3, 9), 6),  # identical
        ((5, 5), (0, 10), 0),  # zero length inside
    ],
)
def test_intersection_cases(a, b, expected):
    """|A∩B| / min(|A|, |B|) of one iteration; 0 when either has zero length."""
    shorter = min(a[1] - a[0], b[1] - b[0])
    fraction = pairwise_overlap_mean(arr([[a[0]], [b[0]]]), arr([[a[1]], [b[1]]]))
    assert fraction[0, 1] == fraction[1, 0] == (expected / shorter if shorter else 0.0)


# --- union_length_ns ----------------------------------------------------------------------------


def test_union_single_block():
    np.testing.assert_array_equal(union_length_ns(arr([[0, 5]]), arr([[10, 7]])), [10, 2])


def test_union_three_blocks_with_gap():
    # [0,10] ∪ [5,12] ∪ [20,25] = 12 + 5, gap 12..20 excluded
    starts = arr([[0], [5], [20]])
    ends = arr([[10], [12], [25]])
    np.testing.assert_array_equal(union_length_ns(starts, ends), [17])


def test_union_disjoint_nested_identical_zero():
    starts = arr([[0, 0, 3, 5], [20, 2, 3, 5]])
    ends = arr([[10, 50, 9, 5], [30, 8, 9, 5]])
    # disjoint: 20; nested: 50; identical: 6; zero length: 0
    np.testing.assert_array_equal(union_length_ns(starts, ends), [20, 50, 6, 0])


def test_union_order_independent():
    # a later-starting interval listed first, and a long one hidden in the middle
    starts = arr([[40], [0], [5]])
    ends = arr([[45], [50], [6]])
    np.testing.assert_array_equal(union_length_ns(starts, ends), [50])


def test_union_large_timestamps_no_overflow():
    base = 1_700_000_000_000_000_000  # CLOCK_REALTIME ns
    starts = arr([[base], [base + 5]])
    ends = arr([[base + 10], [base + 30]])
    np.testing.assert_array_equal(union_length_ns(starts, ends), [30])
    np.testing.assert_array_equal(makespan_ns(starts, ends), [30])


def test_union_matches_reference_on_random_data():
    rng = np.random.default_rng(1234)
    starts, ends = random_intervals(rng, num_blocks=5, num_iters=2000)
    s0, e0 = starts.copy(), ends.copy()
    got = union_length_ns(starts, ends)
    expected = [
        ref_union(list(zip(starts[:, i].tolist(), ends[:, i].tolist(), strict=True)))
        for i in range(starts.shape[1])
    ]
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(starts, s0)
    np.testing.assert_array_equal(ends, e0)


def test_union_many_iterations_fast_path_shape():
    rng = np.random.default_rng(7)
    starts, ends = random_intervals(rng, num_blocks=4, num_iters=100_000)
    got = union_length_ns(starts, ends)
    assert got.shape == (100_000,)
    # spot-check a sample against the reference
    for i in rng.choice(100_000, size=200, replace=False):
        ivs = list(zip(starts[:, i].tolist(), ends[:, i].tolist(), strict=True))
        assert got[i] == ref_union(ivs)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 100), st.integers(0, 50)),
        min_size=1,
        max_size=6,
    )
)
def test_union_property(pairs):
    starts = arr([[s] for s, _ in pairs])
    ends = arr([[s + d] for s, d in pairs])
    expected = ref_union([(s, s + d) for s, d in pairs])
    assert int(union_length_ns(starts, ends)[0]) == expected


def test_interval_validation():
    with pytest.raises(ValueError, match="ends before"):
        union_length_ns(arr([[10]]), arr([[5]]))
    with pytest.raises(ValueError, match="shape"):
        union_length_ns(arr([[0, 1]]), arr([[1]]))
    with pytest.raises(ValueError, match="shape"):
        union_length_ns(arr([0, 1]), arr([1, 2]))
    with pytest.raises(ValueError, match="present"):
        makespan_ns(arr([[0]]), arr([[1]]), present=np.array([1]))
    with pytest.raises(ValueError, match="finite"):
        union_length_ns(np.array([[0.0]]), np.array([[np.nan]]))


# --- union_intersection_ns ----------------------------------------------------------------------


def test_union_intersection_hand_computed():
    # A = [0,10] ∪ [20,30]; B = [5,25]  -> overlap [5,10] + [20,25] = 10
    a_s, a_e = arr([[0], [20]]), arr([[10], [30]])
    b_s, b_e = arr([[5]]), arr([[25]])
    np.testing.assert_array_equal(union_intersection_ns(a_s, a_e, b_s, b_e), [10])


def test_union_intersection_disjoint_nested_identical():
    # iter 0: A=[0,10], B=[10,15] ∪ [30,35] -> 0 (disjoint, touching at 10)
    # iter 1: A=[0,100], B=[20,60] ∪ [40,45] -> 40 (B nested in A and overlapping itself)
    a_s, a_e = arr([[0, 0]]), arr([[10, 100]])
    b_s, b_e = arr([[10, 20], [30, 40]]), arr([[15, 60], [35, 45]])
    np.testing.assert_array_equal(union_intersection_ns(a_s, a_e, b_s, b_e), [0, 40])
    same = union_intersection_ns(arr([[4]]), arr([[8]]), arr([[4]]), arr([[8]]))
    np.testing.assert_array_equal(same, [4])


def test_union_intersection_random_against_reference():
    rng = np.random.default_rng(99)
    a_s, a_e = random_intervals(rng, 3, 500)
    b_s, b_e = random_intervals(rng, 2, 500)
    got = union_intersection_ns(a_s, a_e, b_s, b_e)
    for i in range(500):
        a = list(zip(a_s[:, i].tolist(), a_e[:, i].tolist(), strict=True))
        b = list(zip(b_s[:, i].tolist(), b_e[:, i].tolist(), strict=True))
        assert got[i] == ref_union_intersection(a, b), i


def test_union_intersection_iteration_mismatch():
    with pytest.raises(ValueError, match="num_iters"):
        union_intersection_ns(arr([[0, 0]]), arr([[1, 1]]), arr([[0]]), arr([[1]]))


# --- pairwise overlap --------------------------------------------------------------------------


def pairwise_overlap_fraction(starts, ends, present=None):
    """Per-iteration fractions, from pairwise_overlap_mean of each iteration alone."""
    s, e = np.asarray(starts), np.asarray(ends)
    return np.stack(
        [pairwise_overlap_mean(s[:, [i]], e[:, [i]], present) for i in range(s.shape[1])], axis=-1
    )


def test_pairwise_hand_computed():
    # block 0 [0,10], block 1 [5,25], block 2 [30,40]
    starts = arr([[0], [5], [30]])
    ends = arr([[10], [25], [40]])
    frac = pairwise_overlap_fraction(starts, ends)
    assert frac.shape == (3, 3, 1)
    expected = np.array([[1.0, 0.5, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 1.0]])  # 5 / min(10, 20)
    np.testing.assert_allclose(frac[:, :, 0], expected)


def test_pairwise_nested_identical_and_zero_length():
    starts = arr([[0, 3, 0], [2, 3, 5]])
    ends = arr([[100, 9, 10], [4, 9, 5]])
    frac = pairwise_overlap_fraction(starts, ends)
    assert frac[0, 1, 0] == 1.0  # nested: the short one fully inside
    assert frac[0, 1, 1] == 1.0  # identical
    assert frac[0, 1, 2] == 0.0  # zero-length partner: defined as 0
    assert frac[1, 1, 2] == 1.0  # diagonal is 1 even for a zero-length block
    np.testing.assert_array_equal(frac, frac.transpose(1, 0, 2))  # symmetric


def test_pairwise_single_block():
    frac = pairwise_overlap_fraction(arr([[0, 5]]), arr([[10, 6]]))
    np.testing.assert_array_equal(frac, np.ones((1, 1, 2)))


def test_pairwise_absent_block_is_nan():
    starts = arr([[0], [-1], [5]])
    ends = arr([[10], [-1], [15]])
    frac = pairwise_overlap_fraction(starts, ends, present=np.array([True, False, True]))
    assert np.isnan(frac[1]).all()
    assert np.isnan(frac[:, 1]).all()
    assert frac[0, 2, 0] == 0.5


def test_pairwise_random_against_reference():
    rng = np.random.default_rng(5)
    starts, ends = random_intervals(rng, 4, 300)
    s0 = starts.copy()
    frac = pairwise_overlap_fraction(starts, ends)
    np.testing.assert_array_equal(starts, s0)
    for it in range(300):
        for i in range(4):
            for j in range(4):
                inter = max(0, min(ends[i, it], ends[j, it]) - max(starts[i, it], starts[j, it]))
                shorter = min(ends[i, it] - starts[i, it], ends[j, it] - starts[j, it])
                if i == j:
                    expected = 1.0
                elif shorter == 0:
                    expected = 0.0
                else:
                    expected = inter / shorter
                assert frac[i, j, it] == pytest.approx(expected)
    assert ((frac >= 0) & (frac <= 1)).all()


def test_pairwise_mean_is_the_mean_of_the_fractions_row_by_row():
    rng = np.random.default_rng(11)
    starts, ends = random_intervals(rng, 6, 250)
    present = np.array([True, True, False, True, True, True])
    full = pairwise_overlap_fraction(starts, ends, present)
    mean = pairwise_overlap_mean(starts, ends, present)
    assert mean.shape == (6, 6)
    assert np.isnan(mean[2]).all() and np.isnan(mean[:, 2]).all()
    keep = np.ix_(present, present)
    np.testing.assert_allclose(mean[keep], full[keep].mean(axis=2), rtol=0, atol=1e-15)
    assert np.isnan(pairwise_overlap_mean(starts[:, :0], ends[:, :0])).all()  # no iterations


# --- makespan_ns --------------------------------------------------------------------------------


def test_makespan_hand_computed():
    starts = arr([[0, 100], [5, 90], [30, 200]])
    ends = arr([[10, 150], [25, 95], [40, 210]])
    np.testing.assert_array_equal(makespan_ns(starts, ends), [40, 120])


def test_makespan_uses_first_start_and_last_end_of_same_rank():
    # the span is from the earliest start to the latest end, even if those belong to
    # different blocks, and it is not start + longest duration
    starts = arr([[0], [50]])
    ends = arr([[60], [70]])
    assert int(makespan_ns(starts, ends)[0]) == 70


def test_makespan_present_mask_and_empty():
    starts = arr([[0], [-1], [20]])
    ends = arr([[10], [-1], [25]])
    present = np.array([True, False, True])
    np.testing.assert_array_equal(makespan_ns(starts, ends, present), [25])
    np.testing.assert_array_equal(makespan_ns(starts[:1], ends[:1]), [10])
    with pytest.raises(ValueError, match="empty"):
        makespan_ns(starts, ends, np.zeros(3, dtype=bool))


# --- comm hidden under compute (time-weighted, HTA's definition) -------------------------------


def test_comm_hidden_hand_computed():
    # comm: [0,10] ∪ [20,30] (20 ns); compute: [5,25] -> hidden [5,10] + [20,25] = 10 ns
    starts = arr([[0], [20], [5]])
    ends = arr([[10], [30], [25]])
    is_comm = np.array([True, True, False])
    is_compute = np.array([False, False, True])
    assert comm_hidden_under_compute_ns(starts, ends, is_comm, is_compute) == (10.0, 20.0)


def test_comm_hidden_is_time_weighted_not_a_mean_of_ratios():
    # Iteration 0: 10 ns of comm, fully hidden; iteration 1: 90 ns of comm, none hidden.
    # HTA's figure is 10 / 100 = 0.1; the mean of per-iteration ratios would be 0.5.
    starts = arr([[0, 1000], [0, 2000]])
    ends = arr([[10, 1090], [10, 2010]])
    hidden, comm = comm_hidden_under_compute_ns(
        starts, ends, np.array([True, False]), np.array([False, True])
    )
    assert (hidden, comm) == (10.0, 100.0)


def test_comm_hidden_counts_across_iteration_boundaries():
    # The comm of iteration 0 runs under the compute of iteration 1 (sync: none).
    starts = arr([[0, 100], [200, 50]])
    ends = arr([[80, 180], [210, 90]])
    hidden, comm = comm_hidden_under_compute_ns(
        starts, ends, np.array([True, False]), np.array([False, True])
    )
    assert comm == 160.0 and hidden == 30.0  # [50, 80] hides under iteration 1's compute


def test_comm_hidden_absent_and_missing_sets():
    starts = arr([[10], [0]])
    ends = arr([[20], [100]])
    is_comm = np.array([True, False])
    is_compute = np.array([False, True])
    assert comm_hidden_under_compute_ns(starts, ends, is_comm, np.zeros(2, bool)) == (0.0, 10.0)
    assert comm_hidden_under_compute_ns(starts, ends, np.zeros(2, bool), is_compute) == (0.0, 0.0)


def test_comm_hidden_ignores_other_blocks():
    starts = arr([[0], [0], [100]])
    ends = arr([[10], [10], [110]])
    got = comm_hidden_under_compute_ns(
        starts, ends, np.array([True, False, False]), np.array([False, False, True])
    )
    assert got == (0.0, 10.0)


def test_comm_hidden_rejects_block_in_both_sets():
    with pytest.raises(ValueError, match="both"):
        comm_hidden_under_compute_ns(arr([[0]]), arr([[1]]), np.array([True]), np.array([True]))


def test_comm_hidden_random_against_reference():
    rng = np.random.default_rng(11)
    starts, ends = random_intervals(rng, 5, 400)
    is_comm = np.array([True, True, False, False, False])
    is_compute = np.array([False, False, True, True, False])
    hidden, comm = comm_hidden_under_compute_ns(starts, ends, is_comm, is_compute)
    comm_iv = [(starts[b, i], ends[b, i]) for b in (0, 1) for i in range(400)]
    comp_iv = [(starts[b, i], ends[b, i]) for b in (2, 3) for i in range(400)]
    assert comm == pytest.approx(ref_union(comm_iv))
    assert hidden == pytest.approx(ref_union_intersection(comm_iv, comp_iv))


# --- scalar aggregates --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("serial", "makespan", "ideal", "expected"),
    [
        (30.0, 20.0, 20.0, 1.0),  # perfect overlap: makespan == longest block
        (30.0, 30.0, 20.0, 0.0),  # fully serialized
        (30.0, 25.0, 20.0, 0.5),
        (30.0, 40.0, 20.0, -1.0),  # worse than serial
        (30.0, 18.0, 20.0, 1.2),  # faster than ideal (noise)
    ],
)
def test_overlap_efficiency(serial, makespan, ideal, expected):
    assert overlap_efficiency(serial, makespan, ideal) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("serial", "makespan", "ideal"),
    [
        (20.0, 20.0, 20.0),  # single block: serial == ideal
        (20.0, 25.0, 20.0),  # all but one block have zero isolated latency
        (10.0, 5.0, 20.0),  # inconsistent inputs: negative headroom
        (float("nan"), 5.0, 1.0),
        (30.0, float("nan"), 10.0),
        (1010.0, 1005.0, 1000.0),  # headroom 10 of 1010 (< 5 %): noise over almost nothing
    ],
)
def test_overlap_efficiency_nan(serial, makespan, ideal):
    assert math.isnan(overlap_efficiency(serial, makespan, ideal))


def test_overlap_efficiency_from_isolated_latencies_and_arrays():
    isolated = np.array([10.0, 20.0, 5.0])
    serial, ideal = isolated.sum(), isolated.max()
    assert overlap_efficiency(serial, 25.0, ideal) == pytest.approx(10 / 15)
    got = overlap_efficiency(np.array([30.0, 20.0]), np.array([20.0, 20.0]), np.array([20.0, 20.0]))
    assert got[0] == 1.0
    assert math.isnan(got[1])


def test_overlap_efficiency_headroom_threshold_is_inclusive_and_adjustable():
    # serial 100, ideal 95: headroom 5 = exactly 5 % of serial, so it is reported.
    assert overlap_efficiency(100.0, 96.0, 95.0) == pytest.approx(0.8)
    assert math.isnan(overlap_efficiency(100.0, 96.0, 95.1))
    assert overlap_efficiency(100.0, 99.0, 98.0, min_headroom_fraction=0.01) == pytest.approx(0.5)
    # Without a threshold, a 1 µs headroom turns 5 µs of noise into an efficiency of -4.
    assert overlap_efficiency(1001.0, 1005.0, 1000.0, min_headroom_fraction=0.0) == pytest.approx(
        -4.0
    )
    assert math.isnan(overlap_efficiency(1001.0, 1005.0, 1000.0))


def test_slowdown():
    assert slowdown(150.0, 100.0) == 1.5
    assert slowdown(100.0, 100.0) == 1.0
    assert math.isnan(slowdown(100.0, 0.0))
    assert math.isnan(slowdown(100.0, float("nan")))
    assert math.isnan(slowdown(float("nan"), 100.0))
    got = slowdown(np.array([2.0, 3.0]), np.array([1.0, 0.0]))
    assert got[0] == 2.0
    assert math.isnan(got[1])


def test_shared_busbw_uses_makespan_not_longest_block():
    # AG and RS of 4 GB each on a team of 4 -> (4-1)/4 x 4 GB = 3 GB bus bytes each, 6 GB total.
    total = 6e9
    # blocks of 1.0 s and 1.5 s overlapping into a 2.0 s makespan -> 3 GB/s (not 4 GB/s)
    assert shared_busbw_gbps(total, 2.0) == pytest.approx(3.0)
    assert math.isnan(shared_busbw_gbps(total, 0.0))
    assert math.isnan(shared_busbw_gbps(total, -1.0))
    got = shared_busbw_gbps(np.array([1e9, 2e9]), np.array([1.0, 0.5]))
    np.testing.assert_allclose(got, [1.0, 4.0])


def test_functions_do_not_mutate_inputs():
    rng = np.random.default_rng(3)
    starts, ends = random_intervals(rng, 4, 50)
    is_comm = np.array([True, False, True, False])
    is_compute = ~is_comm
    present = np.array([True, True, False, True])
    copies = [x.copy() for x in (starts, ends, is_comm, is_compute, present)]
    union_length_ns(starts, ends)
    union_intersection_ns(starts[:2], ends[:2], starts[2:], ends[2:])
    pairwise_overlap_fraction(starts, ends, present)
    makespan_ns(starts, ends, present)
    comm_hidden_under_compute_ns(starts, ends, is_comm, is_compute)
    for original, after in zip(copies, (starts, ends, is_comm, is_compute, present), strict=True):
        np.testing.assert_array_equal(original, after)
