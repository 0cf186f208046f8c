"""One pattern on one rank: its blocks and lanes, its phases in order, the outcome they
measured. The cluster shell runs each phase and agrees after it (core/runtime/phases.py)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ...blocks.base import Block, BlockContext
from ...blocks.dtypes import torch_dtype
from ...blocks.registry import resolve_op
from ...errors import RunError
from ..analysis.intervals import main_kernel_names
from ..analysis.outcome import Isolated, build_outcome, with_fidelity
from ..analysis.records import PatternOutcome
from ..config.spec import PatternSpec
from ..profilers.profiler import Profiler
from . import windows
from .graphs import GRAPH_MEMORY_MARGIN_BYTES, CapturedBlock, capture_blocks
from .hostmem import available_host_memory, check_host_memory
from .lanes import Lane
from .rig import Rig

log = logging.getLogger("maestro.pattern")


def _lane_starts(
    lane_of_block: Sequence[int], after: Sequence[tuple[int, ...]], present: np.ndarray
) -> list[int]:
    """Each block's lane, or -1 where its lane's first block here waits for another lane (a
    rank that runs the awaited block): such a lane is left out of lane skew and gate delay."""
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
        self.captured: dict[int, CapturedBlock] = {}
        """CUDA-graph mode: each block's captured launch, by block index (after capture)."""
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
            self.peak = int(windows.reducer(self.rig.sync_group)(peak, "max")[0])

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
        from .registration import RegisteredPool

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

    def measure(self) -> None:
        lanes = self._lanes
        windows.warmup(self, lanes, self.present)
        if self.pattern.graph:
            if self.pattern.warmup_iters == 0:  # communicators exist before capture
                windows.issue(self, lanes, 1, self.present, Profiler())
            # Eager warmup first (communicators, library handles), then capture, then a warmup
            # of the replays, which sizes the gate for them. The measured window starts after
            # all of it: capture and warmups never reach the numbers.
            ops = [b.op for b in self.pattern.blocks]
            self.captured = capture_blocks(lanes, self.names, ops, self.rig.place.device)
            lanes = self.lanes()
            windows.warmup(self, lanes, self.present)
        self.timings, self.host = windows.timed(self, lanes, self.pattern.num_iters, self.timed)

    def analyse(self) -> None:
        self.agg = windows.summary(self, self.timings, self.host)
        if self.rig.collect_timeline:
            self.timeline = windows.timeline(self, self.timings)

    def trace_steps(self) -> None:
        self.steps = windows.rank_steps(self, self.timings)

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
            windows.warmup(self, lanes, only, sync)
            timings, host = windows.timed(self, lanes, self.pattern.num_iters, only, sync)
            rows[b] = windows.summary(self, timings, host).latency_ns[b]
        self.isolated = Isolated(latency_ns=rows)

    def check(self) -> None:
        wrong = np.zeros(len(self.names))
        for block in self.blocks:
            if block is not None:
                block.prepare_check()
        windows.issue(self, self.lanes(), 1, self.present, Profiler())
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
        self.wrong = windows.reducer(self.rig.sync_group)(wrong, "sum")

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
