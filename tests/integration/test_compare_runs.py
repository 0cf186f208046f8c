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
import sys
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
    assert out.splitlines()[-1].startswith("nothing regressed or improved;"), out
    assert regression_detector.run(_metrics(full), _metrics(again)).details == {}
    status, out, _ = _compare(capsys, full, slower)
    assert status == 1, out[-3000:]
    flagged = [line.split()[0] for line in out.splitlines() if line.endswith(FLAGGED)]
    assert any(key.startswith("p/slow/") for key in flagged), out  # the suite, cmp, in the head
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


REPEATED = """
name: rep
world_size: 1
defaults: {warmup_iters: 2, iters: 10}
patterns:
  - name: p
    blocks:
      - {name: nap, op: sleep, duration_us: 2000}
  - name: q
    blocks:
      - {name: odd, op: "tests.integration.repeat_blocks:FailsAfterTheFirstProcess", duration_us: 500}
"""


def test_repeated_runs_keep_every_process_and_abtest_pairs_rounds(tmp_path, capsys, cli_here):
    from userbenchmark.maestro.core.output.results import load_results

    from .repeat_blocks import MARKER_VARIABLE

    config = tmp_path / "rep.yaml"
    config.write_text(REPEATED)
    out = tmp_path / "out"
    args = ["-c", str(config), "--output-dir", str(out), "--metrics-dir", str(out / "metrics")]
    abtest = ["abtest", str(config), "--a", sys.executable, "--b", sys.executable]
    abtest += ["--rounds", "2", "--output-dir", str(tmp_path / "ab")]
    abtest += ["--pattern", "p"]
    with ThreadPoolExecutor(2) as pool:  # sleeps leave the cores free
        repeated = pool.submit(
            run_maestro,
            ["run", *args, "--repeat", "3"],
            env={MARKER_VARIABLE: str(tmp_path / "marker")},
            timeout=600,
        )
        paired = pool.submit(run_maestro, abtest, timeout=600)  # a hang, not speed
    proc = repeated.result()
    # The second process failed: the run says so, stops there, and keeps the first's numbers.
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "process 2 of 3" in proc.stderr and "process 3 of 3" not in proc.stderr
    assert "2 of 3 processes gathered in" in proc.stderr
    found = load_results(out)
    assert sorted(found.blocks["process"].tolist()) == [0, 0, 1]  # p in both, q in the first
    failures = json.loads((out / "failures.json").read_text())
    assert [(f["pattern"], f["process"]) for f in failures] == [("q", 1)]
    doc = _metrics(out)
    assert doc["environ"]["processes"] == "2"
    assert doc["metrics"]["rep/p/nap/latency_avg_us_ci_df"] == 1  # between the 2 processes
    assert "rep/q/odd/latency_avg_us_ci_df" not in doc["metrics"]  # one process: no interval
    status, text, _ = _compare(capsys, out, next((out / "metrics").glob("metrics-*.json")))
    assert status == 0 and "nothing regressed or improved" in text
    proc = paired.result()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "round 2 of 2: A" in proc.stderr and "nothing regressed or improved" in proc.stdout
    summary = json.loads((tmp_path / "ab" / "abtest.json").read_text())
    assert summary["rounds"] == 2 and summary["a"]["python"] == sys.executable
    verdicts = {c["key"]: c["verdict"] for c in summary["changes"]}
    assert verdicts["rep/p/nap/latency_avg_us"] == "within noise"
    for side in ("a", "b"):
        rounds = load_results(tmp_path / "ab" / f"abtest-{side}")
        assert sorted(rounds.blocks["process"].tolist()) == [0, 1]
        metrics = json.loads((tmp_path / "ab" / f"abtest-{side}" / "metrics.json").read_text())
        assert metrics["environ"]["processes"] == "2" and summary[side]["metrics"].endswith(
            f"abtest-{side}/metrics.json"
        )
