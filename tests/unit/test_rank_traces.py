"""Per-rank Kineto-style traces: CUPTI-shaped records through maestro's own attribution and
writer, read back by HolisticTraceAnalysis (no GPU)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from bench.aggregate_scale import simulate_ranks
from tests.hta_support import load_traces
from userbenchmark.maestro.core.analysis.aggregate import local_summary
from userbenchmark.maestro.core.analysis.intervals import API_DRIVER, API_RUNTIME, WindowTimings
from userbenchmark.maestro.core.analysis.records import (
    BlockResult,
    PatternOutcome,
    PatternResult,
    RankTimeline,
    Timeline,
)
from userbenchmark.maestro.core.output.trace import (
    TRACES_DIR,
    build_rank_traces,
    rank_trace_texts,
    stale_rank_files,
)
from userbenchmark.maestro.core.output.writer import OutputWriter
from userbenchmark.maestro.core.profilers.attribution import (
    GATE_BLOCK,
    KIND_KERNEL,
    KIND_MEMCPY,
    ActivityRecords,
    ApiRecords,
    ExternalCorrelation,
    attribute,
    encode_external_id,
    window_activities,
)

AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas"
)
COPY = "Memcpy DtoD (Device -> Device)"
GATE_SPIN = "void at::cuda::(anonymous namespace)::spin_kernel(long)"
ALIGN = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NAMES = (AG, RS, GEMM, COPY, GATE_SPIN, ALIGN)
BLOCKS = ("allgather", "gemm", "reduce_scatter", "copy")
OPS = ("all_gather", "gemm", "reduce_scatter", "copy")
LANES = ("dp", "tp", "dp", "io")
CATEGORIES = ("comm", "compute", "comm", "other")
CBIDS = {(API_RUNTIME, 211): "cudaLaunchKernel", (API_DRIVER, 703): "cuLaunchKernelEx"}
NUM_ITERS = 6
WINDOW = 3
BASE_NS = 1_760_000_000_123_456_789  # CUPTI timestamps are CLOCK_REALTIME ns


class _Window:
    """CUPTI-shaped records of one rank's window: API calls, external ids, activities."""

    def __init__(self) -> None:
        self.corr = 100
        self.act: list[tuple] = []  # (corr, start, end, kind, stream, name, bytes, grid)
        self.api: list[tuple] = []  # (corr, start, end, cbid, thread, api)
        self.ext: list[tuple[int, int]] = []

    def launch(self, block, it, host_ns, kind, name, start, dur, stream, api, cbid, nbytes=0):
        self.corr += 1
        self.ext.append((self.corr, encode_external_id(WINDOW, block, it)))
        self.api.append((self.corr, host_ns, host_ns + 2_345, cbid, 4242, api))
        grid = (132, 1, 1) if kind == KIND_KERNEL else (0, 0, 0)
        self.act.append(
            (self.corr, start, start + dur, kind, stream, NAMES.index(name), nbytes, grid)
        )

    def records(self):
        a = self.act
        col = lambda i, dtype: np.array([r[i] for r in a], dtype=dtype)  # noqa: E731
        grid = np.array([r[7] for r in a], dtype=np.int32)
        records = ActivityRecords(
            correlation_id=col(0, np.uint64),
            start_ns=col(1, np.int64),
            end_ns=col(2, np.int64),
            kind=col(3, np.uint8),
            stream_id=col(4, np.int64),
            device_id=np.zeros(len(a), np.int32),
            size_bytes=col(6, np.int64),
            grid_x=grid[:, 0],
            grid_y=grid[:, 1],
            grid_z=grid[:, 2],
            block_x=np.where(grid[:, 0] > 0, 256, 0).astype(np.int32),
            block_y=np.zeros(len(a), np.int32),
            block_z=np.zeros(len(a), np.int32),
        )
        api = ApiRecords(
            correlation_id=np.array([r[0] for r in self.api], np.int64),
            start_ns=np.array([r[1] for r in self.api], np.int64),
            end_ns=np.array([r[2] for r in self.api], np.int64),
            cbid=np.array([r[3] for r in self.api], np.int32),
            thread_id=np.array([r[4] for r in self.api], np.int64),
            api=np.array([r[5] for r in self.api], np.uint8),
        )
        ext = ExternalCorrelation(
            correlation_id=np.array([c for c, _ in self.ext], np.uint64),
            external_id=np.array([e for _, e in self.ext], np.uint64),
        )
        return records, ext, api, col(5, np.int32)


def rank_window(rank: int, seed: int) -> _Window:
    """One rank's iterations: gate work, then all_gather || gemm, reduce_scatter after the
    all_gather on the same stream (partly under the gemm), and a copy on its own stream."""
    rng = np.random.default_rng(seed)
    w = _Window()
    for it in range(NUM_ITERS):
        t0 = BASE_NS + it * 1_000_000 + rank * 3_217
        host = t0 - 80_000
        w.launch(GATE_BLOCK, it, host, KIND_KERNEL, ALIGN, t0, 9_000, 20, API_DRIVER, 703)
        w.launch(GATE_BLOCK, it, host + 5_000, KIND_KERNEL, GATE_SPIN, t0 + 9_000, 40_000, 20,
                 API_RUNTIME, 211)  # fmt: skip
        gate = t0 + 49_000
        ag_start = gate + 1_111 + int(rng.integers(0, 20_000))
        ag_dur = 180_000 + int(rng.integers(0, 40_000))
        w.launch(0, it, host + 10_000, KIND_KERNEL, AG, ag_start, ag_dur, 13, API_DRIVER, 703)
        gemm_start = gate + 60_000 + int(rng.integers(0, 50_000)) + rank * 25_000
        w.launch(1, it, host + 20_000, KIND_KERNEL, GEMM, gemm_start, 230_321, 14,
                 API_RUNTIME, 211)  # fmt: skip
        rs_start = ag_start + ag_dur + 1_517
        w.launch(2, it, host + 30_000, KIND_KERNEL, RS, rs_start, 140_000 + 977 * it, 13,
                 API_DRIVER, 703)  # fmt: skip
        w.launch(3, it, host + 40_000, KIND_MEMCPY, COPY, gate + 600_013, 20_000, 15,
                 API_RUNTIME, 8, nbytes=4 << 20)  # fmt: skip
    return w


def block_result(pattern: str, b: int) -> BlockResult:
    return BlockResult(
        suite="s", pattern=pattern, block=BLOCKS[b], op=OPS[b], axis="x", lane=LANES[b],
        team_size=2, dtype="bf16", size_bytes=None, iters=NUM_ITERS, latency_avg_us=1.0,
        latency_min_us=1.0, latency_max_us=1.0, latency_p50_us=1.0, latency_p99_us=1.0,
        latency_stdev_us=0.0,
    )  # fmt: skip


def cupti_outcome(pattern: str, seed: int) -> PatternOutcome:
    """Two ranks' records attributed and aggregated by maestro, as the runtime does."""
    is_comm = np.array([c == "comm" for c in CATEGORIES])
    is_compute = np.array([c == "compute" for c in CATEGORIES])
    present = np.ones(len(BLOCKS), dtype=bool)
    summaries, ranks = [], []
    for rank in range(2):
        records, ext, api, name_index = rank_window(rank, seed + rank).records()
        att = attribute(
            records, ext, window_id=WINDOW, num_blocks=len(BLOCKS), num_iters=NUM_ITERS,
            per_activity=True,
        )  # fmt: skip
        acts = window_activities(
            records, att, name_index=name_index, names=NAMES, api=api,
            api_name=lambda code, cbid: CBIDS.get((code, cbid)),
        )  # fmt: skip
        timings = WindowTimings(
            starts_ns=att.start_ns, ends_ns=att.end_ns, present=present, clock="cupti",
            gate_open_ns=att.gate_end_ns, activities=acts,
        )  # fmt: skip
        summaries.append(
            local_summary(
                timings,
                lane_of_block=[0, 1, 0, 2],
                is_comm=is_comm,
                is_compute=is_compute,
                rank=rank,
                world_size=2,
                shared_clock=True,
            )  # fmt: skip
        )
        ranks.append(
            RankTimeline(
                rank=rank,
                starts_ns=att.start_ns,
                ends_ns=att.end_ns,
                present=present,
                clock="cupti",
                activities=acts,
            )  # fmt: skip
        )
    agg = simulate_ranks(summaries)
    timeline = Timeline(
        pattern=pattern, block_names=BLOCKS, block_lanes=LANES, ranks=tuple(ranks),
        shared_clock=True, block_categories=CATEGORIES, backend="nccl",
    )  # fmt: skip
    result = PatternResult(
        suite="s", pattern=pattern, iters=NUM_ITERS, num_blocks=len(BLOCKS),
        makespan_avg_us=1.0, makespan_p99_us=1.0,
        comm_compute_overlap=agg.comm_compute_overlap,
    )  # fmt: skip
    return PatternOutcome(
        blocks=tuple(block_result(pattern, b) for b in range(len(BLOCKS))),
        pattern=result,
        timeline=timeline,
        comm_compute_overlap_by_rank=tuple(float(v) for v in agg.comm_compute_overlap_by_rank),
    )


def write_traces(folder: Path, outcomes) -> Path:
    traces = folder / TRACES_DIR
    traces.mkdir(parents=True, exist_ok=True)
    for name, text in rank_trace_texts(outcomes).items():
        (traces / name).write_text(text)
    return traces


@pytest.fixture
def exact_times(monkeypatch):
    # HTA rounds fractional-µs timestamps inward unless told not to (docs/outputs-trace-plot.md).
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")


def hta_overlap(analysis) -> dict[int, float]:
    table = analysis.get_comm_comp_overlap(visualize=False)
    return {int(r): float(p) / 100.0 for r, p in zip(table["rank"], table["comp_comm_overlap_pctg"], strict=True)}  # fmt: skip


def test_hta_reads_cupti_records_with_maestros_overlap_and_kernel_names(tmp_path, exact_times):
    outcome = cupti_outcome("ag_gemm_rs", seed=1)
    maestro = outcome.comm_compute_overlap_by_rank
    assert all(0.05 < v < 0.95 for v in maestro), maestro  # partial overlap on both ranks
    assert maestro[0] != pytest.approx(maestro[1], abs=0.01)
    traces = write_traces(tmp_path, [outcome])
    analysis, warnings = load_traces(traces)
    assert warnings == []
    assert analysis.t.get_ranks() == [0, 1]
    for rank in (0, 1):
        assert analysis.t.get_iterations(rank) == list(range(NUM_ITERS))
    hta = hta_overlap(analysis)
    for rank in (0, 1):
        assert hta[rank] == pytest.approx(maestro[rank], rel=0.01)
    _, kernels = analysis.get_gpu_kernel_breakdown(visualize=False, num_kernels=100)
    by_type = {t: set(kernels.loc[kernels["kernel_type"] == t, "name"]) for t in set(kernels["kernel_type"])}  # fmt: skip
    assert by_type["COMMUNICATION"] == {AG, RS}  # the gate's all_reduce is harness: absent
    assert by_type["COMPUTATION"] == {GEMM}  # and so is its spin kernel
    assert by_type["MEMORY"] == {COPY}
    # Every kernel of every iteration: the file's last measured step is kept.
    sym = analysis.t.symbol_table.get_sym_id_map()
    for rank in (0, 1):
        df = analysis.t.get_trace(rank)
        assert int((df["name"] == sym[GEMM]).sum()) == NUM_ITERS


def test_device_events_carry_cupti_fields_and_maestros_attribution(tmp_path):
    outcome = cupti_outcome("ag_gemm_rs", seed=2)
    docs = build_rank_traces([outcome])
    assert sorted(docs) == [0, 1]
    for rank, doc in docs.items():
        keys = list(doc)
        assert keys.index("distributedInfo") < keys.index("traceEvents")
        assert doc["distributedInfo"] == {"backend": "nccl", "rank": rank, "world_size": 2}
        assert re.search(r'"rank":\s+(\d+)', json.dumps(doc)).group(1) == str(rank)
        events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        device = [e for e in events if "stream" in e["args"]]
        assert {e["cat"] for e in device} == {"kernel", "gpu_memcpy"}
        assert len(device) == NUM_ITERS * len(BLOCKS)
        cpu_corr = {e["args"]["correlation"] for e in events if e["cat"] in ("cuda_runtime", "cuda_driver")}  # fmt: skip
        for e in device:
            args = e["args"]
            assert isinstance(args["stream"], int) and args["stream"] >= 1
            assert isinstance(args["correlation"], int) and args["correlation"] in cpu_corr
            assert args["block"] in BLOCKS and 0 <= args["pattern_iteration"] < NUM_ITERS
            assert (
                args["pattern"] == "ag_gemm_rs" and args["op"] == OPS[BLOCKS.index(args["block"])]
            )
            if e["cat"] == "kernel":
                assert args["grid"] == [132, 1, 1] and args["block dims"] == [256, 0, 0]
            else:
                assert args["bytes"] == 4 << 20 and e["name"] == COPY
        launches = {e["name"]: e["cat"] for e in events if e["cat"].startswith("cuda_")}
        # The copy's call (cbid 8) has no name from CUPTI here: a generic runtime name.
        assert launches == {
            "cudaLaunchKernel": "cuda_runtime",
            "cuLaunchKernelEx": "cuda_driver",
            "cudaMemcpyAsync": "cuda_runtime",
        }
        # Harness work is not written; nothing without a block has a stream.
        assert not any(e["name"] in (GATE_SPIN, ALIGN) for e in events)
        steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
        assert [e["name"] for e in steps] == [f"ProfilerStep#{k}" for k in range(NUM_ITERS + 1)]
        assert all("stream" not in e["args"] for e in steps)
        for k, step in enumerate(steps[:-1]):  # each step holds its iteration's launches
            mine = [
                e
                for e in events
                if e["cat"].startswith("cuda_") and e["args"]["pattern_iteration"] == k
            ]
            assert all(step["ts"] <= e["ts"] < step["ts"] + step["dur"] for e in mine)
        annotations = [e for e in events if e["cat"] == "gpu_user_annotation"]
        assert len(annotations) == NUM_ITERS * len(BLOCKS)
        (pattern,) = doc["maestroPatterns"]
        assert pattern["comm_compute_overlap"] == pytest.approx(outcome.comm_compute_overlap_by_rank[rank])  # fmt: skip
        assert pattern["ranks_share_a_clock"] is True and pattern["num_steps"] == NUM_ITERS
        assert doc["maestro"]["comm_compute_overlap"] == pytest.approx(pattern["comm_compute_overlap"])  # fmt: skip
        assert all(e["ts"] >= 0 for e in events)
        json.dumps(doc, allow_nan=False)


def test_several_patterns_one_after_another_match_hta_over_the_whole_file(tmp_path, exact_times):
    outcomes = [cupti_outcome("first", seed=3), cupti_outcome("second", seed=5)]
    traces = write_traces(tmp_path, outcomes)
    docs = {r: json.loads((traces / f"rank{r}.json").read_text()) for r in (0, 1)}
    for rank, doc in docs.items():
        first, second = doc["maestroPatterns"]
        assert second["start_us"] >= first["start_us"] + first["span_us"] + 10.0
        assert (first["first_step"], second["first_step"]) == (0, NUM_ITERS)
        for meta, outcome in zip((first, second), outcomes, strict=True):
            assert meta["comm_compute_overlap"] == pytest.approx(outcome.comm_compute_overlap_by_rank[rank])  # fmt: skip
    analysis, warnings = load_traces(traces)
    assert warnings == []
    assert analysis.t.get_iterations(0) == list(range(2 * NUM_ITERS))
    hta = hta_overlap(analysis)
    for rank, doc in docs.items():
        whole = doc["maestro"]["comm_compute_overlap"]
        assert hta[rank] == pytest.approx(whole, rel=0.01)
        per_pattern = [p["comm_compute_overlap"] for p in doc["maestroPatterns"]]
        assert min(per_pattern) - 1e-9 <= whole <= max(per_pattern) + 1e-9


def cpu_outcome(
    pattern: str = "cpu", clock: str = "perf_counter", shared: bool = True
) -> PatternOutcome:
    starts = np.zeros((len(BLOCKS), NUM_ITERS), dtype=np.int64)
    ends = np.zeros_like(starts)
    for it in range(NUM_ITERS):
        t0 = 5_000_000_000 + it * 2_000_000
        for b in range(len(BLOCKS)):
            starts[b, it] = t0 + b * 100_321
            ends[b, it] = starts[b, it] + 400_777
    ranks = tuple(
        RankTimeline(
            rank=r,
            starts_ns=starts + r * 999,
            ends_ns=ends + r * 999,
            present=np.ones(len(BLOCKS), bool),
            clock=clock,
        )  # fmt: skip
        for r in range(2)
    )
    timeline = Timeline(
        pattern=pattern, block_names=BLOCKS, block_lanes=LANES, ranks=ranks,
        shared_clock=shared, block_categories=CATEGORIES, backend="gloo",
    )  # fmt: skip
    result = PatternResult(
        suite="s", pattern=pattern, iters=NUM_ITERS, num_blocks=len(BLOCKS),
        makespan_avg_us=1.0, makespan_p99_us=1.0,
    )  # fmt: skip
    return PatternOutcome(
        blocks=tuple(block_result(pattern, b) for b in range(len(BLOCKS))),
        pattern=result,
        timeline=timeline,
        comm_compute_overlap_by_rank=(0.5, math.nan),
    )


def test_cpu_blocks_are_user_annotations_without_a_stream(tmp_path):
    docs = build_rank_traces([cpu_outcome()])
    for doc in docs.values():
        events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        assert not any("stream" in e["args"] or "correlation" in e["args"] for e in events)
        blocks = [e for e in events if e["name"] in BLOCKS]
        assert len(blocks) == NUM_ITERS * len(BLOCKS)
        assert {e["cat"] for e in blocks} == {"user_annotation"}
        assert not any(e["name"].startswith("nccl") for e in events)
        assert doc["distributedInfo"]["backend"] == "gloo"
    assert docs[1]["maestroPatterns"][0]["comm_compute_overlap"] is None  # NaN: JSON null
    analysis, warnings = load_traces(write_traces(tmp_path, [cpu_outcome()]))
    assert warnings == []
    assert analysis.t.get_ranks() == [0, 1]
    assert analysis.t.get_iterations(1) == list(range(NUM_ITERS))
    table = analysis.get_comm_comp_overlap(visualize=False)
    assert list(table["rank"]) == [0, 1]  # computed; NaN: HTA sees no GPU kernel


def test_every_rank_gets_a_file_and_stale_rank_files_are_named(tmp_path):
    outcome = cpu_outcome()
    absent = RankTimeline(
        rank=2, starts_ns=np.zeros((len(BLOCKS), NUM_ITERS), np.int64),
        ends_ns=np.zeros((len(BLOCKS), NUM_ITERS), np.int64),
        present=np.zeros(len(BLOCKS), bool), clock="perf_counter",
    )  # fmt: skip
    timeline = outcome.timeline
    three = PatternOutcome(
        blocks=outcome.blocks,
        pattern=outcome.pattern,
        timeline=Timeline(
            pattern=timeline.pattern,
            block_names=BLOCKS,
            block_lanes=LANES,
            ranks=(*timeline.ranks, absent),
            shared_clock=True,
            block_categories=CATEGORIES,
            backend="gloo",
        ),  # fmt: skip
    )
    texts = rank_trace_texts([three])
    assert sorted(texts) == ["rank0.json", "rank1.json", "rank2.json"]
    empty = json.loads(texts["rank2.json"])
    assert empty["maestroPatterns"] == [] and empty["distributedInfo"]["world_size"] == 3
    folder = tmp_path / TRACES_DIR
    folder.mkdir()
    for name in ("rank0.json", "rank7.json", "notes.json", "rank1.json.tmp"):
        (folder / name).write_text("{}")
    assert stale_rank_files(folder, ["rank0.json"]) == [folder / "rank7.json"]


def test_writer_rewrites_rank_files_after_each_pattern(tmp_path):
    out = tmp_path / "out"
    (out / TRACES_DIR).mkdir(parents=True)
    (out / TRACES_DIR / "rank5.json").write_text("{}")  # an earlier run's rank
    writer = OutputWriter(output_dir=out, metrics_path=None, environ={}, trace=True)
    writer.add(cpu_outcome("one"))
    assert sorted(p.name for p in (out / TRACES_DIR).iterdir()) == ["rank0.json", "rank1.json"]
    writer.add(cpu_outcome("two"))
    doc = json.loads((out / TRACES_DIR / "rank0.json").read_text())
    assert [p["pattern"] for p in doc["maestroPatterns"]] == ["one", "two"]
    assert not (out / "trace.json").exists()  # per-rank files only


def test_hta_parsing_every_arg_gives_columns_to_filter_kernels_by_block(tmp_path):
    from hta.configs.parser_config import ParserConfig

    traces = write_traces(tmp_path, [cupti_outcome("ag_gemm_rs", seed=4)])
    saved = ParserConfig.get_default_cfg()
    ParserConfig.set_default_cfg(ParserConfig(parse_all_args=True))
    try:
        analysis, warnings = load_traces(traces)
    finally:
        ParserConfig.set_default_cfg(saved)
    assert warnings == []
    df = analysis.t.get_trace(1)
    sym = analysis.t.symbol_table.get_sym_id_map()
    gemm = df[df["name"] == sym[GEMM]]
    assert set(gemm["block"]) == {"gemm"} and set(gemm["op"]) == {"gemm"}
    assert sorted(gemm["pattern_iteration"]) == list(range(NUM_ITERS))
    assert sorted(gemm["iteration"]) == list(range(NUM_ITERS))  # HTA's: the ProfilerStep


def test_ranks_without_a_shared_clock_each_start_at_their_own_first_event():
    # CUDA events (the events profiler) count from each rank's own reference.
    docs = build_rank_traces([cpu_outcome("ev", clock="cuda_event", shared=False)])
    for doc in docs.values():
        (span,) = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "ev"]
        assert span["ts"] == 0.0
        assert doc["maestroPatterns"][0]["ranks_share_a_clock"] is False
        assert doc["maestro"]["ranks_share_a_clock"] is False
    shared = build_rank_traces([cpu_outcome("ev")])
    first = [
        next(e["ts"] for e in d["traceEvents"] if e.get("name") == "ev") for d in shared.values()
    ]
    assert first == [0.0, 0.999]  # rank 1 started 999 ns later on the same clock
