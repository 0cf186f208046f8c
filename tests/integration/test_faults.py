"""Fault injection on gloo: every process stops, promptly, with one message; finished work stays
saved.

Most cases start the ranks the way srun or a hand-written launcher would (one process per rank,
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT in the environment), so the exit status and the time of
every rank can be checked, not only the launcher's; the ``--nproc`` cases follow every process
of the launch until all are gone. Each case's time from the fault to the last process gone is
checked against the documented deadline (docs/reliability.md) and, when
``MAESTRO_FAULT_TABLE=path`` is set, appended to that JSON file (``python -m bench.fault_table
path`` turns it into the fault table).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.fault_table import append_row
from userbenchmark.maestro import cli
from userbenchmark.maestro.core.runtime.agreement import grace_s
from userbenchmark.maestro.core.runtime.rendezvous import free_port
from userbenchmark.maestro.core.runtime.supervision import EXIT_GRACE_S

from .fault_blocks import MARK_VARIABLE, OUTPUT_VARIABLE, fault_moment
from .helpers import (
    REPO_ROOT,
    add_descendants,
    alive,
    child_pids,
    nap_sweep,
    read_records,
    subprocess_env,
)

pytestmark = pytest.mark.integration

EXIT_DEADLINE_S = 90.0
"""Every rank must have exited this long after the start, whatever failed (catches hangs)."""
TIMEOUT_S = 3.0
"""``timeout_s`` of the pattern files below."""
GONE_LIMIT_S = TIMEOUT_S + grace_s(TIMEOUT_S) + EXIT_GRACE_S
"""The documented deadline: every process of a run is gone this long after a fault."""
TABLE_VARIABLE = "MAESTRO_FAULT_TABLE"


def record(
    fault: str, launcher: str, all_gone_s: float, statuses: list[int], limit_s: float | None
) -> None:
    """Append one measured case to the fault table file named by ``MAESTRO_FAULT_TABLE``."""
    path = os.environ.get(TABLE_VARIABLE)
    if path:
        row = {
            "fault": fault,
            "launcher": launcher,
            "backend": "gloo",
            "timeout_s": TIMEOUT_S,
            "all_gone_s": round(all_gone_s, 1),
            "limit_s": None if limit_s is None else round(limit_s, 2),
            "exit": statuses,
        }
        append_row(Path(path), row)


FAULT = "tests.integration.fault_blocks:FailOnRank"


def suite(fault: str, *, extra_patterns: str = "") -> str:
    """Two ranks; pattern ``first`` is clean, ``second`` carries ``fault``, ``third`` is clean."""
    return f"""
name: faults
timeout_s: 3
defaults: {{warmup_iters: 1, iters: 4, baseline: false}}
patterns:
  - name: first
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
  - name: second
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: bad, op: "{FAULT}", axis: world, {fault}}}
  - name: third
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
{extra_patterns}"""


@dataclass
class Rank:
    rank: int
    returncode: int
    stderr: str
    elapsed_s: float
    ended_at: float = 0.0
    """``time.monotonic()`` when its end was seen (at most the moment it ended)."""


def _env(rank: int, world_size: int, port: int) -> dict[str, str]:
    env = subprocess_env()
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a rank past the deadline says where it hung
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    return env


def start_ranks(
    tmp_path: Path,
    yaml_text: str | list[str],
    world_sizes: list[int],
    *,
    entry: tuple[str, ...] = (),
    extra: list[list[str]] | None = None,
) -> tuple[list[subprocess.Popen], float]:
    """One process per rank; ``world_sizes[r]`` is the WORLD_SIZE rank ``r`` is started with.

    ``yaml_text``: the pattern, or one per rank (each in a folder of its own, as on separate
    nodes, under the same name). ``entry``: the module and its leading arguments, if not
    maestro's own command line. ``extra``: more arguments, one list per rank.
    """
    texts = yaml_text if isinstance(yaml_text, list) else [yaml_text] * len(world_sizes)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    port = free_port()
    start = time.monotonic()
    procs = []
    for rank, ws in enumerate(world_sizes):
        folder = tmp_path if not isinstance(yaml_text, list) else tmp_path / f"node{rank}"
        folder.mkdir(exist_ok=True)
        config = folder / "pattern.yaml"
        config.write_text(texts[rank])
        args = [
            sys.executable,
            "-m",
            *(entry or ("userbenchmark.maestro",)),
            "run",
            "-c",
            str(config),
            "--output-dir",
            str(tmp_path / "out"),
            "--metrics-dir",
            str(tmp_path / "metrics"),
            *(extra[rank] if extra else []),
        ]
        env = _env(rank, ws, port)
        env[MARK_VARIABLE] = str(marks)
        procs.append(
            subprocess.Popen(
                args,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs, start


def wait_ranks(procs: list[subprocess.Popen], start: float) -> list[Rank]:
    """Wait for every rank; one still running after the deadline fails the test (and is killed)."""
    ranks = []
    try:
        for rank, proc in enumerate(procs):
            left = max(0.1, EXIT_DEADLINE_S - (time.monotonic() - start))
            try:
                _, err = proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
                try:
                    _, err = proc.communicate(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, err = proc.communicate()
                pytest.fail(
                    f"rank {rank} still running {EXIT_DEADLINE_S:.0f} s after the start; "
                    f"its stderr ends:\n{(err or '')[-6000:]}"
                )
            now = time.monotonic()
            ranks.append(Rank(rank, proc.returncode, err, now - start, now))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return ranks


def run_ranks(tmp_path: Path, yaml_text: str | list[str], world_sizes: list[int]) -> list[Rank]:
    return wait_ranks(*start_ranks(tmp_path, yaml_text, world_sizes))


def assert_first_saved(tmp_path: Path) -> None:
    """The files hold exactly the pattern that finished before the fault, and no temp file."""
    out = tmp_path / "out"
    records = read_records(out)
    assert {r["pattern"] for r in records} == {"first"}
    assert all(r["latency_avg_us"] > 0 for r in records)
    assert [p["pattern"] for p in read_records(out, "patterns.json")] == ["first"]
    (metrics_file,) = (tmp_path / "metrics").glob("metrics-*.json")
    metrics = json.loads(metrics_file.read_text())["metrics"]
    assert metrics and all(key.startswith("faults/first/") for key in metrics)
    leftovers = [p.name for d in (out, tmp_path / "metrics") for p in d.iterdir()]
    assert not [n for n in leftovers if n.endswith(".tmp")], leftovers


def assert_all_failed(ranks: list[Rank], *, phase: str, failing: int = 1) -> None:
    for r in ranks:
        assert r.returncode != 0, f"rank {r.rank} exited 0:\n{r.stderr[-2000:]}"
        assert r.elapsed_s < EXIT_DEADLINE_S
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
    msg = ranks[0].stderr
    assert f"rank {failing}" in msg and f"phase {phase}" in msg, msg[-3000:]
    assert "pattern 'second'" in msg, msg[-3000:]


def _per_rank_case(tmp_path: Path, fault: str, ranks: list[Rank], *, rank: int = 1) -> None:
    """Check and record the time from ``rank``'s fault to the last rank gone."""
    moment = fault_moment(tmp_path / "marks", rank)
    assert moment is not None, "the fault block never failed"
    gone = max(r.ended_at for r in ranks) - moment
    _assert_gone_in_time(fault, "per-rank processes", gone, [r.returncode for r in ranks])


def test_raise_in_setup_on_one_rank(tmp_path):
    ranks = run_ranks(tmp_path, suite("rank: 1, when: setup"), [2, 2])
    assert_all_failed(ranks, phase="setup")
    assert "injected failure on rank 1" in ranks[0].stderr
    # Contained failure with stop_on_error (the default) on: nothing after it ran.
    assert_first_saved(tmp_path)
    # Setup failures need no collective timeout: every rank learns it at the agreement.
    assert max(r.elapsed_s for r in ranks) < 45, [r.elapsed_s for r in ranks]
    _per_rank_case(tmp_path, "exception in setup on rank 1", ranks)


def raise_in_launch_mid_measurement(tmp_path: Path) -> None:
    ranks = run_ranks(tmp_path, suite("rank: 1, when: launch, after_launches: 3"), [2, 2])
    assert_all_failed(ranks, phase="measure")
    assert "block 'bad'" in ranks[0].stderr and "injected failure" in ranks[0].stderr
    assert_first_saved(tmp_path)
    _per_rank_case(tmp_path, "exception in a block on rank 1", ranks)


def test_raise_in_launch_mid_measurement(waiting_cases):
    waiting_cases["raise_in_launch_mid_measurement"].result()


def sigkill_mid_pattern_on_three_ranks(tmp_path: Path) -> None:
    ranks = run_ranks(
        tmp_path, suite("rank: 1, when: launch, how: kill, after_launches: 3"), [3, 3, 3]
    )
    assert ranks[1].returncode == -signal.SIGKILL
    assert_all_failed(ranks, phase="measure")
    assert "did not reach" in ranks[0].stderr, ranks[0].stderr[-3000:]
    assert "rank 1 " in ranks[2].stderr or ranks[2].returncode != 0
    assert_first_saved(tmp_path)
    _per_rank_case(tmp_path, "SIGKILL of rank 1 of 3", ranks)


def test_sigkill_mid_pattern_on_three_ranks(waiting_cases):
    waiting_cases["sigkill_mid_pattern_on_three_ranks"].result()


def test_ranks_started_with_different_world_sizes(tmp_path):
    ranks = run_ranks(tmp_path, suite("rank: 1"), [2, 3])
    for r in ranks:
        assert r.returncode != 0 and r.elapsed_s < 45, (r.rank, r.elapsed_s, r.stderr[-2000:])
        assert "WORLD_SIZE" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "rank 1 was started with WORLD_SIZE=3" in ranks[0].stderr, ranks[0].stderr[-2000:]
    assert not (tmp_path / "out" / "results.json").exists()


def test_config_world_size_not_matching_the_launch(tmp_path, capsys, cli_here):
    # Refused before any worker starts, so in this process (a refused pattern file in a process
    # of its own: test_ranks_that_read_different_pattern_texts_stop_before_anything_runs).
    config, out = tmp_path / "pattern.yaml", tmp_path / "out"
    config.write_text("world_size: 4\n" + suite("rank: 1"))
    argv = ["run", "-c", str(config), "--nproc", "2", "--output-dir", str(out)]
    assert cli.main([*argv, "--metrics-dir", str(tmp_path / "metrics")]) == 2
    err = capsys.readouterr().err
    assert "world_size" in err and "Traceback" not in err, err
    assert not out.exists()


THREE = """
name: faults
timeout_s: 3
defaults: {warmup_iters: 0, iters: 2, baseline: false}
patterns:
  - {name: a, blocks: [{name: ar, op: all_reduce, axis: world, size: 4K}]}
  - {name: b, blocks: [{name: ar, op: all_reduce, axis: world, size: 4K}]}
  - {name: c, blocks: [{name: ar, op: all_reduce, axis: world, size: 4K}]}
"""


@pytest.mark.parametrize("update", [1, 3])
def test_signals_while_rank_zero_saves_leave_files_that_agree(tmp_path, update):
    # Update 1: the signals wait until the next pattern, which every rank then stops at, through
    # the agreement. Update 3 (the last pattern): nothing is left to stop; rank 0 says it was
    # interrupted, and rank 1, which finished everything, exits 0.
    entry = ("tests.integration.signal_driver", str(update))
    ranks = wait_ranks(*start_ranks(tmp_path, THREE, [2, 2], entry=entry))
    for r in ranks:
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        assert r.elapsed_s < 30, (r.rank, r.elapsed_s, r.stderr[-2000:])  # no collective timeout
    assert ranks[0].returncode == 130, ranks[0].stderr[-2000:]
    assert "interrupted" in ranks[0].stderr
    out = tmp_path / "out"
    expected = ["a", "b", "c"][:update]
    assert sorted({r["pattern"] for r in read_records(out)}) == expected
    assert [p["pattern"] for p in read_records(out, "patterns.json")] == expected
    (metrics_file,) = (tmp_path / "metrics").glob("metrics-*.json")
    metrics = json.loads(metrics_file.read_text())["metrics"]
    assert sorted({key.split("/")[1] for key in metrics}) == expected
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    if update == 1:
        assert ranks[1].returncode == 130, ranks[1].stderr[-2000:]
        assert "interrupted" in ranks[1].stderr or "rank 0" in ranks[0].stderr
        failed = read_records(out, "failures.json")
        assert [f["pattern"] for f in failed] == ["b"] and "interrupted" in failed[0]["error"]
    else:
        assert ranks[1].returncode == 0, ranks[1].stderr[-2000:]
        assert not (out / "failures.json").exists()


GO_ON = f"""
name: go_on
timeout_s: 3
stop_on_error: false
defaults: {{warmup_iters: 1, iters: 3, baseline: false}}
patterns:
  - name: first
    blocks: [{{name: ar, op: all_reduce, axis: world, size: 4K}}]
  - name: setup_fail
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: bad, op: "{FAULT}", axis: world, rank: 1, when: setup}}
  - name: mid
    blocks: [{{name: ar, op: all_reduce, axis: world, size: 4K}}]
  - name: huge
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: huge, op: all_reduce, axis: world, size: 16T}}
  - name: all_fail
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: bad, op: "{FAULT}", axis: world, rank: -1, when: launch, after_launches: 2}}
  - name: sys_exit
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: quitter, op: "{FAULT}", axis: world, rank: -1, when: setup, how: exit}}
  - name: os_exit
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: vanisher, op: "{FAULT}", axis: world, rank: -1, how: os_exit, after_launches: 1}}
  - name: teardown_fail
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: untidy, op: "{FAULT}", axis: world, rank: 1, when: teardown}}
  - name: late
    blocks: [{{name: ar, op: all_reduce, axis: world, size: 4K}}]
  - name: one_fail
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: bad, op: "{FAULT}", axis: world, rank: 1, when: launch, after_launches: 2}}
  - name: never
    blocks: [{{name: ar, op: all_reduce, axis: world, size: 4K}}]
"""


def test_stop_on_error_false_goes_on_only_after_contained_failures(tmp_path):
    """Every way a block can leave on every rank (sys.exit, os._exit), a teardown's error and
    buffers larger than host memory are named, and contained; a failure that is not contained
    stops the run."""
    run = LocalRun(tmp_path, GO_ON)
    fault = run.fault_at(1)
    gone = run.all_gone() - fault
    err = run.stderr()
    assert run.proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    patterns = [p["pattern"] for p in read_records(run.out, "patterns.json")]
    assert patterns == ["first", "mid", "teardown_fail", "late"]  # measured, then torn down
    failures = {f["pattern"]: f["error"] for f in read_records(run.out, "failures.json")}
    assert list(failures) == [
        "setup_fail", "huge", "all_fail", "sys_exit", "os_exit", "teardown_fail", "one_fail"
    ]  # fmt: skip
    assert "rank 1, phase setup" in failures["setup_fail"]
    # The kernel's OOM killer would end a rank without a word; the check says why instead.
    huge = failures["huge"]
    assert (
        "phase setup, pattern 'huge': blocks huge (16384.00 GiB) and 1 more need 16384.00 GiB "
        in huge
    )
    assert "per rank, 32768.00 GiB for the 2 ranks on this host, and only " in huge, huge
    assert "GiB is available (" in huge, huge
    assert "phase setup, pattern 'sys_exit', block 'quitter': sys.exit(0)" in failures["sys_exit"]
    assert (
        "phase measure, pattern 'os_exit', block 'vanisher': ExitCalled: os._exit(0)"
        in (failures["os_exit"])
    )
    assert (
        "rank 1, phase teardown, pattern 'teardown_fail', block 'untidy': RuntimeError: "
        in (failures["teardown_fail"])
    )
    assert "phase measure" in failures["one_fail"]
    # Half-issued collectives cannot be contained: the run stops there.
    assert "never" not in err
    _assert_gone_in_time(
        "exception, sys.exit(0), os._exit(0), error in teardown (stop_on_error: false)",
        "--nproc 2",
        gone,
        [run.proc.returncode],
        limit_s=None,
    )


# ---------------------------------------------------------------------------------------------
# --nproc: every process of the launch is followed until all are gone
# ---------------------------------------------------------------------------------------------
class LocalRun:
    """``maestro run --nproc N`` in the background, in a session of its own; remembers every
    process it started so that their end can be timed, also after the launcher is gone."""

    def __init__(
        self,
        tmp_path: Path,
        yaml_text: str,
        *,
        nproc: int = 2,
        stdout=None,
        backend: str = "gloo",
    ) -> None:
        self.tmp_path = tmp_path
        self.out = tmp_path / "out"
        self.marks = tmp_path / "marks"
        self.marks.mkdir(exist_ok=True)
        config = tmp_path / "pattern.yaml"
        config.write_text(yaml_text)
        env = subprocess_env({MARK_VARIABLE: str(self.marks), OUTPUT_VARIABLE: str(self.out)})
        self.stderr_path = tmp_path / "stderr.txt"
        with self.stderr_path.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "userbenchmark.maestro", "run", "-c", str(config)]
                + ["--nproc", str(nproc), "--backend", backend, "--output-dir", str(self.out)]
                + ["--metrics-dir", str(tmp_path / "metrics")],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL if stdout is None else stdout,
                stderr=err,
                start_new_session=True,  # a group of its own: Ctrl-C reaches all of it
            )
        self.start = time.monotonic()
        self.seen: set[int] = set()

    def watch(self) -> None:
        """Remember every descendant alive now."""
        add_descendants(self.proc.pid, self.seen)

    def wait_for(self, condition, what: str) -> None:
        while not condition():
            self.watch()
            assert self.proc.poll() is None, f"maestro exited before {what}: {self.stderr()}"
            assert time.monotonic() - self.start < EXIT_DEADLINE_S, f"no {what}"
            time.sleep(0.05)
        self.watch()

    def fault_at(self, rank: int = 1) -> float:
        """When the fault block of ``rank`` failed (waits for it)."""
        self.wait_for(lambda: fault_moment(self.marks, rank) is not None, f"fault on rank {rank}")
        return fault_moment(self.marks, rank)

    def all_gone(self) -> float:
        """``time.monotonic()`` when the launcher and every process it started were gone."""
        try:
            while self.proc.poll() is None or any(alive(pid) for pid in self.seen):
                if self.proc.poll() is None:
                    self.watch()
                if time.monotonic() - self.start > 2 * EXIT_DEADLINE_S:
                    left = sorted(p for p in self.seen | {self.proc.pid} if alive(p))
                    pytest.fail(
                        f"still running {2 * EXIT_DEADLINE_S:.0f} s after the start: {left}"
                    )
                time.sleep(0.05)
            return time.monotonic()
        finally:
            for pid in [self.proc.pid, *self.seen]:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait()

    def stderr(self) -> str:
        return self.stderr_path.read_text()


def _assert_verdict(err: str, *, rank: int, phase: str, pattern: str = "second") -> None:
    """One line names the failed rank, the phase and the pattern; no traceback."""
    assert "Traceback" not in err, err[-3000:]
    named = [line for line in err.splitlines() if f"rank {rank}, phase {phase}" in line]
    assert named and f"pattern '{pattern}'" in named[0], err[-3000:]


def _assert_gone_in_time(
    fault: str,
    launcher: str,
    gone_s: float,
    statuses: list[int],
    *,
    limit_s: float | None = GONE_LIMIT_S,
) -> None:
    """Record the case; fail it when the last process was gone later than ``limit_s`` after
    the fault (None: the run goes on after the fault, so it has no deadline)."""
    record(fault, launcher, gone_s, statuses, limit_s)
    if limit_s is not None:
        assert gone_s <= limit_s, f"{fault}: last process gone {gone_s:.1f} s after the fault"


def nproc_sigstop_of_a_worker(tmp_path: Path) -> None:
    run = LocalRun(tmp_path, suite("rank: 1, when: launch, how: stop, after_launches: 3"))
    fault = run.fault_at(1)
    gone = run.all_gone() - fault
    err = run.stderr()
    assert run.proc.returncode == 1, err[-3000:]
    _assert_verdict(err, rank=1, phase="measure")
    assert "rank 1 did not reach the run's agreement step (stopped or hung)" in err, err[-3000:]
    assert_first_saved(tmp_path)
    assert [f["pattern"] for f in read_records(run.out, "failures.json")] == ["second"]
    _assert_gone_in_time("SIGSTOP of rank 1", "--nproc 2", gone, [run.proc.returncode])


def test_nproc_sigstop_of_a_worker(waiting_cases):
    waiting_cases["nproc_sigstop_of_a_worker"].result()


def nproc_block_that_never_returns(tmp_path: Path) -> None:
    """The lane's thread is stuck: the rank itself reports its block. (Stuck in setup, in the
    main thread, it is as a stopped worker: test_nproc_sigstop_of_a_worker.)"""
    run = LocalRun(tmp_path, suite("rank: 1, when: launch, how: hang, after_launches: 3"))
    fault = run.fault_at(1)
    gone = run.all_gone() - fault
    err = run.stderr()
    assert run.proc.returncode == 1, err[-3000:]
    _assert_verdict(err, rank=1, phase="measure")
    assert "block 'bad': block did not return within timeout_s 3 s" in err, err[-3000:]
    assert_first_saved(tmp_path)
    _assert_gone_in_time(
        "block that never returns on rank 1 (launch)", "--nproc 2", gone, [run.proc.returncode]
    )


def test_nproc_block_that_never_returns(waiting_cases):
    waiting_cases["nproc_block_that_never_returns"].result()


def test_nproc_sigkill_of_a_worker_is_named(tmp_path):
    run = LocalRun(tmp_path, suite("rank: 1, when: launch, how: kill, after_launches: 3"))
    fault = run.fault_at(1)
    gone = run.all_gone() - fault
    err = run.stderr()
    assert run.proc.returncode == 1, err[-3000:]
    _assert_verdict(err, rank=1, phase="measure")
    assert "interrupted" not in err, err[-3000:]  # torch's SIGTERM to rank 0 is no interrupt
    # What the kernel's OOM killer does looks the same: the launcher says which rank and how.
    assert "maestro: error: rank 1 was killed (SIGKILL: out of memory?)" in err, err[-3000:]
    # The launcher's last line names the phase the agreement named, not the one before it.
    last = err.strip().splitlines()[-1]
    assert "entering pattern 'second', phase measure, before the run ended" in last, err[-3000:]
    assert_first_saved(tmp_path)
    _assert_gone_in_time("SIGKILL of rank 1", "--nproc 2", gone, [run.proc.returncode])


SLOW = nap_sweep(name="faults", timeout_s=TIMEOUT_S, iters=2, first_us=200000, points=100)


def test_nproc_sigkill_of_the_launcher_leaves_no_worker(tmp_path):
    run = LocalRun(tmp_path, SLOW)
    run.wait_for((run.out / "results.json").exists, "finished pattern")
    time.sleep(0.3)
    run.watch()
    workers = sorted(p for p in run.seen if alive(p))
    assert len(workers) >= 2, workers  # the workers (and Python's resource tracker)
    killed = time.monotonic()
    run.proc.send_signal(signal.SIGKILL)
    gone = run.all_gone() - killed
    assert run.proc.returncode == -signal.SIGKILL
    assert read_records(run.out)  # what finished stays saved
    _assert_gone_in_time("SIGKILL of the launcher", "--nproc 2", gone, [run.proc.returncode])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_nproc_ctrl_c_or_a_closed_terminal(tmp_path, signum):
    """A terminal's Ctrl-C (SIGINT) or its closing (SIGHUP) reaches the whole process group:
    the launcher, Python's resource tracker and the workers; the same single line for both."""
    run = LocalRun(tmp_path, SLOW)
    run.wait_for((run.out / "results.json").exists, "finished pattern")
    time.sleep(0.3)
    run.watch()
    sent = time.monotonic()
    os.killpg(run.proc.pid, signum)
    gone = run.all_gone() - sent
    err = run.stderr()
    assert run.proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == "maestro: interrupted; patterns that finished are saved"
    assert "Traceback" not in err
    fault = "Ctrl-C (SIGINT" if signum == signal.SIGINT else "a closed terminal (SIGHUP"
    _assert_gone_in_time(f"{fault} to the process group)", "--nproc 2", gone, [130])


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP])
def test_nproc_a_worker_killed_or_stopped_during_start_up(tmp_path, signum):
    """A failure named as such, not an interrupt; a stopped worker that never said its pid is
    found and ended as soon as the others give up on it."""
    run = LocalRun(tmp_path, SLOW)

    def a_worker() -> list[int]:
        return [p for p in child_pids(run.proc.pid) if "spawn_main" in _cmdline(p)]

    run.wait_for(a_worker, "worker process")
    sent = time.monotonic()
    os.kill(max(a_worker()), signum)  # the later one: still importing torch
    gone = run.all_gone() - sent
    err = run.stderr()
    assert run.proc.returncode == 1, err[-3000:]
    assert "interrupted" not in err and "Traceback" not in err, err[-3000:]
    if signum == signal.SIGKILL:
        assert "was killed (SIGKILL: out of memory?) during start-up" in err, err
    else:
        assert "did not start within 3 s" in err, err[-3000:]
        assert "never started (stopped or hung): ended it with SIGKILL" in err, err[-3000:]
    name = signal.Signals(signum).name
    _assert_gone_in_time(f"{name} of a worker during start-up", "--nproc 2", gone, [1])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


LEAVES = f"""
name: leaves
timeout_s: 3
defaults: {{warmup_iters: 1, iters: 3, baseline: false}}
patterns:
  - name: first
    blocks:
      - {{name: ar, op: all_reduce, axis: world, size: 4K}}
      - {{name: messy, op: "{FAULT}", axis: world, rank: -1, when: setup, how: leave_behind}}
  - {{name: second, blocks: [{{name: ar, op: all_reduce, axis: world, size: 4K}}]}}
  - {{name: third, blocks: [{{name: ar, op: all_reduce, axis: world, size: 4K}}]}}
"""


def test_what_blocks_leave_behind_and_a_closed_stdout_cost_nothing(tmp_path):
    """Every rank's block starts a child, a forked copy and a thread that never end, and the
    reader of the tables goes away after one line (``| head -1``): every pattern is saved, the
    run succeeds, and nothing it started outlives it."""
    run = LocalRun(tmp_path, LEAVES, stdout=subprocess.PIPE)
    run.proc.stdout.readline()
    run.proc.stdout.close()  # as head -1 does
    fault = run.fault_at(0)
    gone = run.all_gone() - fault
    err = run.stderr()
    assert run.proc.returncode == 0, err[-3000:]
    assert "standard output was closed (BrokenPipeError" in err, err[-3000:]
    patterns = [p["pattern"] for p in read_records(run.out, "patterns.json")]
    assert patterns == ["first", "second", "third"]
    assert len(run.seen) >= 6, run.seen  # two workers, each with a child and a forked copy
    _assert_gone_in_time(
        "blocks leave a child, a forked copy and a thread; stdout closed after one line",
        "--nproc 2",
        gone,
        [0],
        limit_s=None,
    )


def test_an_output_folder_removed_mid_run_stops_the_run(tmp_path):
    text = suite("rank: 0, when: setup, how: remove_output")
    run = LocalRun(tmp_path, text)
    fault = run.fault_at(0)
    gone = run.all_gone() - fault
    err = run.stderr()
    assert run.proc.returncode == 1, err[-3000:]
    line = next(x for x in err.splitlines() if "phase output" in x)
    assert "rank 0, phase output, pattern 'second': the output folder " in line, err[-3000:]
    assert "was removed during the run (FileNotFoundError" in line, line
    assert not run.out.exists()  # never created again
    assert "third" not in err and "Traceback" not in err, err[-3000:]
    _assert_gone_in_time("the output folder removed mid-run", "--nproc 2", gone, [1])


# ---------------------------------------------------------------------------------------------
# per-rank processes, as torchrun or srun start them
# ---------------------------------------------------------------------------------------------
def a_frozen_store_host_ends_every_other_rank(tmp_path: Path) -> None:
    """Rank 0, which hosts the rendezvous store, stops (SIGSTOP) mid-pattern: a store call
    never returns by itself, and rank 1 must end anyway, naming rank 0."""
    procs, start = start_ranks(tmp_path, suite("rank: 0, how: stop, after_launches: 3"), [2, 2])
    try:
        (rank1,) = wait_ranks(procs[1:], start)
        fault = fault_moment(tmp_path / "marks", 0)
        assert fault is not None, rank1.stderr[-3000:]
        assert rank1.returncode == 1, rank1.stderr[-3000:]
        assert "maestro: rank 1: rank 0 at 127.0.0.1:" in rank1.stderr, rank1.stderr[-3000:]
        assert "which hosts the rendezvous store, stopped answering" in rank1.stderr
        assert "Traceback" not in rank1.stderr, rank1.stderr[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    _assert_gone_in_time(
        "SIGSTOP of rank 0, the store's host (the others)",
        "per-rank processes",
        rank1.ended_at - fault,
        [rank1.returncode],
    )


def test_a_frozen_store_host_ends_every_other_rank(waiting_cases):
    waiting_cases["a_frozen_store_host_ends_every_other_rank"].result()


def block_that_never_returns_per_rank(tmp_path: Path) -> None:
    """No launcher can end the hung rank: the verdict of the others does."""
    procs, start = start_ranks(tmp_path, suite("rank: 1, when: setup, how: hang"), [2, 2])
    ranks = wait_ranks(procs, start)
    assert [r.returncode for r in ranks] == [1, 1], [r.stderr[-2000:] for r in ranks]
    _assert_verdict(ranks[0].stderr, rank=1, phase="setup")
    assert "the other ranks ended the run without this rank" in ranks[1].stderr
    assert "Traceback" not in ranks[1].stderr, ranks[1].stderr[-3000:]
    assert_first_saved(tmp_path)
    _per_rank_case(tmp_path, "block that never returns on rank 1 (setup)", ranks)


def test_block_that_never_returns_per_rank(waiting_cases):
    waiting_cases["block_that_never_returns_per_rank"].result()


def sigstop_per_rank_then_sigcont(tmp_path: Path) -> None:
    """The other ranks end in time; the stopped rank, once continued, ends too."""
    procs, start = start_ranks(
        tmp_path, suite("rank: 1, when: launch, how: stop, after_launches: 3"), [2, 2]
    )
    try:
        fault = None
        while fault is None:
            assert time.monotonic() - start < EXIT_DEADLINE_S, "rank 1 never stopped"
            assert procs[1].poll() is None, procs[1].communicate()[1][-3000:]
            fault = fault_moment(tmp_path / "marks", 1)
            time.sleep(0.05)
        (rank0,) = wait_ranks(procs[:1], start)
        assert rank0.returncode == 1, rank0.stderr[-3000:]
        _assert_verdict(rank0.stderr, rank=1, phase="measure")
        assert_first_saved(tmp_path)
        survivors_gone = rank0.ended_at - fault
        procs[1].send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        (rank1,) = wait_ranks(procs[1:], start)
        assert rank1.returncode != 0 and "Traceback" not in rank1.stderr, rank1.stderr[-3000:]
        assert rank1.ended_at - resumed <= GONE_LIMIT_S, rank1.ended_at - resumed
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    _assert_gone_in_time(
        "SIGSTOP of rank 1 (the others; no launcher ends it)",
        "per-rank processes",
        survivors_gone,
        [rank0.returncode],
    )


def test_sigstop_per_rank_then_sigcont(waiting_cases):
    waiting_cases["sigstop_per_rank_then_sigcont"].result()


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_signal_to_the_torchrun_agent_leaves_no_worker(tmp_path, signum):
    """SIGKILL: the workers die with their agent. SIGTERM: torch's agent forwards it, and the
    workers stop as under maestro's own launcher (one message, what finished saved); the agent
    itself then exits 1 with torch's own traceback."""
    config = tmp_path / "pattern.yaml"
    config.write_text(SLOW)
    out = tmp_path / "out"
    env = subprocess_env({"OMP_NUM_THREADS": "1"})
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        agent = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
            + ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
            + ["-m", "userbenchmark.maestro", "run", "-c", str(config), "--backend", "gloo"]
            + ["--output-dir", str(out), "--metrics-dir", str(tmp_path / "metrics")],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    workers: set[int] = set()
    try:
        start = time.monotonic()
        while not (out / "results.json").exists():
            assert agent.poll() is None, "torchrun exited before a pattern finished"
            assert time.monotonic() - start < EXIT_DEADLINE_S, "no pattern finished"
            time.sleep(0.1)
        workers = {p for p in child_pids(agent.pid) if alive(p)}
        assert len(workers) >= 2, workers
        sent = time.monotonic()
        agent.send_signal(signum)
        agent.wait(timeout=EXIT_DEADLINE_S)
        while any(alive(p) for p in workers):
            assert time.monotonic() - sent < EXIT_DEADLINE_S, "workers outlived the agent"
            time.sleep(0.05)
        gone = time.monotonic() - sent
    finally:
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    if signum == signal.SIGTERM:
        err = err_path.read_text()
        assert "maestro: interrupted; patterns that finished are saved" in err, err[-3000:]
        assert read_records(out)
    name = signal.Signals(signum).name
    _assert_gone_in_time(f"{name} of the agent", "torchrun", gone, [agent.returncode])


# ---------------------------------------------------------------------------------------------
# one pattern for every rank
# ---------------------------------------------------------------------------------------------
ONE = """
name: faults
timeout_s: 3
defaults: {warmup_iters: 0, iters: 2, baseline: false}
patterns:
  - {name: NAME, blocks: [{name: ar, op: all_reduce, axis: world, size: 4K}]}
"""


def test_ranks_that_read_different_pattern_texts_stop_before_anything_runs(tmp_path):
    texts = [ONE.replace("NAME", "mine"), ONE.replace("NAME", "other")]  # same name and path
    ranks = run_ranks(tmp_path, texts, [2, 2])
    for r in ranks:
        assert r.returncode == 2, (r.rank, r.returncode, r.stderr[-2000:])
        assert r.elapsed_s < 60 and "Traceback" not in r.stderr, r.stderr[-2000:]
    mine, other = (hashlib.sha256(t.encode()).hexdigest()[:16] for t in texts)
    err = ranks[0].stderr
    assert "maestro: invalid configuration:" in err, err[-2000:]
    assert f"rank 1 runs a different pattern text than rank 0: sha256 {other} on rank 1, " in err
    assert f"{mine} on rank 0" in err, err[-2000:]
    assert not (tmp_path / "out" / "results.json").exists()


# ---------------------------------------------------------------------------------------------
# cases that mostly wait out a deadline, started one after another
# ---------------------------------------------------------------------------------------------
WAITING = (
    sigstop_per_rank_then_sigcont,
    a_frozen_store_host_ends_every_other_rank,
    block_that_never_returns_per_rank,
    sigkill_mid_pattern_on_three_ranks,
    nproc_sigstop_of_a_worker,
    raise_in_launch_mid_measurement,
    nproc_block_that_never_returns,
)
"""Cases whose ranks, once the fault happened, mostly wait (for ``timeout_s`` in a collective,
then for the grace at the agreement), the longest wait after the fault first."""


@pytest.fixture(scope="module")
def waiting_cases(request, tmp_path_factory) -> dict[str, Future]:
    """Each case of ``WAITING`` whose test runs in this session, as a future of its outcome: a
    case's test is its result (its assertion errors, raised again).

    A case starts once the one before it has failed (its fault mark written, so every rank of
    it is past its start-up): the waits after a fault overlap the next case's start-up, and no
    two start-ups share the CPU (ranks that reach the rendezvous far apart would time out).
    While ``MAESTRO_FAULT_TABLE`` is set, one case at a time: each time recorded is its own."""
    selected = {item.name for item in request.session.items}
    one_at_a_time = bool(os.environ.get(TABLE_VARIABLE))
    futures: dict[str, Future] = {}
    with ThreadPoolExecutor(len(WAITING)) as pool:
        for case in WAITING:
            if f"test_{case.__name__}" not in selected:
                continue
            tmp = tmp_path_factory.mktemp(case.__name__)
            future = pool.submit(case, tmp)
            futures[case.__name__] = future
            deadline = time.monotonic() + EXIT_DEADLINE_S
            while not future.done() and time.monotonic() < deadline:
                if not one_at_a_time and any((tmp / "marks").glob("fault-*")):
                    break
                time.sleep(0.05)
        wait(futures.values())
    return futures
