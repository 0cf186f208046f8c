"""The noise model on synthetic samples with known answers (seeded simulations): interval
coverage, false-alarm rate of identical runs, power against a real change, and the derived
figures' intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from userbenchmark.maestro.core.analysis.stats import (
    Phase,
    block_length,
    degrees_of_freedom,
    interval,
    relative_drift,
    t_quantile,
)
from userbenchmark.maestro.core.output.metric_keys import Reading, judge_all


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 5, 2.571), (0.9995, 2, 31.599),
     (0.9995, 5, 6.869), (0.975, 29, 2.045), (0.9995, 30, 3.646), (0.975, math.inf, 1.960)],
)  # fmt: skip
def test_t_quantiles_match_the_tables(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=2e-3)


def test_block_length_follows_the_correlation_of_a_series():
    rng = np.random.default_rng(0)
    assert block_length(rng.normal(size=125)) == 5  # n^(1/3) without correlation
    x = np.zeros(200)
    for t in range(1, 200):
        x[t] = 0.8 * x[t - 1] + rng.normal()
    assert block_length(x) >= 2 * (1 + 0.6) / (1 - 0.6)  # r about 0.8, estimated lower
    assert degrees_of_freedom(x) < degrees_of_freedom(rng.normal(size=200))


def test_drift_is_the_move_of_the_level_beyond_noise():
    rng = np.random.default_rng(1)
    steady = [relative_drift(1000 + rng.normal(0, 50, 200)) for _ in range(50)]
    assert np.median(steady) < 0.005  # iid: half the time exactly 0, else a noise-sized bit
    step = np.r_[1000 + rng.normal(0, 10, 100), 1100 + rng.normal(0, 10, 100)]
    assert relative_drift(step) == pytest.approx(0.2 / 1.05, rel=0.1)  # twice the step


def _reading(phase: Phase, x: np.ndarray, statistic: str) -> Reading:
    value = float(x.mean()) if statistic == "mean" else float(np.sort(x)[math.ceil(x.size / 2) - 1])
    df = degrees_of_freedom(x)
    low, high = interval(value, phase.resample(x, statistic), df)
    return Reading(value=value, low=low, high=high, df=df)


def _run(samples: np.ndarray) -> dict[str, Reading]:
    """One synthetic run: each block's mean and median with their intervals."""
    phase = Phase(seed=0)
    out = {}
    for b, x in enumerate(samples):
        out[f"s/p/b{b}/latency_avg_us"] = _reading(phase, x, "mean")
        out[f"s/p/b{b}/latency_p50_us"] = _reading(phase, x, "p50")
    return out


def _lognormal(rng, blocks, n):
    return 1000 * rng.lognormal(0, 0.6, size=(blocks, n))  # heavy right tail


def _autocorrelated(rng, blocks, n, r=0.5):
    e = rng.normal(size=(blocks, n)) * math.sqrt(1 - r * r)
    x = np.zeros_like(e)
    for t in range(n):
        x[:, t] = (r * x[:, t - 1] if t else 0) + e[:, t]
    return 1000 * np.exp(0.3 * x)


def _sleep(rng, blocks, n):
    """2 ms plus wake-up jitter and a 2 % chance of a long preemption."""
    jitter = rng.exponential(60, size=(blocks, n))
    return 2000 + jitter + (rng.random((blocks, n)) < 0.02) * rng.exponential(2000, (blocks, n))


@pytest.mark.parametrize("draw", [_lognormal, _autocorrelated], ids=["heavy tail", "r=0.5"])
def test_identical_runs_false_alarm_in_at_most_5_percent_of_pairs(draw):
    rng = np.random.default_rng(7)
    pairs, alarms = 60, 0
    for _ in range(pairs):
        verdicts = judge_all(_run(draw(rng, 5, 40)), _run(draw(rng, 5, 40)))
        alarms += any(j.verdict in ("regressed", "improved") for j in verdicts)
    # 5 % of 60 is 3; allow the binomial spread of a 5 % rate (P(X > 7) < 1 %).
    assert alarms <= 7


def test_a_10_percent_longer_sleep_is_found_and_its_neighbours_are_not():
    rng = np.random.default_rng(11)
    pairs, found, wrong = 30, 0, 0
    for _ in range(pairs):
        a, b = _sleep(rng, 3, 200), _sleep(rng, 3, 200)
        b[0] *= 1.10
        verdicts = {j.key: j.verdict for j in judge_all(_run(a), _run(b))}
        found += "regressed" in (verdicts[f"s/p/b0/latency_{m}_us"] for m in ("avg", "p50"))
        wrong += any(v != "within noise" for k, v in verdicts.items() if "/b0/" not in k)
    assert found >= 27 and wrong <= 2


def test_the_mean_interval_covers_the_true_mean():
    rng = np.random.default_rng(3)
    covered = 0
    for seed in range(100):
        x = 1000 * rng.lognormal(0, 0.5, 60)
        low, high = interval(x.mean(), Phase(seed=seed).resample(x), degrees_of_freedom(x))
        covered += low <= 1000 * math.exp(0.125) <= high
    assert covered >= 88  # 95 % nominal: at least 88 of 100 (binomial, P < 1 %)


# --- derived figures: intervals through build_outcome -----------------------------------------


def _two_sleeps(rng, n, alone_means=(1000.0, 800.0), together=(1000.0, 800.0), sd=30.0, ramp=0.0):
    """Two sleeps that start together on their own lanes, and each one's window alone (µs);
    ``ramp``: each window's level rises by this fraction from its first to its last iteration."""
    from bench.aggregate_scale import simulate_ranks
    from tests.unit.test_runtime_pure import _block, _pattern, _timings
    from userbenchmark.maestro.blocks.registry import registered_ops
    from userbenchmark.maestro.core.analysis.aggregate import local_summary
    from userbenchmark.maestro.core.analysis.outcome import Isolated, build_outcome
    from userbenchmark.maestro.core.config.spec import SuiteSpec

    blocks = [_block(name, "sleep", duration_us=1.0) for name in ("a", "b")]
    pattern = _pattern(blocks, iters=n)
    suite = SuiteSpec(name="s", source="x", world_size=1, patterns=(pattern,))
    level = 1 + ramp * (np.arange(n) / n - 0.5)
    durations = np.array([rng.normal(m, sd, n) * level for m in together]) * 1e3
    agg = simulate_ranks(
        [
            local_summary(
                _timings(np.zeros((2, n)), durations.round()),
                lane_of_block=[0, 1],
                is_comm=np.zeros(2, bool),
                is_compute=np.zeros(2, bool),
            )
        ]
    )
    alone = Isolated(latency_ns=np.array([rng.normal(m, sd, n) * level for m in alone_means]) * 1e3)
    sleep = registered_ops()["sleep"]
    return build_outcome(
        suite, pattern, [sleep, sleep], agg, alone, None, None, profiler="host", team_sizes=[1, 1]
    )


def test_the_efficiency_interval_covers_the_truth_with_ideal_inside_serial():
    # Serial 1800, ideal 1000 (one of serial's terms), makespan E[max(A, B)] ~ 1000: the
    # interval must cover the true efficiency; treating ideal as independent of serial (the
    # old propagation) gave a wrong width.
    rng = np.random.default_rng(5)
    truth_makespan = np.maximum(rng.normal(1000, 30, 10**6), rng.normal(800, 30, 10**6)).mean()
    truth = (1800 - truth_makespan) / 800
    covered = 0
    for _ in range(40):
        p = _two_sleeps(rng, 50).pattern
        low, high, _ = p.intervals["overlap_efficiency"]
        covered += low <= truth <= high
        assert low <= p.overlap_efficiency <= high
    assert covered >= 34  # 95 % nominal: at least 34 of 40 (binomial, P < 2 %)


def test_blocks_that_cannot_affect_each_other_are_not_called_faster_overlapped():
    # The same sleeps together and alone on a host whose speed wanders: each window's level
    # moves by 2.5 % from its start to its end, and the windows alone come later, so they read
    # 2.5 % slower. The drift each window shows is in the interval: no "slowdown < 1 beyond
    # noise" note (the old within-run rule flagged 0.975 +- 0.023).
    rng = np.random.default_rng(9)
    notes = 0
    for _ in range(20):
        out = _two_sleeps(rng, 200, alone_means=(1025.0, 820.0), sd=20.0, ramp=0.025)
        notes += any("beyond noise" in b.notes for b in out.blocks)
        slowdown = out.blocks[0]
        assert (
            slowdown.intervals["slowdown"][0]
            <= slowdown.slowdown
            <= slowdown.intervals["slowdown"][1]
        )
    assert notes <= 2


def test_a_change_within_the_spread_of_a_runs_window_means_is_within_noise():
    """+8 % is 5 standard errors of two runs whose 31 windows each spread by 10 %: within the
    drift a run showed from window to window, so within noise; the same change between runs
    whose windows spread by 2 % is a regression."""

    def run(value, se, df=30.0):
        half = se * t_quantile(0.975, df)
        return {
            "s/p/b/latency_avg_us": Reading(
                value=value, low=value * math.exp(-half), high=value * math.exp(half), df=df
            )
        }

    se_wide, se_narrow = 0.10 / math.sqrt(31), 0.02 / math.sqrt(31)
    (wide,) = judge_all(run(100.0, se_wide), run(108.0, se_wide))
    assert wide.verdict == "within noise" and abs(wide.floor - 0.105) < 0.001
    (narrow,) = judge_all(run(100.0, se_narrow), run(108.0, se_narrow))
    assert narrow.verdict == "regressed" and narrow.floor == 0.05
