"""The fidelity script's tables from synthetic maestro records (its GPU parts need a GPU)."""

from __future__ import annotations

import pytest
import yaml

from bench import fidelity_gpu as fg
from userbenchmark.maestro.core.config.loader import load_suite_text


def _pattern(name, *, late=0, **extra):
    return {
        "pattern": name,
        "num_blocks": 2,
        "makespan_avg_us": 5.0,
        "lane_skew_p50_us": 0.2,
        "lane_skew_max_us": 0.3,
        "gate_delay_max_us": 1.7,
        "gate_spin_us": 120.0,
        "enqueue_max_us": 50.0,
        "host_late_iters": late,
        **extra,
    }


def _block(pattern, latency, enqueue=25.0):
    return {"pattern": pattern, "latency_avg_us": latency, "enqueue_avg_us": enqueue}


def test_generated_patterns_are_valid_suites():
    for text in (fg.fidelity_yaml(50, 10), fg.gate_yaml(200, 10)):
        suite = load_suite_text(text, file="generated.yaml")
        assert suite.world_size == 1
        assert yaml.safe_load(text)["name"] in ("fidelity", "gate")
    names = [p.name for p in load_suite_text(fg.gate_yaml(5, 1), file="g.yaml").patterns]
    assert names == fg.gate_names()


def test_launch_bound_comes_from_the_host_count_not_the_gate_delay():
    run = {
        "patterns.json": [
            _pattern("sweep64"),
            _pattern("sweep128", gate_delay_max_us=40.0),  # lanes waited for the GPU
            _pattern("sweep256", late=30),
            _pattern("sweep512", late=1),  # one host hiccup in 200: not launch-bound
        ],
        "results.json": [_block(f"sweep{n}", 2.0 + n / 100) for n in (64, 128, 256, 512)],
        "warnings": [],
    }
    rows = {r["pattern"]: r for r in fg.gate_rows(run)}
    assert rows["sweep128"]["host_late_iters"] == 0
    assert fg.launch_bound(rows["sweep256"], 200) is True
    assert fg.launch_bound(rows["sweep512"], 200) is False
    assert "error" in rows["chain"]  # missing patterns are rows that say so
    # Smallest size from which no larger one is launch-bound: 512 (256 was).
    assert fg.smallest_unbound(fg.gate_rows(run), 200)["pattern"] == "sweep512"


def test_fidelity_rows_ratio_and_naive_launch_bound():
    maestro = {
        "cupti": {"results.json": [_block("gemm256", 2.613, enqueue=24.0)]},
        "graph": {"results.json": [_block("gemm256", 2.600, enqueue=9.0)]},
    }
    local = {
        "gemm256": {
            "gated": {"avg_us": 2.612, "held_fraction": 1.0},
            "held": {"avg_us": 2.700, "held": True},  # back to back: shown, not the reference
            "naive_event_us": 19.8,
        }
    }
    row = next(r for r in fg.fidelity_rows(maestro, local) if r["op"] == "gemm256")
    assert abs(row["ratio_maestro_cupti_over_gated"] - 2.613 / 2.612) < 1e-12
    assert row["within_1pct"] is True and row["naive_launch_bound"] is True
    assert row["gated_all_held"] is True and row["held_kernel_us"] == 2.700
    assert row["maestro_enqueue_us"] == 24.0
    assert row["maestro_graph_us"] == 2.600 and row["maestro_graph_enqueue_us"] == 9.0
    assert abs(row["ratio_graph_over_eager"] - 2.600 / 2.613) < 1e-12
    missing = next(r for r in fg.fidelity_rows(maestro, local) if r["op"] == "gemm8192")
    assert missing["maestro_cupti_us"] is None and missing["within_1pct"] is None
    assert missing["maestro_graph_us"] is None and fg.math.isnan(missing["ratio_graph_over_eager"])


def test_enqueue_probe_warms_then_times_launches_between_two_synchronizes():
    calls = []

    class Cuda:
        @staticmethod
        def synchronize():
            calls.append("sync")

    class Torch:
        cuda = Cuda

    per_launch_us = fg.enqueue_probe_us_per_launch(
        Torch, lambda: calls.append("op"), warmup=2, launches=3
    )
    assert calls == ["op", "op", "sync", "op", "op", "op", "sync"]
    assert per_launch_us > 0


def test_kineto_spans_leave_out_each_iterations_gate_spin():
    from bench.fidelity_gpu import kineto_spans_us

    events = []
    for it in range(3):
        t = 1000.0 * it
        events.append({"cat": "kernel", "name": "spin_kernel", "ts": t, "dur": 200.0})
        events.append({"cat": "kernel", "name": "gemm", "ts": t + 201.0, "dur": 10.0 + it})
        events.append({"cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": t + 212.0, "dur": 2.0})
    events.append({"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5.0, "dur": 3.0})
    got = kineto_spans_us({"traceEvents": events}, 3)
    # Per iteration: gemm start to memcpy end = 11 + 2 = 13 (it 0), 13 (it 1), 13 (it 2).
    assert got == {"avg_us": 13.0, "p50_us": 13.0, "events_per_launch": 2}
    with pytest.raises(ValueError, match="do not split"):
        kineto_spans_us({"traceEvents": events[:-2]}, 3)
