"""Host memory a pattern may still allocate on this rank's host (MemAvailable and the memory
cgroup's room), and the check that refuses a pattern before any of its buffers exists."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import RunError

UNLIMITED_BYTES = 2**60  # a cgroup v1 limit this large is none (page-rounded 2**63 - 1)


@dataclass(frozen=True)
class HostMemory:
    """How much memory may still be allocated, and which reading said so."""

    available_bytes: int
    source: str  # MemAvailable in /proc/meminfo, or a cgroup's limit less its usage


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # unreadable, or "max": no limit
        return None


def _meminfo(proc: Path) -> HostMemory | None:
    with contextlib.suppress(OSError, IndexError, ValueError):
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                kib = int(line.split()[1])
                return HostMemory(kib * 1024, f"MemAvailable in {proc / 'meminfo'}")
    return None


def _cgroup(proc: Path, cgroup_root: Path) -> HostMemory | None:
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    best: HostMemory | None = None
    for _, controllers, path in (line.split(":", 2) for line in lines if line.count(":") >= 2):
        if controllers == "":  # cgroup v2 (unified)
            unified = cgroup_root / "unified"
            root = unified if (unified / "cgroup.controllers").exists() else cgroup_root
            limit_name, usage_name = "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            root = cgroup_root / "memory"
            limit_name, usage_name = "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        current = root / path.lstrip("/")
        if not current.is_dir():  # a cgroup namespace: this process's cgroup is the root
            current = root
        for folder in (current, *current.parents):
            limit = _read_int(folder / limit_name)
            usage = _read_int(folder / usage_name)
            if limit is not None and usage is not None and limit < UNLIMITED_BYTES:
                left = max(0, limit - usage)
                if best is None or left < best.available_bytes:
                    best = HostMemory(
                        left, f"the cgroup's {limit_name} less {usage_name} ({folder})"
                    )
            if folder == root:
                break
    return best


def available_host_memory(
    *, proc: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup"
) -> HostMemory | None:
    """The smaller of ``MemAvailable`` and the memory cgroup's room; None when neither can be
    read (not Linux)."""
    proc, cgroup_root = Path(proc), Path(cgroup_root)
    readings = [r for r in (_meminfo(proc), _cgroup(proc, cgroup_root)) if r is not None]
    return min(readings, key=lambda r: r.available_bytes, default=None)


NAMED_SHARE = 0.9  # a refusal names the largest blocks that together need this share


def check_host_memory(
    blocks: Sequence[tuple[str, int]], *, local_ranks: int, memory: HostMemory | None
) -> None:
    """RunError when ``local_ranks`` ranks, each allocating ``blocks`` ((name, bytes) as
    ``Block.host_buffer_bytes`` counts them), do not fit in ``memory``; it names the few
    blocks that need most of it."""
    need = sum(n for _, n in blocks)
    total = need * local_ranks
    if memory is None or total <= memory.available_bytes:  # needing nothing always fits
        return
    gib = 2**30
    named, covered = [], 0
    for name, nbytes in sorted(blocks, key=lambda b: -b[1]):
        if covered >= NAMED_SHARE * need:
            break
        named.append(f"{name} ({nbytes / gib:.2f} GiB)")
        covered += nbytes
    rest = len(blocks) - len(named)
    others = f" and {rest} more" if rest else ""
    ranks = "the rank" if local_ranks == 1 else f"the {local_ranks} ranks"
    raise RunError(
        f"blocks {', '.join(named)}{others} need {need / gib:.2f} GiB of host memory per rank, "
        f"{total / gib:.2f} GiB for {ranks} on this host, and only "
        f"{memory.available_bytes / gib:.2f} GiB is available ({memory.source}); use smaller "
        "sizes (--max-size), or fewer ranks per host"
    )
