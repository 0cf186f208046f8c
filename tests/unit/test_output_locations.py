"""Output locations checked and claimed before a run: usable folders, one run per output
directory, an earlier run's files moved aside, unique metrics file names."""

from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from userbenchmark.maestro.core.output import locations
from userbenchmark.maestro.core.output.locations import (
    LOCK_NAME,
    PreparedOutputs,
    prepare_output_locations,
)
from userbenchmark.maestro.errors import OptionError

NOW = dt.datetime(2025, 3, 4, 5, 6, 7)
STAMP = "20250304050607"


def _prepare(out, metrics=None, now=NOW) -> PreparedOutputs:
    return prepare_output_locations(out, metrics, now=now)


# --- (a) folders that cannot be used ------------------------------------------------------------


@pytest.mark.parametrize("option", ["--output-dir", "--metrics-dir"])
def test_a_file_is_refused(tmp_path, option):
    path = tmp_path / "taken"
    path.write_text("user data")
    args = (path, None) if option == "--output-dir" else (None, path)
    with pytest.raises(OptionError, match=f"{option} {path}: is a file, expected a directory"):
        prepare_output_locations(*args, now=NOW)
    assert path.read_text() == "user data"


@pytest.mark.parametrize("option", ["--output-dir", "--metrics-dir"])
def test_a_folder_that_cannot_be_created_is_refused(tmp_path, option):
    (tmp_path / "file").write_text("x")
    path = tmp_path / "file" / "sub"
    args = (path, None) if option == "--output-dir" else (None, path)
    with pytest.raises(OptionError, match=f"{option} {path}: cannot be created: Not a directory"):
        prepare_output_locations(*args, now=NOW)


@pytest.mark.parametrize("path", ["/proc/self", "/sys/kernel", "/proc", "/sys/x/new"])
def test_proc_and_sys_are_refused(path):
    with pytest.raises(OptionError, match=r"is under /proc or /sys"):
        _prepare(path)
    with pytest.raises(OptionError, match=r"--metrics-dir .*is under /proc or /sys"):
        _prepare(None, path)


def test_a_link_into_proc_is_refused(tmp_path):
    link = tmp_path / "link"
    link.symlink_to("/proc/self")
    with pytest.raises(OptionError, match=f"--output-dir {link}: is under /proc or /sys"):
        _prepare(link)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(OptionError, match=f"--output-dir {folder}: is not writable"):
            _prepare(folder)
    finally:
        folder.chmod(0o755)


def test_a_refused_probe_file_is_reported_and_not_left(tmp_path, monkeypatch):
    # The probe really is created and removed; here the file system refuses it (as a read-only
    # mount or missing permission would, which root cannot be shown in a test).
    real_open = os.open

    def refuse_probe(path, flags, mode=0o777, *, dir_fd=None):
        if os.fspath(path).startswith(os.fspath(tmp_path)) and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(locations.os, "open", refuse_probe)
    with pytest.raises(OptionError, match=f"--metrics-dir {tmp_path}: is not writable: Perm"):
        _prepare(None, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_probe_file_is_removed(tmp_path):
    with _prepare(tmp_path / "out", tmp_path / "m") as prepared:
        assert prepared.output_dir == tmp_path / "out"
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [LOCK_NAME]
        assert [p.name for p in (tmp_path / "m").iterdir()] == [f".metrics-{STAMP}.json.reserved"]


# --- (b) one run per output directory -----------------------------------------------------------


def test_a_second_run_into_the_same_directory_is_refused_until_the_first_ends(tmp_path):
    first = _prepare(tmp_path)
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with pytest.raises(OptionError) as info:
        _prepare(tmp_path)
    assert f"another maestro run is writing to {tmp_path} (pid {os.getpid()})" in str(info.value)
    first.close()
    first.close()  # idempotent
    assert not (tmp_path / LOCK_NAME).exists()  # a clean run leaves no lock file behind
    with _prepare(tmp_path), pytest.raises(OptionError, match="another maestro run"):
        _prepare(tmp_path)


def test_a_lock_file_removed_while_a_run_waited_for_it_is_taken_anew(tmp_path, monkeypatch):
    """The run that held the lock removed its file as it ended, after this run had opened it:
    the lock of the removed file means nothing, so this run takes a new file."""
    real_flock = locations.fcntl.flock
    calls = []

    def flock(fd, operation):
        if not calls:  # the holder ends between our open and our lock
            (tmp_path / LOCK_NAME).unlink()
        calls.append(fd)
        return real_flock(fd, operation)

    monkeypatch.setattr(locations.fcntl, "flock", flock)
    with _prepare(tmp_path):
        assert len(calls) == 2 and (tmp_path / LOCK_NAME).exists()
        monkeypatch.setattr(locations.fcntl, "flock", real_flock)
        with pytest.raises(OptionError, match="another maestro run"):
            _prepare(tmp_path)


def test_a_planted_lock_link_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(target)
    with pytest.raises(OptionError, match=f"--output-dir {out}: {LOCK_NAME} is a symbolic link"):
        _prepare(out)
    assert target.read_text() == "keep me"
    (out / LOCK_NAME).unlink()
    (out / "results.json").symlink_to(target)  # any name maestro writes
    with pytest.raises(OptionError, match="results.json is a symbolic link"):
        _prepare(out)
    assert target.read_text() == "keep me" and not (out / LOCK_NAME).exists()


def test_temporaries_of_a_killed_run_are_removed_and_named(tmp_path, caplog):
    out, metrics = tmp_path / "out", tmp_path / "metrics"
    for folder in (out, metrics):
        folder.mkdir()
    stale = [".results.json.0123abcd.tmp", ".plot-p.png.89abcdef.tmp"]
    mine = [".notes.txt.0123abcd.tmp", "x.tmp"]  # not names maestro writes
    for name in stale + mine:
        (out / name).write_text("part")
    (metrics / ".metrics-1.json.0123abcd.tmp").write_text("killed run")
    (metrics / ".metrics-2.json.0123abcd.tmp").write_text("live run")
    (metrics / ".metrics-2.json.reserved").write_text("")
    with caplog.at_level(logging.INFO, logger="maestro.output"), _prepare(out, metrics):
        pass
    assert sorted(p.name for p in out.iterdir()) == sorted(mine)
    assert sorted(p.name for p in metrics.iterdir()) == [
        ".metrics-2.json.0123abcd.tmp",
        ".metrics-2.json.reserved",
    ]
    assert ".results.json.0123abcd.tmp" in caplog.text and ".metrics-1.json" in caplog.text


def test_the_lock_names_the_other_process_and_dies_with_it(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys
                from userbenchmark.maestro.core.output.locations import prepare_output_locations
                prepared = prepare_output_locations({str(tmp_path)!r}, None)
                print("locked", flush=True)
                sys.stdin.readline()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(
            OptionError, match=rf"another maestro run is writing to .* \(pid {holder.pid}\)"
        ):
            _prepare(tmp_path)
    finally:
        holder.communicate("\n", timeout=300)  # a hang: it exits on this newline
    with _prepare(tmp_path):  # the process ended: its lock went with it
        pass


def test_a_file_system_without_locks_warns_and_goes_on(tmp_path, monkeypatch, caplog):
    def no_locks(fd, operation):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(locations.fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger="maestro.output"):
        prepared = _prepare(tmp_path)
    assert prepared._lock_fd is None
    assert "cannot lock" in caplog.text and "Function not implemented" in caplog.text


# --- (c) an earlier run's files are moved aside -------------------------------------------------

MAESTRO_FILES = [
    "results.json",
    "results.csv",
    "patterns.json",
    "patterns.csv",
    "pairs.json",
    "pairs.csv",
    "failures.json",
    "trace.json",
    "plot-ag_rs.png",
    "plot-ag_rs-2.png",
]
USER_FILES = ["notes.txt", "results.txt", "my-results.json", "plot-ag_rs.jpg", "metrics-1.json"]


def test_earlier_files_are_moved_aside_and_user_files_are_untouched(tmp_path, caplog):
    for name in MAESTRO_FILES + USER_FILES:
        (tmp_path / name).write_text(f"old {name}")
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank0.json").write_text("old trace")
    with caplog.at_level(logging.INFO, logger="maestro.output"), _prepare(tmp_path) as prepared:
        previous = tmp_path / f"previous-{STAMP}"
        assert prepared.output_dir == tmp_path
        assert sorted(p.name for p in previous.iterdir()) == sorted([*MAESTRO_FILES, "traces"])
    for name in MAESTRO_FILES:
        assert not (tmp_path / name).exists()
        assert (previous / name).read_text() == f"old {name}"
    assert (previous / "traces" / "rank0.json").read_text() == "old trace"
    for name in USER_FILES:
        assert (tmp_path / name).read_text() == f"old {name}"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and f"to {previous}" in lines[0] and "\n" not in lines[0]


def test_a_second_move_in_the_same_second_gets_its_own_folder(tmp_path):
    (tmp_path / "results.json").write_text("first")
    with _prepare(tmp_path):
        pass
    (tmp_path / "results.json").write_text("second")
    with _prepare(tmp_path):
        assert (tmp_path / f"previous-{STAMP}-2").is_dir()
    assert (tmp_path / f"previous-{STAMP}" / "results.json").read_text() == "first"
    assert (tmp_path / f"previous-{STAMP}-2" / "results.json").read_text() == "second"


def test_nothing_to_move_makes_no_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with _prepare(tmp_path):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_files_of_a_running_run_are_not_moved(tmp_path):
    with _prepare(tmp_path):
        (tmp_path / "results.json").write_text("live")  # the running run writes
        with pytest.raises(OptionError, match="another maestro run"):
            _prepare(tmp_path)
    assert (tmp_path / "results.json").read_text() == "live"
    assert not list(tmp_path.glob("previous-*"))


# --- (d) metrics file names -------------------------------------------------------------------


def test_runs_started_in_the_same_second_get_different_metrics_names(tmp_path):
    metrics = tmp_path / "metrics"
    first = _prepare(tmp_path / "a", metrics)
    second = _prepare(tmp_path / "b", metrics)
    assert first.metrics_path == metrics / f"metrics-{STAMP}.json"
    assert second.metrics_path == metrics / f"metrics-{STAMP}-2.json"
    first.metrics_path.write_text("{}")  # the runs write their files
    first.close()
    second.close()
    third = _prepare(None, metrics)  # the finished file keeps its name taken
    assert third.metrics_path == metrics / f"metrics-{STAMP}-2.json"
    third.close()
    assert sorted(p.name for p in metrics.iterdir()) == [f"metrics-{STAMP}.json"]


def test_concurrent_runs_never_share_a_metrics_name(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    barrier = threading.Barrier(12)
    prepared: list[PreparedOutputs] = []
    lock = threading.Lock()

    def start():
        barrier.wait()
        result = _prepare(None, metrics)
        with lock:
            prepared.append(result)

    threads = [threading.Thread(target=start) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = sorted(p.metrics_path.name for p in prepared)
    assert len(set(names)) == 12
    assert all(n.startswith(f"metrics-{STAMP}") and n.endswith(".json") for n in names)
    # The reservations are hidden: TorchBench's metrics-*.json glob never sees them.
    assert list(metrics.glob("metrics-*.json")) == []
    for p in prepared:
        p.close()
    assert list(metrics.iterdir()) == []


def test_no_metrics_dir_means_no_metrics_file(tmp_path):
    with _prepare(tmp_path / "out", None) as prepared:
        assert prepared.metrics_path is None
    with prepare_output_locations(None, None) as nothing:
        assert nothing.output_dir is None and nothing.metrics_path is None


# ---- a run's inputs are never moved nor overwritten; names too long are one line ----
@pytest.mark.parametrize("name", ["results.json", "traces/my_op.py", "plot-p.png"])
def test_an_input_among_what_a_run_moves_or_writes_is_refused_before_anything_moves(tmp_path, name):
    out = tmp_path / "pd"
    (out / "traces").mkdir(parents=True)
    source = out / name
    source.write_text("name: mine\n")
    (out / "patterns.json").write_text("an earlier run's")
    with pytest.raises(OptionError, match=rf"{source} is an input of this run, and "):
        prepare_output_locations(out, None, now=NOW, inputs=[source])
    assert source.read_text() == "name: mine\n" and (out / "patterns.json").exists()
    assert not list(out.glob("previous-*")) and not (out / LOCK_NAME).exists()
    with pytest.raises(OptionError, match="is an input of this run"):  # through a link too
        (tmp_path / "link.yaml").symlink_to(source)
        prepare_output_locations(out, None, now=NOW, inputs=[tmp_path / "link.yaml"])
    (tmp_path / "mine.yaml").write_text("name: mine\n")
    with prepare_output_locations(out, None, now=NOW, inputs=[tmp_path / "mine.yaml"]):
        assert (out / f"previous-{STAMP}" / "patterns.json").exists()  # others still move


def test_run_of_a_pattern_file_inside_the_output_folder_under_a_results_name_is_refused(
    tmp_path, capsys, cli_here
):
    from userbenchmark.maestro import cli
    from userbenchmark.maestro.core.config.loader import resolve_config_path

    out = tmp_path / "pd"
    out.mkdir()
    (out / "results.json").write_text(resolve_config_path("quickstart").read_text())
    argv = ["run", "-c", str(out / "results.json"), "--output-dir", str(out), "--no-metrics"]
    assert cli.main(argv) == 2
    assert "is an input of this run" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]


@pytest.mark.parametrize("option", ["--output-dir", "--metrics-dir"])
def test_a_path_component_over_255_bytes_is_one_line_and_status_2(
    tmp_path, capsys, option, cli_here
):
    from userbenchmark.maestro import cli

    folder = tmp_path / ("a" * 300)
    assert cli.main(["run", "--iters", "1", option, str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"maestro: invalid option: {option} {folder}: cannot be created: ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_an_output_file_name_over_255_bytes_is_one_line_and_status_2(tmp_path, capsys, cli_here):
    from userbenchmark.maestro import cli

    output = tmp_path / ("a" * 300 + ".yaml")
    assert cli.main(["import-trace", str(tmp_path), "-o", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"maestro: invalid option: -o {output}: ") and err.count("\n") == 1
