"""The busy bench's pattern files and verdicts (its measurements need a GPU)."""

from __future__ import annotations

from bench import busy_gpu as bg
from userbenchmark.maestro.core.config.loader import load_suite_text


def test_the_generated_pattern_files_validate():
    real = load_suite_text(bg.real_alone_yaml(1, 50, 1024), file="real.yaml")
    assert real.patterns[0].blocks[0].params == {"mib": 1024}
    suite = load_suite_text(bg.overlap_yaml(2, 50, 1024, 812.34), file="overlap.yaml")
    names = [p.name for p in suite.patterns]
    assert names == [f"with_{p}[size={s}]" for p in bg.PARTNERS for s in bg.SIZES]
    busy = suite.patterns[2].blocks[1]
    assert (busy.op, busy.lane, busy.params["duration_us"]) == ("busy", "partner", 812.3)


def test_excess_reads_the_collectives_slowdown_per_partner_and_size():
    records = [
        {"pattern": "with_busy[size=64M]", "block": "ag", "slowdown": 1.5},
        {"pattern": "with_busy[size=64M]", "block": "partner", "slowdown": 1.1},
        {"pattern": "with_sleep[size=256M]", "block": "ag", "slowdown": None},
    ]
    assert bg.excess(records) == {("busy", "64M"): 0.5}


def test_verdicts():
    same = bg.verdict({"real": [0.5, 0.52], "busy": [0.45, 0.47], "sleep": [0.01, 0.0]})
    assert same["result"] == "pass"
    off = bg.verdict({"real": [0.5, 0.5], "busy": [0.1, 0.1], "sleep": [0.0, 0.0]})
    assert off["result"] == "FAIL" and not off["busy_matches_real"]
    spin = bg.verdict({"real": [0.5, 0.5], "busy": [0.5, 0.5], "sleep": [0.4, 0.4]})
    assert spin["result"] == "FAIL" and not spin["sleep_competes_with_nothing"]
    flat = bg.verdict({"real": [0.02, 0.03], "busy": [0.0, 0.0], "sleep": [0.0, 0.0]})
    assert flat["result"].startswith("inconclusive")


def test_the_duration_bench_pattern_validates_and_its_rows_read_cupti_kernels():
    from bench import busy_duration_gpu as bd

    suite = load_suite_text(bd.pattern_yaml(20), file="busy_duration.yaml")
    alone = len(bd.DURATIONS_US) * 2
    assert len(suite.patterns) == alone + len(bd.AFTER_GEMM_US) * 2
    assert suite.patterns[alone].blocks[1].after == ("mm",)
    p = "alone[d=57,mode=false]"
    kernel = {"ph": "X", "args": {"stream": 7, "block": "busy", "pattern": p}}
    events = [
        {**kernel, "ts": ts, "dur": dur, "args": {**kernel["args"], "pattern_iteration": it}}
        for it, (ts, dur) in enumerate([(0.0, 28.0), (29.5, 27.0), (100.0, 28.0), (130.0, 28.0)])
    ]
    events[1]["args"]["pattern_iteration"] = 0  # two kernels in iteration 0, one gap of 1.5 µs
    rows = bd.rows_of([{"pattern": p, "block": "busy", "latency_avg_us": 56.0}],
                      {"traceEvents": events})  # fmt: skip
    assert rows[0][:4] == [p, 57.0, 56.0, 56.0 / 57.0]
    assert rows[0][4] == 4 / 3 and rows[0][6] == 1.5 and rows[0][-1] == "yes"
