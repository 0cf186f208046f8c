"""The NCCL path across ranks: overlap, bandwidth against a hand loop, options, check.

Ranks run one per GPU where there are enough GPUs, or several on one GPU in NCCL's
multi-rank mode (``NCCL_MULTI_RANK_GPU_ENABLE=1``, NCCL >= 2.30.7): then every functional
assertion holds and the assertions about speed skip, since ranks that time-share a GPU
describe nothing real. ``MAESTRO_GPU_WORLD=N`` picks the world size of the world-size
dependent tests (default: 2 for the first group, 8 or 4 for the second). Commands are in
docs/multi-gpu.md.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.gpu.device_limits import assert_sane_speed, peak_tflops  # noqa: E402
from tests.integration.helpers import (  # noqa: E402
    NCCL_TESTS_BUS_FACTOR,
    REPO_ROOT,
    by_block,
    pair_overlaps,
    read_records,
    run_maestro,
)
from userbenchmark.maestro.core.config.loader import (  # noqa: E402
    CONFIGS_DIR,
    listed_world_sizes,
    load_suite,
)

COMM_OPS = frozenset(NCCL_TESTS_BUS_FACTOR)

NUM_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


SHARED_GPU = NUM_GPUS >= 1 and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"
"""Several ranks may share a GPU (NCCL's multi-rank mode, NCCL 2.30 or newer). Whoever sets
the variable loads such an NCCL: torch.cuda.nccl.version() reports the NCCL torch was built
against, not the one a preload put in its place, so it cannot tell."""


def runnable(world: int) -> bool:
    return world <= NUM_GPUS or SHARED_GPU


def shares_gpus(world: int) -> bool:
    return world > NUM_GPUS


SMALL_WORLD = int(os.environ.get("MAESTRO_GPU_WORLD", "2"))
BIG_WORLD = int(os.environ.get("MAESTRO_GPU_WORLD", "8" if runnable(8) else "4"))
"""World size of the second group: the stated 8 where 8 ranks can run, else the 4-rank variants."""
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not runnable(2),
        reason="needs 2 or more CUDA GPUs, or NCCL_MULTI_RANK_GPU_ENABLE=1 with NCCL >= 2.30.7",
    ),
]
needs_4 = pytest.mark.skipif(not runnable(4), reason="needs 4 ranks (GPUs or a shared GPU)")


def speed(world: int):
    """Skip an assertion about speed where ranks time-share GPUs."""
    return pytest.mark.skipif(
        shares_gpus(world),
        reason=f"{world} ranks share {NUM_GPUS} GPU(s): timings describe nothing real",
    )


KEEP = os.environ.get("MAESTRO_GPU_OUT")
# NVLink SHARP (multicast) stays off: the machines these run on do not support it.
ENV = {"NCCL_NVLS_ENABLE": "0"}
SIZES = ("1M", "4M", "16M", "64M", "256M", "1G")
MIB = 1 << 20
COMPARE_FROM_BYTES = 64 * MIB
"""From this size up the GPU time dominates launch costs: maestro and the loop must agree."""
RATIO_TOLERANCE = 0.03
SLOWDOWN_FLOOR = 0.9
"""No block runs faster overlapped than alone beyond a GPU's run-to-run noise."""
BIG_GEMM_SHARE = 0.2
"""A GEMM of 8192 rows or more in bf16 reaches at least this share of the device's peak."""
SHARED_GPU_MAX_CTAS = "2"
"""CTAs per NCCL kernel where ranks share a GPU and many collectives run at once. A collective's
kernels on every rank must be resident together to progress; seven communicators of 4-8 ranks
at NCCL's default channel counts can fill the SMs with kernels waiting for peers that cannot
start (seen: a broadcast that never finished at 4 ranks). Capped, they fit."""
STANDALONE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def _here(name: str) -> str:
    return str(Path(__file__).with_name(name))


def _run(
    tmp_path: Path,
    tag: str,
    config: str,
    nproc: int,
    *,
    extra: tuple[str, ...] = (),
    profiler: str = "auto",
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> Path:
    """Run maestro on `nproc` ranks (one GPU each, or sharing GPUs); return its output folder.

    Where ranks share a GPU only correctness is checked, so iterations are few.
    """
    out = Path(KEEP) / f"multi-{tag}" if KEEP else tmp_path / tag
    args = ["run", "-c", config, "--nproc", str(nproc), "--profiler", profiler]
    args += ["--output-dir", str(out), "--no-metrics", *extra]
    if shares_gpus(nproc) and "--iters" not in extra:
        args += ["--iters", "4", "--warmup-iters", "2"]
    proc = run_maestro(args, timeout=timeout, env={**ENV, **(env or {})})
    print(proc.stdout)
    print(proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _patterns(out: Path) -> dict[str, dict]:
    return {p["pattern"]: p for p in read_records(out, "patterns.json")}


def _timed(rec: dict) -> bool:
    return not rec["notes"].startswith("not timed")


def _whole_activities(rec: dict) -> None:
    # Warmup leaking into the window would add a fraction per iteration (e.g. 5 / 20 = 0.25).
    per_iter = rec["activities_per_iter"]
    assert per_iter is not None and per_iter >= 1, rec
    assert per_iter == pytest.approx(round(per_iter), abs=1e-9), rec


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


# --- a. the seed's all_gather || reduce_scatter -------------------------------------------


@pytest.fixture(scope="module")
def ag_rs_runs(tmp_path_factory):
    pytest.importorskip("cupti")
    tmp = tmp_path_factory.mktemp("ag_rs")
    assert SMALL_WORLD in listed_world_sizes(CONFIGS_DIR / "ag_rs.yaml")
    return {
        "4M": _run(tmp, "ag_rs", "ag_rs", SMALL_WORLD, profiler="cupti"),
        "sweep": _run(
            tmp, "ag_rs_sweep", _here("multi_ag_rs_sweep.yaml"), SMALL_WORLD, profiler="cupti"
        ),
    }


def _check_ag_rs_pattern(out: Path, pattern: str) -> list[list]:
    blocks = by_block(read_records(out), pattern)
    assert set(blocks) == {"allgather", "reduce_scatter"}, blocks
    rows = []
    for name, rec in blocks.items():
        assert rec["team_size"] == SMALL_WORLD and rec["profiler"] == "cupti", rec
        assert rec["ranks_per_gpu"] == (SMALL_WORLD if shares_gpus(SMALL_WORLD) else 1), rec
        _whole_activities(rec)
        assert rec["latency_avg_us"] > 0 and _finite(rec["isolated_latency_avg_us"]), rec
        assert _finite(rec["slowdown"]) and rec["slowdown"] > 0, rec
        if not shares_gpus(SMALL_WORLD):
            assert_sane_speed(rec)
            assert rec["slowdown"] >= SLOWDOWN_FLOOR, rec  # sharing links never speeds one up
        rows.append([pattern, name, rec["latency_avg_us"], rec["isolated_latency_avg_us"]])
        rows[-1] += [rec["slowdown"], rec["activities_per_iter"]]
    pairs = pair_overlaps(out)
    assert 0.0 <= pairs[(pattern, "allgather", "reduce_scatter")] <= 1.0, pairs
    return rows


def test_ag_rs_4m_alone_and_overlapped(ag_rs_runs):
    for row in _check_ag_rs_pattern(ag_rs_runs["4M"], "ag_rs"):
        print(row)


def test_ag_rs_sweep_1m_to_1g(ag_rs_runs):
    print("pattern, block, overlapped us, isolated us, slowdown, activities/iter")
    for size in SIZES:
        for row in _check_ag_rs_pattern(ag_rs_runs["sweep"], f"ag_rs[size={size}]"):
            print(row)
    if shares_gpus(SMALL_WORLD):
        return
    records, pairs = read_records(ag_rs_runs["sweep"]), pair_overlaps(ag_rs_runs["sweep"])
    for name in ("allgather", "reduce_scatter"):
        rec = {size: by_block(records, f"ag_rs[size={size}]")[name] for size in SIZES}
        alone = [rec[size]["isolated_latency_avg_us"] for size in SIZES[2:]]  # from 16M
        assert alone == sorted(alone) and len(set(alone)) == len(alone), (name, alone)
        assert rec["1G"]["algbw_gbps"] > 2 * rec["1M"]["algbw_gbps"], (name, rec)
    for size in SIZES[3:]:  # from 64M both run long enough to be in flight together
        assert pairs[(f"ag_rs[size={size}]", "allgather", "reduce_scatter")] > 0.5, pairs


# --- b. standalone collectives against a hand-written CUDA-event loop ----------------------


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("standalone")
    out = _run(tmp, "standalone", _here("multi_standalone.yaml"), SMALL_WORLD)
    loop_json = (Path(KEEP) if KEEP else tmp) / "nccl_event_loop.json"
    loop_json.parent.mkdir(parents=True, exist_ok=True)
    if shares_gpus(SMALL_WORLD):
        return read_records(out), {}  # no speed reference where ranks share a GPU
    cmd = [sys.executable, str(REPO_ROOT / "bench" / "nccl_event_loop.py"), "--nproc", "2"]
    cmd += ["--ops", ",".join(STANDALONE_OPS), "--sizes", ",".join(SIZES)]
    cmd += ["--dtype", "bf16", "--iters", "20", "--warmup-iters", "5", "--json", str(loop_json)]
    env = {**os.environ, **ENV}
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    print(proc.stdout, proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    loop = json.loads(loop_json.read_text())["results"]
    return read_records(out), {(r["op"], r["size_bytes"]): r for r in loop}


@speed(SMALL_WORLD)
@pytest.mark.parametrize("op", STANDALONE_OPS)
def test_standalone_busbw_matches_event_loop(standalone, op):
    records, loop = standalone
    recs = sorted((r for r in records if r["op"] == op), key=lambda r: r["size_bytes"])
    assert len(recs) == len(SIZES), [r["pattern"] for r in recs]
    print(f"{op}: size, maestro busbw, loop busbw, ratio")
    failures = []
    for rec in recs:
        ref = loop[(op, rec["size_bytes"])]
        ratio = rec["busbw_gbps"] / ref["busbw_gbps"]
        print(rec["size_bytes"], rec["busbw_gbps"], ref["busbw_gbps"], round(ratio, 4))
        if rec["size_bytes"] >= COMPARE_FROM_BYTES and abs(ratio - 1) > RATIO_TOLERANCE:
            failures.append((rec["size_bytes"], ratio))
    assert not failures, f"{op}: busbw ratio maestro / loop off by more than 3%: {failures}"


def test_standalone_busbw_is_algbw_times_nccl_tests_factor(standalone):
    records, _ = standalone
    assert {r["op"] for r in records} == set(STANDALONE_OPS)
    for rec in records:
        factor = NCCL_TESTS_BUS_FACTOR[rec["op"]](rec["team_size"])
        assert rec["busbw_gbps"] == pytest.approx(rec["algbw_gbps"] * factor, rel=1e-9), rec
        seconds = rec["latency_avg_us"] * 1e-6
        assert rec["algbw_gbps"] == pytest.approx(rec["size_bytes"] / seconds / 1e9, rel=1e-9)


# --- c. FSDP-like all_gather || reduce_scatter || GEMM -------------------------------------


def test_fsdp_at_2_ranks(tmp_path):
    assert SMALL_WORLD in listed_world_sizes(CONFIGS_DIR / "fsdp.yaml")
    out = _run(tmp_path, "fsdp2", "fsdp", SMALL_WORLD)
    suite = load_suite("fsdp", world_size=SMALL_WORLD)
    records = read_records(out)
    assert {(r["pattern"], r["block"]) for r in records} == {
        (p.name, b.name) for p in suite.patterns for b in p.blocks
    }
    real = not shares_gpus(SMALL_WORLD)
    for rec in records:
        assert _finite(rec["slowdown"]) and rec["slowdown"] > 0, rec
        _whole_activities(rec)
        if real:
            assert_sane_speed(rec)
            assert rec["slowdown"] >= SLOWDOWN_FLOOR, rec
        if real and rec["op"] == "gemm":  # 8192 x 4096 x 11008 bf16: no launch-bound GEMM
            assert rec["tflops"] >= BIG_GEMM_SHARE * peak_tflops(), rec
    for name, pat in _patterns(out).items():
        print(name, pat["overlap_efficiency"], pat["shared_busbw_gbps"], pat["makespan_avg_us"])
        assert _finite(pat["shared_busbw_gbps"]) and pat["shared_busbw_gbps"] > 0, pat
        if real:  # time-shared ranks may leave no headroom to judge
            assert _finite(pat["overlap_efficiency"]), pat
            assert (pat["overlap_efficiency_ci_low"] or 0.0) <= 1.0, pat  # makespan < ideal
            assert pat["makespan_avg_us"] >= max(
                r["latency_avg_us"] for r in records if r["pattern"] == name
            ), pat  # the makespan spans every block of the iteration


# --- d. per-axis options: CTA limits and stream priority -----------------------------------


@pytest.fixture(scope="module")
def axis_options(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("axis_options")
    return read_records(
        _run(tmp, "axis_options", _here("multi_axis_options.yaml"), SMALL_WORLD, profiler="cupti")
    )


def test_max_ctas_reaches_the_communicator(axis_options):
    # The axis's nccl: {max_ctas: N} shows in the grid of its NCCL kernels (CUPTI).
    low = by_block(axis_options, "ctas_low")["allreduce"]
    high = by_block(axis_options, "ctas_high")["allreduce"]
    print("kernel CTAs max_ctas=1:", low["kernel_ctas_max"], "32:", high["kernel_ctas_max"])
    assert low["kernel_ctas_max"] == 1, low
    assert 1 <= high["kernel_ctas_max"] <= 32, high


@speed(SMALL_WORLD)
def test_max_ctas_1_is_slower_than_32(axis_options):
    low = by_block(axis_options, "ctas_low")["allreduce"]
    high = by_block(axis_options, "ctas_high")["allreduce"]
    print("busbw max_ctas=1:", low["busbw_gbps"], "max_ctas=32:", high["busbw_gbps"])
    assert low["busbw_gbps"] < high["busbw_gbps"], (low, high)


def test_priority_under_gemm_contention_is_measured(axis_options):
    slowdowns = {}
    for pattern in ("contention_high", "contention_normal"):
        blocks = by_block(axis_options, pattern)
        ar, gemm = blocks["allreduce"], blocks["gemm"]
        print(
            pattern,
            f"allreduce {ar['latency_avg_us']:.1f} us slowdown {ar['slowdown']:.3f};",
            f"gemm {gemm['latency_avg_us']:.1f} us slowdown {gemm['slowdown']:.3f}",
        )
        assert ar["latency_avg_us"] > 0 and gemm["latency_avg_us"] > 0
        assert _finite(ar["slowdown"]) and _finite(gemm["slowdown"])
        slowdowns[pattern] = ar["slowdown"]
        if not shares_gpus(SMALL_WORLD):
            for rec in (ar, gemm):
                assert_sane_speed(rec)
                assert rec["slowdown"] >= SLOWDOWN_FLOOR, rec  # both want the same SMs
            assert gemm["tflops"] >= BIG_GEMM_SHARE * peak_tflops(), gemm  # 8192^3 bf16
    if not shares_gpus(SMALL_WORLD):  # a high-priority stream never makes it slower
        assert slowdowns["contention_high"] <= 1.1 * slowdowns["contention_normal"], slowdowns


# --- e. check mode under overlap -------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4, 8])
def test_every_collective_checks_clean_under_overlap(tmp_path, world):
    if not runnable(world):
        pytest.skip(f"needs {world} ranks (GPUs or a shared GPU)")
    env = {"NCCL_MAX_CTAS": SHARED_GPU_MAX_CTAS} if shares_gpus(world) else None
    out = _run(tmp_path, f"check{world}", _here("multi_check.yaml"), world, env=env)
    records = read_records(out)
    comm = [r for r in records if r["op"] in COMM_OPS]
    assert {r["pattern"] for r in comm} == {"all_overlap[dtype=fp32]", "all_overlap[dtype=bf16]"}
    assert len(comm) == 2 * 7
    for rec in comm:
        assert rec["wrong_elements"] == 0, rec


# --- f. four or eight GPUs -------------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped_runs(tmp_path_factory):
    """Each shipped config run once at BIG_WORLD-compatible size with check, trace and plot."""
    done: dict[str, tuple[Path, int]] = {}

    def get(path: Path) -> tuple[Path, int]:
        if path.stem not in done:
            sizes = listed_world_sizes(path)
            world = sizes[0] if sizes[0] <= BIG_WORLD else BIG_WORLD
            if world not in sizes or not runnable(world):
                pytest.skip(f"{path.name} states world sizes {sizes}; this machine runs {world}")
            tmp = tmp_path_factory.mktemp(path.stem)
            extra: tuple[str, ...] = ("--check", "--trace", "--plot")
            if shares_gpus(world):  # correctness only: small and short
                extra += ("--iters", "3", "--warmup-iters", "1", "--max-size", "16M")
            done[path.stem] = (
                _run(tmp, f"shipped-{path.stem}", str(path), world, extra=extra),
                world,
            )
        return done[path.stem]

    return get


@needs_4
@pytest.mark.parametrize("path", sorted(CONFIGS_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_config_at_its_world_size(shipped_runs, path):
    out, world = shipped_runs(path)
    records = read_records(out)
    assert records
    suite = load_suite(path, world_size=world)
    assert {(r["pattern"], r["block"]) for r in records} <= {
        (p.name, b.name) for p in suite.patterns for b in p.blocks
    }
    for rec in records:
        if rec["op"] in COMM_OPS:
            assert rec["wrong_elements"] == 0, rec
        if _timed(rec):
            assert rec["latency_avg_us"] > 0 and rec["team_size"] <= world, rec
            _whole_activities(rec)
            if not shares_gpus(world):
                assert_sane_speed(rec)
    files = {p.name for p in (out / "traces").iterdir()}
    assert files == {f"rank{r}.json" for r in range(world)}, files  # one file per rank
    pngs = list(out.glob("plot-*.png"))
    assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


@needs_4
def test_mesh_dp_x_tp_collectives_on_both_axes(tmp_path):
    tp = BIG_WORLD // 2
    config = _here(f"multi_mesh_2x{tp}.yaml")
    blocks = by_block(
        read_records(_run(tmp_path, f"mesh2x{tp}", config, BIG_WORLD)), "mesh_overlap"
    )
    assert blocks["tp_allgather"]["team_size"] == tp
    assert blocks["tp_reduce_scatter"]["team_size"] == tp
    assert blocks["dp_allreduce"]["team_size"] == 2
    for name, rec in blocks.items():
        print(name, rec["latency_avg_us"], rec["slowdown"], rec["busbw_gbps"], rec["tflops"])
        assert rec["latency_avg_us"] > 0 and _finite(rec["slowdown"]), rec
        _whole_activities(rec)
        if rec["op"] in COMM_OPS:
            assert rec["wrong_elements"] == 0, rec
            assert rec["busbw_gbps"] > 0, rec
        if not shares_gpus(BIG_WORLD):
            assert_sane_speed(rec)
            assert rec["slowdown"] >= SLOWDOWN_FLOOR, rec
    assert blocks["gemm"]["tflops"] > 0


@needs_4
def test_moe_at_two_capacity_factors(tmp_path):
    path = CONFIGS_DIR / ("moe.yaml" if BIG_WORLD == 8 else "moe_4.yaml")
    world = listed_world_sizes(path)[0]
    extra = ("--iters", "5", "--warmup-iters", "2") if shares_gpus(world) else ()
    out = _run(tmp_path, f"moe{world}", str(path), world, extra=extra)
    records = read_records(out)
    cf1, cf125 = by_block(records, "cf1.0"), by_block(records, "cf1.25")
    for name in ("dispatch", "combine"):
        small, big = cf1[name], cf125[name]
        print(name, small["size_bytes"], big["size_bytes"])
        print(name, small["isolated_latency_avg_us"], big["isolated_latency_avg_us"])
        assert big["size_bytes"] == small["size_bytes"] * 5 // 4
        assert small["wrong_elements"] in (None, 0) and big["wrong_elements"] in (None, 0)
        if not shares_gpus(world):
            # 25% more bytes at bandwidth-bound sizes (64M and 80M) takes longer alone.
            assert big["isolated_latency_avg_us"] > small["isolated_latency_avg_us"], (small, big)
            assert _finite(small["slowdown"]) and _finite(big["slowdown"])
            for rec in (small, big):
                assert_sane_speed(rec)
    for pattern in ("cf1.0", "cf1.25"):
        pat = _patterns(out)[pattern]
        print(pattern, pat["makespan_avg_us"], pat["overlap_efficiency"])
        assert pat["makespan_avg_us"] > 0, pat
