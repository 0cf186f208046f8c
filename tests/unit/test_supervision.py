"""The local launcher's supervision: workers die with their parent, and the watchdog ends the
workers that cannot end by themselves, never one that is still working."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from userbenchmark.maestro.core.runtime import supervision
from userbenchmark.maestro.core.runtime.supervision import (
    EXIT_GRACE_S,
    LEAVING,
    RUNNING,
    VERDICT,
    Watchdog,
    WorkerBoard,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


class Machine:
    """A fake clock and fake worker processes for the watchdog (patched into ``supervision``)."""

    def __init__(self, num_workers: int, monkeypatch) -> None:
        self.board = WorkerBoard(num_workers, multiprocessing.get_context("spawn"))
        self.now = 0.0
        self.running: set[int] = set()
        self.killed: list[int] = []
        for rank in range(num_workers):
            self.board.pids[rank] = 1000 + rank
            self.board.stage[rank] = RUNNING
            self.running.add(1000 + rank)
        self.groups: list[int] = []
        self.abandoned = 0
        self.unattached: list[int] = []
        monkeypatch.setattr(
            supervision, "child_exit", lambda pid: None if pid in self.running else 0
        )
        monkeypatch.setattr(supervision, "kill_group", lambda pid: self.groups.append(pid - 1000))
        monkeypatch.setattr(supervision, "unattached_workers", lambda board: self.unattached)
        monkeypatch.setattr(os, "kill", self._kill)  # check() runs in the test's own thread
        self.watchdog = Watchdog(self.board, exit_deadline_s=20.0, abandon=self._abandon)

    def _abandon(self) -> None:
        self.abandoned += 1

    def _kill(self, pid: int, signum: int) -> None:
        assert signum == signal.SIGKILL
        self.killed.append(pid - 1000)
        self.running.discard(pid)

    def exit(self, rank: int) -> None:
        self.running.discard(1000 + rank)

    def at(self, seconds: float) -> list[int]:
        self.now = seconds
        self.watchdog.check(seconds)
        return self.killed


def test_a_rank_a_verdict_named_as_gone_is_killed_at_once(monkeypatch):
    m = Machine(3, monkeypatch)
    assert m.at(1.0) == []
    m.board.missing[1] = 1  # rank 0 saved and printed the verdict, then posted this
    m.board.stage[0] = VERDICT
    assert m.at(1.05) == [1]
    assert m.watchdog.killed(1) and "did not reach" in m.watchdog.kills[0].reason


def test_stragglers_are_killed_a_grace_after_every_rank_has_its_verdict(monkeypatch):
    m = Machine(2, monkeypatch)
    m.board.stage[0] = VERDICT
    m.board.stage[1] = VERDICT  # both know the outcome; rank 1 hangs on its way out
    m.exit(0)
    assert m.at(10.0) == []
    assert m.at(10.0 + EXIT_GRACE_S - 0.1) == []
    assert m.at(10.0 + EXIT_GRACE_S) == [1]


def test_a_rank_named_as_gone_before_it_said_its_pid_is_found_and_killed(monkeypatch):
    m = Machine(2, monkeypatch)
    m.board.pids[1] = 0
    m.unattached.append(1001)  # the worker spawned, stopped at import
    m.board.missing[1] = 1
    assert m.at(1.0) == [1] and "never started" in m.watchdog.kills[0].reason


def test_workers_still_starting_are_left_alone(monkeypatch):
    m = Machine(2, monkeypatch)
    m.board.pids[1] = 0  # not started yet
    m.board.stage[0] = VERDICT
    assert m.at(1.0) == [] and m.at(1.0 + EXIT_GRACE_S) == []


def test_a_rank_still_working_after_another_finished_is_left_alone(monkeypatch):
    """Rank 1 finished; rank 0 still writes its files (nobody exited yet: success)."""
    m = Machine(2, monkeypatch)
    m.board.stage[1] = LEAVING
    assert m.at(1000.0) == []


def test_everyone_still_running_long_after_a_worker_exited_is_killed(monkeypatch):
    m = Machine(3, monkeypatch)
    m.exit(2)  # killed by someone else; torch's launcher terminates the others
    assert m.at(5.0) == []
    assert m.at(5.0 + 19.9) == []
    assert sorted(m.at(5.0 + 20.0)) == [0, 1]


def test_what_an_exited_worker_left_is_ended_and_a_launch_stuck_after_all_exited_abandoned(
    monkeypatch,
):
    m = Machine(2, monkeypatch)
    m.exit(1)
    m.at(1.0)
    assert m.groups == [1] and m.watchdog.exits == {1: 0}
    m.exit(0)
    m.at(2.0)
    assert m.groups == [1, 0] and m.abandoned == 0
    m.at(2.0 + EXIT_GRACE_S)  # torch's launcher still waits on a worker that vanished
    assert m.abandoned == 1 and m.killed == []


def test_exited_peers_names_siblings_whose_process_ended(monkeypatch):
    board = WorkerBoard(3, multiprocessing.get_context("spawn"))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    board.pids[0] = os.getpid()
    board.pids[1] = gone.pid
    board.pids[2] = os.getppid()
    board.stage[2] = LEAVING
    monkeypatch.setattr(supervision, "_board", None)
    assert supervision.exited_peers() == () and supervision.forwarded()  # not a local worker
    supervision.attach(board, 0)
    assert supervision.exited_peers() == (1, 2) and not supervision.forwarded()
    board.interrupted.value = 1  # the launcher forwards a user's signal: an interrupt
    assert supervision.exited_peers() == () and supervision.forwarded()


def test_a_wait_past_its_deadline_ends_the_process_naming_the_cause(monkeypatch, capsys):
    ended = threading.Event()
    codes = []
    monkeypatch.setattr(supervision, "_real_exit", lambda code: (codes.append(code), ended.set()))
    monkeypatch.setattr(supervision, "end_children", lambda: None)
    with supervision.deadline(60.0, "never", rank=1):
        pass  # returned in time: nothing happens
    with supervision.deadline(0.05, "rank 0 at h:1, which hosts the store, stopped", rank=1):
        assert ended.wait(30)
    assert codes == [1]
    assert capsys.readouterr().err == (
        "maestro: rank 1: rank 0 at h:1, which hosts the store, stopped: no answer within "
        "0.05 s; exiting\n"
    )


def test_a_blocks_os_exit_is_refused_while_the_rank_runs():
    real = os._exit
    with supervision.exits_refused(), pytest.raises(supervision.ExitCalled, match=r"_exit\(0\)"):
        os._exit(0)
    assert os._exit is real


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_children_a_process_left_are_ended(tmp_path):
    script = (
        "import subprocess, sys, time\n"
        "from userbenchmark.maestro.core.runtime import supervision\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "print(child.pid, flush=True)\n"
        "supervision.end_children()\n"
        "print(child.wait(), flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.split()
    assert out[1] == "-9", out


CHILD = """
import sys, time
from pathlib import Path
from userbenchmark.maestro.core.runtime.supervision import die_with_parent
die_with_parent(int(sys.argv[1]))
Path(sys.argv[2]).write_text("bound")
time.sleep(120)
"""
PARENT = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", *sys.argv[1:2], str(os.getpid()), *sys.argv[2:]])
print(child.pid, flush=True)
child.wait()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="follows processes through /proc")
def test_a_worker_dies_with_its_parent(tmp_path):
    bound = tmp_path / "bound"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(bound)],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 60
        while not bound.exists() or not bound.read_text():
            assert time.monotonic() < deadline, "the child never bound itself to its parent"
            time.sleep(0.05)
        parent.kill()
        parent.wait()
        killed = time.monotonic()
        while _alive(child):
            assert time.monotonic() - killed < 5, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.wait()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
