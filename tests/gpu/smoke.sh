#!/usr/bin/env bash
# The GPU smoke run: at most 5 minutes on one H200. Run it after any change to core/runtime/,
# core/profilers/, blocks/, replay/ or the launcher, and keep its last result in BENCHMARKS.md.
# Covers: both CUDA profilers (cupti, events), CUDA-graph mode, --nproc 1 (every run of
# test_gpu_path.py goes through the local launcher), the shipped one-rank replay eager and under
# graphs, and the wall-time figures of bench/wall_gpu.py (with MULTI="DIR ..." it also replays
# those multi-rank traces at their world size: ranks sharing the GPU need NCCL 2.30.7 or newer
# with NCCL_MULTI_RANK_GPU_ENABLE=1).
#   OUT=smoke-logs bash tests/gpu/smoke.sh
set -u
OUT=${OUT:-smoke-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
began=$(date +%s)
python3 - <<'PY' | tee "$OUT/versions.txt"
import datetime, importlib.metadata as md, torch
try:
    cupti = md.version("cupti-python")
except md.PackageNotFoundError:
    cupti = "not installed"
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-"
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {device}; "
      f"torch {torch.__version__}; NCCL {nccl}; cupti-python {cupti}")
PY
status=0
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs \
  tests/gpu/test_gpu_path.py tests/gpu/test_graph_mode.py tests/gpu/test_replay_gpu.py \
  -k "not several_ranks" > "$OUT/tests.log" 2>&1 || status=1
tail -n 5 "$OUT/tests.log"
# shellcheck disable=SC2086
timeout 240 python3 -m bench.wall_gpu --json "$OUT/wall.json" ${MULTI:+--multi-rank $MULTI} \
  > "$OUT/wall.md" 2>&1 || status=1
cat "$OUT/wall.md"
echo "smoke: $(( $(date +%s) - began )) s, status $status"
exit $status
