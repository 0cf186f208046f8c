"""Unit tests for the rank-0 progress line and its time-left estimate."""

from __future__ import annotations

import pytest

from userbenchmark.maestro.core.output.reporter import (
    Progress,
    estimate_left_s,
    format_line,
    progress_wanted,
)


class FakeStream:
    """A text stream that records writes and says whether it is a terminal."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.text = ""
        self.flushes = 0

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        self.flushes += 1


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("MAESTRO_NO_PROGRESS", raising=False)


def test_estimate_left_s():
    assert estimate_left_s(0, 10, 5.0) is None
    assert estimate_left_s(3, 10, 12.3) == pytest.approx(28.7)
    assert estimate_left_s(1, 4, 2.0) == 6.0
    assert estimate_left_s(10, 10, 50.0) == 0.0
    assert estimate_left_s(11, 10, 50.0) == 0.0  # more items than announced: nothing left
    assert estimate_left_s(5, 10, 0.0) == 0.0


def test_format_line():
    assert (
        format_line(3, 10, "pattern ar_sweep[size=4M]", 12.3)
        == "[3/10] pattern ar_sweep[size=4M]  elapsed 12.3 s  left ~28.7 s"  # docs' example
    )
    assert format_line(0, 2, "x", 0.04) == "[0/2] x  elapsed 0.0 s"
    assert format_line(2, 2, "x", 7.0) == "[2/2] x  elapsed 7.0 s  left ~0.0 s"


def test_progress_wanted_env_and_tty():
    tty, pipe = FakeStream(True), FakeStream(False)
    assert progress_wanted(tty, {}) is True
    assert progress_wanted(pipe, {}) is False
    assert progress_wanted(tty, {"CI": "true"}) is False
    assert progress_wanted(tty, {"CI": ""}) is True  # empty means unset
    assert progress_wanted(tty, {"MAESTRO_NO_PROGRESS": "1"}) is False
    assert progress_wanted(object(), {}) is False  # no isatty at all

    class Closed(FakeStream):
        def isatty(self) -> bool:
            raise ValueError("I/O operation on closed file")

    assert progress_wanted(Closed(True), {}) is False


def test_auto_enabled_on_a_terminal(clean_env):
    stream, clock = FakeStream(True), FakeClock()
    p = Progress(3, stream, clock=clock)
    assert p.enabled
    p.start()
    clock.now += 4.0
    p.advance("pattern a")
    assert stream.text == "\r[1/3] pattern a  elapsed 4.0 s  left ~8.0 s"
    clock.now += 2.0
    p.advance("b")
    # The shorter line is padded so nothing of the previous one stays visible.
    first = "[1/3] pattern a  elapsed 4.0 s  left ~8.0 s"
    second = "[2/3] b  elapsed 6.0 s  left ~3.0 s"
    assert stream.text == "\r" + first + "\r" + second + " " * (len(first) - len(second))
    p.close()
    assert stream.text.endswith("\n") and stream.text.count("\n") == 1
    p.close()
    p.advance("late")  # after close nothing is drawn
    assert stream.text.count("\n") == 1 and "late" not in stream.text


@pytest.mark.parametrize("var", ["CI", "MAESTRO_NO_PROGRESS"])
def test_auto_disabled_by_env(clean_env, monkeypatch, var):
    monkeypatch.setenv(var, "1")
    stream = FakeStream(True)
    p = Progress(2, stream)
    assert not p.enabled
    p.start()
    p.advance("a")
    p.close()
    assert stream.text == ""
    assert p.done == 1  # still counts


def test_auto_disabled_when_not_a_tty(clean_env):
    stream = FakeStream(False)
    p = Progress(2, stream)
    assert not p.enabled
    p.advance("a")
    p.close()
    assert stream.text == ""


def test_forced_on_and_off(clean_env, monkeypatch):
    monkeypatch.setenv("CI", "true")
    pipe = FakeStream(False)
    p = Progress(1, pipe, enabled=True, clock=FakeClock())
    p.advance("only")
    p.close()
    assert pipe.text == "\r[1/1] only  elapsed 0.0 s  left ~0.0 s\n"

    monkeypatch.delenv("CI")
    tty = FakeStream(True)
    p = Progress(1, tty, enabled=False)
    p.advance("only")
    p.close()
    assert tty.text == ""


def test_close_without_output_prints_nothing(clean_env):
    stream = FakeStream(True)
    p = Progress(5, stream)
    p.start()
    p.close()
    assert stream.text == ""


def test_clear_erases_the_line(clean_env):
    stream, clock = FakeStream(True), FakeClock()
    p = Progress(2, stream, clock=clock)
    p.advance("a")
    drawn = stream.text
    p.clear()
    width = len(drawn) - 1
    assert stream.text == drawn + "\r" + " " * width + "\r"
    p.advance("b")
    assert stream.text.endswith("\r[2/2] b  elapsed 0.0 s  left ~0.0 s")
    p.clear()
    p.close()  # the line was erased: no newline needed
    assert not stream.text.endswith("\n")


def test_elapsed_starts_at_first_advance_without_start(clean_env):
    clock = FakeClock()
    p = Progress(2, FakeStream(True), clock=clock)
    assert p.elapsed_s() == 0.0
    clock.now += 10.0
    p.advance("a")  # starts the clock now, so elapsed is 0, not 10
    assert p.elapsed_s() == 0.0
    clock.now += 1.5
    assert p.elapsed_s() == 1.5


def test_default_stream_is_stderr_at_call_time(clean_env, monkeypatch):
    fake = FakeStream(True)
    monkeypatch.setattr("sys.stderr", fake)
    p = Progress(1)
    assert p.stream is fake and p.enabled


def test_a_note_says_what_the_next_item_does_without_counting_it(clean_env):
    stream, clock = FakeStream(True), FakeClock()
    p = Progress(2, stream, clock=clock)
    p.start()
    clock.now += 4.0
    p.note("replay: baseline, block 3 of 55, left ~12.0 s")
    assert stream.text == "\r[0/2] replay: baseline, block 3 of 55, left ~12.0 s  elapsed 4.0 s"
    p.note("replay: check")  # shorter: padded over the longer line
    longer = len("[0/2] replay: baseline, block 3 of 55, left ~12.0 s  elapsed 4.0 s")
    shorter = "[0/2] replay: check  elapsed 4.0 s"
    assert stream.text.endswith("\r" + shorter + " " * (longer - len(shorter)))
    assert p.done == 0


def test_a_note_of_steps_says_the_block_and_the_time_left_from_the_first(clean_env):
    stream, clock = FakeStream(True), FakeClock()
    p = Progress(1, stream, clock=clock)
    p.note("p: baseline", 0, 4)
    assert stream.text.endswith("[0/1] p: baseline, block 1 of 4  elapsed 0.0 s")
    clock.now += 3.0
    p.note("p: baseline", 1, 4)  # one block took 3 s: three more take 9 s
    assert "[0/1] p: baseline, block 2 of 4, left ~9.0 s  elapsed 3.0 s" in stream.text


def test_a_run_notes_each_phase_and_baseline_block(tmp_path, monkeypatch, capsys, cli_here):
    from userbenchmark.maestro import cli
    from userbenchmark.maestro.core.output import reporter as progress

    monkeypatch.setattr(progress, "progress_wanted", lambda stream: True)
    config = tmp_path / "p.yaml"
    config.write_text(
        "name: notes\ndefaults: {warmup_iters: 1, iters: 2}\npatterns:\n  - name: three\n"
        "    blocks:\n"
        + "".join(
            f"      - {{name: s{i}, op: sleep, axis: {a}, duration_us: 50}}\n"
            for i, a in enumerate(("world", "w2", "w3"))
        )
        + "axes:\n  w2: {like: world}\n  w3: {like: world}\n"
    )
    assert cli.main(["run", "-c", str(config), "--no-metrics"]) == 0
    err = capsys.readouterr().err
    for doing in ("setup", "measure", "baseline", "baseline, block 2 of 3, left ~", "analysis"):
        assert f"[0/1] three: {doing}" in err
