"""One pattern on one rank: its blocks and lanes, its phases in order, the outcome they
measured. The cluster shell runs each phase and agrees after it (core/runtime/phases.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from ...blocks.base import Block, BlockContext
from ...blocks.dtypes import torch_dtype
from ...blocks.registry import resolve_op
from ...errors import RunError
from ..analysis.aggregate import WindowAggregate, local_summary, reduce_summaries
from ..analysis.intervals import HostTimings, WindowTimings, main_kernel_names
from ..analysis.outcome import Isolated, build_outcome
from ..analysis.records import PatternOutcome, RankTimeline, Timeline
from ..config.spec import PatternSpec
from ..profilers.profiler import Profiler
from ..replay.fidelity import rank_steps, with_fidelity
from .lanes import (
    DEFAULT_GATE_US,
    DEFAULT_START_MARGIN_US,
    Lane,
    calibrated_gate_us,
    calibrated_start_margin_us,
    gc_paused,
)
from .rig import RegisteredPool, Rig, reducer

log = logging.getLogger("maestro.pattern")

# Device memory set aside per captured block: a graph's private pool holds what its capture
# allocates (library workspaces; maestro's buffers exist before it).
GRAPH_MEMORY_MARGIN_BYTES = 64 << 20


def _lane_starts(
    lane_of_block: Sequence[int], after: Sequence[tuple[int, ...]], present: np.ndarray
) -> list[int]:
    # -1 where a lane's first block here waits for another lane: left out of lane skew and
    # gate delay.
    firsts: dict[int, int] = {}
    for i in np.flatnonzero(present):
        firsts.setdefault(lane_of_block[i], int(i))
    waiting = {li for li, i in firsts.items() if present[list(after[i])].any()}
    return [-1 if li in waiting else li for li in lane_of_block]


class PatternRun:
    def __init__(self, rig: Rig, pattern: PatternSpec) -> None:
        self.rig, self.pattern = rig, pattern
        specs, cuda = pattern.blocks, rig.place.is_cuda
        self.names = [b.name for b in specs]
        self.classes: list[type[Block]] = [resolve_op(b.op) for b in specs]
        self.present = np.array([rig.comms.team(b.axis) is not None for b in specs], dtype=bool)
        self.lane_of_block = [list(pattern.lanes).index(b.lane) for b in specs]
        self.order = pattern.issue_order
        # Each block's waits on other lanes (a lane runs its blocks in order anyway).
        self.after = [
            tuple(j for j in waits if self.lane_of_block[j] != self.lane_of_block[i])
            for i, waits in enumerate(pattern.predecessors)
        ]
        self.lane_starts = _lane_starts(self.lane_of_block, self.after, self.present)
        self.is_comm = np.array([c.category == "comm" for c in self.classes], dtype=bool)
        self.is_compute = np.array([c.category == "compute" for c in self.classes], dtype=bool)
        self.blocks: list[Block | None] = [None] * len(specs)
        self.pools: dict[str, Any] = {}
        self.captured: dict[int, Any] = {}  # CUDA-graph mode: {block index: its replay as launch}
        self.team_sizes = [rig.comms.axis(b.axis).team_size for b in specs]
        # Blocks known to launch no device work (a 1-rank NCCL all_reduce) run but are not
        # timed: CUPTI would find nothing to attribute. Same answer on every rank.
        self.idle: list[str | None] = [
            cls.idle_reason(b.params, team_size=n, backend=rig.place.backend) if cuda else None
            for cls, b, n in zip(self.classes, specs, self.team_sizes, strict=True)
        ]
        self.timed = self.present & np.array([r is None for r in self.idle], dtype=bool)
        self.notes: list[tuple[str, ...]] = [
            ((f"not timed: {r}",) if r else ())
            + cls.notes(b.params, dtype=b.dtype, device="cuda" if cuda else "cpu")
            for cls, b, r in zip(self.classes, specs, self.idle, strict=True)
        ]
        self.isolated = Isolated.unmeasured(len(specs))
        self.timings = self.host = self.agg = self.timeline = None
        self.steps = self.wrong = self.peak = None
        self._lanes: list[Lane] = []

    def phases(self) -> Iterator[tuple[str, Callable[[], None]]]:
        """Each phase's name and work, in order; what runs between them (the lanes, the memory
        peak) belongs to no phase."""
        yield "setup", self.setup
        self._lanes = self.lanes()
        yield "measure", self.measure
        yield "analysis", self.analyse
        if self.pattern.traced:  # an imported step reports every rank's makespan
            yield "analysis", self.trace_steps
        if self.pattern.baseline and len(self.names) > 1:
            yield "baseline", self.baseline
        if self.pattern.check:
            yield "check", self.check
        if self.rig.place.is_cuda:
            peak = np.array([float(torch.cuda.max_memory_allocated(self.rig.place.device))])
            self.peak = int(reducer(self.rig.sync_group)(peak, "max")[0])

    def setup(self) -> None:
        rig, place = self.rig, self.rig.place
        here = [i for i in range(len(self.names)) if self.present[i]]
        self._check_memory(here)
        for i in here:
            spec = self.pattern.blocks[i]
            allocator = None
            if spec.register_buffers and place.is_cuda:
                allocator = self._pool(spec.axis).allocator()
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
                graph=self.pattern.graph,
            )
            block = self.blocks[i] = self.classes[i](spec, ctx)
            try:
                block.setup()
                self.notes[i] += tuple(block.setup_notes())
            except RunError:
                raise
            except Exception as exc:
                raise RunError(
                    f"setup failed: {type(exc).__name__}: {exc}", block=spec.name
                ) from exc
        for pool in self.pools.values():
            pool.register()  # after every buffer exists: registration covers the pool's segments

    def _check_memory(self, here: Sequence[int]) -> None:
        place = self.rig.place
        need, host = 0, []
        for i in here:
            spec = self.pattern.blocks[i]
            sized = {"dtype": spec.dtype, "team_size": self.team_sizes[i]}
            need += self.classes[i].buffer_bytes(spec.params, **sized)
            host.append((self.names[i], self.classes[i].host_buffer_bytes(spec.params, **sized)))
            if self.pattern.graph:
                need += GRAPH_MEMORY_MARGIN_BYTES
        if place.is_cuda:
            free, _ = torch.cuda.mem_get_info(place.device)
            if need > free:
                raise RunError(
                    f"blocks {', '.join(self.names[i] for i in here)} need "
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

    def _pool(self, axis: str) -> Any:  # one per communicator and pattern
        if axis not in self.pools:
            self.pools[axis] = RegisteredPool(self.rig.comms.group(axis), self.rig.place.device)
        return self.pools[axis]

    def lanes(self, only: int | None = None) -> list[Lane]:
        """The lanes of a window of every block here, or of block ``only``."""
        lanes: dict[int, Lane] = {}
        names = self.pattern.lanes

        def runs(i: int) -> bool:
            return self.blocks[i] is not None and only in (None, i)

        for i, block in enumerate(self.blocks):
            if not runs(i):
                continue
            li = self.lane_of_block[i]
            if li not in lanes:  # its stream has its axis's priority
                priority = self.rig.comms.axis(self.pattern.blocks[i].axis).priority
                stream = self.rig.lane_stream(names[li], priority)
                lanes[li] = Lane(name=names[li], blocks=[], stream=stream)
            lanes[li].blocks.append((i, self.captured.get(i, block)))  # a graph: its replay
            waits = tuple(j for j in self.after[i] if runs(j))
            if waits:
                lanes[li].after[i] = waits
        return [lanes[k] for k in sorted(lanes)]

    # One window (issued with the garbage collector paused) and its figures over the ranks.
    def _issue(
        self,
        lanes: Sequence[Lane],
        num_iters: int,
        present: np.ndarray,
        profiler: Profiler,
        sync: str | None = None,
    ) -> HostTimings:
        """Run ``lanes`` for ``num_iters`` under ``profiler``; ``sync`` overrides the pattern's."""
        rig = self.rig
        rig.window_id += 1
        profiler.begin_window(rig.window_id, len(self.names), num_iters, present)
        with gc_paused():
            sync = sync or self.pattern.sync
            return rig.lanes.run_window(
                lanes, num_iters, profiler, sync=sync, block_names=self.names, order=self.order
            )

    def timed_window(
        self, lanes: Sequence[Lane], num_iters: int, present: np.ndarray, sync: str | None = None
    ) -> tuple[WindowTimings, HostTimings]:
        host = self._issue(lanes, num_iters, present, self.rig.profiler, sync)
        return self.rig.profiler.end_window(), host

    def warmup(self, lanes: Sequence[Lane], present: np.ndarray, sync: str | None = None) -> None:
        """Run the warmup iterations (never timed) and size the gate from their enqueue, from the
        default gate (no pattern inherits another's). Ranks agree on the longest gate: ranks whose
        gates opened apart would start their collectives apart and time each other."""
        rig, cuda = self.rig, self.rig.place.is_cuda
        if cuda:
            rig.lanes.gate_us = DEFAULT_GATE_US
        else:
            rig.lanes.start_margin_us = DEFAULT_START_MARGIN_US
        if self.pattern.warmup_iters <= 0:
            return
        # With the measured window's profiler hooks (CUPTI's push/pop cost host time), so the gate
        # is sized for them; never ended: the next window's begin discards its records.
        host = self._issue(lanes, self.pattern.warmup_iters, present, rig.profiler, sync)
        reduce = reducer(rig.sync_group)
        if not cuda:
            proposal = np.array([calibrated_start_margin_us(host.agree_ns)])
            rig.lanes.start_margin_us = float(reduce(proposal, "max")[0])
            return
        rig.lanes.gate_us = float(reduce(np.array([calibrated_gate_us(host.enqueue_ns)]), "max")[0])
        log.debug(
            "pattern %s: gate spin %.1f µs (this rank's warmup enqueue µs: %s)",
            self.pattern.name,
            rig.lanes.gate_us,
            host.enqueue_ns / 1e3,
        )

    def _summary(self, timings: WindowTimings, host: HostTimings) -> WindowAggregate:
        place = self.rig.place
        local = local_summary(
            timings,
            lane_of_block=self.lane_starts,
            is_comm=self.is_comm,
            is_compute=self.is_compute,
            rank=place.rank,
            world_size=place.world_size,
            shared_clock=place.one_host,
            host=host,
        )
        reduce = reducer(self.rig.sync_group)
        return reduce_summaries(local, rank=place.rank, world_size=place.world_size, reduce=reduce)

    def _gather_timeline(self, timings: WindowTimings) -> Timeline | None:
        # Every rank's intervals on rank 0 (None elsewhere), only for --trace/--plot.
        place = self.rig.place
        mine = RankTimeline(
            rank=place.rank,
            starts_ns=np.asarray(timings.starts_ns, dtype=np.int64),
            ends_ns=np.asarray(timings.ends_ns, dtype=np.int64),
            present=np.asarray(timings.present, dtype=bool),
            clock=timings.clock,
            activities=timings.activities,  # CUPTI with --trace only
        )
        gathered: list[Any] = [None] * place.world_size
        tdist.all_gather_object(gathered, mine, group=self.rig.sync_group)
        if place.rank != 0:
            return None
        return Timeline(
            pattern=self.pattern.name,
            block_names=tuple(self.names),
            block_lanes=tuple(self.pattern.lanes[i] for i in self.lane_of_block),
            ranks=tuple(sorted(gathered, key=lambda r: r.rank)),
            shared_clock=place.one_host and timings.host_clock,
            block_categories=tuple(c.category for c in self.classes),
            backend=place.backend,
        )

    def measure(self) -> None:
        lanes = self._lanes
        self.warmup(lanes, self.present)
        if self.pattern.graph:
            if self.pattern.warmup_iters == 0:  # communicators exist before capture
                self._issue(lanes, 1, self.present, Profiler())
            # Eager warmup first (communicators, library handles), then capture, then a warmup
            # of the replays, which sizes the gate for them. The measured window starts after
            # all of it: capture and warmups never reach the numbers.
            ops = [b.op for b in self.pattern.blocks]
            self.captured = _capture_blocks(lanes, self.names, ops, self.rig.place.device)
            lanes = self.lanes()
            self.warmup(lanes, self.present)
        self.timings, self.host = self.timed_window(lanes, self.pattern.num_iters, self.timed)

    def analyse(self) -> None:
        self.agg = self._summary(self.timings, self.host)
        if self.rig.collect_timeline:
            self.timeline = self._gather_timeline(self.timings)

    def trace_steps(self) -> None:  # (world, iters): every rank's makespan per iteration (ns)
        place = self.rig.place
        mine = rank_steps(self.timings, place.rank, place.world_size)
        self.steps = reducer(self.rig.sync_group)(mine, "sum")

    def baseline(self) -> None:  # each block alone, for the pattern's iterations
        num_blocks, note = len(self.names), self.rig.note
        rows = np.full((num_blocks, self.pattern.num_iters), np.nan)
        for b in range(num_blocks):
            if note is not None:
                note(f"{self.pattern.name}: baseline", b, num_blocks)
            if self.idle[b] is not None:
                continue  # nothing to time (the same on every rank)
            only = np.zeros(num_blocks, dtype=bool)
            only[b] = self.timed[b]
            lanes = self.lanes(only=b)
            # On CUDA a block alone that talks to no other rank needs no cross-rank start: its
            # iterations follow each other on the device, each after its gate spin, with no
            # host barrier or alignment collective between them. On CPU its lane would then
            # run warm where the pattern's ran after a wait.
            sync = "none" if self.rig.place.is_cuda and not self.is_comm[b] else None
            self.warmup(lanes, only, sync)
            timings, host = self.timed_window(lanes, self.pattern.num_iters, only, sync)
            rows[b] = self._summary(timings, host).latency_ns[b]
        self.isolated = Isolated(latency_ns=rows)

    def check(self) -> None:
        wrong = np.zeros(len(self.names))
        for block in self.blocks:
            if block is not None:
                block.prepare_check()
        self._issue(self.lanes(), 1, self.present, Profiler())
        if self.rig.place.is_cuda:
            torch.cuda.synchronize(self.rig.place.device)
        for i, block in enumerate(self.blocks):
            if block is not None:
                try:
                    wrong[i] = block.verify()
                except Exception as exc:
                    raise RunError(
                        f"verify failed: {type(exc).__name__}: {exc}", block=self.names[i]
                    ) from exc
        self.wrong = reducer(self.rig.sync_group)(wrong, "sum")

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
            if not rig.lanes.drained(list(rig.streams.values()), drain_s):
                rig.wedged = True
                log.error(
                    "rank %d: device work of pattern %s still running %g s after it failed; "
                    "leaving without freeing its buffers",
                    rig.place.rank,
                    self.pattern.name,
                    drain_s,
                )
                return
        elif cuda:
            torch.cuda.synchronize(rig.place.device)  # every stream, NCCL's own too
        self.captured = {}  # graphs first: they hold the blocks' buffers
        for block in self.blocks:
            if block is not None:
                block.teardown()
        self.blocks = [None] * len(self.names)
        for pool in self.pools.values():
            pool.release()
        self.pools = {}
        if cuda:
            torch.cuda.empty_cache()

    def outcome(self) -> PatternOutcome:
        rig = self.rig
        outcome = build_outcome(
            rig.suite,
            self.pattern,
            self.classes,
            self.agg,
            self.isolated,
            self.wrong,
            self.peak,
            profiler=rig.profiler.name,
            team_sizes=self.team_sizes,
            notes=self.notes,
            ranks_per_gpu=rig.place.ranks_per_gpu,
        )
        if self.steps is not None:
            kernels = main_kernel_names(self.timings.activities, len(self.names))
            outcome = with_fidelity(outcome, self.pattern, self.agg, self.steps, kernels)
        if self.timeline is not None:
            outcome = dataclasses.replace(outcome, timeline=self.timeline)
        return outcome


def _capture_blocks(
    lanes: Sequence[Lane], names: Sequence[str], ops: Sequence[str], device: Any
) -> dict[int, Any]:
    # One graph per block, replayed on its lane stream after the gate event with its external
    # correlation id pushed around replay(): CUPTI attributes each kernel per block and
    # iteration as in eager mode (H200, torch 2.11, cupti-python 13.0.1); a graph of a whole
    # iteration would give every kernel one id. Communicators and handles exist (after warmup).
    pool = torch.cuda.graph_pool_handle()  # one private pool for the pattern's graphs
    captured: dict[int, Any] = {}
    torch.cuda.synchronize(device)
    for lane in lanes:
        for index, block in lane.blocks:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=pool, stream=lane.stream):
                    block.launch()
            except Exception as exc:
                raise RunError(
                    f"op {ops[index]} cannot be captured into a CUDA graph with torch "
                    f"{torch.__version__} ({type(exc).__name__}: {exc}); run this pattern with "
                    "graph: false",
                    block=names[index],
                ) from exc
            captured[index] = SimpleNamespace(launch=graph.replay)
    torch.cuda.synchronize(device)
    return captured


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
        while True:
            limit = _read_int(current / limit_name)
            usage = _read_int(current / usage_name)
            if limit is not None and usage is not None and limit < UNLIMITED_BYTES:
                left = max(0, limit - usage)
                if best is None or left < best.available_bytes:
                    best = HostMemory(
                        left, f"the cgroup's {limit_name} less {usage_name} ({current})"
                    )
            if current == root or current.parent == current:
                break
            current = current.parent
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
