"""Traces of other stacks, made by our own code in the structure of the real files of
tests/data/corpus (which the repository cannot hold): each builder names the corpus file it
mimics, and tests/unit/test_replay_stacks.py checks the likeness where that file is at hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .replay_traces import TraceBuilder

CUTLASS = (
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>"
    "(cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4::Params)"
)
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"
ROCBLAS = "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_WG64_4_1"
RCCL = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"


def write(doc: dict[str, Any], folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def torch18_rank1() -> dict[str, Any]:
    """torch 1.8's trace (torch18_old_categories_rank1): ``Kernel`` and ``Runtime`` events with
    a lower-case ``external id``, no CPU op, no ProfilerStep, a ``Trace`` span, and a
    distributedInfo with a rank but no world size; two of its four kernels are cuBLAS's and
    CUTLASS's GEMMs."""
    b = TraceBuilder(rank=1, world_size=2)
    kernels = [FILL, "void gemmk1_kernel<float, 256, 5, false>(cublasGemmk1Params<float>)"]
    kernels += [CUTLASS.replace("80_tensorop_s1688", "70_wmma_tensorop_f16_s161616"), FILL]
    for i, kernel in enumerate(kernels):
        b.launch(stream=7, launch=10 + 30 * i, start=20 + 30 * i, dur=15, op=None, kernel=kernel)
    events = [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
               "tid": "PyTorch Profiler", "ts": b.base_ts, "dur": 200, "args": {"Op count": 0}}]  # fmt: skip
    for ev in b.events:
        args = {k.lower(): v for k, v in ev["args"].items()}  # External id -> external id
        events.append(ev | {"cat": {"kernel": "Kernel"}.get(ev["cat"], "Runtime"), "args": args})
    return {"distributedInfo": {"rank": 1}, "traceEvents": events}


def rocm_rank(
    rank: int, *, world: int = 2, late_s: float = 0.0, base_late_s: float | None = None
) -> dict[str, Any]:
    """An MI250 step as ROCm 6's Kineto writes it (mi250_rocm6_2_toy_train, a process without
    distributedInfo: ``world`` 1): hip* runtime calls (a rocBLAS GEMM by
    hipExtModuleLaunchKernel), an RCCL all_reduce where ``world`` > 1, fractional-µs timestamps
    of the process's own clock that ``baseTimeNanoseconds`` places in time. This rank's
    timestamps start ``late_s`` later; its base is as much earlier unless ``base_late_s``
    says otherwise."""
    b = TraceBuilder(rank=rank, world_size=world, sync_events=False, distributed=world > 1)
    b.base_ts = 4203669603187.439
    b.base_ts += late_s * 1e6
    b.step(1, 0, 1500.125)
    b.gemm(stream=0, launch=10.5, start=20.25, dur=300.5, m=128, n=128, k=5, dtype="float",
           op="aten::addmm", kernel=ROCBLAS, call="hipExtModuleLaunchKernel")  # fmt: skip
    b.launch(stream=0, launch=20.75, start=321.5, dur=6.88, op="aten::relu", kernel=FILL)
    if world > 1:
        b.collective(stream=1, launch=30.5, start=330.25, dur=400.75, in_nelems=1 << 20,
                     dtype="Float", kernel=RCCL)  # fmt: skip
    doc = b.document()
    for ev in doc["traceEvents"]:
        if ev.get("cat") == "cuda_runtime":
            ev["name"] = ev["name"].replace("cudaLaunchKernel", "hipLaunchKernel")
            ev["args"] |= {"cid": ev["args"].pop("cbid"), "stream": "0x0"}
        elif ev.get("cat") == "kernel":
            ev["args"]["kind"] = "Dispatch Kernel"
    doc["deviceProperties"] = [{"id": 0, "name": "AMD Radeon Graphics", "warpSize": 64}]
    late = late_s if base_late_s is None else base_late_s
    doc["baseTimeNanoseconds"] = 1735632360000000000 - int(late * 1e9)
    return doc


def old_comms_rank(rank: int, *, shapes: bool = False) -> dict[str, Any]:
    """A 2-rank step of torch 1.13-2.0 (v100_rank1_of_2_old_comms; with ``shapes``, as in
    a100_rank0_of_16_all_to_all and rank0_of_128_no_shapes): an all_reduce and an all_gather,
    each a c10d op around a record_param_comms that names neither the collective nor its sizes
    or group, and a distributedInfo without pg_config. With ``shapes``, record_shapes' dims on
    the c10d ops: the all_gather's output and input, none for the all_reduce's TensorList."""
    b = TraceBuilder(rank=rank, world_size=2, sync_events=False, record_shapes=shapes)
    b.step(6, 0, 3000)
    b.gemm(stream=7, launch=10, start=20, dur=400, m=1024, n=1024, k=1024, dtype="float",
           kernel="volta_sgemm_128x64_nn")  # fmt: skip
    reduce_shapes = ([[], [], [], []], ["TensorList", "", "", "Scalar"]) if shapes else (None,) * 2
    b.old_collective(stream=14, launch=30, start=430, dur=300, op="allreduce_",
                     dims=reduce_shapes[0], types=reduce_shapes[1])  # fmt: skip
    gather_shapes = (
        ([[2048, 64], [1024, 64], []], ["float", "float", ""]) if shapes else (None,) * 2
    )
    b.old_collective(stream=14, launch=100, start=800, dur=200, op="_allgather_base_",
                     dims=gather_shapes[0], types=gather_shapes[1],
                     kernel="ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)")  # fmt: skip
    doc = b.document()
    doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    for key in ("record_shapes", "baseTimeNanoseconds"):  # torch of then wrote neither
        del doc[key]
    return doc


def no_shapes_rank() -> dict[str, Any]:
    """Rank 3 of 8, profiled without record_shapes (a100_rank3_of_8): GEMM ops without Input
    Dims, their kernels cuBLAS's (``volta_sgemm``) and CUTLASS's, and an all_reduce whose
    record_param_comms says nothing of it (old_collective)."""
    b = TraceBuilder(rank=3, world_size=8, record_shapes=False, sync_events=False)
    b.step(1014, 0, 2000)
    b.gemm(stream=7, launch=10, start=20, dur=400, m=1, n=1, k=1, kernel="volta_sgemm_128x64_nn")
    b.launch(stream=7, launch=20, start=421, dur=100, op="aten::add", kernel=FILL)
    b.gemm(stream=7, launch=30, start=522, dur=300, m=1, n=1, k=1, op="aten::addmm", kernel=CUTLASS)
    b.old_collective(stream=14, launch=50, start=823, dur=200)
    doc = b.document()
    doc["distributedInfo"] = {"backend": "nccl", "rank": 3, "world_size": 8}
    for key in ("record_shapes", "baseTimeNanoseconds"):
        del doc[key]
    return doc


def unrecorded_memsets_rank() -> dict[str, Any]:
    """Three steps of one rank, each with two cudaMemsetAsync calls of cuDNN that CUPTI records
    no device work for in any step, and an all_reduce (v100_one_rank_cudnn_memsets)."""
    b = TraceBuilder(rank=0, world_size=1, sync_events=False)
    for n in range(3):
        t = 1000.0 * n
        b.step(103 + n, t, t + 900)
        conv = "aten::cudnn_convolution"
        b.launch(stream=7, launch=t + 10, start=t + 20, dur=200, op=conv,
                 kernel="volta_scudnn_128x64_relu_interior_nn_v1")  # fmt: skip
        for i in range(2):
            b.launch(stream=7, launch=t + 30 + i, start=0, dur=0, op=conv, cat="gpu_memset",
                     call="cudaMemsetAsync", with_activity=False)  # fmt: skip
        b.launch(stream=7, launch=t + 40, start=t + 221, dur=50, op="aten::relu_")
        b.old_collective(stream=14, launch=t + 50, start=t + 272, dur=100)
    doc = b.document()
    for key in ("record_shapes", "baseTimeNanoseconds"):
        del doc[key]
    return doc
