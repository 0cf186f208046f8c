"""Where a SIGINT/SIGTERM stops a rank, and that an interrupted write leaves files that agree."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from userbenchmark.maestro.core.analysis.records import BlockResult, PatternOutcome, PatternResult
from userbenchmark.maestro.core.output import locations as outputs
from userbenchmark.maestro.core.output.locations import atomic_write_files
from userbenchmark.maestro.core.output.writer import OutputWriter
from userbenchmark.maestro.core.runtime import launcher
from userbenchmark.maestro.core.runtime import supervision as interrupts


def pending() -> bool:
    """A signal arrived that no deliverable region has raised yet."""
    return interrupts._state.pending is not None


@pytest.fixture
def installed():
    restore = interrupts.install()
    yield
    restore()


def _signal_self(signum: int = signal.SIGINT) -> None:
    os.kill(os.getpid(), signum)  # delivered to the main thread before the next bytecode


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_inside_a_deliverable_region_raises_at_once(installed, signum):
    with pytest.raises(KeyboardInterrupt), interrupts.deliverable():
        _signal_self(signum)
        raise AssertionError("not interrupted")  # pragma: no cover
    assert not pending()


def test_signal_outside_waits_for_the_next_deliverable_region(installed):
    _signal_self()
    assert pending()  # recorded, not raised here
    with pytest.raises(KeyboardInterrupt), interrupts.deliverable():
        raise AssertionError("the pending signal must be raised on entry")  # pragma: no cover
    assert not pending()
    with interrupts.deliverable():
        pass  # raised once only


def test_second_signal_outside_a_region_raises(installed):
    _signal_self()
    with pytest.raises(KeyboardInterrupt):
        _signal_self()
    assert not pending()


def test_held_region_defers_every_signal(installed):
    with interrupts.held():
        _signal_self()
        _signal_self(signal.SIGTERM)
        with interrupts.deliverable():  # even a region opened inside does not raise
            _signal_self()
    assert pending()
    with pytest.raises(KeyboardInterrupt), interrupts.deliverable():
        pass


def test_restore_puts_back_the_previous_handlers():
    before = signal.getsignal(signal.SIGINT)
    restore = interrupts.install()
    assert signal.getsignal(signal.SIGINT) is not before
    restore()
    assert signal.getsignal(signal.SIGINT) is before
    assert signal.getsignal(signal.SIGTERM) is not interrupts._handler
    with interrupts.deliverable():  # not installed: a plain context
        pass


def test_install_off_the_main_thread_changes_nothing():
    before = signal.getsignal(signal.SIGINT)
    restores = []
    t = threading.Thread(target=lambda: restores.append(interrupts.install()))
    t.start()
    t.join()
    assert signal.getsignal(signal.SIGINT) is before
    restores[0]()
    assert signal.getsignal(signal.SIGINT) is before


def test_atomic_write_files_changes_nothing_when_one_file_fails(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    atomic_write_files({a: b"old a", b: b"old b"})
    with pytest.raises(TypeError):
        atomic_write_files({a: b"new a", b: 123})  # type: ignore[dict-item]
    assert a.read_bytes() == b"old a" and b.read_bytes() == b"old b"
    assert not list(tmp_path.glob(".*.tmp"))


def _outcome(name: str) -> PatternOutcome:
    block = BlockResult(
        suite="s", pattern=name, block="b", op="sleep", axis="world", lane="b", team_size=1,
        dtype="bf16", size_bytes=None, iters=2, latency_avg_us=1.0, latency_min_us=1.0,
        latency_max_us=1.0, latency_p50_us=1.0, latency_p99_us=1.0, latency_stdev_us=0.0,
    )  # fmt: skip
    result = PatternResult(
        suite="s", pattern=name, iters=2, num_blocks=1, makespan_avg_us=1.0, makespan_p99_us=1.0
    )
    return PatternOutcome(blocks=(block,), pattern=result)


def test_interrupt_while_files_are_written_leaves_them_in_agreement(
    tmp_path, installed, monkeypatch
):
    writer = OutputWriter(
        output_dir=tmp_path, metrics_path=tmp_path / "m.json", environ={}, guard=interrupts.held
    )
    writer.add(_outcome("one"))
    real = outputs._write_temporary
    calls = []

    def write_then_signal(path, data):
        calls.append(path.name)
        if len(calls) == 1:  # between the first file and the rest: Ctrl-C, then a launcher's
            _signal_self()  # SIGTERM, which outside a held region would raise at once
            _signal_self(signal.SIGTERM)
        return real(path, data)

    monkeypatch.setattr(outputs, "_write_temporary", write_then_signal)
    writer.add(_outcome("two"))  # the signal must not split this update
    # results, patterns, pairs (json and csv each), run.json, metrics
    assert len(calls) == 8 and pending()
    blocks = {r["pattern"] for r in json.loads((tmp_path / "results.json").read_text())}
    patterns = {r["pattern"] for r in json.loads((tmp_path / "patterns.json").read_text())}
    assert blocks == patterns == {"one", "two"}
    assert "two" in (tmp_path / "results.csv").read_text()
    assert "two" in (tmp_path / "patterns.csv").read_text()
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.fixture
def peers_exited(monkeypatch):
    """As in a worker of the local launcher whose sibling (rank 1) has exited."""
    from userbenchmark.maestro.core.runtime import supervision

    monkeypatch.setattr(supervision, "exited_peers", lambda: (1,))
    restore = interrupts.install()
    yield
    restore()


def test_sigterm_after_a_sibling_exited_is_the_launcher_ending_the_run(peers_exited):
    with pytest.raises(interrupts.PeerExited) as info, interrupts.deliverable():
        _signal_self(signal.SIGTERM)
        raise AssertionError("not stopped")  # pragma: no cover
    assert info.value.ranks == (1,) and "worker 1 exited" in str(info.value)
    assert not pending()


def test_sigint_is_always_the_users(peers_exited):
    with pytest.raises(KeyboardInterrupt) as info, interrupts.deliverable():
        _signal_self(signal.SIGINT)
        raise AssertionError("not interrupted")  # pragma: no cover
    assert not isinstance(info.value, interrupts.PeerExited)


def test_a_held_launcher_sigterm_is_no_pending_interrupt(peers_exited):
    _signal_self(signal.SIGTERM)
    assert pending() and not interrupts.pending_interrupt()
    with pytest.raises(interrupts.PeerExited), interrupts.deliverable():
        pass


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_without_exited_siblings_sigterm_or_sighup_interrupts(installed, signum):
    with pytest.raises(KeyboardInterrupt) as info, interrupts.deliverable():
        _signal_self(signum)
        raise AssertionError("not interrupted")  # pragma: no cover
    assert not isinstance(info.value, interrupts.PeerExited)


def test_the_launchers_signal_router_ignores_a_wake_up_that_is_no_signal(monkeypatch):
    # A tracer (py-spy, gdb) attaching to the launcher can end its sigtimedwait with signal
    # number 0: that is nobody's interrupt, and the router thread must live on.
    calls: list[float] = []

    def sigtimedwait(signals, timeout_s):
        calls.append(timeout_s)
        return SimpleNamespace(si_signo=0) if len(calls) == 1 else None

    monkeypatch.setattr(signal, "sigtimedwait", sigtimedwait)
    died: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    board = interrupts.WorkerBoard(1, multiprocessing.get_context("spawn"))
    with launcher._signals_to_main_thread(board):
        hang_deadline = time.monotonic() + 30
        while len(calls) < 2 and not died and time.monotonic() < hang_deadline:
            time.sleep(0.01)
    assert not died and len(calls) >= 2 and not board.interrupted.value
