"""after: on one GPU, eager and under CUDA graphs: by CUPTI's timestamps, a waiting block's
first device activity starts after the last one of every block it waits for, in every
iteration; its latency is its own run; ideal is the critical path; busy takes its duration."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from tests.integration.helpers import read_records, run_maestro  # noqa: E402

CONFIG = str(Path(__file__).with_name("dependencies.yaml"))
WAITS = {"ag": ("mm",), "mm2": ("mm", "ag"), "hbm": ("mm",)}
MODES = ("chain[mode=false]", "chain[mode=true]")


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    pytest.importorskip("cupti")
    out = tmp_path_factory.mktemp("dependencies")
    proc = run_maestro(
        ["run", "-c", CONFIG, "--profiler", "cupti", "--trace", "--output-dir", str(out),
         "--no-metrics"],
        timeout=500,
    )  # fmt: skip
    print(proc.stdout)
    print(proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _spans(out: Path, pattern: str) -> dict[tuple[str, int], tuple[float, float]]:
    """{(block, iteration): (first device start, last device end)} in µs, from CUPTI's records."""
    doc = json.loads((out / "traces" / "rank0.json").read_text())
    spans: dict[tuple[str, int], list[float]] = defaultdict(lambda: [float("inf"), -float("inf")])
    for e in doc["traceEvents"]:
        if e["ph"] != "X" or "stream" not in e["args"] or e["args"]["pattern"] != pattern:
            continue
        span = spans[(e["args"]["block"], e["args"]["pattern_iteration"])]
        span[0] = min(span[0], e["ts"])
        span[1] = max(span[1], e["ts"] + e["dur"])
    return {key: (s, e) for key, (s, e) in spans.items()}


@pytest.mark.parametrize("pattern", MODES)
def test_a_waiting_block_starts_after_what_it_waits_for_in_every_iteration(out, pattern):
    spans = _spans(out, pattern)
    iters = {it for _, it in spans}
    assert len(iters) == 50
    for it in iters:
        for block, waits in WAITS.items():
            for other in waits:
                # Timestamps are rounded to the ns in the trace: one ns of slack.
                assert spans[(block, it)][0] >= spans[(other, it)][1] - 0.002, (block, other, it)


@pytest.mark.parametrize("pattern", MODES)
def test_latency_is_the_blocks_own_run_and_ideal_the_critical_path(out, pattern):
    blocks = {r["block"]: r for r in read_records(out) if r["pattern"] == pattern}
    (result,) = [p for p in read_records(out, "patterns.json") if p["pattern"] == pattern]
    # The copy waits for the 4096^3 GEMM (~170 µs) but takes far less itself: a latency with
    # the wait in it would exceed the GEMM's.
    assert blocks["ag"]["latency_avg_us"] < blocks["mm"]["latency_avg_us"]
    iso = {name: rec["isolated_latency_avg_us"] for name, rec in blocks.items()}
    chain = max(iso["mm"] + iso["ag"] + iso["mm2"], iso["mm"] + iso["hbm"])
    assert result["ideal_us"] == pytest.approx(chain, rel=1e-9)
    assert result["makespan_avg_us"] >= 0.95 * chain  # the chain cannot overlap itself
    assert result["graph"] is (pattern == "chain[mode=true]")


def test_busy_takes_its_duration_alone_and_reports_its_bandwidth(out):
    for pattern in MODES:
        hbm = next(r for r in read_records(out) if r["pattern"] == pattern and r["block"] == "hbm")
        print(pattern, hbm["isolated_latency_avg_us"], hbm["notes"])
        assert hbm["isolated_latency_avg_us"] == pytest.approx(200, rel=0.10)
        gbps = float(re.search(r"at (\d+) GB/s", hbm["notes"]).group(1))
        assert gbps > 1000  # HBM-bound on every SM (an H200 has 4.8 TB/s), not a spin
