"""compare and the TorchBench detector on real runs: identical runs compare clean, a sleep made
15 % longer (a code change, not a setting) is flagged on that block alone, and a run with other
iterations is refused with the difference named, and compared with a warning under --force.

Sleeps, not collectives: on a busy 2-core host, gloo collectives move between identical runs by
more than one run can see (docs/recipes.md), which would make this test flaky. One rank: what is
compared does not depend on the world size, and a run of one rank needs no launcher. The two
identical runs are made at the same time, as are the slower one and the shorter one (sleeps
leave the cores free). The comparisons run through the command line's entry point in this
process."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.noise_blocks import FACTOR_VARIABLE
from userbenchmark.maestro import cli, regression_detector

from .helpers import run_maestro

pytestmark = pytest.mark.integration

PATTERN = """
name: cmp
world_size: 1
defaults: {warmup_iters: 3, iters: 30}
axes:
  a: {like: world}
  b: {like: world}
patterns:
  - name: p
    blocks:
      - {name: fast, op: sleep, axis: a, duration_us: 10000}
      - {name: slow, op: "bench.noise_blocks:ScaledSleep", axis: b, duration_us: 10000}
"""
FLAGGED = ("regressed", "improved", "changed")


def _runs(tmp_path, *runs):
    """Each run of PATTERN, given as (name, sleep factor, *run options), all at the same time;
    their output folders."""
    config = tmp_path / "cmp.yaml"
    config.write_text(PATTERN)

    def run(name, factor, *extra):
        out = tmp_path / name
        command = ["run", "-c", str(config), "--nproc", "1", "--output-dir", str(out)]
        command += ["--metrics-dir", str(out / "metrics"), *extra]
        proc = run_maestro(
            command,
            env={FACTOR_VARIABLE: str(factor)},
            timeout=300,  # a hang, not speed: each run takes seconds
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return out

    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(lambda spec: run(*spec), runs))


def _compare(capsys, *args):
    """``maestro compare ARGS``: (exit status, stdout, stderr)."""
    status = cli.main(["compare", *(str(a) for a in args)])
    out, err = capsys.readouterr()
    return status, out, err


def _metrics(folder):
    return json.loads(next((folder / "metrics").glob("metrics-*.json")).read_text())


def test_identical_runs_compare_clean_and_a_slower_block_is_flagged_alone(
    tmp_path, capsys, cli_here
):
    full, again = _runs(tmp_path, ("full", 1.0), ("again", 1.0))
    slower, shorter = _runs(tmp_path, ("slower", 1.15), ("shorter", 1.0, "--iters", "5"))
    status, out, _ = _compare(capsys, full, again)
    assert status == 0, out[-3000:]
    assert not any(f" {verdict}" in out for verdict in FLAGGED[:2])
    assert regression_detector.run(_metrics(full), _metrics(again)).details == {}
    status, out, _ = _compare(capsys, full, slower)
    assert status == 1, out[-3000:]
    flagged = [line.split()[0] for line in out.splitlines() if line.endswith(FLAGGED)]
    assert any(key.startswith("cmp/p/slow/") for key in flagged), out
    assert not any("/fast/" in key for key in flagged), out
    details = regression_detector.run(_metrics(full), _metrics(slower)).details
    assert any(key.startswith("cmp/p/slow/") for key in details), details
    assert not any("/fast/" in key for key in details), details
    status, _, err = _compare(capsys, full, shorter)
    assert status == 2
    assert "iters_override" in err and "pattern.p" in err
    assert "--force" in err and "Traceback" not in err
    status, out, err = _compare(capsys, full, shorter, "--force")
    assert status in (0, 1), err
    assert "WARNING: compared with --force" in out
