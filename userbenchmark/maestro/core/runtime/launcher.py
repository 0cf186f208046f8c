"""Start N local workers through torch's own launcher API when no launcher started us."""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

log = logging.getLogger("maestro.launcher")


def _worker(config: str, world_size: int, options: dict[str, Any], log_level: str) -> int:
    """Entry point of one worker process (module level so it can be pickled)."""
    from .logs import configure_logging
    from .worker import run_worker

    configure_logging(log_level)
    return run_worker(config, world_size, options)


def launch_local(config: str, nproc: int, options: dict[str, Any], log_level: str) -> int:
    """Run ``nproc`` workers on this machine; the worst worker exit status is returned."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # As torchrun does: one intra-op thread per worker unless the user chose otherwise.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cfg = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"maestro-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    try:
        results = elastic_launch(cfg, _worker)(config, nproc, options, log_level)
    except ChildFailedError as exc:
        failures = exc.failures
        for rank, failure in sorted(failures.items()):
            log.error("worker %d failed with exit code %s", rank, failure.exitcode)
        codes = [f.exitcode if f.exitcode > 0 else 1 for f in failures.values() if f.exitcode]
        return max(codes) if codes else 1
    return max(int(code or 0) for code in results.values())
