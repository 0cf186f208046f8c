"""What the GPUs of this machine can do at most, for the sane ranges the GPU tests hold maestro's
figures to: a GEMM's TFLOP/s under the device's dense tensor-core peak, a collective's busbw
under twice a GPU-to-GPU copy measured here (NCCL's kernels may beat the copy engines, never
by 2x), so that a unit slip (x8 bits, x1000, a wrong bus factor) fails a test."""

from __future__ import annotations

import functools
import math

import pytest

torch = pytest.importorskip("torch")

PEAK_DENSE_TFLOPS = {"H100": 989.4, "H200": 989.4, "H800": 989.4, "H20": 148.0, "A100": 312.0,
                     "A800": 312.0, "B200": 2250.0, "B100": 1750.0, "L40S": 362.0}  # fmt: skip
"""Dense bf16/fp16 tensor-core peak of each data-center GPU (vendor data sheets, SXM parts):
no GEMM of any dtype runs faster."""
LINK_MARGIN = 2.0
COPY_BYTES = 256 << 20


@functools.cache
def peak_tflops() -> float:
    """The device's dense bf16 peak, inf for a device not in :data:`PEAK_DENSE_TFLOPS`."""
    name = torch.cuda.get_device_name(0)
    return next((v for k, v in PEAK_DENSE_TFLOPS.items() if k in name), math.inf)


@functools.cache
def peer_copy_gbps() -> float:
    """GB/s of the fastest of 5 copies of 256 MiB from GPU 0 to GPU 1 (CUDA events); inf with
    fewer than 2 GPUs (no bound)."""
    if torch.cuda.device_count() < 2:
        return math.inf
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda:1")
    dst.copy_(src)  # warm: peer access enabled, pages mapped
    best_ms = math.inf
    for _ in range(5):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        best_ms = min(best_ms, start.elapsed_time(end))
    torch.cuda.synchronize("cuda:1")
    return COPY_BYTES / (best_ms * 1e-3) / 1e9


def assert_sane_speed(rec: dict) -> None:
    """A timed record's TFLOP/s under the device's peak and its busbw under the link bound."""
    if rec.get("tflops") is not None:
        assert 0 < rec["tflops"] <= peak_tflops(), (rec["tflops"], peak_tflops(), rec)
    if rec.get("busbw_gbps") is not None:
        bound = LINK_MARGIN * peer_copy_gbps()
        assert 0 < rec["busbw_gbps"] <= bound, (rec["busbw_gbps"], bound, rec)
