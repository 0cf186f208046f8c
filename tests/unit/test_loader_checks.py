"""Pattern-file loader: every problem of a file in one run, values as written, the bounds of
numbers that reach timers and allocations, launcher-owned variables, and custom ops as trusted
code (contained, and checkable without importing them)."""

from __future__ import annotations

import logging
import sys
import uuid

import pytest
import yaml

from userbenchmark.maestro.blocks.registry import BlockImportError, resolve_op
from userbenchmark.maestro.core.config import loader as yaml_reader
from userbenchmark.maestro.core.config.loader import load_suite, load_suite_text
from userbenchmark.maestro.core.config.options import RunOptions, apply_overrides
from userbenchmark.maestro.core.config.patterns import MAX_ITERS
from userbenchmark.maestro.core.config.problems import MAX_ISSUES
from userbenchmark.maestro.core.config.summary import rank_buffer_bytes, suite_summary
from userbenchmark.maestro.errors import ConfigError, OptionError

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
        "'all_reduce'?); valid ops: all_gather, all_reduce, all_to_all, broadcast, busy, gemm, "
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
        "sweep values must be strings, numbers or booleans, got [1]",
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


def test_like_null_is_an_axis_without_teams():
    # It used to pass validation and leave the axis out of the suite, which then failed later.
    text = HEAD + "axes:\n  x: {like: null}\n" + pat("{name: a, op: all_reduce, axis: x, size: 4K}")
    [(_, path, message)] = problems(text)
    assert path == "axes.x"
    assert message.startswith("an axis needs teams (a list of lists of ranks) or like: <axis>")


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


# ---------------------------------------------------------------------------------------------
# Values as written, booleans strict
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "y", "n", "Yes", "ON", "'yes'"])
def test_boolean_keys_take_only_true_or_false(word):
    ((line, path, message),) = problems(HEAD + f"defaults: {{baseline: {word}}}\n" + pat(AR))
    written = word.strip("'")
    assert (line, path) == (3, "defaults.baseline")
    assert message.startswith(f"expected true or false, got '{written}': write true or false")


@pytest.mark.parametrize("word", ["true", "True", "TRUE", "false", "False", "FALSE"])
def test_true_and_false_are_booleans(word):
    suite = load_suite_text(HEAD + f"defaults: {{baseline: {word}}}\n" + pat(AR))
    assert suite.patterns[0].baseline is (word.lower() == "true")


def test_yes_is_a_word_in_sweeps_and_names():
    text = HEAD + pat(
        "{name: 'ar_${c}', op: all_reduce, size: 4K}", extra="    sweep: {c: [yes, on]}\n"
    )
    suite = load_suite_text(text)
    assert [p.name for p in suite.patterns] == ["p[c=yes]", "p[c=on]"]
    assert [p.blocks[0].name for p in suite.patterns] == ["ar_yes", "ar_on"]
    text = HEAD + pat(AR, extra="    check: '${c}'\n    sweep: {c: [yes, true]}\n")
    ((_, path, message),) = problems(text)
    assert path == "patterns[0].check"
    assert message == (
        "expected true or false, got 'yes': write true or false (yes/no/on/off/y/n are not "
        "booleans in a pattern file) (at sweep point c=yes)"
    )


def test_env_text_and_booleans():
    text = HEAD + "env: {A: 'yes', B: true, C: off_peak, D: 'on'}\n" + pat(AR)
    assert dict(load_suite_text(text).env) == {"A": "yes", "B": "1", "C": "off_peak", "D": "on"}


def test_values_are_shown_as_written():
    text = HEAD + "defaults: {sync: yes, dtype: 0x10}\nmesh: {dp: .inf}\n" + pat(AR)
    messages = {path: message for _, path, message in problems(text)}
    assert messages["defaults.sync"].startswith("unknown sync mode 'yes';")
    assert messages["defaults.dtype"].startswith("unknown dtype 0x10;")
    assert messages["mesh.dp"] == "expected an integer, got .inf"


# ---------------------------------------------------------------------------------------------
# Deep nesting is refused by maestro's own limit, whatever PyYAML's
# ---------------------------------------------------------------------------------------------
def test_deep_flow_is_ours_even_where_the_parser_has_its_own_limit(monkeypatch):
    # libyaml in PyYAML 6.0.4 refuses 1000 flow levels before the first event; emulate it.
    real_parse = yaml.parse

    def parse_with_a_limit(stream, Loader):
        if stream.count("[") > 1000:
            raise yaml.scanner.ScannerError(
                "while increasing flow level", None, "exceeded maximum nesting depth", None
            )
        return real_parse(stream, Loader=Loader)

    monkeypatch.setattr(yaml_reader.yaml, "parse", parse_with_a_limit)
    with pytest.raises(ConfigError) as info:
        load_suite_text("x: " + "[" * 5000 + "]" * 5000 + "\n")
    assert str(info.value) == "<string>:1: nesting deeper than 100 levels"


def test_brackets_in_text_are_not_nesting():
    many = "[" * 150
    text = f"# {many}\n" + HEAD + f"env: {{X: '{many}', Y: \"{many}\"}}\n" + pat(AR)
    assert load_suite_text(text).env["X"] == many


# ---------------------------------------------------------------------------------------------
# Bounds on the command line too
# ---------------------------------------------------------------------------------------------
def test_command_line_iterations_are_bounded():
    suite = load_suite_text(HEAD + pat(AR, "{name: g, op: gemm, m: 8, n: 8, k: 8, lane: mm}"))
    with pytest.raises(
        OptionError, match=r"--iters must be between 1 and 1000000, got 100000000000000$"
    ):
        RunOptions(iters=10**14)
    with pytest.raises(OptionError, match="--warmup-iters must be between 0 and 1000000"):
        RunOptions(warmup_iters=MAX_ITERS + 1)
    wide = load_suite_text(
        HEAD + pat(*[f"{{name: g{i}, op: gemm, m: 8, n: 8, k: 8}}" for i in range(20)])
    )
    with pytest.raises(ConfigError, match="20 blocks x 1000000 iterations"):
        apply_overrides(wide, RunOptions(iters=MAX_ITERS))
    assert apply_overrides(suite, RunOptions(iters=MAX_ITERS)).patterns[0].num_iters == MAX_ITERS


# ---------------------------------------------------------------------------------------------
# The launcher's variables
# ---------------------------------------------------------------------------------------------
LAUNCHER_VARIABLES = [
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "NCCL_COMM_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
]


@pytest.mark.parametrize("name", LAUNCHER_VARIABLES)
def test_launcher_variables_are_refused_at_the_top_and_per_axis(name):
    top = problems(HEAD + f"env: {{{name}: '1'}}\n" + pat(AR))
    axis = problems(HEAD + f"axes:\n  ep: {{like: world, env: {{{name}: '1'}}}}\n" + pat(AR))
    for (line, path, message), where in ((top[0], "env"), (axis[0], "axes.ep.env")):
        assert (line, path) == (3 if where == "env" else 4, f"{where}.{name}")
        assert message == (
            f"{name} belongs to the launcher (torchrun, srun or maestro's own --nproc), which "
            "owns the rendezvous and each rank's place in it; a pattern file may not set it"
        )


def test_other_variables_are_fine():
    text = HEAD + "env: {NCCL_ALGO: Ring, MASTER_ADDRESS_NOTE: x, SLURMISH: 1}\n" + pat(AR)
    assert set(load_suite_text(text).env) == {"NCCL_ALGO", "MASTER_ADDRESS_NOTE", "SLURMISH"}


# ---------------------------------------------------------------------------------------------
# The world size of the run
# ---------------------------------------------------------------------------------------------
def test_world_size_mismatch_names_both_sizes():
    issues = problems(HEAD + pat(AR), world_size=3)
    assert issues == [
        (
            2,
            "world_size",
            "the file sets world_size 4 but the run has 3 rank(s) (--nproc, --world-size or "
            "the launcher's world size); they must agree",
        )
    ]


def test_a_bad_run_size_is_reported():
    issues = problems("name: t\n" + pat(AR), world_size=0)
    assert [(path, message) for _, path, message in issues] == [
        ("world size", "must be at least 1, got 0")
    ]


# ---------------------------------------------------------------------------------------------
# Custom ops: trusted code, contained, and checkable without importing
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write a module on sys.path; returns a function (body) -> its unique module name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(body: str) -> str:
        name = f"maestro_user_{uuid.uuid4().hex}"
        (tmp_path / f"{name}.py").write_text(body)
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def test_system_exit_at_import_is_an_error_at_the_op(user_module):
    name = user_module("raise SystemExit(3)\n")
    ((line, path, message),) = problems(HEAD + pat(f"{{name: a, op: '{name}:X'}}"))
    assert (line, path) == (6, "patterns[0].blocks[0].op")
    assert message == f"cannot import module {name!r}: SystemExit: 3"


def test_keyboard_interrupt_at_import_goes_through(user_module):
    name = user_module("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        resolve_op(f"{name}:X")


def test_a_main_module_is_never_imported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("venv.__main__", None)
    with pytest.raises(BlockImportError, match="names a __main__ module"):
        resolve_op("venv.__main__:X")
    for op in ("__main__:X", "pkg.__main__.sub:X"):
        with pytest.raises(BlockImportError, match="__main__"):
            resolve_op(op)
    assert "venv.__main__" not in sys.modules
    assert list(tmp_path.iterdir()) == []


def test_without_import_a_custom_op_is_checked_by_name_only(user_module, caplog):
    name = user_module("raise RuntimeError('must not be imported')\n")
    text = HEAD + pat(
        f"{{name: c, op: '{name}:MyBlock', size: 4K, anything: [1, 2], lane: side}}",
        "{name: ar, op: all_reduce, size: 4K}",
    )
    with caplog.at_level(logging.WARNING, logger="maestro.config"):
        suite = load_suite_text(text, import_ops=False)
    assert name not in sys.modules
    custom = suite.patterns[0].blocks[0]
    assert custom.op == f"{name}:MyBlock" and custom.lane == "side"
    assert dict(custom.params) == {"size": "4K", "anything": [1, 2]}
    warnings = [r.getMessage() for r in caplog.records if r.name == "maestro.config"]
    assert warnings == [
        f"<string>: patterns[0].blocks[0].op: custom op '{name}:MyBlock' was not imported: "
        "only its name was checked, not its parameters nor whether it communicates (its lane)"
    ]
    summary = suite_summary(suite, import_ops=False)
    assert "custom ops not imported, not counted" in summary
    assert rank_buffer_bytes(suite, suite.patterns[0], import_ops=False) == (4096,) * 4
    assert name not in sys.modules


def test_without_import_built_in_ops_and_op_names_are_still_checked(caplog):
    text = HEAD + pat(
        "{name: a, op: 'pkg.mod:Good', size: 4K}",
        "{name: b, op: 'pkg mod:Bad'}",
        "{name: c, op: 'venv.__main__:X'}",
        "{name: d, op: all_reduce, size: -1}",
        "{name: e, op: nope}",
        "{name: f, op: 'pkg.mod:Good', axis: nowhere, dtype: fp8}",
    )
    with caplog.at_level(logging.WARNING, logger="maestro.config"):
        found = {path: message for _, path, message in problems(text, import_ops=False)}
    # Said even when the file has problems: the block is only partly checked either way.
    assert [r.getMessage().split(": ")[1] for r in caplog.records] == ["patterns[0].blocks[0].op"]
    assert set(found) == {
        "patterns[0].blocks[1].op",
        "patterns[0].blocks[2].op",
        "patterns[0].blocks[3].size",
        "patterns[0].blocks[4].op",
        "patterns[0].blocks[5].axis",
        "patterns[0].blocks[5].dtype",
    }
    assert "dotted Python names" in found["patterns[0].blocks[1].op"]
    assert "__main__" in found["patterns[0].blocks[2].op"]


def test_load_suite_passes_the_options_through(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text("name: t\nworld_size: 2\n" + pat("{name: c, op: 'no_such_pkg_q.m:C'}"))
    assert load_suite(path, import_ops=False).patterns[0].blocks[0].op == "no_such_pkg_q.m:C"
    with pytest.raises(ConfigError, match="cannot import module 'no_such_pkg_q.m'"):
        load_suite(path)
    with pytest.raises(ConfigError, match=r"the run has 4 rank\(s\)"):
        load_suite(path, world_size=4, import_ops=False)
