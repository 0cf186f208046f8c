"""The dumper is the loader's inverse: load(dump(x)) == x for every shipped pattern file, a file
reaching every part of the schema, and generated suites (hypothesis), but for where things were
written (source, YAML paths, the text's hash) and for sweeps, which it does not write."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from userbenchmark.maestro.core.config.loader import (
    dump_suite,
    flow,
    load_suite,
    load_suite_text,
    scalar,
    shipped_configs,
)
from userbenchmark.maestro.core.config.spec import PatternSpec, SuiteSpec
from userbenchmark.maestro.errors import ConfigError

from .test_loader_fuzz import RICH

EXAMPLES = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def where_free(suite: SuiteSpec) -> SuiteSpec:
    """``suite`` without what depends on the text it came from."""
    r = dataclasses.replace

    def pattern(p: PatternSpec) -> PatternSpec:
        blocks = tuple(r(b, yaml_path="") for b in p.blocks)
        return r(p, yaml_path="", blocks=blocks, variants=tuple(map(pattern, p.variants)))

    return r(
        suite,
        source="",
        text_sha256="",
        patterns=tuple(map(pattern, suite.patterns)),
    )


def unswept(suite: SuiteSpec) -> SuiteSpec:
    """``suite`` with each sweep point a pattern of its own (the dumper writes no sweep)."""
    r = dataclasses.replace

    def own(p: PatternSpec, name: str) -> PatternSpec:
        variants = tuple(own(v, name) for v in p.variants)
        return r(p, name=name, base_name=name, sweep_point=(), variants=variants)

    return r(
        suite,
        patterns=tuple(
            own(p, f"{p.base_name}_{i}") if p.sweep_point else p
            for i, p in enumerate(suite.patterns)
        ),
    )


def round_trip(suite: SuiteSpec, world_size: int | None = None) -> SuiteSpec:
    text = dump_suite(suite)
    return load_suite_text(text, world_size=world_size, import_ops=False)


@pytest.mark.parametrize("name", shipped_configs())
def test_every_shipped_file_round_trips(name):
    try:
        suite = load_suite(name, import_ops=False)
        size = None
    except ConfigError:  # a file for any world size
        size = 8
        suite = load_suite(name, world_size=size, import_ops=False)
    suite = unswept(suite)
    assert where_free(round_trip(suite, size)) == where_free(suite)


def test_a_file_reaching_every_part_of_the_schema_round_trips():
    suite = load_suite_text(RICH, import_ops=False)
    with pytest.raises(ValueError, match=r"is a sweep point: the dumper writes no sweeps"):
        dump_suite(suite)
    suite = unswept(suite)
    text = dump_suite(suite)
    assert where_free(load_suite_text(text)) == where_free(suite)
    assert "mesh: {dp: 2, tp: 2}" in text and "dp_rs: {like: dp}" in text


def test_only_what_differs_from_the_defaults_is_written():
    text = """
name: t
world_size: 2
patterns:
  - name: p
    blocks:
      - {name: a, op: all_reduce, size: 4K, reduce_op: sum, lane: world}
      - {name: g, op: gemm, m: 8, n: 8, k: 8, tf32: false, traced_kernel: "nvjet_sm90 <x>, y"}
"""
    dumped = dump_suite(load_suite_text(text))
    assert "- {name: a, op: all_reduce, size: 4096}" in dumped
    assert '- {name: g, op: gemm, m: 8, n: 8, k: 8, traced_kernel: "nvjet_sm90 <x>, y"}' in dumped
    assert "defaults" not in dumped and "iters" not in dumped


def test_header_and_block_comments():
    suite = load_suite_text(
        "name: t\nworld_size: 1\npatterns: [{name: p, blocks: [{name: s, op: sleep, duration_us: 5}]}]"
    )
    text = dump_suite(suite, header=["made by a test", ""], comments={("p", "s"): "a nap"})
    assert text.startswith("# made by a test\n#\nname: t\n")
    assert "- {name: s, op: sleep, duration_us: 5.0}  # a nap" in text


@given(
    st.one_of(
        st.text(max_size=12),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False),
        st.booleans(),
        st.none(),
    )
)
@settings(deadline=None)
def test_scalars_read_back_as_themselves(value):
    read = yaml.safe_load(f"x: {scalar(value)}")["x"]
    assert read == value and type(read) is type(value)


def test_non_finite_floats_and_flow_collections():
    assert yaml.safe_load(scalar(math.inf)) == math.inf
    assert math.isnan(yaml.safe_load(scalar(math.nan)))
    assert yaml.safe_load(flow({"a": [1, "b c", {"d": None}]})) == {"a": [1, "b c", {"d": None}]}


# ---------------------------------------------------------------------------------------------
# Generated suites
# ---------------------------------------------------------------------------------------------
NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)


@st.composite
def suites(draw) -> str:
    """The text of a valid-looking pattern file over most of the schema."""
    world = draw(st.sampled_from([1, 2, 4, 8]))
    teams = draw(st.sampled_from([d for d in (1, 2, 4, 8) if world % d == 0]))
    axes = {"pairs": {"teams": [list(range(i, i + teams)) for i in range(0, world, teams)]}}
    if draw(st.booleans()):
        axes["pairs"]["priority"] = "high"
    if draw(st.booleans()):
        axes["pairs"]["nccl"] = {"max_ctas": draw(st.integers(1, 32))}
    axes["twin"] = {"like": "pairs"}
    doc = {"name": draw(NAMES), "world_size": world, "axes": axes, "patterns": []}
    if world == 4 and draw(st.booleans()):
        doc["mesh"] = {"dp": 2, "tp": 2}
        axes["dp"] = {"priority": "high"}
    if draw(st.booleans()):
        doc["defaults"] = {"dtype": draw(st.sampled_from(["fp32", "bf16", "fp16"]))}
    if draw(st.booleans()):
        doc["env"] = {"NCCL_ALGO": draw(st.sampled_from(["Ring", "1", "yes", "0x10", "a b"]))}
    for p in range(draw(st.integers(1, 3))):
        blocks = []
        for i in range(draw(st.integers(1, 5))):
            block = {"name": f"b{i}", **draw(_block(world, teams))}
            if i and draw(st.booleans()):
                block["after"] = [f"b{draw(st.integers(0, i - 1))}"]
            if draw(st.booleans()):
                block["traced_us"] = draw(st.floats(0, 1e6, allow_nan=False))
            if draw(st.booleans()):
                block["traced_kernel"] = draw(
                    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30)
                )
            if draw(st.booleans()):
                block["traced_overlap"] = draw(st.floats(0, 1))
            blocks.append(block)
        pattern = {"name": f"p{p}", "blocks": blocks}
        if draw(st.booleans()):
            pattern["iters"] = draw(st.integers(1, 100))
        if draw(st.booleans()):
            pattern["graph"] = draw(st.booleans())
        if draw(st.booleans()):
            pattern["traced_us"] = draw(st.floats(0, 1e6, allow_nan=False))
            pattern["traced_by_rank_us"] = draw(
                st.lists(st.floats(0, 1e6), min_size=world, max_size=world)
            )
        doc["patterns"].append(pattern)
    return yaml.safe_dump(doc, sort_keys=False)


@st.composite
def _block(draw, world: int, teams: int) -> dict:
    op = draw(st.sampled_from(["all_reduce", "all_gather", "send_recv", "gemm", "busy", "sleep"]))
    out: dict = {"op": op}
    if op in ("all_reduce", "all_gather", "send_recv"):
        out["axis"] = draw(st.sampled_from(["world", "pairs", "twin"]))
        out["size"] = draw(st.integers(1, 64)) * 8 * world
        if op == "all_reduce" and draw(st.booleans()):
            out["reduce_op"] = draw(st.sampled_from(["sum", "max"]))
    elif op == "gemm":
        out |= {d: draw(st.integers(1, 64)) for d in "mnk"}
        if draw(st.booleans()):
            out["b_transposed"] = True
    else:
        out["duration_us"] = draw(st.floats(0.5, 1000))
    if draw(st.booleans()):
        out["lane"] = draw(st.sampled_from(["compute", "side"]))
    return out


@given(suites())
@EXAMPLES
def test_generated_suites_round_trip(text):
    try:
        suite = load_suite_text(text)
    except ConfigError:
        assume(False)
    assert where_free(round_trip(suite)) == where_free(suite)
