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


def test_the_report_names_traced_kernels_and_splits_gemms_by_overlap():
    from types import SimpleNamespace

    specs = {
        "mm": SimpleNamespace(
            op="gemm",
            traced_kernel="nvjet_sm90_x_TNT",
            traced_overlap=0.6,
            traced_min_us=95.0,
            traced_max_us=100.5,
        )
    }
    runs = {"eager": _run(1.01, 0), "graph": _run(1.0, 0)}
    text, ok = rg.report(runs, specs)
    assert ok and "| mm | m=1 n=1 k=1 | 100.0 | nvjet_sm90_x_TNT |" in text
    assert "## GEMMs apart" in text
    assert "| eager | overlapped a collective | 1 | 1 |" in text
    assert "| eager | ran alone | 0 | 0 |" in text
    # Replayed 101 µs (eager) and 100 µs (graph) against a traced range of 95-100.5 µs.
    assert "| eager | 1 | 0 |" in text and "| graph | 1 | 1 |" in text
    assert runs["graph"]["gemms_inside_traced_range"] == [1, 1]


def test_the_gemm_gap_report_has_every_candidate_per_gemm_and_a_summary():
    from collections import Counter
    from types import SimpleNamespace

    from bench import gemm_gap_gpu as gap

    spec = SimpleNamespace(params={"m": 64, "n": 32, "k": 16, "b_transposed": True})
    gemms = [{"name": "mm", "spec": spec, "traced_us": 100.0, "traced_kernel": "nvjet_a_TNT"}]
    measured = {(0, c): ([100.0 + i, 102.0 + i, 104.0 + i], Counter({"nvjet_b_TNT": 3}))
                for i, c in enumerate(gap.CANDIDATES)}  # fmt: skip
    text = gap.report(gemms, measured, {"maestro, data uniform": {"mm": 1.05}})
    assert "| mm | 64x32x16 BT | 100.0 | 1.020 | 1.030 | 1.040 |" in text
    assert text.count("\n| ") >= 1 + len(gap.CANDIDATES) + 1
    assert "| uniform, L2 cold | 1 | 1 | 1 | 1.020 |" in text
    assert "| maestro, data uniform | 1 | 0 | 1 | 1.050 |" in text
    assert "| mm | nvjet_a_TNT | nvjet_b_TNT | replayed b; traced a |" in text


def test_the_gemm_gap_report_names_the_words_two_kernels_differ_in():
    from bench import gemm_gap_gpu as gap

    traced = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT"
    replayed = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopB_TNT"
    words = "replayed 128x256, 2x1, v, coopB; traced 256x128, 1x2, h, coopA, bias"
    assert gap.word_difference(traced, replayed) == words
    assert gap.word_difference(traced, traced) == "same"
    assert gap.word_difference(traced, "") == gap.word_difference("", replayed) == "unknown"


def test_the_gemm_gap_bench_finds_every_traced_gemm():
    from bench import gemm_gap_gpu as gap

    gemms, suite = gap.traced_gemms(gap.TRACE)
    assert len(gemms) == 24 and suite.world_size == 1
    assert all(g["traced_kernel"].startswith("nvjet") and g["traced_us"] > 0 for g in gemms)


def test_the_gemm_gap_bench_attributes_kernels_to_their_annotated_launch(tmp_path):
    """Each timed launch runs inside a ``gap|gemm|candidate`` annotation; its kernels (not the
    L2 flush launched before it) are its time, read with maestro's trace reader."""
    from bench import gemm_gap_gpu as gap

    from .replay_traces import TraceBuilder

    b = TraceBuilder(rank=0, world_size=1, distributed=False)
    b.step(1, 0, 1000)
    b.launch(stream=7, launch=5, start=10, dur=50, kernel="flush")  # outside any annotation
    b.annotate("gap|0|1", 20, 30)
    b.launch(stream=7, launch=22, start=61, dur=160, kernel="nvjet_x")
    b.annotate("gap|0|1", 40, 50)
    b.launch(stream=7, launch=42, start=222, dur=170, kernel="nvjet_x")
    path = b.write(tmp_path, gz=False)
    found = gap._attribute(path)
    assert list(found) == [(0, gap.CANDIDATES[1])]
    us, names = found[(0, gap.CANDIDATES[1])]
    assert us == [160, 170] and names == {"nvjet_x": 2}
