"""Atomic output files: the permissions a plain open() gives, and no temporary left behind."""

from __future__ import annotations

import os
import stat

import pytest

from userbenchmark.maestro.core.analysis.records import (
    BlockResult,
    PatternOutcome,
    PatternResult,
    RankTimeline,
    Timeline,
)
from userbenchmark.maestro.core.output.locations import atomic_write_bytes, atomic_write_files
from userbenchmark.maestro.core.output.writer import OutputWriter


@pytest.fixture
def umask():
    """Set the process umask for one test (it is process-wide: restored afterwards)."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _plain_open_mode(folder) -> int:
    reference = folder / "reference-by-open"
    with open(reference, "w") as fh:
        fh.write("x")
    mode = _mode(reference)
    reference.unlink()
    return mode


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_new_files_get_the_mode_of_a_plain_open(tmp_path, umask, mask, expected):
    umask(mask)
    path = tmp_path / "f.json"
    atomic_write_bytes(path, b"new")
    assert path.read_text() == "new"
    assert _mode(path) == expected == _plain_open_mode(tmp_path)
    # A folder removed during a run is never created again: the write fails instead.
    with pytest.raises(FileNotFoundError):
        atomic_write_bytes(tmp_path / "gone" / "f.json", b"new")
    assert not (tmp_path / "gone").exists()


def test_rewriting_keeps_the_existing_permissions_like_open_does(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "f.json"
    path.write_text("old")
    path.chmod(0o640)
    atomic_write_bytes(path, b"new")
    assert path.read_text() == "new" and _mode(path) == 0o640


def _outcome():
    block = BlockResult(
        suite="s", pattern="p", block="b", op="sleep", axis="world", lane="world", team_size=1,
        dtype="fp32", size_bytes=None, iters=2, latency_avg_us=1.0, latency_min_us=1.0,
        latency_max_us=1.0, latency_p50_us=1.0, latency_p99_us=1.0, latency_stdev_us=0.0,
    )  # fmt: skip
    pattern = PatternResult(
        suite="s", pattern="p", iters=2, num_blocks=1, makespan_avg_us=1.0, makespan_p99_us=1.0
    )
    rank = RankTimeline(
        rank=0, starts_ns=[[0, 2000]], ends_ns=[[1000, 3000]], present=[True], clock="perf_counter"
    )
    timeline = Timeline(pattern="p", block_names=("b",), block_lanes=("world",), ranks=(rank,))
    return PatternOutcome(blocks=(block,), pattern=pattern, timeline=timeline)


def test_every_output_and_metrics_file_is_readable_by_others_under_umask_022(tmp_path, umask):
    umask(0o022)
    writer = OutputWriter(
        output_dir=tmp_path / "out",
        metrics_path=tmp_path / "metrics" / "metrics-20250101000000.json",
        environ={},
        trace=True,
    )
    writer.add(_outcome())
    writer.add_failure("q", "rank 1 failed")
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {
        "results.json",
        "results.csv",
        "patterns.json",
        "patterns.csv",
        "failures.json",
        "rank0.json",
        "metrics-20250101000000.json",
    }
    assert {p.name: _mode(p) for p in files} == {p.name: 0o644 for p in files}


def test_a_failed_rename_leaves_no_temporary(tmp_path):
    a, blocked = tmp_path / "a.json", tmp_path / "b.json"
    blocked.mkdir()  # a non-empty folder where a file should go: os.replace fails on it
    (blocked / "keep").write_text("x")
    with pytest.raises(OSError):
        atomic_write_files({a: b"new a", blocked: b"new b"})
    assert a.read_bytes() == b"new a"  # renamed before the failure
    assert (blocked / "keep").read_text() == "x"
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_failed_first_rename_cleans_every_temporary(tmp_path, monkeypatch):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    atomic_write_files({a: b"old a", b: b"old b"})

    def refuse(src, dst):
        raise PermissionError(13, "refused", str(dst))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError):
        atomic_write_files({a: b"new a", b: b"new b"})
    assert (a.read_bytes(), b.read_bytes()) == (b"old a", b"old b")
    assert not list(tmp_path.glob(".*.tmp"))
