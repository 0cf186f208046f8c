"""What is checked before any worker starts: launcher variables, --nproc, devices, log lines."""

from __future__ import annotations

import logging

import pytest

from userbenchmark.maestro.core.runtime import rendezvous as preflight
from userbenchmark.maestro.core.runtime.rendezvous import check_rendezvous_env, detect_launch
from userbenchmark.maestro.core.runtime.supervision import configure_logging
from userbenchmark.maestro.errors import LaunchError, OptionError


# ---- launcher variables ----
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK=5 is outside the world: WORLD_SIZE=2 numbers"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 is outside the world"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, "LOCAL_RANK=-1 must be between"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "x"}, "LOCAL_RANK='x' is not an integer"),
        (
            {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
            "LOCAL_RANK=2 is outside this node: LOCAL_WORLD_SIZE=2",
        ),
        ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"}, "SLURM_PROCID='x' is not an integer"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "two"}, "SLURM_NTASKS='two' is not an integer"),
        ({"SLURM_PROCID": "2", "SLURM_NTASKS": "2"}, "SLURM_PROCID=2 is outside the world"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "0"}, "SLURM_NTASKS=0 must be at least 1"),
        (
            {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "-3"},
            "SLURM_LOCALID=-3 must be between 0 and 1",
        ),
    ],
)
def test_launch_variables_that_cannot_describe_a_run(env, message):
    with pytest.raises(LaunchError, match=message.replace("(", r"\(")):
        detect_launch(env)


def test_valid_launches_still_detected():
    info = detect_launch({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank) == (1, 2, 1)
    # RANK beats SLURM_PROCID even when the SLURM variables alone would be wrong.
    info = detect_launch({"RANK": "0", "WORLD_SIZE": "1", "SLURM_PROCID": "x"})
    assert info.launcher == "torchrun"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT are not set"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "MASTER_PORT is not set"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "p"},
            "MASTER_PORT='p' is not an integer",
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
            "MASTER_PORT=70000 is not a TCP port",
        ),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, "SLURM_NTASKS=4 ranks meet at"),
    ],
)
def test_a_multi_rank_launch_needs_a_meeting_point(env, message):
    with pytest.raises(LaunchError, match=message):
        check_rendezvous_env(detect_launch(env), env)


def test_meeting_point_not_needed_for_one_rank():
    for env in ({}, {"RANK": "0", "WORLD_SIZE": "1"}, {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}):
        check_rendezvous_env(detect_launch(env), env)
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    check_rendezvous_env(detect_launch(env), env)


# ---- --nproc ----
def test_nproc_is_bounded_by_the_cap_and_the_open_file_limit():
    preflight.check_nproc(preflight.MAX_LOCAL_WORKERS, limit=10**6)
    with pytest.raises(OptionError, match="at most 256, got 257: maestro's limit"):
        preflight.check_nproc(257, limit=10**6)
    most = (1024 - preflight.FILES_RESERVED) // preflight.FILES_PER_WORKER
    assert most < preflight.MAX_LOCAL_WORKERS
    preflight.check_nproc(most, limit=1024)
    with pytest.raises(OptionError, match=rf"at most {most}, got {most + 1}: .*may open 1024"):
        preflight.check_nproc(most + 1, limit=1024)
    with pytest.raises(OptionError, match="at most 1, got 2"):  # always room for one
        preflight.check_nproc(2, limit=10)


# ---- devices ----
@pytest.fixture
def machine(monkeypatch):
    """A fake machine: ``machine(gpus=..., cuda_build=..., cupti=(ok, why))``."""
    import torch

    from userbenchmark.maestro.core.profilers import cupti

    def make(*, gpus: int, cuda_build: bool = True, cupti_ok: tuple[bool, str] = (True, "ok")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        monkeypatch.setattr(torch.version, "cuda", "12.8" if cuda_build else None)
        monkeypatch.setattr(cupti, "cupti_available", lambda: cupti_ok)

    return make


@pytest.mark.parametrize(
    ("gpus", "cuda_build", "backend", "profiler", "message"),
    [
        (0, False, "nccl", "auto", "--backend nccl needs CUDA.*CPU build.*--backend gloo"),
        (0, True, "nccl", "auto", "--backend nccl needs CUDA, and torch sees no CUDA device;"),
        (0, False, "auto", "cupti", "--profiler cupti times CUDA work.*--profiler host"),
        (0, False, "gloo", "events", "--profiler events times CUDA work"),
        (1, True, "gloo", "cupti", "--backend gloo runs every lane on the CPU"),
        (1, True, "auto", "host", "--profiler host times CPU lanes"),
        (1, True, "nccl", "host", "--profiler host times CPU lanes"),
    ],
)
def test_backend_and_profiler_this_machine_cannot_run(
    machine, gpus, cuda_build, backend, profiler, message
):
    machine(gpus=gpus, cuda_build=cuda_build)
    with pytest.raises(OptionError, match=message):
        preflight.check_devices(backend=backend, profiler=profiler)


def test_cupti_without_a_usable_cupti_python(machine):
    machine(gpus=1, cupti_ok=(False, "cupti-python is not installed (torch uses CUDA 12.8)"))
    with pytest.raises(OptionError, match="--profiler cupti cannot run: cupti-python is not"):
        preflight.check_devices(backend="auto", profiler="cupti")
    preflight.check_devices(backend="auto", profiler="auto")  # auto falls back to events
    preflight.check_devices(backend="nccl", profiler="events")


def test_one_gpu_per_local_worker_on_nccl(machine, monkeypatch):
    monkeypatch.delenv(preflight.SHARED_GPU_VARIABLE, raising=False)
    machine(gpus=2)
    preflight.check_devices(backend="auto", profiler="auto", local_workers=2)
    with pytest.raises(OptionError, match="--nproc 3 on the nccl backend needs one GPU per"):
        preflight.check_devices(backend="auto", profiler="auto", local_workers=3)
    preflight.check_devices(backend="gloo", profiler="host", local_workers=3)
    # NCCL's multi-rank-per-GPU mode (a correctness test) is the user's explicit choice.
    monkeypatch.setenv(preflight.SHARED_GPU_VARIABLE, "1")
    preflight.check_devices(backend="auto", profiler="auto", local_workers=3)


def test_what_runs_here_passes(machine):
    machine(gpus=0, cuda_build=False)
    for backend in ("auto", "gloo"):
        for profiler in ("auto", "host"):
            preflight.check_devices(backend=backend, profiler=profiler, local_workers=4)
    machine(gpus=1)
    for profiler in ("auto", "cupti", "events"):
        preflight.check_devices(backend="auto", profiler=profiler)


# ---- log lines: a rank inside a run, none outside ----
@pytest.fixture
def maestro_logger():
    logger = logging.getLogger("maestro")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


def test_log_lines_outside_a_run_have_no_rank(maestro_logger, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "3")
    configure_logging("INFO", ranked=False)  # binds the stderr pytest captures
    logging.getLogger("maestro.config").warning("per-axis env %s", "ignored")
    assert capsys.readouterr().err == "maestro: warning: per-axis env ignored\n"


def test_log_lines_inside_a_run_carry_the_rank(maestro_logger, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "3")
    configure_logging("INFO")
    logging.getLogger("maestro.pattern").warning("slow")
    assert capsys.readouterr().err == "maestro r3: warning: slow\n"


def test_log_lines_escape_what_a_terminal_would_act_on(maestro_logger, capsys):
    configure_logging("INFO", ranked=False)
    logging.getLogger("maestro.config").warning("%s: custom op", "a\x1b[2J\nfile is valid")
    err = capsys.readouterr().err
    assert err == "maestro: warning: a\\x1b[2J\\nfile is valid: custom op\n", err


# ---- every rank runs rank 0's pattern text and options ----
def _check_two_ranks(shared0: dict, shared1: dict) -> list[BaseException | None]:
    """check_launch on ranks 0 and 1 at once over one store; each rank's error (or None)."""
    import threading

    import torch.distributed as dist

    from userbenchmark.maestro.core.runtime.rendezvous import LaunchInfo, check_launch

    store = dist.HashStore()
    errors: list[BaseException | None] = [None, None]

    def rank(r: int, shared: dict) -> None:
        launch = LaunchInfo(rank=r, world_size=2, local_rank=r, launcher="torchrun")
        try:
            check_launch(store, launch, 10.0, shared=shared, source="/nodes/pattern.yaml")
        except BaseException as exc:  # handed to the test
            errors[r] = exc

    threads = [threading.Thread(target=rank, args=(r, s)) for r, s in enumerate((shared0, shared1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors


def test_ranks_with_different_pattern_texts_fail_on_both_sides_naming_both_digests():
    from userbenchmark.maestro.errors import ConfigError

    a, b = "a" * 64, "b" * 64
    errors = _check_two_ranks({"pattern_sha256": a}, {"pattern_sha256": b})
    for err in errors:
        assert isinstance(err, ConfigError), errors
        assert str(err) == (
            "/nodes/pattern.yaml: rank 1 runs a different pattern text than rank 0: sha256 "
            f"{b[:16]} on rank 1, {a[:16]} on rank 0; every rank must run the same pattern "
            "(the same file on every node, unchanged until the run starts)"
        )


def test_ranks_with_different_options_fail_naming_the_option():
    from userbenchmark.maestro.errors import OptionError

    errors = _check_two_ranks(
        {"options": {"iters": 5, "seed": 0}}, {"options": {"iters": 7, "seed": 0}}
    )
    for err in errors:
        assert isinstance(err, OptionError), errors
        assert "rank 1 was started with other options than rank 0: iters=7 on rank 1, " in str(err)
        assert "iters=5 on rank 0; start every rank with the same command line" in str(err)


def test_ranks_that_agree_pass():
    shared = {"pattern_sha256": "c" * 64, "options": {"iters": 5}}
    assert _check_two_ranks(shared, dict(shared)) == [None, None]


def test_the_registry_names_every_profiler_and_auto_falls_back_with_a_warning(machine, caplog):
    from userbenchmark.maestro.core.profilers import profiler_registry as registry

    assert registry.profiler_names() == ("auto", "cupti", "events", "host")
    machine(gpus=1, cupti_ok=(False, "cupti-python is not installed"))
    profiler = registry.make_profiler("auto", on_cuda=True, backend="nccl", warn=True)
    assert profiler.name == "events"
    assert "cupti cannot run (cupti-python is not installed); timing with CUDA events" in (
        caplog.text
    )
    assert registry.make_profiler("auto", on_cuda=False, backend="gloo").name == "host"
