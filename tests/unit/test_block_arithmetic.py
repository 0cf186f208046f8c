"""An op's arithmetic lives on its Block class: S, bus factor, FLOPs and what --max-size caps.

The reference factors are written out here from nccl-tests' doc/PERFORMANCE.md, not taken from
maestro, and a block named by module path or subclassed by a user gets exactly the figures of
the built-in it is.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from bench.aggregate_scale import simulate_ranks
from userbenchmark.maestro.blocks.base import Block
from userbenchmark.maestro.blocks.registry import registered_ops, resolve_op
from userbenchmark.maestro.core.analysis.aggregate import local_summary
from userbenchmark.maestro.core.analysis.intervals import WindowTimings
from userbenchmark.maestro.core.analysis.outcome import Isolated, build_outcome
from userbenchmark.maestro.core.config.loader import load_suite_text
from userbenchmark.maestro.core.config.options import apply_max_size

# nccl-tests doc/PERFORMANCE.md: busBw = algBw * factor, n ranks.
NCCL_TESTS_FACTORS = {
    "all_reduce": lambda n: Fraction(2 * (n - 1), n),
    "reduce_scatter": lambda n: Fraction(n - 1, n),
    "all_gather": lambda n: Fraction(n - 1, n),
    "all_to_all": lambda n: Fraction(n - 1, n),
    "broadcast": lambda n: Fraction(1),
    "reduce": lambda n: Fraction(1),
    "send_recv": lambda n: Fraction(1),
}
LITERAL = {  # a few written out, so the lambdas above are checked too
    ("all_reduce", 8): 1.75,
    ("all_reduce", 2): 1.0,
    ("all_gather", 4): 0.75,
    ("reduce_scatter", 8): 0.875,
    ("all_to_all", 16): 0.9375,
    ("broadcast", 8): 1.0,
    ("all_reduce", 1): 0.0,
}


@pytest.mark.parametrize("op", sorted(NCCL_TESTS_FACTORS))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 16, 64])
def test_every_collective_states_nccl_tests_bus_factor(op, n):
    assert registered_ops()[op].bus_factor(n) == float(NCCL_TESTS_FACTORS[op](n))


@pytest.mark.parametrize(("op", "n"), sorted(LITERAL))
def test_bus_factor_literal_values(op, n):
    assert registered_ops()[op].bus_factor(n) == LITERAL[(op, n)]


def test_blocks_without_bus_bytes_have_no_bus_factor():
    for op in ("gemm", "sleep"):
        assert registered_ops()[op].bus_factor(4) is None
    assert Block.bus_factor(4) is None


def test_flops_are_two_m_n_k():
    gemm = registered_ops()["gemm"]
    assert gemm.flop_count({"m": 4096, "n": 1024, "k": 512}) == 2 * 4096 * 1024 * 512
    assert registered_ops()["all_reduce"].flop_count({"size": 4096}) is None


_SUITE = """
name: arith
world_size: 4
defaults: {{dtype: bf16, iters: 3, warmup_iters: 0}}
axes:
  world2: {{like: world}}
patterns:
  - name: p
    blocks:
      - {{name: ar, op: {ar}, axis: world, size: 4M}}
      - {{name: ag, op: {ag}, axis: world2, size: 4M}}
      - {{name: mm, op: {mm}, axis: world, lane: compute, m: 4096, n: 2048, k: 1024}}
"""
BUILTIN = {"ar": "all_reduce", "ag": "all_gather", "mm": "gemm"}
BY_PATH = {
    "ar": "userbenchmark.maestro.blocks.comm:AllReduce",
    "ag": "userbenchmark.maestro.blocks.comm:AllGather",
    "mm": "userbenchmark.maestro.blocks.compute:Gemm",
}
SUBCLASSED = {
    "ar": "tests.unit.custom_ops:MyAllReduce",
    "ag": "tests.unit.custom_ops:MyAllGather",
    "mm": "tests.unit.custom_ops:MyGemm",
}


def _outcome(ops: dict[str, str]):
    suite = load_suite_text(_SUITE.format(**ops), file="arith.yaml")
    pattern = suite.patterns[0]
    classes = [resolve_op(b.op) for b in pattern.blocks]
    durations = np.array([[400e3, 410e3, 420e3], [300e3, 310e3, 320e3], [900e3, 910e3, 920e3]])
    starts = np.zeros((3, 3), dtype=np.int64)
    timings = WindowTimings(
        starts_ns=starts,
        ends_ns=starts + durations.astype(np.int64),
        present=np.ones(3, dtype=bool),
        clock="test",
    )
    agg = simulate_ranks(
        [
            local_summary(
                timings,
                lane_of_block=[0, 1, 2],
                is_comm=np.array([c.category == "comm" for c in classes]),
                is_compute=np.array([c.category == "compute" for c in classes]),
            )
        ]
    )
    return build_outcome(
        suite,
        pattern,
        classes,
        agg,
        Isolated(latency_ns=np.repeat([[300e3], [250e3], [800e3]], 3, axis=1)),
        None,
        None,
        profiler="host",
        team_sizes=[4, 4, 4],
    )


@pytest.mark.parametrize("ops", [BY_PATH, SUBCLASSED], ids=["module-path", "user-subclass"])
def test_custom_ops_get_the_figures_of_the_builtin_they_are(ops):
    want = _outcome(BUILTIN)
    got = _outcome(ops)
    for w, g in zip(want.blocks, got.blocks, strict=True):
        for field in ("size_bytes", "algbw_gbps", "busbw_gbps", "tflops", "slowdown"):
            a, b = getattr(w, field), getattr(g, field)
            assert (a == b) or (a is None and b is None) or (math.isnan(a) and math.isnan(b)), (
                w.block,
                field,
                a,
                b,
            )
    ar, ag, mm = got.blocks
    assert ar.busbw_gbps == pytest.approx(ar.algbw_gbps * 1.5)
    assert ag.busbw_gbps == pytest.approx(ag.algbw_gbps * 0.75)
    assert mm.tflops == pytest.approx(2 * 4096 * 2048 * 1024 / 910e-6 / 1e12)
    # Both collectives count in the shared busbw, the GEMM does not.
    shared = (4 * 2**20 * 1.5 + 4 * 2**20 * 0.75) / (want.pattern.makespan_avg_us * 1e-6) / 1e9
    assert got.pattern.shared_busbw_gbps == pytest.approx(shared)
    assert got.pattern.shared_busbw_gbps == want.pattern.shared_busbw_gbps


@pytest.mark.parametrize("ops", [BY_PATH, SUBCLASSED], ids=["module-path", "user-subclass"])
def test_custom_ops_are_capped_like_the_builtin_they_are(ops):
    want = apply_max_size(load_suite_text(_SUITE.format(**BUILTIN), file="a.yaml"), 64 * 1024)
    got = apply_max_size(load_suite_text(_SUITE.format(**ops), file="a.yaml"), 64 * 1024)
    for w, g in zip(want.patterns[0].blocks, got.patterns[0].blocks, strict=True):
        assert dict(w.params) == dict(g.params)
    ar, ag, mm = (dict(b.params) for b in got.patterns[0].blocks)
    assert ar["size"] == ag["size"] == 64 * 1024
    assert max(mm["m"] * mm["k"], mm["k"] * mm["n"], mm["m"] * mm["n"]) * 2 <= 64 * 1024
