"""The hand-written NCCL loop's numbers and buffer shapes (pure functions, no GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.nccl_event_loop import buffer_numels, loop_numbers, parse_ops, parse_sizes

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "nccl_event_loop.py"


def test_time_is_the_slowest_rank_per_op_and_busbw_uses_nccl_tests_factors():
    # 2 ranks took 10 ms and 12 ms for 20 all_reduces of 64 MiB: t = 12 ms / 20 = 600 us.
    row = loop_numbers("all_reduce", 64 << 20, 2, [10.0, 12.0], 20)
    assert row["time_us"] == pytest.approx(600.0)
    assert row["algbw_gbps"] == pytest.approx((64 << 20) / 600e-6 / 1e9)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (2 - 1) / 2)
    assert row["rank_time_us"] == pytest.approx([500.0, 600.0])


@pytest.mark.parametrize(
    ("op", "factor"),
    [
        ("all_reduce", 2 * 7 / 8),
        ("all_gather", 7 / 8),
        ("reduce_scatter", 7 / 8),
        ("all_to_all", 7 / 8),
        ("send_recv", 1.0),
    ],
)
def test_bus_factor_per_op_at_8_ranks(op, factor):
    row = loop_numbers(op, 1 << 30, 8, [1.0] * 8, 1)
    assert row["busbw_gbps"] / row["algbw_gbps"] == pytest.approx(factor)


def test_loop_numbers_rejects_empty_input():
    with pytest.raises(ValueError):
        loop_numbers("all_reduce", 1024, 2, [], 10)
    with pytest.raises(ValueError):
        loop_numbers("all_reduce", 1024, 2, [1.0, 1.0], 0)


def test_buffer_sizes_follow_nccl_tests_size_definitions():
    mib = 1 << 20  # bytes; bf16 elements are 2 bytes
    assert buffer_numels("all_reduce", 4 * mib, 4, 2) == (2 * mib, 2 * mib)
    assert buffer_numels("all_gather", 4 * mib, 4, 2) == (mib // 2, 2 * mib)  # S is the output
    assert buffer_numels("reduce_scatter", 4 * mib, 4, 2) == (2 * mib, mib // 2)  # S the input
    assert buffer_numels("all_to_all", 4 * mib, 4, 2) == (2 * mib, 2 * mib)  # S sent per rank
    assert buffer_numels("send_recv", 4 * mib, 2, 2) == (2 * mib, 2 * mib)


def test_buffer_sizes_reject_what_does_not_split():
    with pytest.raises(ValueError, match="does not split"):
        buffer_numels("all_gather", 6, 4, 2)  # 6 bytes over 4 ranks of bf16
    with pytest.raises(ValueError, match="does not split"):
        buffer_numels("all_reduce", 3, 2, 2)
    with pytest.raises(ValueError, match="at least 2"):
        buffer_numels("send_recv", 1024, 1, 2)
    with pytest.raises(ValueError, match="unknown op"):
        buffer_numels("allreduce", 1024, 2, 2)


def test_parsers():
    assert parse_sizes("1M, 64M,1G") == [1 << 20, 64 << 20, 1 << 30]
    assert parse_ops("all_reduce,send_recv") == ["all_reduce", "send_recv"]
    with pytest.raises(ValueError):
        parse_ops("all_reduce,bogus")
    with pytest.raises(ValueError):
        parse_sizes("-4M")


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,  # a hang, not speed: --help and argument errors take seconds
        stdin=subprocess.DEVNULL,
    )


def test_help_works_as_a_file():
    proc = _script("--help")
    assert proc.returncode == 0, proc.stderr
    assert "--sizes" in proc.stdout and "all_to_all" in proc.stdout


def test_without_cuda_exits_with_a_message():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = _script("--ops", "all_reduce", "--sizes", "1M")
    assert proc.returncode == 1
    assert "needs NVIDIA GPUs with CUDA" in proc.stderr and "Traceback" not in proc.stderr
