"""Host memory a CPU run may use (MemAvailable and the memory cgroup's room, from fake files),
and the check that refuses a pattern before it allocates."""

from __future__ import annotations

from pathlib import Path

import pytest

from userbenchmark.maestro.core.measure.prepare import (
    HostMemory,
    available_host_memory,
    check_host_memory,
)
from userbenchmark.maestro.errors import RunError

GIB = 2**30


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path: Path, *, available_kib: int | None, cgroup: str) -> Path:
    proc = tmp_path / "proc"
    meminfo = "MemTotal:       67108864 kB\n"
    if available_kib is not None:
        meminfo += f"MemAvailable:   {available_kib} kB\n"
    _write(proc / "meminfo", meminfo)
    _write(proc / "self" / "cgroup", cgroup)
    return proc


def test_cgroup_v2_room_is_limit_less_usage_when_smaller(tmp_path):
    proc = _proc(tmp_path, available_kib=20 * 1024 * 1024, cgroup="0::/job/step\n")
    root = tmp_path / "cgroup"
    _write(root / "cgroup.controllers", "memory\n")
    _write(root / "job" / "step" / "memory.max", "max\n")  # no limit here
    _write(root / "job" / "step" / "memory.current", str(1 * GIB))
    _write(root / "job" / "memory.max", str(6 * GIB))  # an ancestor's limit applies too
    _write(root / "job" / "memory.current", str(2 * GIB))
    memory = available_host_memory(proc=proc, cgroup_root=root)
    assert memory == HostMemory(
        4 * GIB, f"the cgroup's memory.max less memory.current ({root / 'job'})"
    )


def test_meminfo_when_it_is_smaller_than_the_cgroup_room(tmp_path):
    proc = _proc(tmp_path, available_kib=3 * 1024 * 1024, cgroup="0::/job\n")
    root = tmp_path / "cgroup"
    _write(root / "job" / "memory.max", str(6 * GIB))
    _write(root / "job" / "memory.current", str(1 * GIB))
    memory = available_host_memory(proc=proc, cgroup_root=root)
    assert memory == HostMemory(3 * GIB, f"MemAvailable in {proc / 'meminfo'}")


def test_cgroup_v1_memory_controller_and_its_unlimited_value(tmp_path):
    proc = _proc(tmp_path, available_kib=None, cgroup="4:memory:/batch/42\n1:cpu:/\n")
    root = tmp_path / "cgroup"
    _write(root / "memory" / "batch" / "42" / "memory.limit_in_bytes", str(2**63 - 4096))
    _write(root / "memory" / "batch" / "42" / "memory.usage_in_bytes", str(GIB))
    assert available_host_memory(proc=proc, cgroup_root=root) is None  # nothing limits
    _write(root / "memory" / "batch" / "memory.limit_in_bytes", str(8 * GIB))
    _write(root / "memory" / "batch" / "memory.usage_in_bytes", str(3 * GIB))
    memory = available_host_memory(proc=proc, cgroup_root=root)
    assert memory is not None and memory.available_bytes == 5 * GIB
    assert "memory.limit_in_bytes less memory.usage_in_bytes" in memory.source


def test_a_cgroup_namespace_reads_the_hierarchy_root(tmp_path):
    proc = _proc(tmp_path, available_kib=None, cgroup="0::/seen/from/the/host\n")
    root = tmp_path / "cgroup"
    _write(root / "memory.max", str(4 * GIB))
    _write(root / "memory.current", str(GIB))
    assert available_host_memory(proc=proc, cgroup_root=root).available_bytes == 3 * GIB


def test_nothing_readable_is_no_reading(tmp_path):
    assert available_host_memory(proc=tmp_path / "none", cgroup_root=tmp_path / "none") is None


def test_the_check_names_the_blocks_the_need_and_what_is_available():
    memory = HostMemory(6 * GIB, "the cgroup's memory.max less memory.current (/sys/fs/cgroup)")
    with pytest.raises(RunError) as info:
        check_host_memory([("ar1", 2 * GIB), ("ar2", 2 * GIB)], local_ranks=2, memory=memory)
    message = str(info.value)
    assert message.startswith(
        "blocks ar1 (2.00 GiB), ar2 (2.00 GiB) need 4.00 GiB of host memory per rank, "
    )
    assert "8.00 GiB for the 2 ranks on this host, and only 6.00 GiB is available" in message
    assert "(the cgroup's memory.max less memory.current (/sys/fs/cgroup))" in message


def test_the_check_passes_what_fits_and_without_a_reading():
    memory = HostMemory(8 * GIB, "MemAvailable in /proc/meminfo")
    check_host_memory([("ar", 4 * GIB)], local_ranks=2, memory=memory)
    check_host_memory([("ar", 400 * GIB)], local_ranks=2, memory=None)


def test_a_refusal_names_the_few_blocks_that_need_the_memory():
    """90 blocks, three of them large: the message names those three, not all 90."""
    blocks = [(f"busy_{i}", 4096) for i in range(87)]
    blocks += [("gemm_a", 3 * GIB), ("gemm_b", 2 * GIB), ("ag", 1 * GIB)]
    with pytest.raises(RunError) as info:
        check_host_memory(blocks, local_ranks=4, memory=HostMemory(GIB, "MemAvailable"))
    message = str(info.value)
    assert message.startswith(
        "blocks gemm_a (3.00 GiB), gemm_b (2.00 GiB), ag (1.00 GiB) and 87 more need"
    )
    assert "busy_0" not in message


def test_busy_blocks_count_what_they_allocate_on_cpu():
    """A busy block's CUDA buffers follow its duration (a 50 µs one moves 250 MB); on CPU each
    operand holds at most BUSY_CPU_ELEMS elements, and the host check counts that."""
    from userbenchmark.maestro.blocks.compute import BUSY_CPU_ELEMS, Busy

    params = {"duration_us": 50.0}
    assert Busy.buffer_bytes(params, dtype="bf16", team_size=1) > 200e6
    assert Busy.host_buffer_bytes(params, dtype="bf16", team_size=1) == 3 * BUSY_CPU_ELEMS * 2
