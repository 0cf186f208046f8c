"""Kernel names as PyTorch's profiler and HolisticTraceAnalysis read them."""

import pytest

from userbenchmark.maestro.core.profilers.cupti import demangle


def test_nccl_kernel_symbol_reads_as_nccl_kernel():
    # Symbols CUPTI reported for NCCL 2.32's ring kernels on an H200.
    mangled = "_Z28ncclDevKernel_AllGather_RING24ncclDevKernelArgsStorageILm4096EE"
    assert demangle(mangled) == "ncclDevKernel_AllGather_RING(ncclDevKernelArgsStorage<4096ul>)"
    mangled = "_Z37ncclDevKernel_ReduceScatter_bf16_RING24ncclDevKernelArgsStorageILm4096EE"
    assert demangle(mangled).startswith("ncclDevKernel_ReduceScatter_bf16_RING(")


def test_plain_function_and_namespaced_template():
    assert demangle("_Z3fooi") == "foo(int)"
    assert demangle("_ZN2at6native4fillIfEEvPT_i") == "void at::native::fill<float>(float*, int)"


@pytest.mark.parametrize(
    "name",
    [
        "Memcpy DtoD (Device -> Device)",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
        "sm90_xmma_gemm_bf16bf16_bf16f32",
        "",
        "_Znot a symbol",  # starts like one, is not: left as it is
    ],
)
def test_names_that_are_not_mangled_symbols_stay(name):
    assert demangle(name) == name
