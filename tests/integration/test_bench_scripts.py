"""Every script in ``bench/`` runs: the CPU ones for real at tiny sizes, the GPU ones as far as a
machine without CUDA takes them (fidelity_gpu's no-CUDA exit; the others' options), and
exit_tail, whose least run is two whole launches of the CLI, as far as its options. A script
that drifted from the package fails here, not on the day someone measures with it. Tiny sizes
measure nothing: no number is checked."""

from __future__ import annotations

import importlib
import json

import pytest

from .helpers import REPO_ROOT

pytestmark = pytest.mark.integration

SCRIPTS = sorted(
    p.stem
    for p in (REPO_ROOT / "bench").glob("*.py")
    if not p.stem.startswith("_") and "\ndef main(" in p.read_text()  # not a helper module
)
TINY = {
    "postprocess": ["--sizes", "20000", "--reps", "1"],
    "aggregate_scale": ["--worlds", "2", "--blocks", "2", "--iters", "4", "--reps", "1"]
    + ["--shape-world", "2", "--shapes", "2x4"],
    "overhead_cpu": ["--sizes", "4K", "--iters", "3", "--warmup", "1", "--reps", "1", "--no-cli"],
    "alignment_cpu": ["--sizes", "4K", "--iters", "3", "--warmup", "1", "--reps", "1"],
    "handloop_cpu": ["--iters", "3", "--warmup", "1", "--reps", "1"],
    "fidelity_gpu": ["--iters", "2", "--warmup", "1"],  # without CUDA: a message, exit 0
    "import_trace": ["--size-mb", "1", "--repeats", "1"],
}
"""Options of each script's tiny run (``python -m bench.NAME OPTIONS --json FILE``)."""


def test_the_cpu_scripts_and_the_gpu_ones_are_all_known():
    assert set(TINY) | {"fault_table", "nccl_event_loop"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_bench_script_runs(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # overhead_cpu sets it for its workers
    main = importlib.import_module(f"bench.{name}").main
    if name in TINY:
        out = tmp_path / "out.json"
        assert main([*TINY[name], "--json", str(out)]) == 0
        written = json.loads(out.read_text())
        assert written["benchmark"] == name
        if "skipped" in written:  # a GPU script without CUDA says so, and measures nothing
            assert written["skipped"] in capsys.readouterr().out
            return
    elif name == "fault_table":
        rows = tmp_path / "faults.json"
        case = {"fault": "SIGKILL of rank 1", "launcher": "--nproc 2", "all_gone_s": 3.5}
        rows.write_text(json.dumps([{**case, "limit_s": 18.0, "exit": [1]}]))
        assert main([str(rows)]) == 0
    else:  # a GPU script: its options parse and its help prints
        with pytest.raises(SystemExit) as done:
            main(["--help"])
        assert done.value.code == 0
        assert "usage" in capsys.readouterr().out.lower()
        return
    assert "| " in capsys.readouterr().out  # the markdown table
