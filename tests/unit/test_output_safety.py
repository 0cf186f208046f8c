"""No input and no earlier result is ever overwritten by accident: the one rule of the files a
command writes under a name the user gives (``compare --plot FILE``, ``import-trace -o FILE``;
``run --output-dir`` has its own folder rules, tests/unit/test_output_locations.py), and
``compare --plot``'s errors, which leave the table printed."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from userbenchmark.maestro import cli
from userbenchmark.maestro.core.output.locations import check_output_file
from userbenchmark.maestro.core.output.writer import OutputWriter
from userbenchmark.maestro.errors import OptionError

from .replay_scenarios import ddp_rank
from .replay_traces import write_all
from .test_golden_outputs import _outcomes

pytestmark = pytest.mark.usefixtures("cli_here")  # tests/conftest.py
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
YAML = {"suffixes": (".yaml", ".yml"), "writes": "YAML"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two output folders of the same (made-up) run: A and B."""
    root = tmp_path_factory.mktemp("runs")
    for name in ("a", "b"):
        writer = OutputWriter(output_dir=root / name, metrics_path=None, environ={})
        for _, outcome, _ in _outcomes():
            writer.add(outcome)
    return root / "a", root / "b"


@pytest.fixture
def traces(tmp_path):
    return write_all([ddp_rank(0), ddp_rank(1)], tmp_path / "traces")


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _one_line(err: str, *parts: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert all(part in err for part in parts), err


# --- import-trace -o ---------------------------------------------------------------------------


def test_import_trace_never_writes_over_its_input_trace(traces, capsys):
    before = _snapshot(traces)
    target = traces / "rank0.json.gz"
    assert target.exists()
    assert cli.main(["import-trace", str(traces), "-o", str(target)]) == 2
    _one_line(capsys.readouterr().err, f"-o {target}: is {target}, an input of this command")
    assert _snapshot(traces) == before


def test_import_trace_never_writes_over_a_hard_link_of_its_input(traces, tmp_path, capsys):
    source = traces / "rank0.json.gz"
    link = tmp_path / "step.yaml"
    os.link(source, link)
    before = source.read_bytes()
    assert cli.main(["import-trace", str(source), str(traces / "rank1.json.gz"), "-o", str(link)])
    _one_line(capsys.readouterr().err, f"-o {link}: is {source}, an input of this command")
    assert source.read_bytes() == before and link.read_bytes() == before


def test_import_trace_refuses_a_suffix_that_is_not_yaml(traces, tmp_path, capsys):
    out = tmp_path / "step.json"
    assert cli.main(["import-trace", str(traces), "-o", str(out)]) == 2
    _one_line(capsys.readouterr().err, f"-o {out}: writes YAML: name a file ending in .yaml")
    assert not out.exists()


def test_import_trace_an_empty_output_is_named_so(traces, capsys):
    assert cli.main(["import-trace", str(traces), "-o", ""]) == 2
    _one_line(capsys.readouterr().err, "-o '': an empty path; name the file to write")


def test_import_trace_never_writes_through_a_link(traces, tmp_path, capsys):
    target = tmp_path / "precious.txt"
    target.write_text("user data")
    link = tmp_path / "step.yaml"
    link.symlink_to(target)
    assert cli.main(["import-trace", str(traces), "-o", str(link)]) == 2
    _one_line(capsys.readouterr().err, f"-o {link}: is a symbolic link")
    assert link.is_symlink() and target.read_text() == "user data"


def test_import_trace_replaces_an_earlier_output_atomically(traces, tmp_path, capsys):
    out = tmp_path / "step.yaml"
    out.write_text("earlier\n")
    keep = tmp_path / "earlier.yaml"
    os.link(out, keep)  # a second name of the earlier file: a rename leaves it whole
    assert cli.main(["import-trace", str(traces), "-o", str(out)]) == 0
    assert "world_size: 2" in out.read_text() and keep.read_text() == "earlier\n"


# --- the rule itself ---------------------------------------------------------------------------


def test_a_folder_a_fifo_and_a_new_file(tmp_path):
    with pytest.raises(OptionError, match=f"-o {tmp_path}: is a folder"):
        check_output_file("-o", tmp_path, **YAML)
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    with pytest.raises(OptionError, match="is not a regular file"):
        check_output_file("-o", fifo, **YAML)
    assert check_output_file("-o", tmp_path / "NEW.YML", **YAML) == tmp_path / "NEW.YML"


def test_a_file_of_a_maestro_run_is_refused_whatever_its_suffix(runs, tmp_path):
    a, _ = runs
    for name in ("results.json", "run.json", "plot-x.png"):
        with pytest.raises(OptionError, match="is a file of a maestro run"):
            check_output_file("--plot", a / name, suffixes=(".png", ".json"), writes="x")
    metrics = tmp_path / "metrics-20250304050607-2.json"
    with pytest.raises(OptionError, match="is a file of a maestro run"):
        check_output_file("-o", metrics, suffixes=(".json",), writes="x")
    # The same names elsewhere, and other names beside a run's files, are anyone's.
    check_output_file("--plot", tmp_path / "plot-x.png", suffixes=(".png",), writes="x")
    check_output_file("--plot", a / "compare.png", suffixes=(".png",), writes="x")


# --- compare --plot ----------------------------------------------------------------------------


def _compare(runs, *extra):
    return cli.main(["compare", *map(str, runs), *map(str, extra)])


def test_compare_plot_never_writes_over_a_results_file(runs, capsys):
    a, _ = runs
    before = _snapshot(a)
    assert _compare(runs, "--plot", a / "results.json") == 2
    _one_line(capsys.readouterr().err, f"--plot {a / 'results.json'}: is ")
    assert _snapshot(a) == before


def test_compare_plot_never_writes_over_an_input_file(runs, capsys):
    a, b = runs
    before = (b / "results.json").read_bytes()
    assert cli.main(["compare", str(a), str(b / "results.json"), "--plot", str(b / "results.json")])
    _one_line(capsys.readouterr().err, "an input of this command")
    assert (b / "results.json").read_bytes() == before


def test_compare_plot_never_writes_through_a_link(runs, tmp_path, capsys):
    target = tmp_path / "precious.png"
    target.write_bytes(b"user data")
    link = tmp_path / "cmp.png"
    link.symlink_to(target)
    assert _compare(runs, "--plot", link) == 2
    _one_line(capsys.readouterr().err, f"--plot {link}: is a symbolic link")
    assert link.is_symlink() and target.read_bytes() == b"user data"


def test_compare_plot_refuses_a_suffix_it_cannot_write(runs, tmp_path, capsys):
    assert _compare(runs, "--plot", tmp_path / "cmp.jpg") == 2
    _one_line(capsys.readouterr().err, "writes an image: name a file ending in .png or .pdf")
    assert not (tmp_path / "cmp.jpg").exists()


@pytest.mark.parametrize(
    ("suffix", "magic"), [(".pdf", b"%PDF"), (".svg", b"<?xml"), (".png", PNG_MAGIC)]
)
def test_compare_plot_writes_the_format_its_suffix_names(runs, tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"cmp{suffix}"
    old = os.umask(0o027)
    try:
        assert _compare(runs, "--plot", out) == 0
    finally:
        os.umask(old)
    assert out.read_bytes().startswith(magic)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640  # the umask, not mkstemp's 0600
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary left


def test_compare_plot_missing_folder_prints_the_table_and_one_line(runs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "absent" / "cmp.png"
    assert _compare(runs, "--plot", out) == 2
    captured = capsys.readouterr()
    assert "nothing regressed or improved; " in captured.out  # the table: nothing changed
    _one_line(captured.err, f"maestro: --plot {out}: not written: No such file or directory")
    assert ".tmp" not in captured.err


def test_compare_plot_without_matplotlib_prints_the_table(runs, tmp_path, capsys, monkeypatch):
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert _compare(runs, "--plot", tmp_path / "cmp.png") == 2
    captured = capsys.readouterr()
    assert "nothing regressed or improved; " in captured.out
    _one_line(captured.err, "not written: --plot needs matplotlib: pip install matplotlib")


# --- what compare judges -----------------------------------------------------------------------

SKEW = "s/p/ag/start_skew_us"
LAT = "s/p/ag/latency_avg_us"


def _metrics(path, skew, lat=100.0):
    metrics = {}
    for key, value, half in ((SKEW, skew, 0.5), (LAT, lat, 1.0)):
        metrics.update({key: value, f"{key}_ci_low": value - half, f"{key}_ci_high": value + half})
        metrics[f"{key}_ci_df"] = 30
    for stat_name in ("min", "max", "p50"):
        metrics[f"s/p/ag/latency_{stat_name}_us"] = lat
    environ = {"profiler": "cupti"}  # a GPU run's: the metrics' own floors
    path.write_text(json.dumps({"name": "maestro", "environ": environ, "metrics": metrics}))
    return path


def test_a_harness_skew_is_shown_and_decides_nothing(tmp_path, capsys):
    a, b = _metrics(tmp_path / "a.json", 2.0), _metrics(tmp_path / "b.json", 60.0)
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("A: ") and "nothing regressed or improved; " in out
    assert "1 regressed (harness)" in out  # counted, not listed
    assert cli.main(["compare", str(a), str(b), "--all"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "start_skew_us" in line]
    assert row.endswith("regressed (harness)")
    assert cli.main(["compare", str(a), str(b), "--judge-harness"]) == 1
    assert "1 regressed" in capsys.readouterr().out


def test_the_detector_ignores_harness_diagnostics_unless_asked(tmp_path):
    from userbenchmark.maestro import regression_detector

    a, b = _metrics(tmp_path / "a.json", 2.0), _metrics(tmp_path / "b.json", 60.0)
    docs = [json.loads(p.read_text()) for p in (a, b)]
    assert regression_detector.run(*docs).details == {}
    assert list(regression_detector.run(*docs, judge_harness=True).details) == [SKEW]


def _records(folder, latency):
    folder.mkdir()
    block = {
        "suite": "s", "pattern": "p", "block": "ag", "op": "all_gather", "axis": "world",
        "team_size": 2, "dtype": "bf16", "size_bytes": 4096, "iters": 20,
        "latency_avg_us": latency, "latency_min_us": 90.0, "latency_max_us": 130.0,
        "latency_p50_us": 99.0, "busbw_gbps": 2.0,
    }  # fmt: skip
    (folder / "results.json").write_text(json.dumps([block]))
    return folder / "results.json"


@pytest.mark.parametrize("nan", [None, float("nan")], ids=["null", "NaN"])
def test_nan_on_one_side_is_a_failure_not_only_in_a(tmp_path, capsys, nan):
    a, b = _records(tmp_path / "a", 100.0), _records(tmp_path / "b", nan)
    assert cli.main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "only in A" not in out
    assert "FAILED: NaN in B where A has a value: s/p/ag/latency_avg_us" in out
    assert cli.main(["compare", str(b), str(a)]) == 1
    assert "FAILED: NaN in A where B has a value: s/p/ag/latency_avg_us" in capsys.readouterr().out


def test_each_setting_difference_is_listed_once(tmp_path, capsys):
    for name, size in (("a", 4096), ("b", 8192)):
        folder = tmp_path / name
        _records(folder, 100.0)
        records = json.loads((folder / "results.json").read_text())
        records[0]["size_bytes"] = size
        (folder / "results.json").write_text(json.dumps(records))
        setting = f"op=all_gather dtype=bf16 team_size=2 size={size // 1024}K"
        (folder / "run.json").write_text(json.dumps({"block.p/ag": setting}))
    paths = [str(tmp_path / name / "results.json") for name in ("a", "b")]  # run.json beside
    assert cli.main(["compare", *paths]) == 2
    err = capsys.readouterr().err
    assert err.count("block.p/ag") == 1, err
