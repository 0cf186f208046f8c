"""bench/fault_table.py turns the rows the fault tests record into docs/reliability.md's table."""

from __future__ import annotations

import json

from bench.fault_table import main, render

ROWS = [
    {
        "fault": "SIGKILL of rank 1",
        "launcher": "--nproc 2",
        "backend": "gloo",
        "timeout_s": 3.0,
        "all_gone_s": 10.2,
        "limit_s": 18.75,
        "exit": [1],
    },
    {"fault": "SIGINT to the launcher", "launcher": "--nproc", "all_gone_s": 21.04, "exit": [130]},
]


def test_rows_render_as_a_markdown_table_with_the_machine():
    text = render(ROWS, {"date_utc": "2026-01-01 00:00:00 UTC", "cpu": "X", "usable_cpus": 2})
    lines = text.splitlines()
    assert lines[0].startswith("Measured 2026-01-01 00:00:00 UTC on X, 2 usable CPUs, torch ")
    assert lines[2].startswith("| fault | launcher | backend | timeout_s | all gone after (s) |")
    assert lines[4] == "| SIGKILL of rank 1 | --nproc 2 | gloo | 3.0 | 10.2 | 18.75 | 1 |"
    assert lines[5] == "| SIGINT to the launcher | --nproc | nccl | - | 21.0 | - | 130 |"


def test_a_case_over_its_limit_is_marked_and_fails(tmp_path, capsys):
    path = tmp_path / "faults.json"
    path.write_text(json.dumps([{**ROWS[0], "all_gone_s": 19.0}]))
    assert main([str(path)]) == 1
    assert "| 19.0 (over the limit) | 18.75 |" in capsys.readouterr().out
    path.write_text(json.dumps(ROWS))
    assert main([str(path)]) == 0


def test_an_unmeasured_case_is_not_late_and_a_bad_file_exits_2(tmp_path, capsys):
    path = tmp_path / "faults.json"
    path.write_text(json.dumps([{**ROWS[0], "all_gone_s": None}]))
    assert main([str(path)]) == 0
    path.write_text("{not json")
    assert main([str(path)]) == 2
    assert main([str(tmp_path / "missing.json")]) == 2
    path.write_text(json.dumps({"fault": "x"}))
    assert main([str(path)]) == 2
    assert "fault_table:" in capsys.readouterr().err
