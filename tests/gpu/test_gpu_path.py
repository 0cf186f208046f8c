"""The CUDA path on one GPU: warmup excluded, the gate, sleep accuracy, CUPTI vs events."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from tests.integration.helpers import read_records, run_maestro  # noqa: E402

CONFIG = str(Path(__file__).with_name("gpu_checks.yaml"))
KEEP = os.environ.get("MAESTRO_GPU_OUT")


def _run(tmp_path: Path, profiler: str, config: str = CONFIG, nproc: int = 1) -> Path:
    out = Path(KEEP) / f"{Path(config).stem}-{profiler}" if KEEP else tmp_path / profiler
    proc = run_maestro(
        [
            "run",
            "-c",
            config,
            "--profiler",
            profiler,
            "--output-dir",
            str(out),
            "--no-metrics",
            "--nproc",
            str(nproc),
        ],
        timeout=400,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def cupti_out(tmp_path_factory):
    pytest.importorskip("cupti")
    return _run(tmp_path_factory.mktemp("cupti"), "cupti")


@pytest.fixture(scope="module")
def events_out(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("events"), "events")


def _blocks(out: Path) -> dict[tuple[str, str], dict]:
    return {(r["pattern"], r["block"]): r for r in read_records(out)}


def _patterns(out: Path) -> dict[str, dict]:
    return {p["pattern"]: p for p in read_records(out, "patterns.json")}


def test_warmup_excluded_one_kernel_per_iteration(cupti_out):
    # Attributed activities = iters x activities per launch: a whole number per iteration.
    # 10 leaked warmup launches over 50 measured iterations would add 0.2 per iteration.
    for key, rec in _blocks(cupti_out).items():
        per_iter = rec["activities_per_iter"]
        assert per_iter >= 1 and per_iter == pytest.approx(round(per_iter), abs=1e-9), key


def test_two_gemms_start_together_and_slow_each_other(cupti_out):
    p = _patterns(cupti_out)["gemm_pair"]
    assert p["lane_skew_p50_us"] < 10.0
    blocks = _blocks(cupti_out)
    for name in ("g1", "g2"):
        assert blocks[("gemm_pair", name)]["slowdown"] > 1.0


def test_sleep_1ms_within_3_percent(cupti_out, events_out):
    for out in (cupti_out, events_out):
        rec = _blocks(out)[("sleep_1ms", "nap")]
        assert rec["latency_avg_us"] == pytest.approx(1000.0, rel=0.03)


def test_cupti_and_events_agree_on_big_gemm(cupti_out, events_out):
    a = _blocks(cupti_out)[("big_gemm", "g")]["latency_avg_us"]
    b = _blocks(events_out)[("big_gemm", "g")]["latency_avg_us"]
    assert a == pytest.approx(b, rel=0.02)


def test_world_size_1_all_gather_memcpy_attributed(cupti_out):
    rec = _blocks(cupti_out)[("ag_ws1", "ag")]
    assert rec["activities_per_iter"] == pytest.approx(1.0)
    assert rec["latency_avg_us"] > 0


@pytest.mark.parametrize("config", ["quickstart", "ag_rs"])
def test_shipped_configs_run_on_gpu(tmp_path, config):
    out = _run(tmp_path, "auto", config=config)
    assert read_records(out)
    print(json.dumps(read_records(out, "patterns.json"), indent=1)[:2000])
