"""Pattern-file loader: every problem of a file in one run."""

from __future__ import annotations

import pytest

from userbenchmark.maestro.core.config.loader import (
    MAX_ISSUES,
    load_suite_text,
)
from userbenchmark.maestro.errors import ConfigError

HEAD = "name: t\nworld_size: 4\n"
AR = "{name: ar, op: all_reduce, size: 4M}"


def pat(*blocks: str, extra: str = "", name: str = "p") -> str:
    body = "".join(f"      - {b}\n" for b in blocks)
    return f"patterns:\n  - name: {name}\n{extra}    blocks:\n{body}"


def problems(text: str, **kwargs) -> list[tuple[int | None, str, str]]:
    """(line, path, message) of every issue ``text`` gives."""
    with pytest.raises(ConfigError) as info:
        load_suite_text(text, file="f.yaml", **kwargs)
    return [(i.line, i.path, i.message) for i in info.value.issues]


# ---------------------------------------------------------------------------------------------
# Every problem of a file in one run
# ---------------------------------------------------------------------------------------------
FOUR_PROBLEMS = """\
name: t
world_size: 4
name: u
patterns:
  - name: a
    blocks:
      - {name: x, op: allreduce, size: 4K}
  - name: b
    sweep: {size: [4K, 8K], unused: [1, 2]}
    blocks:
      - {name: y, op: all_reduce, size: "${size}", reduce_op: mean}
"""


def test_duplicate_key_unknown_op_unused_variable_and_bad_parameter_at_once():
    with pytest.raises(ConfigError) as info:
        load_suite_text(FOUR_PROBLEMS, file="four.yaml")
    shown = str(info.value).splitlines()
    assert shown == [
        "four.yaml:3: name: duplicate key 'name'",
        "four.yaml:7: patterns[0].blocks[0].op: unknown op 'allreduce' (did you mean "
        "'all_reduce'?); valid ops: all_gather, all_reduce, all_to_all, broadcast, gemm, "
        "reduce, reduce_scatter, send_recv, sleep, or a custom 'package.module:ClassName'",
        "four.yaml:9: patterns[1].sweep.unused: sweep variable 'unused' is not used by any "
        'block (reference it as "${unused}")',
        "four.yaml:11: patterns[1].blocks[0].reduce_op: unknown value 'mean'; valid values: "
        "sum, avg, max, min, prod",
    ]


def test_a_bad_sweep_still_checks_the_blocks_without_guessing_its_values():
    text = HEAD + pat(
        "{name: 'a_${bad}', op: all_reduce, size: 4K, axis: '${bad}'}",
        "{name: s, op: all_reduce, size: '${size}'}",
        "{name: b, op: all_reduce, size: 4K, colour: red}",
        extra="    sweep: {size: [4K, 3], bad: [[1]]}\n",
    )
    found = {(path, message.split(";")[0]) for _, path, message in problems(text)}
    assert (
        "patterns[0].sweep.bad[0]",
        "sweep values must be strings, numbers or booleans, got a list",
    ) in found
    # size is valid: its points are checked (3 bytes is not whole fp32 elements).
    assert any(p == "patterns[0].blocks[1].size" and "size=3" in m for p, m in found), found
    assert ("patterns[0].blocks[2].colour", "unknown key 'colour' for op 'all_reduce'") in found
    # Values naming the bad variable are not reported again, at every point.
    assert not any(
        p in ("patterns[0].blocks[0].name", "patterns[0].blocks[0].axis") for p, _ in found
    ), found


def test_a_pattern_name_problem_still_checks_its_blocks():
    text = HEAD + "patterns:\n  - name: 'p q'\n    blocks: [{name: a, op: nope}]\n"
    paths = [path for _, path, _ in problems(text)]
    assert paths == ["patterns[0].name", "patterns[0].blocks[0].op"]


def test_problems_past_the_cap_are_counted():
    blocks = [f"{{name: b{i}, op: all_reduce, size: -{i + 1}}}" for i in range(MAX_ISSUES + 7)]
    issues = problems(HEAD + pat(*blocks))
    assert len(issues) == MAX_ISSUES + 1
    assert issues[-1][2] == "... and 7 more problems"


def test_fatal_problems_still_stop_at_once():
    issues = problems("name: t\nname: u\npatterns: [\n")
    assert len(issues) == 1 and "YAML syntax error" in issues[0][2]
    issues = problems("- name: t\n- name: t\n")
    assert len(issues) == 1 and "must be a mapping" in issues[0][2]
