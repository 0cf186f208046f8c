"""What maestro prints for users: strings they supplied escaped, so that no message can drive the
terminal or forge a line of its own."""

from __future__ import annotations

import pytest

from userbenchmark.maestro import cli
from userbenchmark.maestro.errors import (
    ConfigIssue,
    OptionError,
    printable,
    say,
    user_error_message,
)

pytestmark = pytest.mark.usefixtures("cli_here")  # tests/conftest.py

HOSTILE = "\x1b[2J\x1b[H\nfile is valid\r\u202e"


def test_printable_escapes_what_a_terminal_acts_on_and_keeps_the_rest():
    assert printable(HOSTILE) == "\\x1b[2J\\x1b[H\\nfile is valid\\r\\u202e"
    assert printable("µs ∩ 4K, tab\there") == "µs ∩ 4K, tab\\there"
    assert printable(printable(HOSTILE)) == printable(HOSTILE)  # escaping twice changes nothing


def test_a_yaml_key_with_escapes_prints_as_one_escaped_line(tmp_path, capsys):
    config = tmp_path / "hostile.yaml"
    config.write_text(
        "name: x\nworld_size: 1\npatterns:\n  - name: p\n    blocks:\n      - {name: a, op: "
        'sleep, duration_us: 10, "\\e[2J\\nfile is valid": 1}\n'
    )
    assert cli.main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and err.count("\n") == 2, err  # the label line and one problem
    assert "blocks[0].\\x1b[2J\\nfile is valid: unknown key" in err


def test_messages_escape_paths_and_keys_in_every_kind_of_input_error(capsys):
    issue = ConfigIssue("bad", path=f"a.{HOSTILE}", file=f"/tmp/{HOSTILE}.yaml", line=3)
    assert "\n" not in str(issue) and "\x1b" not in str(issue)
    option = user_error_message(OptionError(f"--output-dir {HOSTILE}: is a file"))
    assert option == f"maestro: invalid option: --output-dir {printable(HOSTILE)}: is a file"
    say(f"two lines\n{HOSTILE}")  # a message's own lines stay lines; nothing else acts
    err = capsys.readouterr().err
    assert err.startswith("two lines\n\\x1b[2J") and "\x1b" not in err and "\r" not in err


def test_a_config_name_with_escapes_is_escaped_in_the_not_found_message(capsys):
    assert cli.main(["validate", f"nowhere{HOSTILE}"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err and err.count("\n") == 2, err


def test_a_run_that_finished_no_pattern_does_not_say_metrics_were_written(tmp_path, capsys):
    from userbenchmark.maestro.core.config.loader import load_suite
    from userbenchmark.maestro.core.config.options import RunOptions
    from userbenchmark.maestro.core.output.reporter import Reporter
    from userbenchmark.maestro.core.output.writer import OutputWriter

    path = tmp_path / "a\x1b[2J\nb" / "metrics-20260101000000.json"  # a user's folder name
    reporter = Reporter(load_suite("quickstart", world_size=1), RunOptions(metrics_path=str(path)))
    reporter.writer = OutputWriter(output_dir=None, metrics_path=path, environ={})
    reporter.failed("overlap_ar_gemm", "interrupted")  # an interrupted first pattern
    reporter.close(130)
    out = capsys.readouterr().out
    assert "metrics written" not in out and "\x1b" not in out, out
    assert f"maestro: {printable(str(path))} holds no metric: no pattern finished\n" in out, out


def test_one_iteration_is_written_in_the_singular():
    from userbenchmark.maestro.core.config.sizes import counted
    from userbenchmark.maestro.core.output.table import format_pattern

    from .test_flagged_figures import GEMM, _outcome

    text = format_pattern(_outcome([GEMM, GEMM], [[900.0], [800.0]], [[850.0], [700.0]]))
    assert "(1 iteration, profiler host)" in text and "with 1 iteration (< 100)" in text, text
    assert "1 iterations" not in text
    assert (counted(0, "lane"), counted(1, "lane"), counted(2, "lane")) == (
        "0 lanes",
        "1 lane",
        "2 lanes",
    )
