"""Distributed runtime: who am I (rank/world/local rank), process-group start-up, control group.

Rank and world come from torchrun's RANK/WORLD_SIZE/LOCAL_RANK first, then from SLURM's
SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (plain srun); without either the world is one rank.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .errors import RunError

log = logging.getLogger("maestro.dist")

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True, kw_only=True)
class LaunchInfo:
    """This process's place in the job, as the launcher described it."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str
    """``torchrun`` (RANK set), ``slurm`` (only SLURM_* set) or ``none``."""


def _env_int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError as exc:
        raise RunError(f"environment variable {key}={env[key]!r} is not an integer") from exc


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Rank, world size and local rank; RANK beats SLURM_PROCID (srun starting torchrun)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return LaunchInfo(
            rank=_env_int(env, "RANK"),
            world_size=_env_int(env, "WORLD_SIZE"),
            local_rank=_env_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            launcher="torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return LaunchInfo(
            rank=_env_int(env, "SLURM_PROCID"),
            world_size=_env_int(env, "SLURM_NTASKS"),
            local_rank=_env_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            launcher="slurm",
        )
    return LaunchInfo(rank=0, world_size=1, local_rank=0, launcher="none")


def resolve_backend(requested: str, cuda_available: bool) -> str:
    """``auto`` is NCCL when CUDA is available, else gloo; NCCL without CUDA is an error."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}; valid: {', '.join(BACKENDS)}")
    if requested == "auto":
        return "nccl" if cuda_available else "gloo"
    if requested == "nccl" and not cuda_available:
        raise RunError("backend nccl needs CUDA, and torch sees no GPU; use --backend gloo")
    return requested


def apply_env(values: Mapping[str, str]) -> dict[str, str | None]:
    """Set process-wide variables (before the first communicator); returns previous values.

    Only the named keys are touched: the environment is never cleared wholesale, because
    library threads may read it concurrently.
    """
    previous: dict[str, str | None] = {}
    for key, value in values.items():
        previous[key] = os.environ.get(key)
        if previous[key] is not None and previous[key] != value:
            log.warning(
                "pattern env sets %s=%s (was %s in the environment)", key, value, previous[key]
            )
        os.environ[key] = str(value)
    return previous


def free_port() -> int:
    """A TCP port on the loopback interface that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(kw_only=True)
class DistContext:
    """The initialised runtime of one rank."""

    launch: LaunchInfo
    backend: str
    device: Any
    """torch.device of this rank (cuda:LOCAL_RANK or cpu)."""
    control: Any
    """gloo group over all ranks used only by the agreement step (never timed)."""
    timeout_s: float

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def init_distributed(launch: LaunchInfo, *, backend: str, timeout_s: float) -> DistContext:
    """Initialise torch.distributed for this rank and create the gloo control group."""
    import torch
    import torch.distributed as dist

    backend = resolve_backend(backend, torch.cuda.is_available())
    if backend == "nccl":
        if launch.local_rank >= torch.cuda.device_count():
            raise RunError(
                f"local rank {launch.local_rank} has no GPU: torch sees "
                f"{torch.cuda.device_count()} device(s)",
                rank=launch.rank,
                phase="setup",
            )
        device = torch.device("cuda", launch.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        init_method = None
        if launch.world_size == 1 and "MASTER_ADDR" not in os.environ:
            init_method = f"tcp://127.0.0.1:{free_port()}"
        elif "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
            raise RunError(
                "MASTER_ADDR and MASTER_PORT must be set for a multi-rank launch "
                "without torchrun (e.g. under plain srun)",
                rank=launch.rank,
                phase="setup",
            )
        kwargs: dict[str, Any] = {
            "backend": backend,
            "timeout": timeout,
            "rank": launch.rank,
            "world_size": launch.world_size,
        }
        if init_method:
            kwargs["init_method"] = init_method
        dist.init_process_group(**kwargs)
    # The agreement step must outlast a peer's timed-out collective, so it waits longer.
    control = dist.new_group(
        backend="gloo", timeout=timedelta(seconds=agreement_timeout_s(timeout_s))
    )
    return DistContext(
        launch=launch, backend=backend, device=device, control=control, timeout_s=timeout_s
    )


def agreement_timeout_s(timeout_s: float) -> float:
    """How long the agreement step waits: longer than any communicator operation."""
    return 2.0 * timeout_s + 30.0


def shutdown_distributed() -> None:
    """Destroy every process group (safe to call when none exists)."""
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:  # teardown after a failure must not mask the real error
            log.debug("destroy_process_group failed: %s", exc)
