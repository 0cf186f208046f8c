"""Unit tests for bandwidth factors, algbw/busbw and FLOP rates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from userbenchmark.maestro.core.analysis.bandwidth import (
    COMM_OPS,
    algbw_gbps,
    bus_bytes,
    bus_factor,
    busbw_gbps,
    gemm_flops,
    tflops,
)


def test_comm_ops_is_the_documented_set():
    assert isinstance(COMM_OPS, frozenset)
    expected = {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "broadcast",
        "reduce",
        "send_recv",
    }
    assert expected == COMM_OPS


@pytest.mark.parametrize(
    ("op", "n", "expected"),
    [
        ("all_reduce", 8, 2 * 7 / 8),
        ("all_reduce", 2, 1.0),
        ("all_reduce", 1, 0.0),  # as nccl-tests reports for one rank
        ("all_gather", 8, 7 / 8),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 4, 0.75),
        ("all_to_all", 16, 15 / 16),
        ("all_to_all", 1, 0.0),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("send_recv", 2, 1.0),
        ("broadcast", 1, 1.0),
    ],
)
def test_bus_factor(op, n, expected):
    assert bus_factor(op, n) == pytest.approx(expected, abs=0, rel=1e-15)


def test_bus_factor_accepts_numpy_int():
    assert bus_factor("all_reduce", np.int64(4)) == 1.5


@pytest.mark.parametrize("n", [0, -1])
def test_bus_factor_rejects_small_team(n):
    with pytest.raises(ValueError, match="team_size"):
        bus_factor("all_reduce", n)


@pytest.mark.parametrize("n", [4.0, True])
def test_bus_factor_rejects_non_int_team(n):
    with pytest.raises(TypeError):
        bus_factor("all_reduce", n)


def test_bus_factor_unknown_op_lists_valid_ops():
    with pytest.raises(ValueError, match="allreduce") as info:
        bus_factor("allreduce", 4)
    for op in COMM_OPS:
        assert op in str(info.value)


def test_algbw_scalar():
    result = algbw_gbps(4 * 2**20, 1e-3)
    assert isinstance(result, float)
    assert result == pytest.approx(4 * 2**20 / 1e-3 / 1e9)  # GB is 1e9, not 2**30
    assert algbw_gbps(2e9, 2.0) == 1.0


def test_algbw_zero_negative_nan_time_is_nan_not_inf():
    times = np.array([1.0, 0.0, -1.0, np.nan])
    result = algbw_gbps(1e9, times)
    assert isinstance(result, np.ndarray)
    assert result[0] == 1.0
    assert np.all(np.isnan(result[1:]))
    assert not np.any(np.isinf(result))
    assert math.isnan(algbw_gbps(1e9, 0.0))


def test_algbw_vectorised_matches_scalar_and_does_not_mutate():
    sizes = np.array([1024, 2**20, 2**30], dtype=np.int64)
    times = np.array([1e-6, 1e-4, 1e-2])
    sizes0, times0 = sizes.copy(), times.copy()
    result = algbw_gbps(sizes, times)
    expected = [algbw_gbps(int(s), float(t)) for s, t in zip(sizes, times, strict=True)]
    np.testing.assert_allclose(result, expected, rtol=1e-15)
    np.testing.assert_array_equal(sizes, sizes0)
    np.testing.assert_array_equal(times, times0)


def test_busbw_all_reduce_hand_computed():
    # 1 GB in 0.5 s is 2 GB/s algbw; 8 ranks: factor 14/8 -> 3.5 GB/s
    assert busbw_gbps("all_reduce", 1e9, 8, 0.5) == pytest.approx(3.5)


def test_busbw_all_gather_and_broadcast():
    assert busbw_gbps("all_gather", 4e9, 4, 1.0) == pytest.approx(3.0)
    assert busbw_gbps("broadcast", 4e9, 4, 1.0) == pytest.approx(4.0)


def test_busbw_single_rank_is_zero_and_zero_time_is_nan():
    assert busbw_gbps("all_reduce", 1e9, 1, 1.0) == 0.0
    assert math.isnan(busbw_gbps("all_reduce", 1e9, 1, 0.0))
    assert math.isnan(busbw_gbps("all_reduce", 1e9, 8, 0.0))


def test_busbw_array():
    result = busbw_gbps("reduce_scatter", [1e9, 2e9], 2, [1.0, 0.0])
    assert result[0] == pytest.approx(0.5)
    assert math.isnan(result[1])


def test_busbw_unknown_op():
    with pytest.raises(ValueError, match="valid"):
        busbw_gbps("gemm", 1e9, 8, 1.0)


def test_bus_bytes():
    assert bus_bytes("all_reduce", 1000, 4) == 1500.0
    np.testing.assert_array_equal(bus_bytes("all_gather", [400, 800], 4), [300.0, 600.0])


def test_gemm_flops_exact_python_int():
    assert gemm_flops(8192, 8192, 8192) == 2 * 8192**3
    big = gemm_flops(2**40, 2**40, 2**40)  # far past int64
    assert isinstance(big, int)
    assert big == 2**121
    result = gemm_flops(np.int32(2**20), np.int32(2**20), np.int32(2**20))  # int32 overflow trap
    assert result == 2**61
    assert type(result) is int


def test_gemm_flops_is_not_divided_by_dtype_size():
    # The seed's bug divided dimensions by the element size; 4096^3 must give 2*4096^3.
    assert gemm_flops(4096, 4096, 4096) == 137_438_953_472


def test_gemm_flops_rejects_bad_dims():
    with pytest.raises(ValueError, match="k"):
        gemm_flops(1, 1, -1)
    with pytest.raises(TypeError):
        gemm_flops(1.5, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        gemm_flops(True, 1, 1)


def test_tflops():
    assert tflops(2 * 8192**3, 1e-3) == pytest.approx(2 * 8192**3 / 1e-3 / 1e12)
    assert tflops(1e12, 1.0) == 1.0
    assert tflops(2**121, 1.0) == pytest.approx(2**121 / 1e12)  # Python int past int64
    assert math.isnan(tflops(1e12, 0.0))
    assert math.isnan(tflops(1e12, -2.0))
    arr = tflops(np.array([1e12, 2e12]), np.array([1.0, 0.0]))
    assert arr[0] == 1.0
    assert math.isnan(arr[1])


@given(
    size=st.integers(min_value=1, max_value=2**40),
    seconds=st.floats(min_value=1e-9, max_value=1e3),
    n=st.integers(min_value=1, max_value=4096),
    op=st.sampled_from(sorted(COMM_OPS)),
)
def test_busbw_is_algbw_times_factor(size, seconds, n, op):
    assert busbw_gbps(op, size, n, seconds) == pytest.approx(
        algbw_gbps(size, seconds) * bus_factor(op, n), rel=1e-12
    )
    assert 0.0 <= bus_factor(op, n) < 2.0
