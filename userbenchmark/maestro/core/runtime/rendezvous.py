"""Start-up: this process's place (torchrun's RANK..., else srun's SLURM_PROCID..., else one
rank), the checks made before any worker starts (options, this machine, the one validation of
the pattern file), the rendezvous store and its checks, the default process group."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from functools import partial
from typing import Any

from ...errors import (
    EXIT_FAILED,
    ConfigError,
    LaunchError,
    MaestroError,
    OptionError,
    RunError,
    cause_of,
    say,
)
from ..config.loader import load_suite
from ..config.options import RunOptions, apply_overrides, check_graphs
from ..config.spec import SuiteSpec
from ..config.summary import large_for_cpu
from ..measure.rig import RankPlace
from ..profilers.profiler_registry import no_gpu, resolve_profiler
from . import supervision
from .agreement import StoreExchange, group_timeout, wait_for_keys, watch_ended

log = logging.getLogger("maestro.dist")


@dataclass(frozen=True, kw_only=True)
class LaunchInfo:
    """This process's place in the job, as the launcher described it."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str  # torchrun (RANK set), slurm (only SLURM_* set) or none


_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
_SLURM_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
_WHO = {"torchrun": "torchrun (or a launcher like it)", "slurm": "srun"}


def _launch_int(env: Mapping[str, str], key: str, launcher: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise LaunchError(
            f"{key}={env[key]!r} is not an integer; {_WHO[launcher]} sets it to a whole number "
            "(unset it to run without a launcher)"
        ) from None


def _launch_info(env: Mapping[str, str], launcher: str) -> LaunchInfo:
    rank_key, world_key, local_key = _TORCHRUN_VARS if launcher == "torchrun" else _SLURM_VARS
    rank = _launch_int(env, rank_key, launcher)
    world = _launch_int(env, world_key, launcher)
    local = _launch_int(env, local_key, launcher) if local_key in env else 0
    if world < 1:
        raise LaunchError(f"{world_key}={world} must be at least 1 (the number of ranks)")
    if not 0 <= rank < world:
        raise LaunchError(
            f"{rank_key}={rank} is outside the world: {world_key}={world} numbers the ranks "
            f"0 to {world - 1}"
        )
    if not 0 <= local < world:
        raise LaunchError(
            f"{local_key}={local} must be between 0 and {world - 1}: it numbers this rank on "
            f"its node, and the world has {world} rank(s)"
        )
    if "LOCAL_WORLD_SIZE" in env and launcher == "torchrun":
        local_world = _launch_int(env, "LOCAL_WORLD_SIZE", launcher)
        if not 0 <= local < local_world:
            raise LaunchError(
                f"{local_key}={local} is outside this node: LOCAL_WORLD_SIZE={local_world} "
                f"numbers the local ranks 0 to {local_world - 1}"
            )
    return LaunchInfo(rank=rank, world_size=world, local_rank=local, launcher=launcher)


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Rank, world size and local rank; RANK beats SLURM_PROCID (srun starting torchrun).
    LaunchError when the variables cannot describe a run."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return _launch_info(env, "torchrun")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return _launch_info(env, "slurm")
    return LaunchInfo(rank=0, world_size=1, local_rank=0, launcher="none")


def check_rendezvous_env(launch: LaunchInfo, env: Mapping[str, str] | None = None) -> None:
    """LaunchError unless a multi-rank launch names where its ranks meet (MASTER_ADDR and
    MASTER_PORT) and GLOO_SOCKET_IFNAME names interfaces this machine has."""
    env = os.environ if env is None else env
    _check_interfaces(env)
    if launch.launcher == "none" or launch.world_size == 1:
        return
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    world_key = "WORLD_SIZE" if launch.launcher == "torchrun" else "SLURM_NTASKS"
    if missing:
        raise LaunchError(
            f"{world_key}={launch.world_size} ranks meet at MASTER_ADDR:MASTER_PORT, and "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; torchrun "
            "sets both, under plain srun export them (docs/multinode.md)"
        )
    port = _launch_int(env, "MASTER_PORT", launch.launcher)
    if not 1 <= port <= 65535:
        raise LaunchError(f"MASTER_PORT={port} is not a TCP port (1 to 65535)")


def _check_interfaces(env: Mapping[str, str]) -> None:
    names = [n for n in env.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
    if not names or not hasattr(socket, "if_nameindex"):
        return
    known = [name for _, name in socket.if_nameindex()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise LaunchError(
            f"GLOO_SOCKET_IFNAME={env['GLOO_SOCKET_IFNAME']} names no network interface of "
            f"this machine ({', '.join(unknown)}; it has {', '.join(known) or 'none'}): unset "
            "it, or name one of those"
        )


SHARED_GPU_VARIABLE = "NCCL_MULTI_RANK_GPU_ENABLE"

MAX_LOCAL_WORKERS = 256  # most --nproc workers on one machine; more come from torchrun or srun
FILES_PER_WORKER = 8  # open files the local launcher holds per worker (about five measured)
FILES_RESERVED = 64  # open files the launcher needs for itself (Python, torch, the store)


def check_nproc(nproc: int, *, limit: int | None = None) -> None:
    """OptionError when ``--nproc`` is more workers than this machine can start: maestro's
    limit, or what the open-file limit (``limit``, default ``ulimit -n``) leaves."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if limit is None else limit
    by_files = max(1, (soft - FILES_RESERVED) // FILES_PER_WORKER)
    most, why = (
        MAX_LOCAL_WORKERS,
        "maestro's limit for one machine; start more ranks with torchrun or srun across machines",
    )
    if soft != resource.RLIM_INFINITY and soft >= 0 and by_files < MAX_LOCAL_WORKERS:
        most = by_files
        why = (
            f"the launcher holds about {FILES_PER_WORKER} open files per worker and may open "
            f"{soft} (ulimit -n); raise the limit or start fewer workers"
        )
    if nproc > most:
        raise OptionError(f"--nproc must be at most {most}, got {nproc}: {why}")


def resolve_backend(requested: str, cuda_available: bool) -> str:
    """``auto`` is NCCL when CUDA is available, else gloo; NCCL without CUDA is an OptionError."""
    if requested == "nccl" and not cuda_available:
        raise OptionError(
            f"--backend nccl needs CUDA, and {no_gpu()}; use --backend gloo (or auto, which "
            "picks gloo without CUDA)"
        )
    if requested == "auto":
        return "nccl" if cuda_available else "gloo"
    return requested


def check_devices(*, backend: str, profiler: str, local_workers: int = 1) -> str:
    """The backend ``--backend`` resolves to here; OptionError when it or ``--profiler`` cannot
    run on this machine, where ``local_workers`` ranks share its GPUs (``--nproc``)."""
    import torch

    resolved = resolve_backend(backend, torch.cuda.is_available())
    on_cuda = resolved == "nccl"
    resolve_profiler(profiler, on_cuda=on_cuda, backend=backend)
    if on_cuda and local_workers > 1 and os.environ.get(SHARED_GPU_VARIABLE) != "1":
        gpus = torch.cuda.device_count()
        if local_workers > gpus:
            raise OptionError(
                f"--nproc {local_workers} on the nccl backend needs one GPU per worker, and "
                f"torch sees {gpus}; use --nproc {gpus} or fewer, or --backend gloo (or set "
                f"{SHARED_GPU_VARIABLE}=1, NCCL >= 2.30.7, to let ranks share GPUs in a "
                "correctness test whose timings describe nothing real)"
            )
    return resolved


def prepare_suite(
    config: str, options: RunOptions, *, world_size: int, local_workers: int = 1, sink: Any
) -> SuiteSpec:
    """Everything checked before any worker starts: ``--nproc``, backend and profiler here, what
    the ``sink`` (a phases.SinkFactory) cannot write here, then the pattern file ``config``,
    validated once with the options applied (ConfigError, OptionError)."""
    if local_workers > 1:
        check_nproc(local_workers)
    backend = check_devices(
        backend=options.backend, profiler=options.profiler, local_workers=local_workers
    )
    sink.check(options)
    suite = load_suite(config, world_size=world_size)
    try:
        suite = apply_overrides(suite, options)
    except ConfigError as err:  # the file is fine: the option does not fit it
        raise OptionError(
            "; ".join(_placed(i.message, i.file, i.path) for i in err.issues)
        ) from None
    check_graphs(suite, options, backend)
    large = large_for_cpu(suite) if backend == "gloo" else ""
    if large:  # said before anything starts
        logging.getLogger("maestro.config").warning("%s", large)
    return suite


def _placed(message: str, file: str, path: str) -> str:
    where = ": ".join(part for part in (file, path) if part)
    return f"{message} ({where})" if where else message


def apply_env(values: Mapping[str, str]) -> None:
    """Set process-wide variables (before the first communicator), only the named keys: library
    threads may read the environment concurrently."""
    for key, value in values.items():
        was = os.environ.get(key)
        if was is not None and was != value:
            log.warning("pattern env sets %s=%s (was %s in the environment)", key, value, was)
        os.environ[key] = str(value)


def free_port() -> int:
    """A TCP port on the loopback interface that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(kw_only=True)
class DistContext(RankPlace):
    """One rank once distributed is initialised: its place, and the store's side of the shell."""

    agreement: StoreExchange
    ended_watch: threading.Event | None = None  # set: the ended watch stops
    hosts_store: bool = False  # the rendezvous store lives (and ends) with this process


def gpu_index(local_rank: int, device_count: int) -> int:
    """The GPU of a local rank: its own, or ``local_rank % device_count`` when ranks may share
    GPUs (``NCCL_MULTI_RANK_GPU_ENABLE=1``, NCCL >= 2.30.7: correctness only). NCCL is chosen
    only where CUDA is available (:func:`resolve_backend`): torch sees a GPU."""
    if local_rank < device_count:
        return local_rank
    if os.environ.get(SHARED_GPU_VARIABLE) == "1":
        return local_rank % device_count
    raise RunError(
        f"local rank {local_rank} has no GPU of its own: torch sees {device_count} device(s); "
        f"start at most {device_count} rank(s) per host, or set {SHARED_GPU_VARIABLE}=1 "
        "(NCCL >= 2.30.7) to let ranks share GPUs for correctness tests (their timings then "
        "describe nothing real)",
        phase="start-up",
    )


def init_distributed(
    launch: LaunchInfo,
    *,
    backend: str,
    timeout_s: float,
    shared: Mapping[str, Any] | None = None,
    source: str = "",
) -> DistContext:
    """Initialise torch.distributed for this rank: the rendezvous store, :func:`check_launch`,
    the default process group, every rank's host and device. Each step waits at most
    ``timeout_s``; any failure of torch's is a RunError of the phase ``start-up``."""
    import torch
    import torch.distributed as dist

    backend = resolve_backend(backend, torch.cuda.is_available())
    if backend == "nccl":
        # On a collective's timeout torch's watchdog aborts the communicator but leaves the
        # process alive to reach the agreement step (3, its default, kills it with a C++ stack).
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        device = torch.device("cuda", gpu_index(launch.local_rank, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = group_timeout(backend, timeout_s)  # NCCL's: after maestro's deadline and agreement
    exchange = StoreExchange(
        store=None, world_size=launch.world_size, timeout_s=timeout_s, owner=store_owner(launch)
    )
    try:
        with exchange.waiting(timeout_s, launch.rank):
            store = rendezvous_store(launch, timeout_s)
            launch_store = dist.PrefixStore("maestro/launch/", store)
            check_launch(launch_store, launch, timeout_s, shared=shared, source=source)
        with exchange.waiting(timeout_s, launch.rank):
            dist.init_process_group(
                backend=backend,
                store=store,
                rank=launch.rank,
                world_size=launch.world_size,
                timeout=timeout,
            )
        exchange.store = dist.PrefixStore("maestro/", store)
        me = (socket.gethostname(), device.index if device.type == "cuda" else -1)
        with exchange.waiting(timeout_s, launch.rank):
            places = _everyones(exchange.store, "places", launch, me, timeout_s)
    except MaestroError:
        raise
    except Exception as exc:  # torch's own start-up: a bad interface, a refused connection
        raise RunError(cause_of(exc) + _hint(), phase="start-up") from exc
    ended_watch = None
    if launch.world_size > 1:
        ended_watch = watch_ended(
            partial(_store_client, store.host, store.port, timeout_s),
            rank=launch.rank,
            leave=partial(_leave_ended, launch.rank),
        )
    return DistContext(
        rank=launch.rank,
        world_size=launch.world_size,
        hosts=tuple(h for h, _ in places),
        devices=tuple(d for _, d in places),
        backend=backend,
        device=device,
        agreement=exchange,
        ended_watch=ended_watch,
        hosts_store=store_hosted_here(launch),
    )


def _hint() -> str:
    names = [k for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if os.environ.get(k)]
    shown = ", ".join(f"{k}={os.environ[k]}" for k in names)
    return f" (with {shown})" if shown else ""


def _everyones(store: Any, key: str, launch: LaunchInfo, mine: Any, timeout_s: float) -> list:
    store.set(f"{key}/{launch.rank}", json.dumps(mine))
    keys = [f"{key}/{r}" for r in range(launch.world_size)]
    if not wait_for_keys(store, keys, timeout_s):
        late = [r for r, k in enumerate(keys) if not store.check([k])]
        raise RunError(
            f"rank {', '.join(map(str, late))} stopped answering during start-up (nothing "
            f"within timeout_s {timeout_s:g} s)",
            phase="start-up",
            missing=tuple(late),
        )
    return [json.loads(store.get(k)) for k in keys]


def store_owner(launch: LaunchInfo) -> str:
    """Who hosts the rendezvous store, for a message saying it stopped answering."""
    where = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '?')}"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return f"rank 0 at {where}"
    if supervision.attached():
        return f"maestro's launcher (pid {os.getppid()}) at {where}"
    return f"torchrun's agent at {where}"


def _store_client(host: str, port: int, timeout_s: float) -> Any:
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    client = dist.TCPStore(host, port, None, False, timeout, wait_for_workers=False)
    return dist.PrefixStore("maestro/", client)


def _leave_ended(rank: int, verdict: str) -> None:
    say(
        f"maestro: rank {rank}: the other ranks ended the run without this rank, which "
        f"never reached their agreement step ({verdict}); exiting"
    )
    supervision.hard_exit(EXIT_FAILED, rank)  # the main thread is stuck in a block


def store_hosted_here(launch: LaunchInfo) -> bool:
    """Whether this rank hosts the rendezvous store: rank 0, unless a launcher's agent does."""
    return launch.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"


def rendezvous_store(launch: LaunchInfo, timeout_s: float) -> Any:
    """The TCP store every rank meets at (rank 0 hosts it unless torchrun's agent does)."""
    import torch.distributed as dist

    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    else:  # one rank: check_rendezvous_env (the CLI) requires both for more
        host, port = "127.0.0.1", free_port()
    try:
        return dist.TCPStore(
            host,
            port,
            None,  # world size unknown on purpose: check_launch compares what ranks were told
            is_master=store_hosted_here(launch),
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            multi_tenant=True,
        )
    except Exception as exc:
        raise RunError(
            f"could not reach the rendezvous store at {host}:{port} within {timeout_s:g} s "
            f"({type(exc).__name__}: {exc}); is rank 0 running, and are MASTER_ADDR and "
            "MASTER_PORT the same on every rank?",
            phase="start-up",
        ) from exc


def check_launch(
    store: Any,
    launch: LaunchInfo,
    timeout_s: float,
    *,
    shared: Mapping[str, Any] | None = None,
    source: str = "",
) -> None:
    """Fail fast when ranks have different world sizes, a rank is claimed twice, or a rank runs
    another pattern text (ConfigError) or options (OptionError) than rank 0. A rank reads the
    other side's values before writing its world size: both sides see the mismatch."""
    rank, world = launch.rank, launch.world_size
    if store.add(f"claims/{rank}", 1) > 1:
        raise RunError(
            f"two processes were started as rank {rank} (RANK={rank}); each rank of a run "
            "needs its own RANK",
            phase="start-up",
        )
    mine = dict(shared or {})
    store.set(f"shared/{rank}", json.dumps(mine, sort_keys=True))  # before world/{rank}
    others = range(1, world) if rank == 0 else [0]
    if rank == 0:
        store.set("world/0", str(world))
    deadline = time.monotonic() + timeout_s
    for other in others:
        key = f"world/{other}"
        if not wait_for_keys(store, [key], max(0.001, deadline - time.monotonic())):
            raise RunError(
                f"rank {other} did not start within {timeout_s:g} s (this rank {rank} was "
                f"started with WORLD_SIZE={world}, so it waits for ranks 0 to {world - 1})",
                phase="start-up",
                missing=(other,),
            )
        theirs = int(store.get(key))
        if rank != 0:
            store.set(f"world/{rank}", str(world))
        if theirs != world:
            raise RunError(
                f"rank {other} was started with WORLD_SIZE={theirs}, but rank {rank} with "
                f"WORLD_SIZE={world}: every rank of a run needs the same WORLD_SIZE (are two "
                "launches sharing one MASTER_ADDR:MASTER_PORT?)",
                phase="start-up",
            )
        peer = json.loads(store.get(f"shared/{other}"))
        first, second = sorted((rank, other))  # name rank 0's side last: it is the reference
        values = {rank: mine, other: peer}
        _compare_shared(values[second], values[first], second, first, source)


RANK_LOCAL_OPTIONS = frozenset(
    {"output_dir", "metrics_dir", "metrics_path", "write_metrics", "precision", "log_level"}
)
"""Options that only rank 0 uses (where it writes, how it prints); every other option changes
what every rank runs, so the ranks of a run must agree on it."""


def shared_options(options: RunOptions) -> dict[str, Any]:
    """The options every rank of a run must share, as plain JSON-able values."""
    return {
        f.name: list(v) if isinstance(v := getattr(options, f.name), tuple) else v
        for f in fields(options)
        if f.name not in RANK_LOCAL_OPTIONS
    }


def _compare_shared(
    theirs: Mapping[str, Any], ours: Mapping[str, Any], their_rank: int, our_rank: int, source: str
) -> None:
    digest, reference = theirs.get("pattern_sha256"), ours.get("pattern_sha256")
    options, reference_options = theirs.get("options") or {}, ours.get("options") or {}
    if digest and reference and digest != reference:
        raise ConfigError(
            f"rank {their_rank} runs a different pattern text than rank {our_rank}: sha256 "
            f"{digest[:16]} on rank {their_rank}, {reference[:16]} on rank {our_rank}; every "
            "rank must run the same pattern (the same file on every node, unchanged until the "
            "run starts)",
            file=source,
        )
    differ = sorted(
        k for k in {*options, *reference_options} if options.get(k) != reference_options.get(k)
    )
    if differ:
        shown = "; ".join(
            f"{k}={options.get(k)!r} on rank {their_rank}, "
            f"{k}={reference_options.get(k)!r} on rank {our_rank}"
            for k in differ
        )
        raise OptionError(
            f"rank {their_rank} was started with other options than rank {our_rank}: {shown}; "
            "start every rank with the same command line"
        )


def shutdown_distributed(ctx: DistContext) -> None:
    """Destroy every process group (safe to call when none exists); stop ``ctx``'s watch."""
    import torch.distributed as dist

    if ctx.ended_watch is not None:
        ctx.ended_watch.set()
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:  # teardown after a failure must not mask the real error
            log.debug("destroy_process_group failed: %s", exc)
