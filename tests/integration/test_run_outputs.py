"""A run's output locations, in real processes: cleared of an earlier run's files, a metrics
file name no other run has (on the run of a shipped file that test_shipped_configs.py reads
too: the ``shipped_run`` fixture), checked by rank 0 under a per-rank launch. (Unusable
folders and a folder another run holds: tests/unit/test_cli.py and test_output_locations.py,
in-process.)"""

from __future__ import annotations

import json

import pytest

from .helpers import read_records
from .test_faults import start_ranks, wait_ranks

pytestmark = pytest.mark.integration

ONE = """
name: outputs
timeout_s: 1
defaults: {warmup_iters: 0, iters: 2, baseline: false}
patterns:
  - {name: p, blocks: [{name: ar, op: all_reduce, axis: world, size: 4K}]}
"""
"""A pattern whose ranks wait for each other at most 1 s (the shortest ``timeout_s``)."""


def test_an_earlier_runs_files_are_moved_aside_and_the_metrics_name_is_reserved(shipped_run):
    proc, out, metrics = shipped_run.proc, shipped_run.out, shipped_run.metrics
    assert proc.returncode == 0, proc.stderr[-3000:]
    (previous,) = out.glob("previous-*")
    assert sorted(p.name for p in previous.iterdir()) == [
        "failures.json",
        "results.json",
        "trace.json",
    ]
    assert all((previous / n).read_text() == "stale" for n in ("results.json", "trace.json"))
    moved = [line for line in proc.stderr.splitlines() if "of an earlier run" in line]
    assert len(moved) == 1 and "moved 3 file(s)" in moved[0], proc.stderr[-3000:]
    assert (out / "notes.txt").read_text() == "mine"  # nothing else is touched
    assert not (out / "failures.json").exists()  # no stale failure next to new results
    assert read_records(out) and all(r["suite"] == shipped_run.config for r in read_records(out))
    (metrics_file,) = metrics.glob("metrics-*.json")
    count = len([k for k in json.loads(metrics_file.read_text())["metrics"] if "_ci_" not in k])
    assert f"maestro: {count} metrics written to {metrics_file}" in proc.stdout
    assert [p.name for p in metrics.iterdir() if p.name.startswith(".")] == []  # no reservation


def test_under_per_rank_launch_rank_0_checks_the_outputs(tmp_path):
    """Only rank 0 writes, so rank 0 checks; it exits 2 at once and the others stop at the
    rendezvous without it."""
    (tmp_path / "a_file").write_text("")
    bad = str(tmp_path / "a_file")
    procs, start = start_ranks(tmp_path, ONE, [2, 2], extra=[["--output-dir", bad]] * 2)
    ranks = wait_ranks(procs, start)
    assert ranks[0].returncode == 2, ranks[0].stderr[-2000:]
    assert ranks[0].stderr.strip() == (
        f"maestro: invalid option: --output-dir {bad}: is a file, expected a directory"
    )
    assert ranks[1].returncode != 0 and "Traceback" not in ranks[1].stderr, ranks[1].stderr
    assert "rank 0" in ranks[1].stderr, ranks[1].stderr[-2000:]
