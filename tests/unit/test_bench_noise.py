"""The GPU noise bench's bookkeeping (its measurements need a GPU): runs kept in a folder
across calls are read back in order and judged pair by pair."""

from __future__ import annotations

import json

from bench import noise_gpu as ng


def _run(scale: dict[str, float]) -> dict[str, float]:
    """One run's flat metrics: every variant's latency, 0.4 % wide intervals, 50 windows."""
    out = {}
    variants = [f"gemm_d{s}" for s in ng.GEMM_STEPS]
    variants += [f"ag_d{round(s * 1000)}" for s in ng.GATHER_STEPS]
    for pattern in variants:
        block = "mm" if pattern.startswith("gemm") else "ag"
        value = 100.0 * scale.get(pattern, 1.0)
        for metric in ("latency_avg_us", "latency_p50_us"):
            key = f"noise_gpu/{pattern}/{block}/{metric}"
            out |= {key: value, f"{key}_ci_low": value * 0.998, f"{key}_ci_high": value * 1.002}
            out[f"{key}_ci_df"] = 50.0
    return out


def test_kept_runs_are_judged_pair_by_pair(tmp_path, capsys):
    bigger = {"gemm_d512": 1.0625, "ag_d60": 1.06}
    for index in range(3):
        (tmp_path / f"run{index:03d}-iters200.json").write_text(json.dumps(_run(bigger)))
    (tmp_path / "run000-iters50.json").write_text("{}")  # other iterations: not read
    assert len(ng.kept_runs(tmp_path, 200)) == 3
    assert ng.main(["--runs", "0", "--keep", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| gemm | +0.00% | 0/2 | 0/2 | 0/2 |" in out
    assert "| gemm | +6.25% | 2/2 | 2/2 | 2/2 |" in out
    assert "gemm, 5 % floor (default): 0/2 false alarms; smallest change found" in out
    assert "| ag | +6.0% | 2/2 | 2/2 | 2/2 |" in out


def test_one_kept_run_is_no_pair(tmp_path, capsys):
    (tmp_path / "run000-iters200.json").write_text(json.dumps(_run({})))
    assert ng.main(["--runs", "0", "--keep", str(tmp_path)]) == 0
    assert "1 run(s); a pair needs 2" in capsys.readouterr().out
