"""``import-trace`` refuses what cannot be a real step before it writes anything: impossible
numbers (negative, NaN, infinite or absurd durations and timestamps, kernels overlapping on one
stream), a rank that is not an integer, a file that is not a regular file, options that are not
numbers, steps that no rank has complete, and a pattern maestro's loader would reject. Each is
exit status 2, one line naming the event or field, no traceback, and no file left behind."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from userbenchmark.maestro import cli
from userbenchmark.maestro.core.replay.importer import import_traces
from userbenchmark.maestro.core.replay.kineto import TraceError

from .replay_scenarios import ddp_rank
from .replay_traces import TraceBuilder, write_all

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("cli_here")  # tests/conftest.py


def _refused(tmp_path: Path, capsys, builders: list[TraceBuilder], *extra: str) -> str:
    """stderr of ``import-trace`` over ``builders``' files, checked to be one refusal."""
    traces = write_all(builders, tmp_path / "traces")
    out = tmp_path / "out.yaml"
    status = cli.main(["import-trace", str(traces), "-o", str(out), *extra])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".out.yaml")]
    return err


def _kernel(b: TraceBuilder, name_part: str) -> dict:
    return next(e for e in b.events if e["cat"] == "kernel" and name_part in e["name"])


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("dur", -50.0, "negative"),
        ("dur", math.nan, "not a number"),
        ("dur", math.inf, "not finite"),
        ("dur", 1e12, "longer than"),
        ("ts", math.nan, "not a number"),
        ("ts", -5.0, "negative"),
        ("ts", 1e300, "beyond"),
    ],
)
def test_impossible_numbers_of_a_step_kernel_are_refused_naming_it(
    tmp_path, capsys, field, value, why
):
    ranks = [ddp_rank(0), ddp_rank(1)]
    kernel = _kernel(ranks[1], "elementwise")
    kernel[field] = value
    err = _refused(tmp_path, capsys, ranks)
    assert err.startswith("maestro: invalid trace: ") and "rank1.json.gz" in err
    assert f"{kernel['name']!r}" in err and f" {field} " in err and why in err


def test_impossible_numbers_of_a_launch_and_a_step_annotation_are_refused(tmp_path, capsys):
    ranks = [ddp_rank(0), ddp_rank(1)]
    launch = next(e for e in ranks[0].events if e["cat"] == "cuda_runtime")
    launch["dur"] = -1.0
    err = _refused(tmp_path, capsys, ranks)
    assert "cudaLaunchKernel" in err and "negative" in err
    ranks = [ddp_rank(0), ddp_rank(1)]
    step = next(e for e in ranks[0].events if e["name"].startswith("ProfilerStep#"))
    step["dur"] = math.inf
    err = _refused(tmp_path / "b", capsys, ranks)
    assert "ProfilerStep#5" in err and "dur" in err


def test_kernels_overlapping_on_one_stream_are_refused_naming_both(tmp_path, capsys):
    ranks = [ddp_rank(0), ddp_rank(1)]
    gelu = _kernel(ranks[0], "elementwise")
    gelu["ts"] -= 200.0  # now starts inside the first GEMM on stream 7
    err = _refused(tmp_path, capsys, ranks)
    assert "stream 7" in err and "overlap" in err and "nvjet" in err and "elementwise" in err


def test_kernels_touching_within_the_clock_tolerance_are_kept(tmp_path):
    ranks = [ddp_rank(0), ddp_rank(1)]
    _kernel(ranks[0], "elementwise")["ts"] -= 1.5  # 0.5 µs into the GEMM before it
    write_all(ranks, tmp_path)
    assert import_traces([str(tmp_path)]).run.world == 2


def test_a_kernel_long_before_its_launch_is_refused(tmp_path, capsys):
    ranks = [ddp_rank(0), ddp_rank(1)]
    _kernel(ranks[0], "elementwise")["ts"] -= 5000.0  # 5 ms before its launch
    err = _refused(tmp_path, capsys, ranks)
    assert "before the call that launched it" in err and "elementwise" in err


@pytest.mark.parametrize("rank", ["abc", None, 1.5, -1, True])
def test_a_rank_that_is_not_an_integer_is_refused_naming_the_field(tmp_path, capsys, rank):
    b = ddp_rank(0, world=1)
    doc = b.document()
    doc["distributedInfo"]["rank"] = rank
    b.document = lambda: doc  # type: ignore[method-assign]
    err = _refused(tmp_path, capsys, [b])
    assert "distributedInfo.rank" in err and repr(rank) in err


def test_a_world_size_that_is_not_an_integer_is_refused(tmp_path, capsys):
    b = ddp_rank(0, world=1)
    doc = b.document()
    doc["distributedInfo"]["world_size"] = "two"
    b.document = lambda: doc  # type: ignore[method-assign]
    assert "distributedInfo.world_size" in _refused(tmp_path, capsys, [b])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    for given in (fifo, tmp_path):  # named, or found in a folder
        done = subprocess.run(
            [sys.executable, "-m", "userbenchmark.maestro", "import-trace", str(given), "-o",
             str(tmp_path / "x.yaml")],
            capture_output=True, text=True, cwd=REPO, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "not a regular file" in done.stderr or "holds no" in done.stderr
        assert done.stderr.count("\n") == 1 and not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_an_idle_threshold_that_is_not_a_number_is_refused(tmp_path, capsys, value):
    err = _refused(tmp_path, capsys, [ddp_rank(0), ddp_rank(1)], "--idle-us", value)
    assert "--idle-us" in err and value in err


def _steps(rank: int, complete: tuple[int, ...], empty: tuple[int, ...] = ()) -> TraceBuilder:
    """A DDP step #5 (complete), then steps whose device work is in the trace only if listed."""
    b = ddp_rank(rank)
    for i, number in enumerate((6, 7)):
        t = 5000 + 1000 * i
        b.step(number, t, t + 900)
        if number not in empty:
            b.launch(
                stream=7, launch=t + 10, start=t + 100, dur=10, with_activity=number in complete
            )
    return b


def test_ranks_whose_last_complete_steps_differ_import_the_last_common_one(tmp_path):
    write_all([_steps(0, complete=(6,)), _steps(1, complete=(7,))], tmp_path)
    assert import_traces([str(tmp_path)]).step_name == "ProfilerStep#5"


def test_the_message_lists_complete_steps_when_none_is_common(tmp_path, capsys):
    ranks = [_steps(0, complete=(6,)), _steps(1, complete=(7,))]
    early = ranks[1].base_ts + 5000  # rank 1's step 5 loses its device work
    ranks[1].events = [e for e in ranks[1].events if e["cat"] != "kernel" or e["ts"] > early]
    err = _refused(tmp_path, capsys, ranks)
    assert "no step is complete on every rank" in err
    assert "rank 0: ProfilerStep#5, ProfilerStep#6" in err and "rank 1: ProfilerStep#7" in err


def test_a_step_without_device_work_is_not_imported_and_is_named(tmp_path, capsys):
    ranks = [_steps(r, complete=(6,), empty=(7,)) for r in range(2)]
    write_all(ranks, tmp_path / "a")
    assert import_traces([str(tmp_path / "a")]).step_name == "ProfilerStep#6"
    err = _refused(tmp_path / "b", capsys, ranks, "--step", "7")
    assert "ProfilerStep#7 launched no device work" in err
    assert "rank 0: ProfilerStep#5, ProfilerStep#6" in err


def test_a_pattern_the_loader_rejects_exits_2_and_leaves_nothing(tmp_path, capsys):
    ranks = [ddp_rank(0), ddp_rank(1)]
    for b in ranks:  # a 150 ms kernel: longer than any busy block may be
        _kernel(b, "elementwise")["dur"] = 150_000.0
        for e in b.events:
            if e["cat"] == "kernel" and e["ts"] > b.base_ts + 421:
                e["ts"] += 150_000.0
    err = _refused(tmp_path, capsys, ranks)
    assert err.startswith("maestro: invalid trace: ") and "loader" in err
    assert "duration_us" in err


def test_traces_read_directly_raise_trace_errors(tmp_path):
    ranks = [ddp_rank(0), ddp_rank(1)]
    _kernel(ranks[0], "elementwise")["dur"] = math.nan
    write_all(ranks, tmp_path)
    with pytest.raises(TraceError, match="dur nan"):
        import_traces([str(tmp_path)])
