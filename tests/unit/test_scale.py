"""Unit tests for --max-size: capped message sizes, scaled GEMMs, sweep de-duplication, CLI."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from userbenchmark.maestro.blocks.base import Block, Param
from userbenchmark.maestro.blocks.comm import Collective
from userbenchmark.maestro.blocks.compute import cap_gemm_dims
from userbenchmark.maestro.blocks.registry import resolve_op
from userbenchmark.maestro.cli import main, run_command
from userbenchmark.maestro.core.config.loader import load_suite_text
from userbenchmark.maestro.core.config.options import RunOptions, apply_max_size, apply_overrides
from userbenchmark.maestro.errors import ConfigError


class PowerOfTwoOnly(Collective):
    """A custom comm op whose own rule (power-of-two sizes) is stricter than divisibility."""

    params = (Param(name="size", kind="size", doc="bytes"),)

    @classmethod
    def check_params(cls, params, *, dtype, team_size):
        size = params["size"]
        return [] if size & (size - 1) == 0 else [("size", f"needs a power of two, got {size}")]


SUITE = """
name: scale
world_size: 8
defaults: {dtype: bf16}
mesh: {dp: 2, tp: 4}
axes:
  tp_rs: {like: tp}
  s: {like: world}
patterns:
  - name: mixed
    blocks:
      - {name: ag, op: all_gather, axis: tp, size: 3M}
      - {name: rs, op: reduce_scatter, axis: tp_rs, size: 1M}
      - {name: ar, op: all_reduce, axis: dp, size: 100M}
      - {name: a2a, op: all_to_all, axis: world, size: 48K, dtype: fp32}
      - {name: small, op: broadcast, axis: s, size: 1K}
      - {name: mm, op: gemm, axis: tp, lane: compute, m: 8192, n: 2048, k: 4096}
      - {name: nap, op: sleep, axis: tp, lane: nap, duration_us: 250}
  - name: sweep
    sweep: {size: [4K, 64K, 1M, 4M]}
    blocks:
      - {name: "ar_${size}", op: all_reduce, axis: dp, size: "${size}"}
  - name: copy_of_sweep_point
    blocks:
      - {name: ar, op: all_reduce, axis: dp, size: 1M}
"""


def suite(text: str = SUITE):
    return load_suite_text(text, file="scale.yaml")


def block_of(spec, pattern, block):
    blocks = next(p for p in spec.patterns if p.name == pattern).blocks
    return next(b for b in blocks if b.name == block)


def operand_bytes(block):
    m, n, k = (block.params[d] for d in ("m", "n", "k"))
    return max(m * k, k * n, m * n) * block.dtype_size_bytes


# ---- the pure pieces ----
@pytest.mark.parametrize(
    ("size", "cap", "elem", "team", "divide", "expected"),
    [
        (4096, 8192, 4, 8, True, 4096),  # under the cap: unchanged, even if odd-looking
        (1 << 20, 100, 4, 8, True, 96),  # 100 rounded down to a multiple of 8 x 4
        (1 << 20, 101, 2, 8, False, 100),  # whole fp16 elements only
        (1 << 20, 31, 4, 8, True, None),  # nothing valid fits under 32 bytes
        (1 << 20, 3, 4, 1, False, None),
        (1 << 20, 64 * 1024, 2, 8, True, 64 * 1024),
    ],
)
def test_capped_message_size(size, cap, elem, team, divide, expected):
    cls = resolve_op("all_gather" if divide else "all_reduce")  # S split across the team or not
    params = {"size": size, "reduce_op": "sum", "in_place": False}
    kwargs = {"max_size_bytes": cap, "dtype": {4: "fp32", 2: "bf16"}[elem], "team_size": team}
    if expected is None:
        with pytest.raises(ValueError, match="or more"):
            cls.capped_params(params, **kwargs)
    else:
        assert cls.capped_params(params, **kwargs) == {**params, "size": expected}


def test_cap_gemm_dims_keeps_a_gemm_that_fits():
    assert cap_gemm_dims(64, 32, 128, 64 * 128) == (64, 32, 128)


def test_cap_gemm_dims_square_scales_evenly():
    m, n, k = cap_gemm_dims(8192, 8192, 8192, 16384)
    assert m == n == k == 128  # 128 x 128 = 16384 elements: the largest square that fits


def test_cap_gemm_dims_keeps_ratios_roughly():
    m, n, k = cap_gemm_dims(8192, 2048, 4096, 32768)
    assert max(m * k, k * n, m * n) <= 32768
    assert m / n == pytest.approx(4, rel=0.05)
    assert m / k == pytest.approx(2, rel=0.05)


def test_cap_gemm_dims_with_a_dim_clamped_to_one():
    # A vector-like GEMM: m and n would round to 0, so k alone must shrink to fit.
    m, n, k = cap_gemm_dims(1, 1, 10**9, 1000)
    assert (m, n) == (1, 1)
    assert 900 <= k <= 1000


def test_cap_gemm_dims_rejects_nothing_to_fit():
    with pytest.raises(ValueError, match="at least 1"):
        cap_gemm_dims(4, 4, 4, 0)


@given(
    st.integers(1, 1 << 20),
    st.integers(1, 1 << 20),
    st.integers(1, 1 << 20),
    st.integers(1, 1 << 24),
)
def test_cap_gemm_dims_property(m, n, k, max_elems):
    got = cap_gemm_dims(m, n, k, max_elems)
    assert all(1 <= g <= d for g, d in zip(got, (m, n, k), strict=True))
    assert max(got[0] * got[2], got[2] * got[1], got[0] * got[1]) <= max_elems
    if max(m * k, k * n, m * n) <= max_elems:
        assert got == (m, n, k)


# ---- apply_max_size on a validated suite ----
def test_every_comm_block_is_capped_valid_and_keeps_its_dtype():
    original = suite()
    capped = apply_max_size(original, 64 * 1024)
    for pattern in capped.patterns:
        for block in pattern.blocks:
            blocks = next(p for p in original.patterns if p.name == pattern.name).blocks
            before = next(b for b in blocks if b.name == block.name)
            assert block.dtype == before.dtype
            if block.op in ("gemm", "sleep"):
                continue
            assert block.params["size"] <= 64 * 1024
            cls = resolve_op(block.op)
            team = capped.axes[block.axis].team_size
            assert cls.check_params(block.params, dtype=block.dtype, team_size=team) == []
    assert block_of(capped, "mixed", "ag").params["size"] == 64 * 1024
    assert block_of(capped, "mixed", "ar").params["size"] == 64 * 1024
    assert block_of(capped, "mixed", "a2a").params["size"] == 48 * 1024  # under the cap
    assert block_of(capped, "mixed", "small").params["size"] == 1024


def test_rounding_follows_the_ops_divisibility_rule():
    capped = apply_max_size(suite(), 1000)
    # all_gather on tp (teams of 4), bf16: multiples of 8 bytes; all_to_all on world (8), fp32:
    # multiples of 32; all_reduce: whole bf16 elements.
    assert block_of(capped, "mixed", "ag").params["size"] == 1000
    assert block_of(capped, "mixed", "a2a").params["size"] == 992
    capped = apply_max_size(suite(), 999)
    assert block_of(capped, "mixed", "ag").params["size"] == 992
    assert block_of(capped, "mixed", "ar").params["size"] == 998
    assert block_of(capped, "mixed", "small").params["size"] == 998


def test_gemm_operands_fit_and_sleep_is_untouched():
    capped = apply_max_size(suite(), 64 * 1024)
    mm = block_of(capped, "mixed", "mm")
    assert operand_bytes(mm) <= 64 * 1024
    assert mm.params["m"] > mm.params["k"] > mm.params["n"] >= 1  # 8192 : 4096 : 2048
    nap = block_of(capped, "mixed", "nap")
    assert nap == block_of(suite(), "mixed", "nap")


def test_input_suite_is_not_modified():
    original = suite()
    before = [dict(b.params) for p in original.patterns for b in p.blocks]
    apply_max_size(original, 4096)
    assert [dict(b.params) for p in original.patterns for b in p.blocks] == before


def test_a_large_cap_changes_nothing():
    original = suite()
    assert apply_max_size(original, 1 << 40) == original


def test_sweep_points_that_collapse_run_once_under_the_first_name():
    capped = apply_max_size(suite(), 64 * 1024)
    names = [p.name for p in capped.patterns]
    # 64K, 1M and 4M all become 64K: the first of them stays, under its own name.
    assert [n for n in names if n.startswith("sweep")] == ["sweep[size=4K]", "sweep[size=64K]"]
    assert len(names) == len(set(names))
    # A separately named pattern is the user's choice and stays even when it equals a point.
    assert "copy_of_sweep_point" in names


def test_sweep_points_still_distinct_after_capping_all_stay():
    capped = apply_max_size(suite(), 1 << 30)
    assert [p.name for p in capped.patterns if p.base_name == "sweep"] == [
        "sweep[size=4K]",
        "sweep[size=64K]",
        "sweep[size=1M]",
        "sweep[size=4M]",
    ]


def test_sweep_points_that_differ_only_in_a_pattern_setting_all_stay():
    # graph (or sync, check, ...) swept: the capped blocks are equal, the measurements are not.
    text = """
name: modes
world_size: 2
defaults: {iters: 2, warmup_iters: 0}
patterns:
  - name: p
    sweep: {g: [true, false], s: [barrier, barrier-only]}
    graph: "${g}"
    sync: "${s}"
    blocks:
      - {name: ar, op: all_reduce, size: 1G}
"""
    capped = apply_max_size(load_suite_text(text, file="modes.yaml"), 1024)
    assert len(capped.patterns) == 4
    assert {(p.graph, p.sync) for p in capped.patterns} == {
        (True, "barrier"),
        (True, "barrier-only"),
        (False, "barrier"),
        (False, "barrier-only"),
    }


def test_a_capped_imported_block_and_its_step_lose_their_traced_durations(caplog):
    # Traced at the file's sizes: a capped block's replay against the trace would compare
    # another size with it (0.03 for a 16M-capped GEMM of the FSDP2 replay on an H200).
    text = """
name: imported
world_size: 2
patterns:
  - name: step
    traced_us: 900
    traced_by_rank_us: [900, 850]
    blocks:
      - {name: ar, op: all_reduce, size: 1G, traced_us: 500, traced_kernel: k, traced_overlap: 0.5}
      - {name: idle, op: sleep, duration_us: 20, traced_us: 21}
"""
    suite = load_suite_text(text, file="imported.yaml")
    with caplog.at_level("WARNING", logger="maestro.config"):
        (step,) = apply_max_size(suite, 1024).patterns
    ar, idle = step.blocks
    assert (ar.traced_us, ar.traced_kernel, ar.traced_overlap) == (None, None, None)
    assert idle.traced_us == 21 and step.traced
    assert step.traced_us is None and step.traced_by_rank_us == ()
    assert "pattern 'step': --max-size changed 1 of its 2 imported blocks" in caplog.text
    caplog.clear()
    assert apply_max_size(suite, 1 << 40) == suite and not caplog.text  # nothing capped


def test_cap_below_smallest_valid_size_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        apply_max_size(suite(), 16)
    message = str(info.value)
    assert "patterns[0].blocks[3]" in message  # a2a: 8 ranks x 4 bytes = 32 bytes at least
    assert "--max-size 32 or more" in message


def test_cap_must_be_positive_int():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError, match="--max-size"):
            apply_max_size(suite(), bad)


def test_a_custom_ops_own_rule_is_checked_after_capping():
    text = """
name: custom
world_size: 2
patterns:
  - name: p
    blocks:
      - {name: odd, op: "tests.unit.test_scale:PowerOfTwoOnly", size: 1M}
"""
    assert issubclass(PowerOfTwoOnly, Block)
    assert apply_max_size(suite(text), 4096).patterns[0].blocks[0].params["size"] == 4096
    with pytest.raises(ConfigError, match="needs a power of two, got 48"):
        apply_max_size(suite(text), 48)


# ---- wiring: RunOptions and the CLI ----
def test_apply_overrides_caps_after_filtering():
    options = RunOptions(max_size_bytes=4096, patterns=("sweep",))
    result = apply_overrides(suite(), options)
    assert [p.name for p in result.patterns] == ["sweep[size=4K]"]
    assert apply_overrides(suite(), RunOptions()) == suite()


def test_cli_parses_max_size_with_the_size_parser():
    ctx = run_command.make_context("run", ["--max-size", "64K"])
    assert ctx.params["max_size"] == 64 * 1024
    assert run_command.make_context("run", []).params["max_size"] is None


@pytest.mark.parametrize("bad", ["-4M", "0", "64X", "1.5"])
def test_cli_rejects_a_bad_max_size_with_exit_2(bad, capsys):
    assert main(["run", "--max-size", bad]) == 2
    assert "--max-size" in capsys.readouterr().err
