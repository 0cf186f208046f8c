"""``import-trace`` on the command line: exit statuses, messages, the file written, and an
imported pattern run on CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from userbenchmark.maestro import cli

from ..docblocks import bash_blocks
from .replay_scenarios import ddp_rank
from .replay_traces import TraceBuilder, write_all

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("cli_here")  # tests/conftest.py


def test_import_writes_the_pattern_and_says_what_it_holds(tmp_path, capsys):
    traces = write_all([ddp_rank(0), ddp_rank(1)], tmp_path / "traces")
    out = tmp_path / "ddp.yaml"
    assert cli.main(["import-trace", str(traces), "-o", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert f"wrote {out}: ProfilerStep#5 of 2 rank(s) (one role) as 5 blocks" in stdout
    text = out.read_text()
    data = yaml.safe_load(text)
    assert data["name"] == "ddp" and data["world_size"] == 2
    assert f"import-trace {traces} -o {out}" in text  # the header repeats the command


def test_files_named_one_by_one_and_options(tmp_path, capsys):
    traces = write_all([ddp_rank(0), ddp_rank(1)], tmp_path / "traces")
    out = tmp_path / "x.yaml"
    files = [str(traces / "rank1.json.gz"), str(traces / "rank0.json.gz")]
    argv = ["import-trace", *files, "-o", str(out), "--step", "5", "--no-idle"]
    assert cli.main(argv) == 0
    assert "--step 5 --no-idle" in out.read_text()


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (
            lambda p: p.joinpath("bad.json").write_text("{}") and [str(p / "bad.json")],
            "not a torch.profiler (Kineto) trace",
        ),
        (lambda p: [str(write_all([ddp_rank(0)], p / "t"))], "rank 1's trace file is missing"),
        (lambda p: [str(p / "absent.json.gz")], "no such file"),
    ],
    ids=["not-kineto", "rank-missing", "no-file"],
)
def test_bad_input_exits_2_with_one_message_and_writes_nothing(tmp_path, capsys, setup, expected):
    paths = setup(tmp_path)
    out = tmp_path / "out.yaml"
    assert cli.main(["import-trace", *paths, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("maestro: invalid trace: ") and expected in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not out.exists()


def test_output_must_be_a_file_in_an_existing_folder(tmp_path, capsys):
    traces = write_all([ddp_rank(0), ddp_rank(1)], tmp_path / "traces")
    assert cli.main(["import-trace", str(traces), "-o", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert cli.main(["import-trace", str(traces), "-o", str(tmp_path / "no" / "x.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_usage_errors_exit_2(tmp_path, capsys):
    assert cli.main(["import-trace", str(tmp_path)]) == 2  # -o missing
    assert cli.main(["import-trace", str(tmp_path), "-o", "x.yaml", "--step", "-1"]) == 2


def test_a_corrupt_trace_is_refused_by_the_real_command(tmp_path):
    """As a user runs it: a separate process, exit status 2, one line, no traceback."""
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "userbenchmark.maestro",
            "import-trace",
            str(bad),
            "-o",
            str(tmp_path / "x.yaml"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("maestro: invalid trace:") and "Traceback" not in done.stderr


def _replay_on_cpu(config: str, nproc: int, out: Path, capfd, *cap: str) -> tuple[list, dict, str]:
    """Run an imported file on CPU (``cap``: ``--max-size SIZE``, as the docs run a real step);
    its report holds the replay against the trace. Returns the blocks, the step and stderr."""
    argv = ["run", "-c", config, "--nproc", str(nproc), *cap, "--iters", "2"]
    argv += ["--warmup-iters", "1", "--no-baseline", "--no-metrics", "--output-dir", str(out)]
    assert cli.main(argv) == 0
    printed = capfd.readouterr()
    assert "replayed against the trace" in printed.out
    (step,) = json.loads((out / "patterns.json").read_text())
    ranks = json.loads(step["replay_by_rank"])
    assert [r["rank"] for r in ranks] == list(range(nproc))
    assert all(r["replayed_us"] > 0 for r in ranks)
    return json.loads((out / "results.json").read_text()), step, printed.err


def test_an_imported_step_runs_on_cpu_and_reports_its_fidelity(tmp_path, capfd):
    trace = TraceBuilder(rank=0, world_size=1, distributed=False)  # small enough for a CPU
    trace.step(3, 0, 2000)
    trace.launch(stream=7, launch=5, start=10, dur=30, op="aten::native_layer_norm")
    trace.gemm(stream=7, launch=10, start=41, dur=300, m=256, n=256, k=128, op="aten::addmm")
    trace.gemm(stream=7, launch=20, start=342, dur=280, m=256, n=128, k=256)
    out = tmp_path / "step.yaml"
    assert (
        cli.main(["import-trace", str(write_all([trace], tmp_path / "traces")), "-o", str(out)])
        == 0
    )
    capfd.readouterr()
    blocks, step, _ = _replay_on_cpu(str(out), 1, tmp_path / "out", capfd)
    assert blocks and all(b["traced_us"] >= 0 and b["replay_ratio"] > 0 for b in blocks)
    assert step["replay_ratio"] == pytest.approx(step["makespan_avg_us"] / step["traced_us"])
    (rank,) = json.loads(step["replay_by_rank"])
    assert rank["ci_low"] <= rank["ratio"] <= rank["ci_high"]


def test_a_capped_replay_leaves_out_what_the_cap_changed(tmp_path, capfd):
    # --max-size 64K caps every collective and GEMM of the FSDP2 step: the trace timed other
    # sizes, so those blocks and the step get no ratio; busy and sleep blocks keep theirs.
    blocks, step, err = _replay_on_cpu("fsdp2_replay", 2, tmp_path, capfd, "--max-size", "64K")
    kept = {b["op"] for b in blocks if b["traced_us"] is not None}
    dropped = {b["op"] for b in blocks if b["traced_us"] is None}
    assert kept == {"busy", "sleep"} and {"all_gather", "reduce_scatter", "gemm"} <= dropped
    assert all(b["replay_ratio"] > 0 for b in blocks if b["traced_us"] is not None)
    assert all(b["replay_ratio"] is None for b in blocks if b["traced_us"] is None)
    assert step["traced_us"] is None and step["replay_ratio"] is None
    assert all(r["traced_us"] is None for r in json.loads(step["replay_by_rank"]))
    assert "--max-size changed 35 of its 84 imported blocks" in err


def test_the_import_command_of_the_replay_page_runs_as_written(tmp_path):
    """docs/replay.md's import command, run in a folder holding `traces/` (the DDP traces of
    tests/data/traces), prints the line the page shows."""
    page = REPO / "docs" / "replay.md"
    (block,) = [b for b in bash_blocks(page) if b.kind == "run by"]
    assert block.text == "tests/unit/test_replay_cli.py" and "replay.md" in page.name
    shutil.copytree(REPO / "tests" / "data" / "traces" / "ddp", tmp_path / "traces")
    lines = page.read_text().splitlines()
    shown = next(x for x in lines if x.startswith("wrote step.yaml:"))
    covered = lines[lines.index(shown) + 1]
    assert covered.startswith("coverage of the step's GPU time")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for command in block.commands:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-2:] == [shown, covered]
    assert (tmp_path / "step.yaml").is_file()
