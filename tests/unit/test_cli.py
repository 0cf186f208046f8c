"""The command line in-process: commands, help, usage errors, option errors, TorchBench's run()."""

from __future__ import annotations

import os
import sys
import uuid

import click
import pytest

from userbenchmark.maestro import cli
from userbenchmark.maestro.core.config import loader
from userbenchmark.maestro.errors import ConfigError
from userbenchmark.maestro.run import run

COMMANDS = {
    "run": cli.run_command,
    "validate": cli.validate_command,
    "compare": cli.compare_command,
    "abtest": cli.abtest_command,
    "list-blocks": cli.list_blocks_command,
}


pytestmark = pytest.mark.usefixtures("cli_here")  # tests/conftest.py


def _opts(command: click.Command) -> list[str]:
    return [opt for p in command.params if isinstance(p, click.Option) for opt in p.opts]


# ---- surface ----
def test_group_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Usage: python -m userbenchmark.maestro" in out
    for name in COMMANDS:
        assert name in out
    assert "130" in out  # the exit statuses are documented


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_of_each_command_lists_its_options(name, capsys):
    assert cli.main([name, "--help"]) == 0
    out = capsys.readouterr().out
    for opt in _opts(COMMANDS[name]):
        assert opt in out, opt
    assert "-h, --help" in out


def test_run_keeps_todays_options_and_defaults():
    expected = {
        "-c": "quickstart",
        "--config": "quickstart",
        "--nproc": None,
        "--output-dir": None,
        "--metrics-dir": None,
        "--no-metrics": False,
        "--backend": "auto",
        "--profiler": "auto",
        "--iters": None,
        "--warmup-iters": None,
        "--check": False,
        "--no-baseline": False,
        "--pattern": (),
        "--precision": 2,
        "--seed": 0,
        "--trace": False,
        "--plot": False,
        "--max-size": None,
        "--log-level": "INFO",
    }
    params = {opt: p for p in cli.run_command.params for opt in p.opts}
    assert set(expected) <= set(params)
    ctx = cli.run_command.make_context("run", [])
    for opt, default in expected.items():
        assert ctx.params[params[opt].name] == default, opt
    options = cli._options_of(ctx.params)
    # Flags not given leave the pattern file's settings alone.
    assert options.check is None and options.baseline is None
    given = cli._options_of(
        cli.run_command.make_context(
            "run", ["--check", "--no-baseline", "--pattern", "a*", "--pattern", "b"]
        ).params
    )
    assert given.check is True and given.baseline is False
    assert given.patterns == ("a*", "b")


def test_validate_and_compare_options():
    assert {"--world-size", "--no-import"} <= set(_opts(cli.validate_command))
    assert "--threshold" in _opts(cli.compare_command)


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["run", "--bogus"], ["--bogus"]),
        (["run", "--nproc", "two"], ["--nproc", "two"]),
        (["run", "--backend", "mpi"], ["--backend", "mpi"]),
        (["run", "--max-size", "64X"], ["--max-size", "64X"]),
        (["run", "--repeat", "0"], ["--repeat", "0"]),
        (["validate"], ["CONFIG"]),
        (["compare", "a.json"], ["B"]),
        (["no-such-command"], ["no-such-command"]),
        ([], []),
    ],
)
def test_usage_errors_exit_2_with_clicks_message(argv, fragments, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    # click words the message (and rewords it between releases): the test holds it only to
    # what maestro controls, the program's name in the usage and the offending name or value
    # on the message's last line.
    assert "python -m userbenchmark.maestro" in err and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    for fragment in fragments:
        assert fragment in last, (fragment, err)


# ---- launcher variables ----
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK=5 is outside the world"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
        ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "-1"}, "LOCAL_RANK=-1 must be between"),
        ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "one"}, "LOCAL_RANK='one' is not an"),
        ({"SLURM_PROCID": "abc", "SLURM_NTASKS": "2"}, "SLURM_PROCID='abc' is not an integer"),
        ({"SLURM_PROCID": "3", "SLURM_NTASKS": "2"}, "SLURM_PROCID=3 is outside the world"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "0"}, "SLURM_NTASKS=0 must be at least 1"),
        (
            {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "-2"},
            "SLURM_LOCALID=-2 must be between",
        ),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "WORLD_SIZE=2 ranks meet at MASTER_ADDR:MASTER_PORT"),
        (
            {"GLOO_SOCKET_IFNAME": "nonexistent0"},
            "GLOO_SOCKET_IFNAME=nonexistent0 names no network interface of this machine",
        ),
    ],
)
def test_invalid_launch_variables_exit_2_before_any_worker(env, message, monkeypatch, capsys):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["run", "-c", "quickstart", "--no-metrics"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("maestro: invalid launch environment: ") and err.count("\n") == 1
    assert message in err, err


# ---- option errors: labelled as options, one line, exit status 2 ----
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nproc", "0"], "--nproc must be at least 1, got 0"),
        (["--iters", "0"], "--iters must be between 1 and 1000000, got 0"),
        (["--iters", "1000001"], "--iters must be between 1 and 1000000, got 1000001"),
        (["--warmup-iters", "-1"], "--warmup-iters must be between 0 and 1000000, got -1"),
        (["--seed", "18446744073709551616"], "--seed must be between 0 and 4294967295, got"),
        (["--seed", "-1"], "--seed must be between 0 and 4294967295, got -1"),
        (["--output-dir", ""], "--output-dir is empty: give a folder"),
        (["--metrics-dir", " "], "--metrics-dir is empty: give a folder"),
        (["--precision", "10"], "--precision must be between 0 and 9, got 10"),
        (["--precision", "-1"], "--precision must be between 0 and 9, got -1"),
        (["--trace"], "--trace writes into --output-dir: give --output-dir DIR"),
        (["--plot"], "--plot writes into --output-dir: give --output-dir DIR"),
        (["--nproc", "100000"], "--nproc must be at most"),
        (["--pattern", "no_such_*"], "--pattern no_such_* matches no pattern; patterns: "),
    ],
)
def test_option_errors_are_labelled_as_options(argv, message, capsys):
    assert cli.main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"maestro: invalid option: {message}"), err
    assert err.count("\n") == 1 and "invalid configuration" not in err


def test_plot_without_matplotlib_is_an_option_error(monkeypatch, tmp_path, capsys):
    from userbenchmark.maestro.core.output import writer as plot

    monkeypatch.setattr(plot, "matplotlib_available", lambda: False)
    assert cli.main(["run", "--plot", "--output-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"maestro: invalid option: {plot.MISSING_MATPLOTLIB}\n"


def test_repeat_and_abtest_refuse_a_launcher_and_abtest_what_it_sets(monkeypatch, tmp_path, capsys):
    out = ["--output-dir", str(tmp_path / "out")]
    me = ["--a", sys.executable, "--b", sys.executable]
    assert cli.main(["abtest", "quickstart", *me, *out, "--iters", "5", "-c", "x"]) == 2
    assert "abtest sets -c itself; leave it out" in capsys.readouterr().err
    assert cli.main(["abtest", "quickstart", *me, *out, "--metrics-dir=m"]) == 2
    assert "abtest sets --metrics-dir=m itself" in capsys.readouterr().err
    assert cli.main(["abtest", "quickstart", "--a", "no-such-python", "--b", "python3", *out]) == 2
    assert "--a no-such-python: no such interpreter" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cli.main(["run", "--repeat", "2", "--no-metrics"]) == 2
    assert "--repeat starts fresh processes itself" in capsys.readouterr().err
    assert cli.main(["abtest", "quickstart", *me, *out]) == 2
    assert "abtest starts its own processes" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_nproc_conflicting_with_the_launcher_is_an_option_error(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cli.main(["run", "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("maestro: invalid option: --nproc 2 conflicts with the launcher's")


def test_pattern_file_errors_stay_configuration_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\npatterns: 3\n")
    assert cli.main(["run", "-c", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("maestro: invalid configuration:\n") and str(bad) in err
    assert cli.main(["validate", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("maestro: invalid configuration:\n")


def test_validate_world_size_must_be_positive(capsys):
    assert cli.main(["validate", "quickstart", "--world-size", "0"]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--world-size': 0 is not in the range x>=1." in err


# ---- validate passes --no-import to the loader; run validates once, with the world size ----
def _recording_loader(calls: list[dict], *, fail: bool = False):
    real = loader.load_suite

    def load_suite(source, *, world_size=None, import_ops=True):
        calls.append({"world_size": world_size, "import_ops": import_ops})
        if fail:
            raise ConfigError("stop here", file=str(source))
        return real(source, world_size=world_size, import_ops=import_ops)

    return load_suite


MARKING_MODULE = """
import pathlib
pathlib.Path(__file__).with_name("imported.marker").write_text("imported")
from userbenchmark.maestro.blocks.compute import Gemm
class Mine(Gemm):
    \"\"\"A user's GEMM whose module leaves a mark when it is imported.\"\"\"
"""


def test_validate_no_import_imports_nothing_and_validate_says_it_imports(
    tmp_path, monkeypatch, capsys
):
    from userbenchmark.maestro.core.config import blocks

    module = f"marking_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(MARKING_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(blocks, "_ANNOUNCED", set())
    config = tmp_path / "custom.yaml"
    config.write_text(
        "name: c\nworld_size: 1\npatterns:\n  - name: p\n    blocks:\n"
        f"      - {{name: a, op: '{module}:Mine', m: 64, n: 64, k: 64}}\n"
    )
    assert cli.main(["validate", str(config), "--no-import"]) == 0
    captured = capsys.readouterr()
    assert not (tmp_path / "imported.marker").exists() and module not in sys.modules
    assert "custom ops not imported, not counted" in captured.out
    assert "trusted code" not in captured.err
    for _ in range(2):  # said once per process
        assert cli.main(["validate", str(config)]) == 0
    captured = capsys.readouterr()
    assert (tmp_path / "imported.marker").exists()
    assert captured.err.count(f"importing module '{module}' runs its code") == 1, captured.err
    assert "48 KiB" in captured.out  # its buffers counted once imported


def test_run_validates_the_file_once_with_the_runs_world_size(monkeypatch, capsys):
    from userbenchmark.maestro.core.runtime import rendezvous as preflight

    calls: list[dict] = []
    monkeypatch.setattr(preflight, "load_suite", _recording_loader(calls, fail=True))
    assert cli.main(["run", "--nproc", "3", "--backend", "gloo"]) == 2
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cli.main(["run"]) == 2
    assert calls == [{"world_size": 3, "import_ops": True}, {"world_size": 1, "import_ops": True}]
    assert capsys.readouterr().err.count("maestro: invalid configuration:") == 2


def test_graph_on_the_cpu_is_an_option_error_and_graph_in_the_file_a_config_error(
    monkeypatch, tmp_path, capsys
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["run", "--graph", "--no-metrics"]) == 2
    assert capsys.readouterr().err == (
        "maestro: invalid option: --graph: CUDA graphs need CUDA, and this run uses the gloo "
        "backend on the CPU; drop --graph or run on GPUs\n"
    )
    config = tmp_path / "g.yaml"
    config.write_text(
        "name: g\nworld_size: 1\npatterns:\n  - name: captured\n    graph: true\n"
        "    blocks: [{name: s, op: sleep, duration_us: 1}]\n"
    )
    assert cli.main(["run", "-c", str(config), "--no-metrics"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("maestro: invalid configuration:\n") and "patterns[0]" in err
    assert "patterns captured: graph: true, and CUDA graphs need CUDA" in err


# ---- TorchBench's run(args) ----
def test_torchbench_run_uses_the_run_options_without_clicks_exit(capsys):
    assert run(["--help"]) is None  # status 0: no SystemExit, not even SystemExit(0)
    out = capsys.readouterr().out
    assert "run_benchmark.py maestro" in out.splitlines()[0]  # the usage names TorchBench's command
    for opt in _opts(cli.run_command):
        assert opt in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "--bogus"),
        (["--nproc", "0"], "maestro: invalid option: --nproc must be at least 1, got 0"),
    ],
)
def test_torchbench_run_raises_systemexit_with_the_status(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        run(args)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_interrupt_in_a_command_is_status_130_and_one_line(monkeypatch, capsys):
    def interrupted(params):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_run", interrupted)
    assert cli.main(["run"]) == 130
    assert capsys.readouterr().err == "maestro: interrupted\n"


# ---- refused before any worker starts (``run --nproc 2`` would start two) ----
@pytest.mark.parametrize(
    ("option", "where", "message"),
    [
        ("--output-dir", "a_file", "is a file, expected a directory"),
        ("--metrics-dir", "a_file", "is a file, expected a directory"),
        ("--metrics-dir", "/proc/maestro", "is under /proc or /sys"),
        ("--output-dir", "a_file/below", "cannot be created"),
    ],
)
def test_unusable_output_locations_are_option_errors(tmp_path, option, where, message, capsys):
    (tmp_path / "a_file").write_text("not a folder")
    path = where if where.startswith("/") else str(tmp_path / where)
    assert cli.main(["run", "--nproc", "2", option, path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"maestro: invalid option: {option} {path}: {message}"), err
    assert err.count("\n") == 1


def test_an_output_dir_another_run_writes_to_is_an_option_error(tmp_path, capsys):
    from userbenchmark.maestro.core.output.locations import prepare_output_locations

    with prepare_output_locations(tmp_path, None):
        assert cli.main(["run", "--nproc", "2", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("maestro: invalid option: ") and err.count("\n") == 1, err
    assert f"another maestro run is writing to {tmp_path} (pid {os.getpid()})" in err


def test_a_bad_pattern_file_is_one_configuration_error_before_any_worker(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(
        "name: bad\npatterns:\n  - name: p\n    blocks:\n"
        "      - {name: a, op: all_reduce, size: -4M}\n"
    )
    assert cli.main(["run", "-c", str(config), "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert "patterns[0].blocks[0].size" in err and err.count("invalid configuration") == 1


GRAPHS = """
name: graphs
world_size: 2
defaults: {warmup_iters: 1, iters: 3}
patterns:
  - name: eager
    blocks:
      - {name: ar, op: all_reduce, size: 4K}
  - name: captured
    graph: true
    blocks:
      - {name: ar, op: all_reduce, size: 4K}
"""


def test_cuda_graphs_on_gloo_are_refused_before_any_worker(tmp_path, capsys):
    # In the file (pattern 'captured') and on the command line (--graph) alike.
    config = tmp_path / "graphs.yaml"
    config.write_text(GRAPHS)
    assert cli.main(["run", "-c", str(config), "--nproc", "2", "--backend", "gloo"]) == 2
    err = capsys.readouterr().err
    assert "captured" in err and "CUDA graphs" in err and "gloo" in err, err
    config.write_text(GRAPHS.split("  - name: captured")[0])
    argv = ["run", "-c", str(config), "--nproc", "2", "--graph", "--backend", "gloo"]
    assert cli.main(argv) == 2
    assert "CUDA graphs" in capsys.readouterr().err


# ---- validate NAME: the world sizes a shipped file's header lists ----
@pytest.mark.parametrize("name", loader.shipped_configs())
def test_validate_works_on_every_shipped_config_without_a_world_size(name, capsys):
    assert cli.main(["validate", name]) == 0, capsys.readouterr().err
    sizes = loader.listed_world_sizes(name)
    out = capsys.readouterr().out
    assert sizes and f"\nworld size {sizes[0]}," in out
    if len(sizes) > 1:
        listed = ", ".join(map(str, sizes[1:]))
        assert out.endswith(f"also valid at the other world sizes its header lists: {listed}\n")


def test_validate_names_the_listed_world_size_a_file_fails_at(tmp_path, capsys):
    config = tmp_path / "listed.yaml"
    config.write_text(
        "# World size: 2 (also runs at: 4, 3; 4K must split evenly)\n\nname: listed\npatterns:\n"
        "  - name: p\n    blocks:\n      - {name: ag, op: all_gather, size: 4K}\n"
    )
    assert loader.listed_world_sizes(config) == (2, 4, 3)
    assert cli.main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "maestro: invalid configuration at world size 3, which the file's header lists:\n"
    ), err
    config.write_text(config.read_text().replace("# World", "# Any world"))
    assert cli.main(["validate", str(config)]) == 2  # no listed size: as before
    assert "the world size is unknown" in capsys.readouterr().err


# ---- a file too large for the CPU says so before anything starts ----
def test_a_run_too_large_for_the_cpu_says_so_before_it_starts_and_names_max_size(
    monkeypatch, tmp_path, capsys
):
    import torch

    from userbenchmark.maestro.core.config.summary import large_for_cpu
    from userbenchmark.maestro.core.runtime import launcher

    assert large_for_cpu(loader.load_suite("quickstart", world_size=2)) == ""
    said = large_for_cpu(loader.load_suite("fsdp", world_size=2))
    assert "backward (3.77 GiB of buffers, 244 TFLOP of GEMM work)" in said, said
    started = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(launcher, "launch_local", lambda *args: started.append(capsys.readouterr()))
    argv = ["run", "-c", "fsdp", "--nproc", "2", "--metrics-dir", str(tmp_path)]
    cli.main(argv)
    assert started and started[0].err.count("--max-size 64K runs every pattern") == 1
    cli.main([*argv, "--max-size", "64K"])
    assert "large for a CPU run" not in started[1].err


def test_list_blocks_shows_each_ops_whole_first_paragraph(capsys):
    assert cli.main(["list-blocks"]) == 0
    out = capsys.readouterr().out
    assert (
        "busy (compute): Memory-bound compute occupying the GPU as an elementwise kernel does "
        "(every SM, HBM): `c = a + b`, repeated and sized by calibration so the block takes "
        "`duration_us` alone; on CPU the same add in a loop until `duration_us`.\n"
    ) in out
