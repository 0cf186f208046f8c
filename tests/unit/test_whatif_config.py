"""``whatif:`` variants of a pattern: what each changes (values, factors, globs, axes' options),
every problem at the whatif entry behind it, sweeps per point, --max-size and the command line's
overrides, validate's summary and the dumper's inverse."""

from __future__ import annotations

import pytest

from userbenchmark.maestro.core.config.loader import dump_suite, load_suite_text
from userbenchmark.maestro.core.config.options import RunOptions, apply_overrides
from userbenchmark.maestro.core.config.spec import whatif_label
from userbenchmark.maestro.core.config.summary import suite_summary
from userbenchmark.maestro.errors import ConfigError

from .test_config_dump import where_free

STEP = """\
name: w
world_size: 4
mesh: {dp: 2, tp: 2}
axes:
  dp_rs: {like: dp, nccl: {max_ctas: 8}}
patterns:
  - name: step
    blocks:
      - {name: ag, op: all_gather, axis: dp, size: 4M}
      - {name: rs, op: reduce_scatter, axis: dp_rs, size: 4M}
      - {name: gemm, op: gemm, lane: compute, m: 64, n: 64, k: 64}
      - {name: gemm_next, op: gemm, lane: compute, m: 64, n: 64, k: 64, after: ag}
      - {name: nap, op: sleep, lane: idle, duration_us: 100}
    whatif:
"""


def load(whatif: str, text: str = STEP, **kwargs):
    return load_suite_text(text + whatif, file="f.yaml", **kwargs)


def variants(whatif: str, text: str = STEP):
    return {v.variant: v for v in load(whatif, text).patterns[0].variants}


def block(variant, name):
    return next(b for b in variant.blocks if b.name == name)


def problems(whatif: str, text: str = STEP) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ConfigError) as info:
        load(whatif, text)
    return [(i.line, i.path, i.message) for i in info.value.issues]


def test_values_factors_and_globs_change_only_what_they_name():
    found = variants(
        "      same: {}\n"
        "      bigger: {ag: {size: x1.5}, gemm: {m: x1.02, k: 80}, nap: {duration_us: x1.2}}\n"
        "      prefetch: {gemm_next: {after: []}}\n"
        '      half: {"gemm*": {dtype: bf16}}\n'
    )
    base = load("").patterns[0]
    assert base.variants == () and base.variant is None
    assert list(found) == ["same", "bigger", "prefetch", "half"]
    same = found["same"]
    assert same.name == "step" and same.label == "step[whatif=same]" and same.variants == ()
    assert [b.params for b in same.blocks] == [b.params for b in base.blocks]
    bigger = found["bigger"]
    assert block(bigger, "ag").params["size"] == 6 * 1024 * 1024
    assert block(bigger, "gemm").params["m"] == 65  # round(64 * 1.02): a whole number
    assert block(bigger, "gemm").params["k"] == 80 and block(bigger, "gemm").work.startswith("m=65")
    assert block(bigger, "nap").params["duration_us"] == pytest.approx(120.0)
    assert block(bigger, "rs") == base.blocks[1]  # untouched, at the pattern's own path
    assert block(bigger, "gemm").yaml_path == "patterns[0].whatif.bigger.gemm"
    assert bigger.yaml_path == "patterns[0].whatif.bigger"
    assert block(found["prefetch"], "gemm_next").after == ()
    assert block(found["prefetch"], "gemm").after == ()
    assert [b.dtype for b in found["half"].blocks] == ["fp32", "fp32", "bf16", "bf16", "fp32"]


def test_a_size_factor_keeps_whole_elements_of_the_variants_dtype():
    text = """\
name: e
world_size: 2
patterns:
  - name: p
    blocks: [{name: a, op: all_reduce, size: 4M}, {name: b, op: all_reduce, size: 4M}]
    whatif:
"""
    # 4M x 1.0000003 is 4194305.26 bytes: 1048576.3 fp32 elements, so 1048576 of them
    found = variants("      v: {a: {size: x1.0000003}, b: {size: x1.0000003, dtype: fp16}}\n", text)
    assert block(found["v"], "a").params["size"] == 4 * 1024 * 1024
    assert block(found["v"], "b").params["size"] == 4194306  # 2097153 fp16 elements


def test_a_variant_that_changes_an_axis_gets_communicators_of_its_own():
    suite = load(
        "      ctas: {axes: {dp_rs: {nccl: {min_ctas: 2}}, dp: {priority: high}}}\n"
        "      moved: {gemm: {axis: dp, lane: dp}}\n"
    )
    ctas = suite.patterns[0].variants[0]
    assert [b.axis for b in ctas.blocks[:2]] == ["dp[whatif=ctas]", "dp_rs[whatif=ctas]"]
    assert [b.lane for b in ctas.blocks[:2]] == ["dp", "dp_rs"]  # the lanes stay
    own = suite.axes["dp_rs[whatif=ctas]"]
    assert own.like == "dp_rs" and own.teams == suite.axes["dp_rs"].teams
    assert dict(own.nccl) == {"max_ctas": 8, "min_ctas": 2}  # over the axis's own options
    assert suite.axes["dp[whatif=ctas]"].priority == "high"
    assert dict(suite.axes["dp_rs"].nccl) == {"max_ctas": 8}  # the pattern's axis is unchanged
    assert block(suite.patterns[0].variants[1], "gemm").axis == "dp"


def test_a_lane_the_file_left_to_its_axis_follows_the_axis():
    text = STEP.replace("{name: nap, op: sleep, lane: idle,", "{name: nap, op: sleep, axis: tp,")
    nap = block(variants("      v: {nap: {axis: dp_rs}}\n", text)["v"], "nap")
    assert (nap.axis, nap.lane) == ("dp_rs", "dp_rs")
    gemm = block(variants("      v: {gemm: {axis: tp}}\n")["v"], "gemm")
    assert (gemm.axis, gemm.lane) == ("tp", "compute")  # written: kept


def test_variants_of_one_name_share_their_axis_and_must_agree_on_its_options():
    two = STEP.replace("whatif:\n", "whatif: {v: {axes: {dp: {nccl: {max_ctas: 2}}}}}\n")
    two += STEP[STEP.index("  - name: step") :].replace("name: step", "name: step2")
    suite = load("      v: {axes: {dp: {nccl: {max_ctas: 2}}}}\n", two)
    assert dict(suite.axes["dp[whatif=v]"].nccl) == {"max_ctas": 2}
    assert block(suite.patterns[1].variants[0], "ag").axis == "dp[whatif=v]"
    assert problems("      v: {axes: {dp: {nccl: {max_ctas: 4}}}}\n", two) == [
        (
            15 + two.count("\n") - STEP.count("\n"),
            "patterns[1].whatif.v.axes.dp",
            "a variant 'v' gives axis 'dp' other options at patterns[0].whatif.v.axes.dp: name "
            "the variants apart (each variant's axis is named after it)",
        )
    ]


@pytest.mark.parametrize(
    ("whatif", "path", "message"),
    [
        ("v: {gem: {m: 2}}", "v.gem", "'gem' names no block (did you mean 'gemm'?); blocks of"),
        ('v: {"z*": {m: 2}}', "v.z*", "'z*' names no block; blocks of this pattern: ag, rs,"),
        ("v: {gemm: {mm: 2}}", "v.gemm.mm", "unknown key 'mm' for op 'gemm' (did you mean 'm'?)"),
        ("v: {gemm: {name: g}}", "v.gemm.name", "name cannot change in a variant: its blocks"),
        ("v: {gemm: {op: busy}}", "v.gemm.op", "op cannot change in a variant: a variant changes"),
        ("v: {gemm: {traced_us: 5}}", "v.gemm.traced_us", "traced_us cannot change in a"),
        ("v: {ag: {dtype: x2}}", "v.ag.dtype", "a factor (x2) scales a number or a size the"),
        ("v: {gemm: {bias: x2}}", "v.gemm.bias", "a factor (x2) scales a number or a size the"),
        ("v: {ag: {size: x0}}", "v.ag.size", "size must be positive, got 0 (x0 of the pattern's"),
        (
            "v: {ag: {size: x1.000001}}",
            "v.ag.size",
            "all_gather needs a size divisible by team size x element size (2 x 4 = 8 bytes for "
            "fp32), got 4194308 bytes (x1.000001 of the pattern's 4194304)",
        ),
        ("v: {gemm: {k: x0.001}}", "v.gemm.k", "must be at least 1, got 0 (x0.001 of the"),
        (
            "v: {ag: {after: gemm_next}}",
            "v.ag.after",
            "blocks 'ag', 'gemm_next' wait for each other in a cycle",
        ),
        ("v: {rs: {axis: dp, lane: x}}", "v.rs.lane", "block 'rs' is on lane 'x' but block 'ag'"),
        ('v: {gemm: {m: 2}, "g*": {m: 3}}', "v.g*.m", "'m' of block 'gemm' is changed twice"),
        ("v: {axes: {tp: {nccl: {max_ctas: 2}}}}", "v.axes.tp", "no block of this variant runs"),
        ("v: {axes: {pp: {}}}", "v.axes.pp", "no block of this variant runs on axis 'pp'; its"),
        ("v: {axes: {dp: {teams: [[0]]}}}", "v.axes.dp.teams", "unknown key 'teams' in a variant"),
        ("v: {axes: {dp_rs: {nccl: {min_ctas: 9}}}}", "v.axes.dp_rs.nccl.min_ctas", "min_ctas 9"),
        ("v!: {}", "v!", "a variant name must be a non-empty string of letters"),
        ("v: [gemm]", "v", "a variant maps block names or globs to the keys it changes"),
        ("v: {1: {m: 2}}", "v.1", "1 names no block; blocks of this pattern: ag, rs, gemm,"),
    ],
)
def test_each_problem_is_at_the_whatif_entry_behind_it(whatif, path, message):
    found = problems(f"      {whatif}\n")
    assert len(found) == 1, found
    line, where, text = found[0]
    assert (line, where) == (15, f"patterns[0].whatif.{path}") and text.startswith(message), text


def test_a_glob_names_the_block_and_an_unchanged_key_names_itself():
    text = STEP.replace("axis: dp_rs, size: 4M}", "axis: dp_rs, size: 24}")
    found = problems('      v: {"gemm*": {dtype: int8}}\n      w: {rs: {axis: world}}\n', text)
    assert [(path, message.rsplit(" (", 1)[1]) for _, path, message in found] == [
        ("patterns[0].whatif.v.gemm*.dtype", "block 'gemm')"),
        ("patterns[0].whatif.v.gemm*.dtype", "block 'gemm_next')"),
        ("patterns[0].whatif.w.rs", "'size' of block 'rs')"),  # 24 bytes: not 4 fp32 ranks'
    ]


def test_a_sweep_has_its_variants_at_every_point_and_problems_name_the_point():
    sweep = """\
name: s
world_size: 2
patterns:
  - name: rs
    sweep: {size: [16, 32]}
    blocks:
      - {name: rs, op: reduce_scatter, size: "${size}"}
    whatif:
"""
    suite = load("      more: {rs: {size: x2}}\n", sweep)
    assert [(p.name, [v.label for v in p.variants]) for p in suite.patterns] == [
        ("rs[size=16]", ["rs[size=16,whatif=more]"]),
        ("rs[size=32]", ["rs[size=32,whatif=more]"]),
    ]
    assert [p.variants[0].blocks[0].params["size"] for p in suite.patterns] == [32, 64]
    assert whatif_label("rs[size=16]", "more") == "rs[size=16,whatif=more]"
    found = problems("      more: {rs: {size: x1.25}}\n", sweep)
    assert found == [
        (
            9,
            "patterns[0].whatif.more.rs.size",
            "reduce_scatter needs a size divisible by team size x element size (2 x 4 = 8 bytes "
            "for fp32), got 20 bytes (x1.25 of the pattern's 16) (at sweep point size=16)",
        )
    ]
    per_point = load('      big: {rs: {size: "x${size}"}}\n', sweep)
    assert [p.variants[0].blocks[0].params["size"] for p in per_point.patterns] == [256, 1024]


def test_max_size_and_the_command_lines_overrides_reach_variants():
    suite = load("      bigger: {ag: {size: x2}}\n      longer: {gemm: {m: x2}}\n")
    capped = apply_overrides(suite, RunOptions(max_size_bytes=1 << 20, iters=7))
    bigger, longer = capped.patterns[0].variants
    assert bigger.num_iters == longer.num_iters == 7
    assert block(bigger, "ag").params["size"] == block(longer, "ag").params["size"] == 1 << 20
    assert block(longer, "gemm").params["m"] == 128


def test_validate_lists_what_each_variant_changes():
    text = suite_summary(
        load("      same: {}\n      v: {ag: {size: x2}, axes: {dp_rs: {nccl: {max_ctas: 2}}}}\n")
    )
    assert "    whatif same: nothing changed (the pattern again: its noise)" in text
    assert "    whatif v: ag size=4M -> size=8M; rs axis dp_rs -> dp_rs[whatif=v]" in text
    assert "dp_rs[whatif=v]  2 x 2" in text and "like dp_rs; nccl max_ctas=2" in text


def test_the_dumper_writes_whatif_back():
    whatif = (
        "      same: {}\n"
        "      v: {ag: {size: x2}, axes: {dp_rs: {nccl: {max_ctas: 2}}}, gemm_next: {after: []}}\n"
        '      w: {"gemm*": {dtype: bf16, m: 32}}\n'
    )
    suite = load(whatif)
    text = dump_suite(suite)
    assert "      v: {ag: {size: 8388608}, axes: {dp_rs: {priority: normal, nccl:" in text
    assert "whatif=" not in text  # the variants' own axes come from their entries
    assert where_free(load_suite_text(text)) == where_free(suite)
    axes = STEP.replace(
        "- {name: nap,", "- {name: axes, op: sleep, duration_us: 1}\n      - {name: nap,"
    )
    suite = load("      v: {axes: {dp: {priority: high}}, '[a]xes': {duration_us: 3}}\n", axes)
    assert '"[a]xes": {duration_us: 3.0}' in dump_suite(suite)
    assert where_free(load_suite_text(dump_suite(suite))) == where_free(suite)
