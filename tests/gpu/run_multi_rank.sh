#!/usr/bin/env bash
# The multi-rank GPU tests in two parallel streams, each stopped after LIMIT seconds (default
# 540), logs in OUT (default gpu-logs). Ranks share the GPUs where there are fewer GPUs than
# ranks (NCCL_MULTI_RANK_GPU_ENABLE=1 with NCCL >= 2.30.7): correctness only, never speed.
#   OUT=gpu-logs bash tests/gpu/run_multi_rank.sh
set -u
OUT=${OUT:-gpu-logs}
LIMIT=${LIMIT:-540}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 MAESTRO_GPU_OUT=${MAESTRO_GPU_OUT:-$OUT/runs}
T=tests/gpu/test_multi_gpu.py
run() { timeout "$LIMIT" python3 -m pytest -q -s -p no:cacheprovider -rs "$@"; }
(
  run tests/gpu/test_trace_gpu.py \
    "$T::test_ag_rs_4m_alone_and_overlapped" "$T::test_standalone_busbw_is_algbw_times_nccl_tests_factor" \
    "$T::test_fsdp_at_2_ranks" "$T::test_max_ctas_reaches_the_communicator" \
    "$T::test_priority_under_gemm_contention_is_measured" \
    "$T::test_every_collective_checks_clean_under_overlap[2]" \
    "$T::test_every_collective_checks_clean_under_overlap[4]" \
    "tests/gpu/test_graph_mode.py::test_graph_mode_at_several_ranks_attributes_and_checks" \
    tests/gpu/test_multi_gpu_faults.py
) > "$OUT/stream_a.log" 2>&1 &
(
  run "$T::test_every_collective_checks_clean_under_overlap[8]" \
    "$T::test_mesh_dp_x_tp_collectives_on_both_axes" "$T::test_moe_at_two_capacity_factors" \
    "$T::test_shipped_config_at_its_world_size"
) > "$OUT/stream_b.log" 2>&1 &
wait
tail -n 30 "$OUT/stream_a.log" "$OUT/stream_b.log"
