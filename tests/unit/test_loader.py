"""Pattern-file loader: a table of bad files (path + message + choices) and what valid ones give."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from userbenchmark.maestro.blocks.base import Block, Param
from userbenchmark.maestro.blocks.compute import Gemm
from userbenchmark.maestro.core.config.axes import mesh_teams
from userbenchmark.maestro.core.config.loader import (
    CONFIGS_DIR,
    load_suite,
    load_suite_text,
    resolve_config_path,
    shipped_configs,
)
from userbenchmark.maestro.core.config.spec import AxisSpec, BlockSpec, PatternSpec, SuiteSpec
from userbenchmark.maestro.core.config.summary import rank_buffer_bytes, suite_summary
from userbenchmark.maestro.errors import ConfigError

HEAD = "name: t\nworld_size: 4\n"
OPS = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "send_recv",
    "gemm",
    "sleep",
]
DTYPES = ["fp32", "fp16", "bf16", "fp64", "int32", "int64", "int8", "uint8"]


def pat(*blocks: str, extra: str = "", name: str = "p") -> str:
    """A patterns: section with one pattern of the given flow-style blocks."""
    body = "".join(f"      - {b}\n" for b in blocks)
    return f"patterns:\n  - name: {name}\n{extra}    blocks:\n{body}"


AR = "{name: ar, op: all_reduce, size: 4M}"


class ExplodingBlock(Block):
    """A custom block whose parameter check raises: the loader must contain it."""

    params = (Param(name="size", kind="size", doc="bytes"),)

    @classmethod
    def check_params(cls, params, *, dtype, team_size):
        raise RuntimeError("boom")


class ChoosyBlock(Block):
    """A custom block whose integer parameter has choices."""

    params = (Param(name="ways", kind="int", choices=(1, 2, 4), doc="ways"),)


def test_an_integer_parameter_with_choices_takes_only_them():
    op = "'tests.unit.test_loader:ChoosyBlock'"
    assert load_suite_text(HEAD + pat(f"{{name: a, op: {op}, ways: 2.0}}")).patterns[0]
    with pytest.raises(ConfigError) as info:
        load_suite_text(HEAD + pat(f"{{name: a, op: {op}, ways: 3}}"))
    assert "ways: unknown value 3; valid values: 1, 2, 4" in str(info.value)


# (id, yaml text, --world-size, expected path, message fragment, choices listed in the message)
# fmt: off
BAD = [
    ("unknown top-level key", HEAD + "colour: red\n" + pat(AR), None, "colour",
     "unknown key 'colour'", ["name", "world_size", "patterns", "mesh", "axes"]),
    ("missing name", "world_size: 4\n" + pat(AR), None, "name", "missing required key 'name'",
     []),
    ("bad name chars", "name: 'a b/c'\nworld_size: 4\n" + pat(AR), None, "name",
     "letters, digits", []),
    ("world_size 0", "name: t\nworld_size: 0\n" + pat(AR), None, "world_size", "at least 1", []),
    ("world_size string", "name: t\nworld_size: '4'\n" + pat(AR), None, "world_size",
     "expected an integer, got '4'", []),
    ("world_size mismatch", HEAD + pat(AR), 8, "world_size",
     "sets world_size 4 but the run has 8 rank(s)", []),
    ("no world size at all", "name: t\n" + pat(AR), None, "world_size", "--world-size", []),
    ("bad --world-size", "name: t\n" + pat(AR), 0, "world size", "at least 1", []),
    ("mesh product mismatch", HEAD + "mesh: {dp: 2, tp: 4}\n" + pat(AR), None, "mesh",
     "multiply to 8", []),
    ("mesh non-int", HEAD + "mesh: {dp: two, tp: 2}\n" + pat(AR), None, "mesh.dp",
     "expected an integer", []),
    ("mesh not a mapping", HEAD + "mesh: [2, 2]\n" + pat(AR), None, "mesh", "mapping", []),
    ("unknown axis option", HEAD + "axes:\n  ep: {teams: [[0, 1, 2, 3]], colour: 1}\n" + pat(AR),
     None, "axes.ep.colour", "unknown key 'colour'", ["teams", "like", "priority", "nccl"]),
    ("teams uneven", HEAD + "axes:\n  ep: {teams: [[0, 1, 2], [3]]}\n" + pat(AR), None,
     "axes.ep.teams", "same size", []),
    ("rank twice in one axis", HEAD + "axes:\n  ep: {teams: [[0, 1], [1, 2]]}\n" + pat(AR),
     None, "axes.ep.teams[1][0]", "appears twice", []),
    ("rank out of range", HEAD + "axes:\n  ep: {teams: [[0, 1], [2, 4]]}\n" + pat(AR), None,
     "axes.ep.teams[1][1]", "out of range", []),
    ("negative rank", HEAD + "axes:\n  ep: {teams: [[0, -1]]}\n" + pat(AR), None,
     "axes.ep.teams[0][1]", "0 or more", []),
    ("empty team", HEAD + "axes:\n  ep: {teams: [[0, 1], []]}\n" + pat(AR), None,
     "axes.ep.teams[1]", "non-empty", []),
    ("rank not an int", HEAD + "axes:\n  ep: {teams: [[0, true]]}\n" + pat(AR), None,
     "axes.ep.teams[0][1]", "must be an integer", []),
    ("axis without teams or like", HEAD + "axes:\n  ep: {priority: high}\n" + pat(AR), None,
     "axes.ep", "needs teams", []),
    ("like unknown axis", HEAD + "axes:\n  ep: {like: nope}\n" + pat(AR), None, "axes.ep.like",
     "unknown axis 'nope'", ["world", "ep"]),
    ("like cycle", HEAD + "axes:\n  a: {like: b}\n  b: {like: a}\n" + pat(AR), None,
     "axes.a.like", "like cycle: a -> b -> a", []),
    ("axis named world", HEAD + "axes:\n  world: {teams: [[0, 1, 2, 3]]}\n" + pat(AR), None,
     "axes.world", "built-in", []),
    ("mesh dimension named world", HEAD + "mesh: {world: 4}\n" + pat(AR), None,
     "mesh.world", "cannot be redefined", []),
    ("mesh axis with teams", HEAD + "mesh: {dp: 4}\naxes:\n  dp: {teams: [[0, 1, 2, 3]]}\n"
     + pat(AR), None, "axes.dp.teams", "mesh dimension", []),
    ("unknown nccl key", HEAD + "axes:\n  ep: {teams: [[0, 1, 2, 3]], nccl: {max_cta: 4}}\n"
     + pat(AR), None, "axes.ep.nccl.max_cta", "unknown nccl option",
     ["max_ctas", "min_ctas", "cga_cluster_size", "net_name", "traffic_class", "cta_policy",
      "blocking", "split_share"]),
    ("nccl value type", HEAD + "axes:\n  ep: {teams: [[0, 1, 2, 3]], nccl: {max_ctas: 0}}\n"
     + pat(AR), None, "axes.ep.nccl.max_ctas", "at least 1", []),
    ("bad priority", HEAD + "axes:\n  ep: {teams: [[0, 1, 2, 3]], priority: urgent}\n"
     + pat(AR), None, "axes.ep.priority", "unknown priority 'urgent'", ["normal", "high"]),
    ("unknown op", HEAD + pat("{name: a, op: allreduce, size: 4M}"), None,
     "patterns[0].blocks[0].op", "unknown op 'allreduce'", OPS),
    ("custom op bad module", HEAD + pat("{name: a, op: 'no_such_pkg_xyz.mod:Foo', size: 4M}"),
     None, "patterns[0].blocks[0].op", "cannot import module", []),
    ("custom op not a Block", HEAD + pat("{name: a, op: 'collections:OrderedDict', size: 4M}"),
     None, "patterns[0].blocks[0].op", "not a subclass", []),
    ("custom op missing class", HEAD + pat("{name: a, op: 'collections:NoSuchThing'}"), None,
     "patterns[0].blocks[0].op", "no attribute", []),
    ("custom op check raises", HEAD + pat(
        "{name: a, op: 'tests.unit.test_loader:ExplodingBlock', size: 4M}"), None,
     "patterns[0].blocks[0]", "RuntimeError: boom", []),
    ("missing op", HEAD + pat("{name: a, size: 4M}"), None, "patterns[0].blocks[0].op",
     "missing required key 'op'", OPS),
    ("unknown block key", HEAD + pat("{name: a, op: all_reduce, size: 4M, colour: red}"), None,
     "patterns[0].blocks[0].colour", "unknown key 'colour' for op 'all_reduce'",
     ["name", "op", "axis", "lane", "dtype", "size", "reduce_op"]),
    ("missing size", HEAD + pat("{name: a, op: all_reduce}"), None, "patterns[0].blocks[0].size",
     "missing required key 'size'", []),
    ("size negative", HEAD + pat("{name: a, op: all_reduce, size: -4M}"), None,
     "patterns[0].blocks[0].size", "positive", []),
    ("size zero", HEAD + pat("{name: a, op: all_reduce, size: 0}"), None,
     "patterns[0].blocks[0].size", "positive", []),
    ("size abc", HEAD + pat("{name: a, op: all_reduce, size: abc}"), None,
     "patterns[0].blocks[0].size", "expected a size", []),
    ("size 1.5 bytes", HEAD + pat("{name: a, op: all_reduce, size: 1.5}"), None,
     "patterns[0].blocks[0].size", "not a whole number of bytes", []),
    ("size past address space", HEAD + pat("{name: a, op: all_reduce, size: 1024T}"), None,
     "patterns[0].blocks[0].size", "address space", []),
    ("all_gather divisibility", HEAD + pat("{name: a, op: all_gather, size: 1000}"), None,
     "patterns[0].blocks[0].size", "divisible by team size x element size (4 x 4", []),
    ("reduce_scatter divisibility", HEAD + pat("{name: a, op: reduce_scatter, size: 24}"), None,
     "patterns[0].blocks[0].size", "reduce_scatter needs a size divisible", []),
    ("all_to_all divisibility", HEAD + pat("{name: a, op: all_to_all, size: 8}"), None,
     "patterns[0].blocks[0].size", "all_to_all needs a size divisible", []),
    ("not whole fp32 elements", HEAD + pat("{name: a, op: all_reduce, size: 6}"), None,
     "patterns[0].blocks[0].size", "whole number of fp32 elements", []),
    ("root out of team", HEAD + pat("{name: a, op: broadcast, size: 4K, root: 4}"), None,
     "patterns[0].blocks[0].root", "below the team size 4", []),
    ("root negative", HEAD + pat("{name: a, op: broadcast, size: 4K, root: -1}"), None,
     "patterns[0].blocks[0].root", "at least 0", []),
    ("bad reduce_op", HEAD + pat("{name: a, op: all_reduce, size: 4K, reduce_op: mean}"), None,
     "patterns[0].blocks[0].reduce_op", "unknown value 'mean'",
     ["sum", "avg", "max", "min", "prod"]),
    ("gemm missing k", HEAD + pat("{name: g, op: gemm, m: 64, n: 64}"), None,
     "patterns[0].blocks[0].k", "gemm needs k", []),
    ("gemm inconsistent shapes", HEAD + pat(
        "{name: g, op: gemm, a_shape: [64, 32], b_shape: [16, 64]}"), None,
     "patterns[0].blocks[0].k", "inconsistent k", []),
    ("gemm dim not an int", HEAD + pat("{name: g, op: gemm, m: 4K, n: 64, k: 64}"), None,
     "patterns[0].blocks[0].m", "expected an integer", []),
    ("gemm dim zero", HEAD + pat("{name: g, op: gemm, m: 0, n: 64, k: 64}"), None,
     "patterns[0].blocks[0].m", "at least 1", []),
    ("gemm shape not positive", HEAD + pat("{name: g, op: gemm, a_shape: [64, 0], n: 8}"), None,
     "patterns[0].blocks[0].a_shape", "positive integers", []),
    ("gemm dtype int8", HEAD + pat("{name: g, op: gemm, m: 64, n: 64, k: 64, dtype: int8}"),
     None, "patterns[0].blocks[0].dtype", "floating dtype", []),
    ("gemm past address space", HEAD + pat(
        "{name: g, op: gemm, m: 100000000, n: 100000000, k: 100000000}"), None,
     "patterns[0].blocks[0]", "address space", []),
    ("send_recv on a team of 1", HEAD + "axes:\n  solo: {teams: [[0], [1], [2], [3]]}\n"
     + pat("{name: s, op: send_recv, axis: solo, size: 4K}"), None,
     "patterns[0].blocks[0].axis", "at least 2 ranks", []),
    ("sleep negative", HEAD + pat("{name: s, op: sleep, duration_us: -5}"), None,
     "patterns[0].blocks[0].duration_us", "at least 0", []),
    ("duplicate block names", HEAD + pat(AR, "{name: ar, op: gemm, m: 8, n: 8, k: 8}"), None,
     "patterns[0].blocks[1].name", "duplicate block name 'ar'", []),
    ("duplicate pattern names", HEAD + "patterns:\n  - {name: p, blocks: [" + AR + "]}\n"
     "  - {name: p, blocks: [" + AR + "]}\n", None, "patterns[1].name", "duplicate pattern", []),
    ("unknown dtype", HEAD + pat("{name: a, op: all_reduce, size: 4K, dtype: fp8}"), None,
     "patterns[0].blocks[0].dtype", "unknown dtype 'fp8'", DTYPES),
    ("unknown block axis", HEAD + pat("{name: a, op: all_reduce, size: 4K, axis: tp}"), None,
     "patterns[0].blocks[0].axis", "unknown axis 'tp'", ["world"]),
    ("iters 0", HEAD + "defaults: {iters: 0}\n" + pat(AR), None, "defaults.iters",
     "at least 1", []),
    ("warmup -1", HEAD + pat(AR, extra="    warmup_iters: -1\n"), None,
     "patterns[0].warmup_iters", "at least 0", []),
    ("iters ten", HEAD + "defaults: {iters: ten}\n" + pat(AR), None, "defaults.iters",
     "expected an integer, got 'ten'", []),
    ("bool as yes string", HEAD + "defaults: {baseline: 'yes'}\n" + pat(AR), None,
     "defaults.baseline", "expected true or false, got 'yes'", []),
    ("in_place as string", HEAD + pat("{name: a, op: all_gather, size: 4K, in_place: 'no'}"),
     None, "patterns[0].blocks[0].in_place", "expected true or false", []),
    ("sync bad", HEAD + pat(AR, extra="    sync: sometimes\n"), None, "patterns[0].sync",
     "unknown sync mode 'sometimes'", ["barrier", "none"]),
    ("unknown defaults key", HEAD + "defaults: {iterations: 5}\n" + pat(AR), None,
     "defaults.iterations", "unknown key", ["iters", "warmup_iters"]),
    ("unknown pattern key", HEAD + pat(AR, extra="    repeat: 2\n"), None, "patterns[0].repeat",
     "unknown key 'repeat'", ["name", "sweep", "blocks"]),
    ("env bad name", HEAD + "env: {'1BAD': x}\n" + pat(AR), None, "env.1BAD",
     "not an environment variable name", []),
    ("env bad value", HEAD + "env: {NCCL_ALGO: [Ring]}\n" + pat(AR), None, "env.NCCL_ALGO",
     "strings or numbers", []),
    ("timeout zero", HEAD + "timeout_s: 0\n" + pat(AR), None, "timeout_s",
     "must be at least 1, got 0 (the seconds ranks wait", []),
    ("stop_on_error string", HEAD + "stop_on_error: 'true'\n" + pat(AR), None, "stop_on_error",
     "expected true or false", []),
    ("sweep undefined var", HEAD + pat("{name: a, op: all_reduce, size: '${sise}'}",
                                       extra="    sweep: {size: [4K]}\n"), None,
     "patterns[0].blocks[0].size", "undefined sweep variable 'sise'", ["size"]),
    ("reference without sweep", HEAD + pat("{name: a, op: all_reduce, size: '${size}'}"), None,
     "patterns[0].blocks[0].size", "undefined sweep variable 'size'", []),
    ("sweep unused var", HEAD + pat(AR, extra="    sweep: {size: [4K]}\n"), None,
     "patterns[0].sweep.size", "not used", []),
    ("sweep factor 1", HEAD + pat("{name: a, op: all_reduce, size: '${size}'}",
                                  extra="    sweep: {size: {from: 1K, to: 1M, factor: 1}}\n"),
     None, "patterns[0].sweep.size.factor", "greater than 1", []),
    ("sweep too many points", HEAD + pat(
        "{name: a, op: all_reduce, size: '${size}'}",
        extra="    sweep: {size: {from: 4, to: 100000000000, factor: 1.001}}\n"), None,
     "patterns[0].sweep.size", "more than", []),
    ("sweep error names the point", HEAD + pat("{name: a, op: all_reduce, size: '${size}'}",
                                               extra="    sweep: {size: [8, 3, 16]}\n"), None,
     "patterns[0].blocks[0].size", "at sweep point size=3", []),
    ("sweep in pattern name", HEAD + "patterns:\n  - name: 'p_${size}'\n    sweep: {size: [4K]}\n"
     "    blocks: [{name: a, op: all_reduce, size: '${size}'}]\n", None, "patterns[0].name",
     "cannot use sweep variables", []),
    ("two lanes on one axis", HEAD + pat(AR, "{name: b, op: all_gather, size: 4M, lane: side}"),
     None, "patterns[0].blocks[1].lane", "like: world", []),
    ("patterns empty", HEAD + "patterns: []\n", None, "patterns", "non-empty list", []),
    ("patterns missing", HEAD, None, "patterns", "missing required key 'patterns'", []),
    ("blocks empty", HEAD + "patterns:\n  - {name: p, blocks: []}\n", None, "patterns[0].blocks",
     "non-empty list", []),
    ("block not a mapping", HEAD + pat("all_reduce"), None, "patterns[0].blocks[0]",
     "a block is a mapping", []),
    ("top-level not a mapping", "- 1\n- 2\n", None, "", "must be a mapping", []),
    ("top-level scalar", "hello\n", None, "", "must be a mapping", []),
    ("duplicate key", HEAD + "name: u\n" + pat(AR), None, "name", "duplicate key 'name'", []),
    ("python tag refused", HEAD + "x: !!python/object/apply:os.system ['true']\n" + pat(AR),
     None, "x", "unsupported YAML", []),
    # Values as written; booleans are true/false only.
    ("sync yes, as written", HEAD + "defaults: {sync: yes}\n" + pat(AR), None, "defaults.sync",
     "unknown sync mode 'yes'", ["barrier", "none"]),
    ("sync hex, as written", HEAD + pat(AR, extra="    sync: 0x10\n"), None, "patterns[0].sync",
     "unknown sync mode 0x10;", []),
    ("mesh degree null, as written", HEAD + "mesh: {dp: ~, tp: 4}\n" + pat(AR), None, "mesh.dp",
     "expected an integer, got ~", []),
    ("baseline yes unquoted", HEAD + "defaults: {baseline: yes}\n" + pat(AR), None,
     "defaults.baseline", "got 'yes': write true or false", []),
    ("check on unquoted", HEAD + pat(AR, extra="    check: on\n"), None, "patterns[0].check",
     "got 'on': write true or false", []),
    ("stop_on_error off", HEAD + "stop_on_error: off\n" + pat(AR), None, "stop_on_error",
     "got 'off': write true or false", []),
    ("register_buffers y", HEAD + pat("{name: a, op: all_reduce, size: 4K, register_buffers: y}"),
     None, "patterns[0].blocks[0].register_buffers", "got 'y': write true or false", []),
    ("in_place no unquoted", HEAD + pat("{name: a, op: all_gather, size: 4K, in_place: no}"),
     None, "patterns[0].blocks[0].in_place", "got 'no': write true or false", []),
    ("nccl blocking yes", HEAD + "axes:\n  ep: {teams: [[0, 1, 2, 3]], nccl: {blocking: yes}}\n"
     + pat(AR), None, "axes.ep.nccl.blocking", "got 'yes': write true or false", []),
    ("env value yes unquoted", HEAD + "env: {NCCL_IB_DISABLE: yes}\n" + pat(AR), None,
     "env.NCCL_IB_DISABLE", "write true or false (set as 1 or 0), or quote 'yes'", []),
    ("float YAML reads as text", HEAD + "timeout_s: 1e3\n" + pat(AR), None, "timeout_s",
     "YAML reads 1e3 as text", []),
    # Bounds of every number that reaches a timer, a sleep or an allocation.
    ("timeout past a day", HEAD + "timeout_s: 1.0e+15\n" + pat(AR), None, "timeout_s",
     "must be at most 86400, got 1.0e+15 (", ["over a day", "1e10 s"]),
    ("timeout 1e10", HEAD + "timeout_s: 10000000000\n" + pat(AR), None, "timeout_s",
     "must be at most 86400", []),
    ("timeout below a second", HEAD + "timeout_s: 1.0e-4\n" + pat(AR), None, "timeout_s",
     "must be at least 1, got 1.0e-4 (", ["under 1 s"]),
    ("iters past the profiler's ids", HEAD + "defaults: {iters: 100000000000000}\n" + pat(AR),
     None, "defaults.iters", "must be at most 1000000, got 100000000000000 (",
     ["24-bit correlation ids", "host memory"]),
    ("warmup_iters too many", HEAD + pat(AR, extra="    warmup_iters: 1000001\n"), None,
     "patterns[0].warmup_iters", "must be at most 1000000", []),
    ("too many launches in one window", HEAD + pat(
        *[f"{{name: g{i}, op: gemm, m: 8, n: 8, k: 8}}" for i in range(11)],
        extra="    iters: 1000000\n"), None, "patterns[0].iters",
     "11 blocks x 1000000 iterations is 11000000 block launches in one window, more than "
     "10000000", ["host memory"]),
    ("sleep past 60 s", HEAD + pat("{name: s, op: sleep, duration_us: 1.0e+300}"), None,
     "patterns[0].blocks[0].duration_us", "must be at most 60000000, got 1.0e+300 (duration_us:",
     ["60 s", "every iteration waits for it"]),
    ("sleep 61 s", HEAD + pat("{name: s, op: sleep, duration_us: 61000000}"), None,
     "patterns[0].blocks[0].duration_us", "must be at most 60000000", []),
    # The launcher owns the rendezvous.
    ("env MASTER_ADDR", HEAD + "env: {MASTER_ADDR: 10.0.0.1}\n" + pat(AR), None,
     "env.MASTER_ADDR", "MASTER_ADDR belongs to the launcher", ["rendezvous", "may not set it"]),
    ("axis env MASTER_PORT", HEAD + "axes:\n  ep: {teams: [[0, 1, 2, 3]], env: {MASTER_PORT: 1}}\n"
     + pat(AR), None, "axes.ep.env.MASTER_PORT", "MASTER_PORT belongs to the launcher", []),
    # Custom ops.
    ("custom op __main__", HEAD + pat("{name: a, op: 'venv.__main__:X'}"), None,
     "patterns[0].blocks[0].op", "names a __main__ module, which runs a program", []),
    ("custom op not dotted names", HEAD + pat("{name: a, op: 'my-pkg.mod:X'}"), None,
     "patterns[0].blocks[0].op", "dotted Python names", []),
    # The world size names where a run's size may come from.
    ("world_size from --world-size", HEAD + pat(AR), 3, "world_size",
     "the run has 3 rank(s) (--nproc, --world-size or the launcher's world size); they must "
     "agree", []),
]
# fmt: on


@pytest.mark.parametrize(
    ("text", "world_size", "path", "fragment", "choices"),
    [case[1:] for case in BAD],
    ids=[case[0] for case in BAD],
)
def test_bad_snippets(text, world_size, path, fragment, choices):
    with pytest.raises(ConfigError) as info:
        load_suite_text(text, file="bad.yaml", world_size=world_size)
    err = info.value
    assert type(err) is ConfigError
    matches = [i for i in err.issues if i.path == path and fragment in i.message]
    assert matches, f"no issue at {path!r} with {fragment!r}; got:\n{err}"
    for choice in choices:
        assert choice in matches[0].message, f"{choice!r} not listed in {matches[0].message!r}"
    assert all(i.file == "bad.yaml" for i in err.issues)


def test_table_is_large_enough():
    assert len(BAD) >= 110


def test_decimal_size_when_whole_is_fine():
    suite = load_suite_text(HEAD + pat("{name: a, op: all_reduce, size: 1.5K}"))
    assert suite.patterns[0].blocks[0].params["size"] == 1536


def test_yaml_syntax_error_has_its_line():
    text = "name: t\nworld_size: 4\npatterns:\n  - name: p\n    blocks: [\n"
    with pytest.raises(ConfigError) as info:
        load_suite_text(text, file="syntax.yaml")
    assert "YAML syntax error" in str(info.value)
    line = info.value.issues[0].line
    assert line is not None and line >= 5
    assert "syntax.yaml:" in str(info.value)


def test_issue_lines_point_at_the_key():
    text = (
        HEAD + "patterns:\n  - name: p\n    blocks:\n      - name: a\n        op: all_reduce\n"
        "        size: -4M\n"
    )
    with pytest.raises(ConfigError) as info:
        load_suite_text(text)
    (issue,) = info.value.issues
    assert issue.path == "patterns[0].blocks[0].size"
    assert issue.line == 8
    assert str(issue).startswith("<string>:8: patterns[0].blocks[0].size: ")


def test_every_problem_is_reported_at_once():
    text = "name: t\nworld_size: 4\ncolour: 1\ndefaults: {iters: 0}\n" + pat(
        "{name: a, op: all_reduce, size: -1}", "{name: b, op: nope}"
    )
    with pytest.raises(ConfigError) as info:
        load_suite_text(text)
    paths = {i.path for i in info.value.issues}
    assert {
        "colour",
        "defaults.iters",
        "patterns[0].blocks[0].size",
        "patterns[0].blocks[1].op",
    } <= paths


def test_file_not_found_names_the_path(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_suite(missing)


def test_unknown_config_name_lists_shipped_ones():
    with pytest.raises(ConfigError) as info:
        load_suite("no_such_config")
    assert "quickstart" in str(info.value) and "ag_rs" in str(info.value)


def test_resolve_config_path(tmp_path):
    assert resolve_config_path("quickstart") == CONFIGS_DIR / "quickstart.yaml"
    assert resolve_config_path("ag_rs.yaml") == CONFIGS_DIR / "ag_rs.yaml"
    own = tmp_path / "mine.yaml"
    own.write_text("name: x\n")
    assert resolve_config_path(str(own)) == own
    assert {"quickstart", "ag_rs"} <= set(shipped_configs())
    with pytest.raises(ConfigError, match="not a file"):
        resolve_config_path(tmp_path)


def test_file_too_large_is_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (4 * 1024 * 1024 + 1))
    with pytest.raises(ConfigError, match="larger than 4 MiB"):
        load_suite(big)
    with pytest.raises(ConfigError, match="larger than 4 MiB"):
        load_suite_text("#" * (4 * 1024 * 1024 + 1))


def test_not_utf8_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_suite(bad)


HOSTILE_HANG_S = 120
"""A hostile file must be refused within this: 10-100x the slowest case's time on a loaded
machine, far below what an unbounded expansion would take."""
BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)
)
MERGE_BOMB = "a: &a {x: 1}\nb0: &b0 {<<: [*a, *a]}\n" + "".join(
    f"b{i}: &b{i} {{<<: [*b{i - 1}, *b{i - 1}], k{i}: 1}}\n" for i in range(1, 40)
)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (BILLION_LAUGHS, "more than 1000000"),
        (MERGE_BOMB, "more than 1000000"),
        ("[" * 100_000 + "]" * 100_000, "deeper than 100"),
        ("a: " + "{b: " * 5000 + "1" + "}" * 5000, "deeper than 100"),
        ("a: &a [*a]\n", "recursive alias"),
        (
            "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 150)),
            "deeper than 100",
        ),
        ("x: [" + ", ".join(["1"] * 1_000_001) + "]\n", "more than 1000000"),
    ],
    ids=[
        "billion-laughs",
        "merge-bomb",
        "deep-flow",
        "deep-mapping",
        "recursive-alias",
        "deep-alias-chain",
        "too-many-nodes",
    ],
)
def test_hostile_yaml_is_refused_quickly(text, fragment):
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=fragment):
        load_suite_text(text)
    # Catches an unbounded expansion (a billion-laughs file expanded in full takes hours and
    # GBs), not speed: the slowest case here, a million-node file, takes 1-10 s under load.
    assert time.perf_counter() - start < HOSTILE_HANG_S


# ---------------------------------------------------------------------------------------------
# What valid files give
# ---------------------------------------------------------------------------------------------
def test_gemm_flops_and_dims_are_element_counts():
    suite = load_suite_text(
        HEAD + pat("{name: g, op: gemm, m: 4096, n: 4096, k: 4096, dtype: bf16}")
    )
    block = suite.patterns[0].blocks[0]
    assert block.params["m"] == block.params["n"] == block.params["k"] == 4096
    assert Gemm.flop_count(block.params) == 2 * 4096**3


def test_gemm_from_operand_shapes_is_not_scaled_by_dtype():
    for dtype in ("fp32", "bf16", "fp64"):
        suite = load_suite_text(
            HEAD
            + pat(
                "{name: g, op: gemm, a_shape: [4096, 1024], "
                f"b_shape: [1024, 2048], dtype: {dtype}}}"
            )
        )
        params = suite.patterns[0].blocks[0].params
        assert (params["m"], params["k"], params["n"]) == (4096, 1024, 2048)
        assert Gemm.flop_count(params) == 2 * 4096 * 1024 * 2048


def test_mesh_teams_follow_device_mesh_order():
    assert mesh_teams([2, 2], 1) == ((0, 1), (2, 3))
    assert mesh_teams([2, 2], 0) == ((0, 2), (1, 3))
    assert mesh_teams([2, 4], 1) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert mesh_teams([2, 4], 0) == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert mesh_teams([2, 2, 2], 1) == ((0, 2), (1, 3), (4, 6), (5, 7))


@pytest.mark.parametrize(
    ("mesh", "world", "expected"),
    [
        ("{dp: 2, tp: 2}", 4, {"tp": ((0, 1), (2, 3)), "dp": ((0, 2), (1, 3))}),
        (
            "{dp: 2, tp: 4}",
            8,
            {"tp": ((0, 1, 2, 3), (4, 5, 6, 7)), "dp": ((0, 4), (1, 5), (2, 6), (3, 7))},
        ),
    ],
)
def test_mesh_axes(mesh, world, expected):
    suite = load_suite_text(f"name: t\nmesh: {mesh}\n" + pat(AR), world_size=world)
    for name, teams in expected.items():
        assert suite.axes[name].teams == teams
    assert suite.axes["world"].teams == (tuple(range(world)),)
    assert list(suite.axes) == ["world", "dp", "tp"]


def test_like_axes_share_teams_but_are_distinct():
    text = (
        "name: t\nworld_size: 4\nmesh: {dp: 2, tp: 2}\naxes:\n"
        "  dp: {priority: high, nccl: {max_ctas: 8, traffic_class: 3}}\n"
        "  dp_rs: {like: dp, nccl: {min_ctas: 2}}\n  dp_rs2: {like: dp_rs}\n"
        "  all2: {like: world}\n"
        + pat(
            "{name: ag, op: all_gather, axis: dp, size: 4M}",
            "{name: rs, op: reduce_scatter, axis: dp_rs, size: 4M}",
            "{name: ar, op: all_reduce, axis: dp_rs2, size: 4M}",
            "{name: ar2, op: all_reduce, axis: all2, size: 4M}",
        )
    )
    suite = load_suite_text(text)
    dp, dp_rs, dp_rs2 = suite.axes["dp"], suite.axes["dp_rs"], suite.axes["dp_rs2"]
    assert dp.teams == dp_rs.teams == dp_rs2.teams == ((0, 2), (1, 3))
    assert (dp_rs.like, dp_rs2.like, dp.like) == ("dp", "dp_rs", None)
    assert dp.priority == "high" and dp_rs.priority == "normal"
    assert dict(dp.nccl) == {"max_ctas": 8, "traffic_class": 3}
    assert dict(dp_rs.nccl) == {"min_ctas": 2}
    assert suite.axes["all2"].teams == ((0, 1, 2, 3),)
    lanes = [b.lane for b in suite.patterns[0].blocks]
    assert lanes == ["dp", "dp_rs", "dp_rs2", "all2"]


def test_sweep_names_and_product_order():
    text = HEAD + pat(
        "{name: 'ar_${size}', op: all_reduce, size: '${size}', dtype: '${dt}'}",
        extra="    sweep: {size: [4K, 1M], dt: [fp32, bf16]}\n",
        name="ar",
    )
    suite = load_suite_text(text)
    assert [p.name for p in suite.patterns] == [
        "ar[size=4K,dt=fp32]",
        "ar[size=4K,dt=bf16]",
        "ar[size=1M,dt=fp32]",
        "ar[size=1M,dt=bf16]",
    ]
    assert suite.patterns[1].sweep_point == (("size", "4K"), ("dt", "bf16"))
    assert suite.patterns[1].base_name == "ar"
    block = suite.patterns[2].blocks[0]
    assert (block.name, block.params["size"], block.dtype) == ("ar_1M", 1024**2, "fp32")


def test_geometric_size_sweep_names():
    text = HEAD + pat(
        "{name: ar, op: all_reduce, size: '${size}'}",
        extra="    sweep: {size: {from: 1K, to: 1G, factor: 4}}\n",
        name="s",
    )
    suite = load_suite_text(text)
    assert [p.name for p in suite.patterns] == [
        f"s[size={v}]"
        for v in ("1K", "4K", "16K", "64K", "256K", "1M", "4M", "16M", "64M", "256M", "1G")
    ]
    assert [p.blocks[0].params["size"] for p in suite.patterns] == [1024 * 4**i for i in range(11)]


def test_sweep_over_gemm_dims_and_sleep():
    text = HEAD + pat(
        "{name: g, op: gemm, m: '${m}', n: '${m}', k: 64}",
        "{name: s, op: sleep, axis: world, duration_us: '${us}', lane: compute}",
        extra="    sweep: {m: [128, 256], us: [10, 2.5]}\n",
    )
    suite = load_suite_text(text)
    assert len(suite.patterns) == 4
    assert suite.patterns[3].blocks[0].params["m"] == 256
    assert suite.patterns[3].blocks[1].params["duration_us"] == 2.5


def test_defaults_and_per_pattern_overrides():
    text = (
        "name: t\nworld_size: 2\ndefaults: {dtype: bf16, warmup_iters: 2, iters: 7, "
        "baseline: false, check: true, sync: none, register_buffers: true}\n"
        "patterns:\n"
        "  - {name: a, blocks: [{name: x, op: all_reduce, size: 4K}]}\n"
        "  - {name: b, dtype: fp16, iters: 3, warmup_iters: 0, baseline: true, check: false,"
        " sync: barrier, register_buffers: false,\n"
        "     blocks: [{name: x, op: all_reduce, size: 4K},\n"
        "              {name: y, op: all_reduce, size: 4K, dtype: fp64, register_buffers: true,"
        " lane: world}]}\n"
    )
    suite = load_suite_text(text)
    a, b = suite.patterns
    assert (a.warmup_iters, a.num_iters, a.baseline, a.check, a.sync) == (2, 7, False, True, "none")
    assert a.blocks[0].dtype == "bf16" and a.blocks[0].register_buffers is True
    assert (b.warmup_iters, b.num_iters, b.baseline, b.check, b.sync) == (
        0,
        3,
        True,
        False,
        "barrier",
    )
    assert b.blocks[0].dtype == "fp16" and b.blocks[0].register_buffers is False
    assert b.blocks[1].dtype == "fp64" and b.blocks[1].register_buffers is True


def test_built_in_defaults():
    suite = load_suite_text("name: t\n" + pat(AR), world_size=1)
    p = suite.patterns[0]
    assert (p.warmup_iters, p.num_iters, p.baseline, p.check, p.sync) == (
        5,
        50,
        True,
        False,
        "barrier",
    )
    block = p.blocks[0]
    assert (block.axis, block.lane, block.dtype, block.register_buffers) == (
        "world",
        "world",
        "fp32",
        False,
    )
    assert dict(block.params) == {"size": 4 * 1024**2, "reduce_op": "sum"}
    assert suite.timeout_s == 45.0 and suite.stop_on_error is True
    assert suite.world_size == 1 and suite.source == "<string>"


def test_top_level_options_and_env_are_stringified():
    text = (
        HEAD + "timeout_s: 12.5\nstop_on_error: false\n"
        "env: {NCCL_ALGO: Ring, NCCL_IB_DISABLE: 1, NCCL_NVLS_ENABLE: false, X_F: 1.5}\n" + pat(AR)
    )
    suite = load_suite_text(text)
    assert suite.timeout_s == 12.5 and suite.stop_on_error is False
    assert dict(suite.env) == {
        "NCCL_ALGO": "Ring",
        "NCCL_IB_DISABLE": "1",
        "NCCL_NVLS_ENABLE": "0",
        "X_F": "1.5",
    }


def test_per_axis_env_warns_and_is_not_applied(caplog):
    text = HEAD + "axes:\n  ep: {teams: [[0, 1, 2, 3]], env: {NCCL_ALGO: Tree}}\n" + pat(AR)
    with caplog.at_level(logging.WARNING, logger="maestro.config"):
        suite = load_suite_text(text)
    records = [r for r in caplog.records if r.name == "maestro.config"]
    assert records and records[0].levelno == logging.WARNING
    message = records[0].getMessage()
    assert "NCCL_ALGO" in message and "once per process" in message and "top-level env" in message
    assert "NCCL_ALGO" not in suite.env
    assert not hasattr(suite.axes["ep"], "env")


def test_ranks_outside_an_axis_are_allowed():
    text = (
        HEAD
        + "axes:\n  half: {teams: [[0, 1]]}\n"
        + pat(
            "{name: a, op: all_reduce, axis: half, size: 4K}",
            "{name: g, op: gemm, m: 8, n: 8, k: 8}",
        )
    )
    suite = load_suite_text(text)
    assert suite.axes["half"].team_of(3) is None
    assert rank_buffer_bytes(suite, suite.patterns[0]) == (4096 + 768, 4096 + 768, 768, 768)


def test_compute_blocks_may_take_their_own_lane_on_a_shared_axis():
    suite = load_suite_text(HEAD + pat(AR, "{name: g, op: gemm, m: 8, n: 8, k: 8, lane: mm}"))
    assert suite.patterns[0].lanes == ("world", "mm")


def test_two_axes_may_share_a_lane():
    text = (
        HEAD
        + "axes:\n  other: {like: world}\n"
        + pat(AR, "{name: b, op: all_reduce, axis: other, size: 4K, lane: world}")
    )
    assert load_suite_text(text).patterns[0].lanes == ("world",)


def test_custom_op_by_module_path():
    text = HEAD + pat("{name: c, op: 'userbenchmark.maestro.blocks.comm:AllReduce', size: 4K}")
    block = load_suite_text(text).patterns[0].blocks[0]
    assert block.op == "userbenchmark.maestro.blocks.comm:AllReduce"
    assert block.params["size"] == 4096


def test_yaml_anchors_and_merge_keys_work():
    text = (
        HEAD + "patterns:\n  - name: p\n    blocks:\n"
        "      - &ar {name: a, op: all_reduce, size: 4K}\n"
        "      - {<<: *ar, name: b}\n"
    )
    blocks = load_suite_text(text).patterns[0].blocks
    assert [(b.name, b.params["size"]) for b in blocks] == [("a", 4096), ("b", 4096)]


def test_result_is_frozen():
    suite = load_suite_text(HEAD + pat(AR))
    assert isinstance(suite, SuiteSpec)
    assert isinstance(suite.patterns[0], PatternSpec)
    assert isinstance(suite.patterns[0].blocks[0], BlockSpec)
    assert isinstance(suite.axes["world"], AxisSpec)
    with pytest.raises(AttributeError):
        suite.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        suite.patterns[0].blocks[0].params["size"] = 1  # type: ignore[index]


def test_world_size_from_the_caller_or_the_file():
    assert load_suite_text(HEAD + pat(AR), world_size=4).world_size == 4
    assert load_suite_text("name: t\n" + pat(AR), world_size=2).world_size == 2


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_quickstart_loads_at_any_small_world(world_size):
    suite = load_suite("quickstart", world_size=world_size)
    assert suite.world_size == world_size
    assert len(suite.patterns) >= 3
    ops = {b.op for p in suite.patterns for b in p.blocks}
    assert {"all_reduce", "gemm", "all_gather", "reduce_scatter"} <= ops
    assert any(a.like for a in suite.axes.values())
    for pattern in suite.patterns:
        assert pattern.num_iters <= 100 and max(rank_buffer_bytes(suite, pattern)) < 16 * 1024**2


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_ag_rs_loads_at_several_sizes(world_size):
    suite = load_suite("ag_rs", world_size=world_size)
    (pattern,) = suite.patterns
    ag, rs = pattern.blocks
    assert (ag.op, rs.op) == ("all_gather", "reduce_scatter")
    assert ag.params["size"] == rs.params["size"] == 4 * 1024**2
    assert ag.dtype == rs.dtype == "bf16"
    assert suite.axes[ag.axis].teams == suite.axes[rs.axis].teams
    assert ag.axis != rs.axis and ag.lane != rs.lane


def test_ag_rs_needs_a_world_size():
    with pytest.raises(ConfigError, match="--world-size"):
        load_suite("ag_rs")


def test_shipped_files_have_a_comment_header():
    for name in ("quickstart", "ag_rs"):
        first = (CONFIGS_DIR / f"{name}.yaml").read_text().splitlines()[0]
        assert first.startswith("#")


def test_summary_lists_patterns_axes_and_memory():
    suite = load_suite("quickstart", world_size=2)
    text = suite_summary(suite)
    for pattern in suite.patterns:
        assert pattern.name in text
    for axis in suite.axes:
        assert axis in text
    assert "buffers per rank" in text and "KiB" in text
    assert "m=256 n=256 k=256" in text and "MFLOP" in text
    assert "size=256K" in text


def test_summary_counts_ranks_outside_an_axis():
    text = (
        HEAD
        + "axes:\n  half: {teams: [[0, 1]]}\n"
        + pat("{name: a, op: broadcast, axis: half, size: 1M}")
    )
    summary = suite_summary(load_suite_text(text))
    assert "2 of 4" in summary and "max 1 MiB (ranks 0, 1), min 0 B" in summary


def test_config_path_is_written_relative_to_the_package():
    expected = Path(__file__).resolve().parents[2] / "userbenchmark/maestro/configs"
    assert expected == CONFIGS_DIR


@pytest.mark.parametrize("name", ["a\0b", "x" * 5000, "", "..", "no/such/dir/file.yaml"])
def test_odd_config_names_give_config_error(name):
    with pytest.raises(ConfigError):
        load_suite(name)


def test_empty_optional_sections_are_absent():
    suite = load_suite_text(HEAD + "env:\naxes:\ndefaults:\nmesh:\n" + pat(AR))
    assert dict(suite.env) == {} and list(suite.axes) == ["world"]


def test_loading_touches_no_distributed_state():
    # In a fresh interpreter: validation must not import torch.distributed (nor need a GPU).
    code = (
        "import sys\n"
        "from userbenchmark.maestro.core.config.loader import load_suite\n"
        "from userbenchmark.maestro.core.config.summary import suite_summary\n"
        "suite_summary(load_suite('quickstart', world_size=2))\n"
        "assert 'torch.distributed' not in sys.modules, 'torch.distributed imported'\n"
    )
    root = Path(__file__).resolve().parents[2]
    # The limit catches a hang, not speed: this takes a few seconds even on a loaded machine.
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=600)
