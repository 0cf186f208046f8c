"""bench/fault_table.py turns the rows the fault tests record into docs/reliability.md's table."""

from __future__ import annotations

import json

from bench.fault_table import append_row, main, render

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


def test_rows_render_as_a_markdown_table_under_the_machine_they_ran_on():
    gpu = {"machine": "H200, X, 16 usable CPUs", "date_utc": "2026-01-02 00:00:00 UTC"}
    cpu = {"machine": "Y, 2 usable CPUs", "date_utc": "2026-01-01 00:00:00 UTC"}
    text = render([{**ROWS[0], **cpu}, {**ROWS[1], **gpu}, {**ROWS[0], **cpu}])
    lines = text.splitlines()
    assert lines[0] == "Measured 2026-01-01 00:00:00 UTC on Y, 2 usable CPUs."
    assert lines[2].startswith("| fault | launcher | backend | timeout_s | all gone after (s) |")
    assert (
        lines[4] == lines[5] == "| SIGKILL of rank 1 | --nproc 2 | gloo | 3.0 | 10.2 | 18.75 | 1 |"
    )
    assert lines[7] == "Measured 2026-01-02 00:00:00 UTC on H200, X, 16 usable CPUs."
    assert lines[11] == "| SIGINT to the launcher | --nproc | nccl | - | 21.0 | - | 130 |"
    assert render(ROWS).startswith("Measured ? on a machine the rows do not name.")


def test_a_row_appended_names_where_and_when_it_was_measured(tmp_path):
    path = tmp_path / "out" / "faults.json"
    append_row(path, ROWS[0])
    append_row(path, ROWS[1], device="NVIDIA H200")
    rows = json.loads(path.read_text())
    assert [r["fault"] for r in rows] == [ROWS[0]["fault"], ROWS[1]["fault"]]
    assert "usable CPUs, torch " in rows[0]["machine"] and rows[0]["date_utc"].endswith(" UTC")
    assert rows[1]["machine"].startswith("NVIDIA H200, ") and "H200" not in rows[0]["machine"]
    assert render(rows).count("Measured ") == 2


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
