"""The what-if report: a variant's change against its pattern paired by round, with its interval
and the one verdict rule (a rise and the matching fall alike, a floor of 1 %), the block whose
latency changed most; rank 0's table, whatif.json/.csv, the variant's own rows and metric keys,
and the plot."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from userbenchmark.maestro.core.analysis.records import BlockResult, PatternOutcome, PatternResult
from userbenchmark.maestro.core.analysis.whatif import WHATIF_FLOOR, build_whatif
from userbenchmark.maestro.core.config.loader import load_suite_text
from userbenchmark.maestro.core.config.options import RunOptions
from userbenchmark.maestro.core.output.locations import prepare_output_locations
from userbenchmark.maestro.core.output.metric_keys import parse_metric_key
from userbenchmark.maestro.core.output.reporter import Reporter, suite_settings
from userbenchmark.maestro.core.output.results import load_results, records_of
from userbenchmark.maestro.core.output.writer import OutputWriter, matplotlib_available

SUITE = load_suite_text(
    """\
name: s
world_size: 1
patterns:
  - name: step
    blocks:
      - {name: gemm, op: gemm, m: 8, n: 8, k: 8}
      - {name: nap, op: sleep, lane: idle, duration_us: 100}
    whatif:
      longer: {gemm: {m: x1.2}}
      same: {}
"""
)
BASE = SUITE.patterns[0]
LONGER, SAME = BASE.variants
ROUNDS = 20


def _rounds(rng: np.random.Generator, mean_ns: float, noise: float) -> np.ndarray:
    """Round averages that drift together (a shared factor per round) plus their own noise."""
    return mean_ns * DRIFT * (1 + rng.normal(0.0, noise, ROUNDS))


DRIFT = 1 + np.random.default_rng(0).normal(0.0, 0.03, ROUNDS)  # 3 % between rounds


def _whatif(variant, factor: float, noise: float = 0.002, *, seed: int = 1, blocks=None):
    rng = np.random.default_rng(seed)
    base, other = _rounds(rng, 1e6, noise), _rounds(rng, 1e6 * factor, noise)
    base_blocks = np.stack([_rounds(rng, 4e5, noise), _rounds(rng, 1e6, noise)])
    other_blocks = base_blocks * np.array([[factor], [1.0]]) if blocks is None else blocks
    return build_whatif(
        BASE,
        variant,
        base_makespan_ns=base,
        variant_makespan_ns=other,
        base_block_ns=base_blocks,
        variant_block_ns=other_blocks,
    )


def test_a_change_beyond_noise_is_its_verdict_with_the_interval_holding_it():
    r = _whatif(LONGER, 1.2)
    assert (r.pattern, r.variant, r.rounds, r.verdict) == ("step", "longer", 20, "slower")
    assert r.change_ci_low_pct < 20 < r.change_ci_high_pct and r.change_pct == pytest.approx(
        20, abs=0.3
    )
    assert r.base_makespan_avg_us == pytest.approx(1000, rel=0.02)
    assert r.makespan_avg_us == pytest.approx(1200, rel=0.02)
    assert (r.block, round(r.block_change_pct)) == ("gemm", 20)


def test_a_rise_and_the_matching_fall_get_the_same_verdict_and_size():
    rng = np.random.default_rng(2)
    a, b, blocks = _rounds(rng, 1e6, 0.01), _rounds(rng, 1.2e6, 0.01), np.ones((2, ROUNDS))
    up, down = (
        build_whatif(
            BASE,
            LONGER,
            base_makespan_ns=x,
            variant_makespan_ns=y,
            base_block_ns=blocks,
            variant_block_ns=blocks,
        )  # fmt: skip
        for x, y in ((a, b), (b, a))
    )
    assert (up.verdict, down.verdict) == ("slower", "faster")
    log = lambda pct: math.log1p(pct / 100)  # noqa: E731
    assert log(up.change_pct) == pytest.approx(-log(down.change_pct))
    assert log(up.change_ci_low_pct) == pytest.approx(-log(down.change_ci_high_pct))


def test_the_drift_rounds_share_cancels_and_the_floor_keeps_tiny_changes_within_noise():
    assert _whatif(SAME, 1.0).verdict == "within noise"
    assert _whatif(SAME, 1.02).verdict == "slower"  # the 3 % drift between rounds pairs out
    tiny = _whatif(SAME, 1 + WHATIF_FLOOR / 2, noise=1e-5)
    assert tiny.change_ci_low_pct > 0 and tiny.verdict == "within noise"  # past 0, not the floor
    # unpaired, the same 2 % would hide in the drift: the rounds' spread is larger than it
    assert np.std(DRIFT) > 0.02


def test_blocks_are_matched_by_name_and_untimed_rounds_are_left_out():
    rng = np.random.default_rng(3)
    other = np.stack([np.full(ROUNDS, np.nan), _rounds(rng, 1.5e6, 0.002)])  # gemm untimed
    r = _whatif(SAME, 1.0, blocks=other)
    assert r.block == "nap" and r.block_change_pct == pytest.approx(50, abs=2)
    none = _whatif(SAME, 1.0, blocks=np.full((2, ROUNDS), np.nan))
    assert none.block == "" and math.isnan(none.block_change_pct)


def test_shapes_and_too_few_rounds_are_refused():
    one = np.ones(3)
    with pytest.raises(
        ValueError, match=r"shapes \[\(3,\), \(2,\), \(2, 3\), \(2, 3\)\], expected"
    ):
        build_whatif(
            BASE, SAME, base_makespan_ns=one, variant_makespan_ns=np.ones(2),
            base_block_ns=np.ones((2, 3)), variant_block_ns=np.ones((2, 3)),
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"1 round\(s\) with both makespans measured; a what-if"):
        build_whatif(
            BASE, SAME, base_makespan_ns=[1.0, np.nan, 2.0], variant_makespan_ns=[1.0, 1.0, np.nan],
            base_block_ns=np.ones((2, 3)), variant_block_ns=np.ones((2, 3)),
        )  # fmt: skip


def _outcome(pattern: str, gemm_us: float) -> PatternOutcome:
    blocks = tuple(
        BlockResult(
            suite="s",
            pattern=pattern,
            block=name,
            op=op,
            axis="world",
            lane=lane,
            team_size=1,
            dtype="fp32",
            size_bytes=None,
            iters=5,
            latency_avg_us=us,
            latency_min_us=us,
            latency_max_us=us,
            latency_p50_us=us,
            latency_p99_us=math.nan,
            latency_stdev_us=0.0,
        )  # fmt: skip
        for name, op, lane, us in (
            ("gemm", "gemm", "world", gemm_us),
            ("nap", "sleep", "idle", 100),
        )
    )
    result = PatternResult(suite="s", pattern=pattern, iters=5, num_blocks=2, makespan_avg_us=150)
    return PatternOutcome(blocks=blocks, pattern=result)


def test_the_report_prints_writes_and_keys_each_variant(tmp_path, capsys):
    folder = tmp_path / "out"
    reporter = Reporter(SUITE, RunOptions(output_dir=str(folder), plot=matplotlib_available()))
    reporter.writer = OutputWriter(
        output_dir=folder,
        metrics_path=tmp_path / "metrics.json",
        environ={},
        plot=reporter.options.plot,
    )
    assert reporter.progress.total == 3  # the pattern and its two variants
    reporter.finished(BASE, _outcome("step", 50.0), {})
    reporter.finished(LONGER, _outcome("step", 60.0), {})
    results = (_whatif(LONGER, 1.2), _whatif(SAME, 1.0))
    reporter.whatif_finished(BASE, results)
    printed = capsys.readouterr().out
    assert "== s / step[whatif=longer]" in printed and "== what if: s / step" in printed
    row = next(line for line in printed.splitlines() if line.startswith("longer"))
    assert " slower " in row and "gemm +20." in row and "+20." in row.split("slower")[0]

    found = load_results(folder)
    rows = records_of(found.blocks)
    assert [(r["pattern"], r["variant"]) for r in rows] == [
        ("step", ""), ("step", ""), ("step[whatif=longer]", "longer"), ("step[whatif=longer]", "longer"),
    ]  # fmt: skip
    whatif = records_of(found.whatif)
    assert [(r["suite"], r["pattern"], r["variant"], r["verdict"]) for r in whatif] == [
        ("s", "step", "longer", "slower"),
        ("s", "step", "same", "within noise"),
    ]
    assert whatif[0]["change_pct"] == results[0].change_pct  # exact
    header, first = (folder / "whatif.csv").read_text().splitlines()[:2]
    row = dict(zip(header.split(","), first.split(","), strict=True))
    assert row["change_pct"] == repr(results[0].change_pct)  # CSV too
    assert list(json.loads((folder / "whatif.json").read_text())[0])[:4] == [
        "suite", "pattern", "variant", "rounds",
    ]  # fmt: skip
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert metrics["s/step[whatif=longer]/gemm/latency_avg_us"] == 60.0
    assert metrics["s/step[whatif=longer]/change_pct"] == results[0].change_pct
    assert "s/step[whatif=same]/change_ci_high_pct" in metrics
    for key in metrics:
        parse_metric_key(key)
    if reporter.options.plot:
        assert (folder / "plot-whatif-step.png").stat().st_size > 0


def test_a_run_without_variants_writes_no_whatif_file_and_a_rerun_moves_one_aside(tmp_path):
    writer = OutputWriter(output_dir=tmp_path, metrics_path=None, environ={})
    writer.add(_outcome("step", 50.0))
    assert not (tmp_path / "whatif.json").exists()
    writer.add_whatif("step", (_whatif(SAME, 1.0),))
    assert (tmp_path / "whatif.csv").exists()
    with prepare_output_locations(tmp_path, None):
        assert not (tmp_path / "whatif.json").exists() and not (tmp_path / "whatif.csv").exists()
    (moved,) = tmp_path.glob("previous-*")
    assert (moved / "whatif.json").exists()


def test_the_metrics_environ_keys_each_variants_settings():
    settings = suite_settings(SUITE)
    assert settings["block.step[whatif=longer]/gemm"].endswith("m=10 n=8 k=8 tf32=false")
    assert settings["block.step/gemm"].endswith("m=8 n=8 k=8 tf32=false")
    assert "pattern.step[whatif=same]" in settings


def test_an_outcome_becomes_its_variants():
    outcome = _outcome("ar[size=4M]", 1.0).of_variant("v")
    assert outcome.variant == "v"
    assert {r.pattern for r in (*outcome.blocks, outcome.pattern)} == {"ar[size=4M,whatif=v]"}
    assert dataclasses.replace(outcome.pattern, variant="", pattern="ar[size=4M]") == (
        _outcome("ar[size=4M]", 1.0).pattern
    )
