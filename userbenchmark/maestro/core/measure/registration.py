"""``register_buffers``: block buffers from a ``torch.cuda.MemPool`` over the NCCL backend's
``mem_allocator``, registered with the communicator (NCCL's zero-copy paths). Support is
probed in a child process: touching an unsupported allocator killed a process later."""

from __future__ import annotations

import functools
import logging
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch

from ...errors import RunError

log = logging.getLogger("maestro.registration")

PROBE_TIMEOUT_S = 120.0

# Runs in a fresh interpreter on the parent's device: a 1-rank NCCL group (in-process store,
# no port), a pool over its allocator, a registered all_reduce on a pool tensor.
_PROBE = """
import sys, torch, torch.distributed as dist
device = torch.device("cuda", int(sys.argv[1]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
try:
    backend = dist.group.WORLD._get_backend(device)
    pool = torch.cuda.MemPool(backend.mem_allocator)
    with torch.cuda.use_mem_pool(pool):
        t = torch.ones(1 << 16, device=device)
    backend.register_mem_pool(pool)
    dist.all_reduce(t)
    torch.cuda.synchronize(device)
    backend.deregister_mem_pool(pool)
    print("ok" if t[0].item() == 1.0 else "wrong result")
finally:
    dist.destroy_process_group()
"""


@functools.cache
def probe_mem_allocator(device_index: int) -> tuple[bool, str]:
    """(supported, detail): whether this torch/NCCL can back a MemPool with NCCL memory."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, str(device_index)],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"the probe did not finish in {PROBE_TIMEOUT_S:.0f} s"
    out = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and out and out[-1] == "ok":
        return True, "ok"
    return False, _last_error_line(proc.stderr) or f"probe exited with {proc.returncode}"


def _last_error_line(stderr: str) -> str:
    """The exception line of a traceback (``RuntimeError: ...``), without rank prefixes."""
    lines = [ln.split("]: ", 1)[-1].strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error:" in ln or "error:" in ln]
    return (errors or lines or [""])[-1]


def require_support(device_index: int) -> None:
    """Raise a RunError naming torch and NCCL when registered buffers are unavailable."""
    ok, detail = probe_mem_allocator(device_index)
    if ok:
        return
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # a CUDA torch without NCCL
        nccl = "unknown"
    raise RunError(
        f"register_buffers: torch {torch.__version__} with NCCL {nccl} cannot allocate "
        f"buffers from NCCL's memory allocator ({detail}); set register_buffers: false, or "
        "use a torch build whose ProcessGroupNCCL supports mem_allocator",
        phase="setup",
    )


class RegisteredPool:
    """One MemPool per communicator; blocks allocate from it, then it is registered."""

    def __init__(self, group: Any, device: Any) -> None:
        self.device = device
        self.backend = group._get_backend(device)
        self.pool = torch.cuda.MemPool(self.backend.mem_allocator)
        self.registered = False

    def allocator(self) -> Callable[[int, Any], Any]:
        """An ``empty``-like allocator drawing from the pool (for BlockContext.allocator)."""

        def empty(numel: int, dtype: Any) -> Any:
            with torch.cuda.use_mem_pool(self.pool, device=self.device):
                return torch.empty(numel, dtype=dtype, device=self.device)

        return empty

    def register(self) -> None:
        self.backend.register_mem_pool(self.pool)
        self.registered = True

    def release(self) -> None:
        if self.registered:
            self.backend.deregister_mem_pool(self.pool)
            self.registered = False
