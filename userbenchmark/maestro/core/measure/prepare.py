"""A pattern (or a what-if variant of it) made ready on this rank: what it runs here (its plan),
its blocks set up once they fit in device or host memory (MemAvailable, the memory cgroup's room)
(a variant's block doing the base's work is the base's object, buffers included), the lanes of a
window of them, and what they allocated, freed by one teardown."""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ...blocks.base import Block, BlockContext
from ...blocks.dtypes import torch_dtype
from ...blocks.registry import resolve_op
from ...errors import RunError
from ..config.spec import PatternSpec
from .lanes import Lane, default_lead_us
from .rig import Rig

log = logging.getLogger("maestro.pattern")

# Device memory set aside per captured block: a graph's private pool holds what its capture
# allocates (library workspaces; maestro's buffers exist before it).
GRAPH_MEMORY_MARGIN_BYTES = 64 << 20


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What a pattern runs on this rank, known before anything is allocated."""

    pattern: PatternSpec
    classes: tuple[type[Block], ...]
    present: np.ndarray
    """(blocks,) bool: this rank is in the block's team."""
    timed: np.ndarray
    """(blocks,) bool: present and not ``idle``."""
    idle: tuple[str | None, ...]
    """Why a block known to launch no device work (a 1-rank NCCL all_reduce) runs untimed: CUPTI
    would find nothing to attribute. The same on every rank."""
    lane_of_block: tuple[int, ...]
    after: tuple[tuple[int, ...], ...]
    """Each block's waits on other lanes (a lane runs its blocks in order anyway)."""
    is_comm: np.ndarray
    is_compute: np.ndarray
    team_sizes: tuple[int, ...]
    notes: tuple[tuple[str, ...], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.pattern.blocks)

    @property
    def lane_starts(self) -> tuple[int, ...]:
        """The lane of each block, -1 where its lane's first block here waits for another lane:
        left out of lane skew and gate delay."""
        firsts: dict[int, int] = {}
        for i in np.flatnonzero(self.present):
            firsts.setdefault(self.lane_of_block[i], int(i))
        waiting = {li for li, i in firsts.items() if self.present[list(self.after[i])].any()}
        return tuple(-1 if li in waiting else li for li in self.lane_of_block)


def make_plan(rig: Rig, pattern: PatternSpec) -> Plan:
    specs, cuda = pattern.blocks, rig.place.is_cuda
    classes = tuple(resolve_op(b.op) for b in specs)
    present = np.array([rig.comms.team(b.axis) is not None for b in specs], dtype=bool)
    lane_of_block = tuple(pattern.lanes.index(b.lane) for b in specs)
    after = tuple(
        tuple(j for j in waits if lane_of_block[j] != lane_of_block[i])
        for i, waits in enumerate(pattern.predecessors)
    )
    team_sizes = tuple(rig.comms.axis(b.axis).team_size for b in specs)
    idle = tuple(
        cls.idle_reason(b.params, team_size=n, backend=rig.place.backend) if cuda else None
        for cls, b, n in zip(classes, specs, team_sizes, strict=True)
    )
    return Plan(
        pattern=pattern,
        classes=classes,
        present=present,
        timed=present & np.array([r is None for r in idle], dtype=bool),
        idle=idle,
        lane_of_block=lane_of_block,
        after=after,
        is_comm=np.array([c.category == "comm" for c in classes], dtype=bool),
        is_compute=np.array([c.category == "compute" for c in classes], dtype=bool),
        team_sizes=team_sizes,
        notes=tuple(
            ((f"not timed: {r}",) if r else ())
            + cls.notes(b.params, dtype=b.dtype, device="cuda" if cuda else "cpu")
            for cls, b, r in zip(classes, specs, idle, strict=True)
        ),
    )


@dataclass(frozen=True, kw_only=True)
class Ready:
    """A plan with its blocks set up (None where a block does not run here) and every block's
    notes; the lanes of a window of them, each block's launch (its CUDA graph's replay once
    captured); and the gate's lead (the default until a warmup sizes it)."""

    plan: Plan
    blocks: tuple[Block | None, ...]
    notes: tuple[tuple[str, ...], ...]
    lanes: tuple[Lane, ...]
    lead_us: float

    @property
    def present(self) -> np.ndarray:
        """(blocks,) bool: the blocks of its lanes (every block here, or one alone)."""
        present = np.zeros(len(self.plan.names), dtype=bool)
        present[[i for lane in self.lanes for i, _ in lane.blocks]] = True
        return present


class Allocated:
    """What a pattern and its variants allocated on this rank (blocks, ``register_buffers``'
    pools, CUDA graphs), freed by :meth:`teardown` whatever happened."""

    def __init__(self, rig: Rig, pattern: str) -> None:
        self.rig, self.pattern = rig, pattern
        self.blocks: list[Block] = []
        # {axis: (its communicator's NCCL backend, a MemPool over the backend's mem_allocator)}
        self.pools: dict[str, tuple[Any, Any]] = {}
        self.registered: list[tuple[Any, Any]] = []  # only these are deregistered
        self.graphs: list[Any] = []

    def allocator(self, axis: str) -> Callable[[int, Any], Any]:
        """An ``empty``-like allocator (``BlockContext.allocator``) drawing from ``axis``'s pool,
        one per communicator and pattern."""
        device = self.rig.place.device
        if axis not in self.pools:
            backend = self.rig.comms.group(axis)._get_backend(device)
            backend.eager_connect_single_device(device)  # registration needs the communicator
            self.pools[axis] = (backend, torch.cuda.MemPool(backend.mem_allocator))
        pool = self.pools[axis][1]

        def empty(numel: int, dtype: Any) -> Any:
            with torch.cuda.use_mem_pool(pool, device=device):
                return torch.empty(numel, dtype=dtype, device=device)

        return empty

    def teardown(self, *, failed: bool, drain_s: float) -> None:
        """Free the graphs, blocks and buffers once the device is done with them (after a
        failure within ``drain_s``); work still running then keeps them, and the rig is wedged:
        a synchronize would never return, the rank leaves after saving."""
        rig = self.rig
        if rig.wedged:
            return  # NCCL kernels still hold the buffers; the process leaves without freeing
        cuda = rig.place.is_cuda
        # Nothing may still use the buffers when their pools are deregistered and freed.
        if cuda and failed:
            if not rig.lanes.drained(drain_s):
                rig.wedged = True
                log.error(
                    "rank %d: device work of pattern %s still running %g s after it failed; "
                    "leaving without freeing its buffers",
                    rig.place.rank,
                    self.pattern,
                    drain_s,
                )
                return
        elif cuda:
            torch.cuda.synchronize(rig.place.device)  # every stream, NCCL's own too
        self.graphs = []  # graphs first: they hold the blocks' buffers
        for block in self.blocks:
            block.teardown()
        self.blocks = []
        for backend, pool in self.registered:
            backend.deregister_mem_pool(pool)
        self.registered = []
        self.pools = {}
        if cuda:
            torch.cuda.empty_cache()


_WORK = operator.attrgetter("op", "params", "dtype", "axis", "register_buffers")
"""What makes a block's object and buffers: a variant's block equal in these is its base's."""


def setup(rig: Rig, plans: Sequence[Plan], held: Allocated) -> tuple[Ready, ...]:
    """Every block ``plans`` run here set up, the pattern's (``plans[0]``) first: a variant's
    block doing the work of the base's block of its name (op, parameters, dtype, axis and
    ``register_buffers`` equal) is that block. The memory they need is checked first."""
    base = plans[0]
    by_name = {name: i for i, name in enumerate(base.names)}

    def owner(side: int, i: int) -> tuple[int, int]:  # (plan, block) of the object it runs
        j = by_name.get(plans[side].names[i])
        spec = plans[side].pattern.blocks[i]
        if side > 0 and j is not None and _WORK(base.pattern.blocks[j]) == _WORK(spec):
            return 0, j
        return side, i

    owners = [
        {int(i): owner(side, int(i)) for i in np.flatnonzero(plan.present)}
        for side, plan in enumerate(plans)
    ]
    made = sorted({key for found in owners for key in found.values()})
    _check_memory(rig, [(plans[side], i) for side, i in made])
    blocks: dict[tuple[int, int], Block] = {}
    notes: dict[tuple[int, int], tuple[str, ...]] = {}
    for side, i in made:
        blocks[side, i], notes[side, i] = _set_up(rig, plans[side].pattern, i, held)
    for backend, pool in held.pools.values():
        # After every buffer exists: registration covers the pool's segments.
        backend.register_mem_pool(pool)
        held.registered.append((backend, pool))
    readies = []
    for plan, found in zip(plans, owners, strict=True):
        mine = tuple(blocks[found[i]] if i in found else None for i in range(len(plan.names)))
        readies.append(
            Ready(
                plan=plan,
                blocks=mine,
                notes=tuple(n + notes.get(found.get(i), ()) for i, n in enumerate(plan.notes)),
                lanes=_lanes_of(rig, plan, mine),
                lead_us=default_lead_us(cuda=rig.place.is_cuda),
            )
        )
    return tuple(readies)


def _set_up(
    rig: Rig, pattern: PatternSpec, i: int, held: Allocated
) -> tuple[Block, tuple[str, ...]]:
    place, spec = rig.place, pattern.blocks[i]
    allocator = None
    if spec.register_buffers and place.is_cuda:
        allocator = held.allocator(spec.axis)
    ctx = BlockContext(
        rank=place.rank,
        device=place.device,
        dtype=torch_dtype(spec.dtype),
        team=rig.comms.team(spec.axis),
        group=rig.comms.group(spec.axis),
        seed=rig.seed,
        backend=place.backend,
        calibration=rig.calibration,
        allocator=allocator,
        graph=pattern.graph,
    )
    block = resolve_op(spec.op)(spec, ctx)
    held.blocks.append(block)  # torn down even when its setup fails
    try:
        block.setup()
        return block, tuple(block.setup_notes())
    except RunError:
        raise
    except Exception as exc:
        raise RunError(f"setup failed: {type(exc).__name__}: {exc}", block=spec.name) from exc


def _check_memory(rig: Rig, blocks: Sequence[tuple[Plan, int]]) -> None:
    place = rig.place
    need, host = 0, []
    for plan, i in blocks:
        spec = plan.pattern.blocks[i]
        sized = {"dtype": spec.dtype, "team_size": plan.team_sizes[i]}
        need += plan.classes[i].buffer_bytes(spec.params, **sized)
        host.append((spec.name, plan.classes[i].host_buffer_bytes(spec.params, **sized)))
        if plan.pattern.graph:
            need += GRAPH_MEMORY_MARGIN_BYTES
    if place.is_cuda:
        free, _ = torch.cuda.mem_get_info(place.device)
        if need > free:
            raise RunError(
                f"blocks {', '.join(name for name, _ in host)} need "
                f"{need / 2**30:.2f} GiB of device memory on this rank, only "
                f"{free / 2**30:.2f} GiB is free"
            )
        torch.cuda.reset_peak_memory_stats(place.device)
        return
    # Every rank on this host allocates at once: together they must fit, or the kernel's
    # OOM killer ends one of them without a word.
    mine = place.hosts[place.rank] if place.hosts else None
    check_host_memory(
        host,
        local_ranks=max(1, sum(1 for h in place.hosts if h == mine)),
        memory=available_host_memory(),
    )


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


def _cgroup(proc: Path, cgroup_root: Path) -> list[HostMemory]:
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
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
                found.append(
                    HostMemory(left, f"the cgroup's {limit_name} less {usage_name} ({folder})")
                )
            if folder == root:
                break
    return found


def available_host_memory(
    *, proc: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup"
) -> HostMemory | None:
    """The smaller of ``MemAvailable`` and the memory cgroup's room; None when neither can be
    read (not Linux)."""
    proc, cgroup_root = Path(proc), Path(cgroup_root)
    readings = [r for r in (_meminfo(proc), *_cgroup(proc, cgroup_root)) if r is not None]
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


def _lanes_of(rig: Rig, plan: Plan, blocks: Sequence[Block | None]) -> tuple[Lane, ...]:
    """The lanes of a window of every block here."""
    lanes: dict[int, Lane] = {}
    names = plan.pattern.lanes
    for i, block in enumerate(blocks):
        if block is None:
            continue
        li = plan.lane_of_block[i]
        if li not in lanes:  # its stream has its axis's priority
            priority = rig.comms.axis(plan.pattern.blocks[i].axis).priority
            stream = rig.lanes.stream(names[li], priority) if rig.place.is_cuda else None
            lanes[li] = Lane(name=names[li], blocks=[], stream=stream)
        lanes[li].blocks.append((i, block))
        waits = tuple(j for j in plan.after[i] if blocks[j] is not None)
        if waits:
            lanes[li].after[i] = waits
    return tuple(lanes[k] for k in sorted(lanes))


def lanes_alone(lanes: Sequence[Lane], b: int) -> tuple[Lane, ...]:
    """Of ``lanes``, block ``b``'s with ``b`` only (none where it does not run here): alone, it
    waits for no other block."""
    return tuple(
        Lane(name=lane.name, blocks=[(i, x) for i, x in lane.blocks if i == b], stream=lane.stream)
        for lane in lanes
        if b in dict(lane.blocks)
    )


def capture(ready: Ready, device: Any, held: Allocated) -> Ready:
    """``ready`` with each block's launch captured into a CUDA graph, replayed on its lane stream
    after the gate event with its external correlation id pushed around replay(): CUPTI
    attributes each kernel per block and iteration as in eager mode, where a graph of a whole
    iteration would give every kernel one id. Communicators and library handles exist already."""
    pool = torch.cuda.graph_pool_handle()  # one private pool for the pattern's graphs
    lanes = []
    torch.cuda.synchronize(device)
    for lane in ready.lanes:
        replays = []
        for index, block in lane.blocks:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=pool, stream=lane.stream):
                    block.launch()
            except Exception as exc:
                spec = ready.plan.pattern.blocks[index]
                raise RunError(
                    f"op {spec.op} cannot be captured into a CUDA graph with torch "
                    f"{torch.__version__} ({type(exc).__name__}: {exc}); run this pattern with "
                    "graph: false",
                    block=spec.name,
                ) from exc
            held.graphs.append(graph)
            replays.append((index, SimpleNamespace(launch=graph.replay)))
        lanes.append(replace(lane, blocks=replays))
    torch.cuda.synchronize(device)
    return replace(ready, lanes=tuple(lanes))
