"""The replay bench's verdicts and report (its measurements need a GPU)."""

from __future__ import annotations

from bench import replay_gpu as rg


def _ratio(value, low, high):
    return {"replay_ratio": value, "replay_ratio_ci_low": low, "replay_ratio_ci_high": high}


def test_verdicts_call_a_figure_outside_only_beyond_its_interval():
    assert rg.verdict(_ratio(1.02, 1.01, 1.03), 0.03) == "within"
    assert rg.verdict(_ratio(0.97, 0.96, 0.98), 0.03) == "within"
    assert rg.verdict(_ratio(1.05, 1.04, 1.06), 0.03) == "outside"
    assert rg.verdict(_ratio(1.05, 1.02, 1.08), 0.03) == "within noise of the target"
    assert rg.verdict(_ratio(None, None, None), 0.03) == "-"


def _run(ratio, late):
    block = {"block": "mm", "op": "gemm", "work": "m=1 n=1 k=1", "traced_us": 100.0}
    block |= {"latency_avg_us": 100.0 * ratio, "enqueue_avg_us": 20.0}
    block |= _ratio(ratio, ratio - 0.001, ratio + 0.001)
    pattern = {
        "traced_us": 100.0,
        "makespan_avg_us": 100.0,
        "host_late_iters": late,
        "profiler": "cupti",
    }
    pattern |= {"gate_spin_us": 50.0, "enqueue_max_us": 30.0} | _ratio(1.0, 0.99, 1.01)
    return {"blocks": [block], "pattern": pattern, "wall_s": 1.0}


def test_the_report_holds_every_section_and_fails_a_missed_target():
    text, ok = rg.report({"eager": _run(1.01, 0), "graph": _run(1.0, 0)})
    assert ok
    for title in ("## Step (makespan)", "## GEMMs", "## busy stand-ins", "## Host enqueue"):
        assert title in text
    assert "| gemm | 20.000 | 20.000 | 20.000 | 20.000 |" in text
    assert not rg.report({"eager": _run(1.10, 0), "graph": _run(1.0, 0)})[1]  # a GEMM 10 % off
    assert not rg.report({"eager": _run(1.0, 3), "graph": _run(1.0, 0)})[1]  # launch-bound
