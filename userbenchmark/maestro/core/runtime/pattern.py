"""The measurement protocol for one rank: set up, warm up, measure, baseline, check, aggregate.
Every rank runs the same phases; an agreement step at each boundary ends a failure on one rank
with the same error on every rank (agreement.py)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from ...blocks.base import Block, BlockContext
from ...blocks.dtypes import torch_dtype
from ...blocks.registry import resolve_op
from ...errors import RunError
from ..analysis import fidelity
from ..analysis.activities import main_kernel_names
from ..analysis.aggregate import WindowAggregate, local_summary, reduce_summaries
from ..analysis.intervals import HostTimings, WindowTimings
from ..analysis.outcome import Isolated, build_outcome
from ..analysis.records import PatternOutcome, RankTimeline, Timeline
from ..config.dependencies import issue_order
from ..config.spec import PatternSpec, SuiteSpec
from ..output.progress import estimate_left_s
from ..profilers.profiler import Profiler
from . import interrupts, supervision
from .agreement import agree, grace_s
from .communicators import Communicators
from .distributed import DistContext, torch_reducer
from .graphs import GRAPH_MEMORY_MARGIN_BYTES, CapturedBlock, capture_blocks
from .hostmem import available_host_memory, check_host_memory
from .lanes import (
    DEFAULT_GATE_US,
    DEFAULT_START_MARGIN_US,
    Lane,
    calibrated_gate_us,
    calibrated_start_margin_us,
    gc_paused,
)

log = logging.getLogger("maestro.pattern")


@dataclass(kw_only=True)
class Runtime:
    """Run-wide state shared by every pattern of a suite on this rank."""

    suite: SuiteSpec
    dist: DistContext
    comms: Communicators
    profiler: Profiler
    executor: Any
    sync_group: Any
    """gloo group for iteration barriers and result reductions; the agreement step goes through
    the store, so a failed rank's agreement never meets a peer's barrier or reduction."""
    seed: int = 0
    calibration: dict[str, float] = field(default_factory=dict)
    streams: dict[str, Any] = field(default_factory=dict)
    window_id: int = 0
    collect_timeline: bool = False
    """Gather every rank's intervals on rank 0 (for ``--trace`` and ``--plot``)."""
    note: Callable[[str], None] | None = None
    """Rank 0's progress line: what a pattern is doing now (None on other ranks)."""
    wedged: bool = False
    """Device work outlived an abort (NCCL kernels that cannot end): nothing may be freed or
    torn down any more; the rank leaves once the failure is saved and printed."""

    def lane_stream(self, name: str, priority: str) -> Any:
        if not self.dist.is_cuda:
            return None
        key = f"{name}:{priority}"
        if key not in self.streams:
            self.streams[key] = self.executor.make_stream(priority)
        return self.streams[key]


def _phase(rt: Runtime, phase: str, pattern: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` then agree with every rank; re-raise the agreed error on all of them. An
    interrupt is reported through the agreement too: every rank stops with the same message."""
    error: BaseException | None = None
    value = None
    if rt.note is not None:
        rt.note(f"{pattern}: {phase}")
    # Where a rank that ends without a word was: the phase the others' agreement will name.
    supervision.agreed(f"entering pattern {pattern!r}, phase {phase}")
    try:
        with interrupts.deliverable():  # the only place a signal stops a pattern
            value = fn()
    except (Exception, KeyboardInterrupt, SystemExit) as exc:  # all reach the agreement
        error = exc
        log.debug("rank %d failed in %s: %s", rt.dist.rank, phase, exc, exc_info=True)
    # Phases that issue collectives leave them half-done when one rank stops early.
    agree(
        rt.dist.agreement, rt.dist.rank, phase, error, pattern=pattern, contained=phase == "setup"
    )
    return value


class PatternRun:
    """One pattern on this rank: its blocks, lanes and the windows it measures."""

    def __init__(self, rt: Runtime, pattern: PatternSpec) -> None:
        self.rt = rt
        self.pattern = pattern
        specs = pattern.blocks
        self.names = [b.name for b in specs]
        self.classes: list[type[Block]] = [resolve_op(b.op) for b in specs]
        self.present = np.array([rt.comms.team(b.axis) is not None for b in specs], dtype=bool)
        lane_names = list(pattern.lanes)
        self.lane_of_block = [lane_names.index(b.lane) for b in specs]
        self.order = issue_order(specs)
        index = {name: i for i, name in enumerate(self.names)}
        # after: across lanes only (a lane runs its blocks in order anyway). A rank that does
        # not run an awaited block has nothing to wait for: a stream waits on its own rank.
        self.after = [
            tuple(index[n] for n in b.after if self.lane_of_block[index[n]] != li)
            for b, li in zip(specs, self.lane_of_block, strict=True)
        ]
        # A lane whose first block here waits for another lane does not start at the gate: -1
        # leaves it out of the lane-start figures (lane skew, gate delay).
        firsts: dict[int, int] = {}
        for i in np.flatnonzero(self.present):
            firsts.setdefault(self.lane_of_block[i], int(i))
        waiting = {li for li, i in firsts.items() if self.present[list(self.after[i])].any()}
        self.lane_starts = [-1 if li in waiting else li for li in self.lane_of_block]
        self.is_comm = np.array([c.category == "comm" for c in self.classes], dtype=bool)
        self.is_compute = np.array([c.category == "compute" for c in self.classes], dtype=bool)
        self.blocks: list[Block | None] = [None] * len(specs)
        self.pools: dict[str, Any] = {}
        self.captured: dict[int, CapturedBlock] = {}
        """CUDA-graph mode: each block's captured launch, by block index (after capture)."""
        team_sizes = [rt.comms.axis(b.axis).team_size for b in specs]
        # Blocks known to launch no device work (a 1-rank NCCL all_reduce) run but are not
        # timed: CUPTI would find nothing to attribute. Same answer on every rank.
        self.idle: list[str | None] = [
            cls.idle_reason(b.params, team_size=n, backend=rt.dist.backend)
            if rt.dist.is_cuda
            else None
            for cls, b, n in zip(self.classes, specs, team_sizes, strict=True)
        ]
        self.timed = self.present & np.array([r is None for r in self.idle], dtype=bool)
        device = "cuda" if rt.dist.is_cuda else "cpu"
        self.notes: list[tuple[str, ...]] = [
            ((f"not timed: {r}",) if r else ()) + cls.notes(b.params, dtype=b.dtype, device=device)
            for cls, b, r in zip(self.classes, specs, self.idle, strict=True)
        ]

    def setup(self) -> None:
        rt, dist = self.rt, self.rt.dist
        here = [i for i in range(len(self.names)) if self.present[i]]
        need, host = 0, []
        for i in here:
            spec = self.pattern.blocks[i]
            sized = {"dtype": spec.dtype, "team_size": rt.comms.axis(spec.axis).team_size}
            need += self.classes[i].buffer_bytes(spec.params, **sized)
            host.append((self.names[i], self.classes[i].host_buffer_bytes(spec.params, **sized)))
            if self.pattern.graph:
                need += GRAPH_MEMORY_MARGIN_BYTES
        if dist.is_cuda:
            free, _ = torch.cuda.mem_get_info(dist.device)
            if need > free:
                raise RunError(
                    f"blocks {', '.join(self.names[i] for i in here)} need "
                    f"{need / 2**30:.2f} GiB of device memory on this rank, only "
                    f"{free / 2**30:.2f} GiB is free"
                )
            torch.cuda.reset_peak_memory_stats(dist.device)
        else:
            # Every rank on this host allocates at once: together they must fit, or the
            # kernel's OOM killer ends one of them without a word.
            mine = dist.hosts[dist.rank] if dist.hosts else None
            check_host_memory(
                host,
                local_ranks=max(1, sum(1 for h in dist.hosts if h == mine)),
                memory=available_host_memory(),
            )
        for i in here:
            spec = self.pattern.blocks[i]
            allocator = None
            if spec.register_buffers and dist.is_cuda:
                allocator = self._pool(spec.axis).allocator()
            ctx = BlockContext(
                rank=dist.rank,
                device=dist.device,
                dtype=torch_dtype(spec.dtype),
                team=rt.comms.team(spec.axis),
                group=rt.comms.group(spec.axis),
                seed=rt.seed,
                backend=dist.backend,
                calibration=rt.calibration,
                allocator=allocator,
            )
            block = self.classes[i](spec, ctx)
            self.blocks[i] = block
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

    def _pool(self, axis: str) -> Any:
        """The registered-memory pool of this rank's communicator on ``axis`` (one per pattern)."""
        from .registration import RegisteredPool

        if axis not in self.pools:
            self.pools[axis] = RegisteredPool(self.rt.comms.group(axis), self.rt.dist.device)
        return self.pools[axis]

    def lanes(self, only: int | None = None) -> list[Lane]:
        lanes: dict[int, Lane] = {}
        names = self.pattern.lanes
        for i, block in enumerate(self.blocks):
            if not self._runs(i, only):
                continue
            block = self.captured.get(i, block)  # CUDA-graph mode: replay the capture
            li = self.lane_of_block[i]
            if li not in lanes:  # its stream has its axis's priority
                priority = self.rt.comms.axis(self.pattern.blocks[i].axis).priority
                stream = self.rt.lane_stream(names[li], priority)
                lanes[li] = Lane(name=names[li], blocks=[], stream=stream)
            lanes[li].blocks.append((i, block))
            waits = tuple(j for j in self.after[i] if self._runs(j, only))
            if waits:
                lanes[li].after[i] = waits
        return [lanes[k] for k in sorted(lanes)]

    def _runs(self, i: int, only: int | None) -> bool:
        """Whether block ``i`` runs on this rank in a window of every block, or of ``only``."""
        return self.blocks[i] is not None and only in (None, i)

    def _issue(
        self,
        lanes: Sequence[Lane],
        num_iters: int,
        present: np.ndarray,
        profiler: Profiler,
        sync: str | None = None,
    ) -> HostTimings:
        self.rt.window_id += 1
        profiler.begin_window(self.rt.window_id, len(self.names), num_iters, present)
        with gc_paused():
            return self.rt.executor.run_window(
                lanes,
                num_iters,
                profiler,
                sync=sync or self.pattern.sync,
                block_names=self.names,
                order=self.order,
            )

    def window(
        self,
        lanes: Sequence[Lane],
        num_iters: int,
        present: np.ndarray,
        *,
        timed: bool,
        sync: str | None = None,
    ) -> tuple[WindowTimings | None, HostTimings]:
        """One window; ``sync`` overrides the pattern's (see ``baseline`` in measure_pattern)."""
        prof = self.rt.profiler if timed else Profiler()
        stats = self._issue(lanes, num_iters, present, prof, sync)
        return (prof.end_window() if timed else None), stats

    def warmup(self, lanes: Sequence[Lane], present: np.ndarray, sync: str | None = None) -> None:
        """Run the warmup iterations (never timed) and size the gate from their enqueue, from
        the default gate (no pattern inherits another's). Ranks agree on the longest gate: ranks
        whose gates opened apart would start their collectives apart and time each other."""
        cuda = self.rt.dist.is_cuda
        if cuda:
            self.rt.executor.gate_us = DEFAULT_GATE_US
        else:
            self.rt.executor.start_margin_us = DEFAULT_START_MARGIN_US
        if self.pattern.warmup_iters <= 0:
            return
        # With the measured window's profiler hooks (CUPTI's push/pop cost host time), so the
        # gate is sized for them; never ended: the next window's begin discards its records.
        stats = self._issue(lanes, self.pattern.warmup_iters, present, self.rt.profiler, sync)
        reduce = torch_reducer(self.rt.sync_group)
        if not cuda:
            proposal = np.array([calibrated_start_margin_us(stats.agree_ns)])
            self.rt.executor.start_margin_us = float(reduce(proposal, "max")[0])
        else:
            proposal = np.array([calibrated_gate_us(stats.enqueue_ns)])
            gate_us = float(reduce(proposal, "max")[0])
            self.rt.executor.gate_us = gate_us
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "pattern %s: gate spin %.1f µs (this rank's warmup enqueue µs: %s)",
                    self.pattern.name,
                    gate_us,
                    np.array2string(stats.enqueue_ns / 1e3, precision=1, max_line_width=200),
                )

    def aggregate(self, timings: WindowTimings, host: HostTimings) -> WindowAggregate:
        dist = self.rt.dist
        local = local_summary(
            timings,
            lane_of_block=self.lane_starts,
            is_comm=self.is_comm,
            is_compute=self.is_compute,
            rank=dist.rank,
            world_size=dist.world_size,
            shared_clock=dist.one_host,
            host=host,
        )
        reduce = torch_reducer(self.rt.sync_group)
        return reduce_summaries(local, rank=dist.rank, world_size=dist.world_size, reduce=reduce)

    def analyse(
        self, timings: WindowTimings, host: HostTimings
    ) -> tuple[WindowAggregate, Timeline | None]:
        """The reduced window, and every rank's intervals on rank 0 when a trace is wanted."""
        agg = self.aggregate(timings, host)
        if not self.rt.collect_timeline:
            return agg, None
        mine = RankTimeline(
            rank=self.rt.dist.rank,
            starts_ns=np.asarray(timings.starts_ns, dtype=np.int64),
            ends_ns=np.asarray(timings.ends_ns, dtype=np.int64),
            present=np.asarray(timings.present, dtype=bool),
            clock=timings.clock,
            activities=timings.activities,  # CUPTI with --trace only
        )
        # One object per rank, blocks x iterations each: only asked for with --trace/--plot.
        gathered: list[Any] = [None] * self.rt.dist.world_size
        tdist.all_gather_object(gathered, mine, group=self.rt.sync_group)
        if self.rt.dist.rank != 0:
            return agg, None
        lanes = self.pattern.lanes
        return agg, Timeline(
            pattern=self.pattern.name,
            block_names=tuple(self.names),
            block_lanes=tuple(lanes[i] for i in self.lane_of_block),
            ranks=tuple(sorted(gathered, key=lambda r: r.rank)),
            shared_clock=self.rt.dist.one_host and timings.host_clock,
            block_categories=tuple(c.category for c in self.classes),
            backend=self.rt.dist.backend,
        )

    def rank_steps(self, timings: WindowTimings) -> np.ndarray:
        """(world, iters): every rank's makespan per iteration (ns), on every rank."""
        mine = fidelity.rank_steps(timings, self.rt.dist.rank, self.rt.dist.world_size)
        return torch_reducer(self.rt.sync_group)(mine, "sum")

    def check(self) -> np.ndarray:
        wrong = np.zeros(len(self.names))
        for block in self.blocks:
            if block is not None:
                block.prepare_check()
        self.window(self.lanes(), 1, self.present, timed=False)
        if self.rt.dist.is_cuda:
            torch.cuda.synchronize(self.rt.dist.device)
        for i, block in enumerate(self.blocks):
            if block is not None:
                try:
                    wrong[i] = block.verify()
                except Exception as exc:
                    raise RunError(
                        f"verify failed: {type(exc).__name__}: {exc}", block=self.names[i]
                    ) from exc
        return torch_reducer(self.rt.sync_group)(wrong, "sum")

    def capture(self) -> None:
        """CUDA-graph mode: capture every block's launch (after the eager warmup)."""
        self.captured = capture_blocks(
            self.lanes(), self.names, [b.op for b in self.pattern.blocks], self.rt.dist.device
        )

    def teardown(self, *, failed: bool) -> None:
        """Free the pattern's graphs, blocks and buffers once the device is done with them (after
        a failure within :func:`agreement.grace_s`: an aborted collective ends at once). Work
        still running then keeps its buffers; the runtime is marked wedged (a synchronize would
        never return) and the rank leaves after saving."""
        if self.rt.wedged:
            return  # NCCL kernels still hold the buffers; the process leaves without freeing
        cuda = self.rt.dist.is_cuda
        # Nothing may still use the buffers when their pools are deregistered and freed.
        if cuda and failed:
            drain_s = grace_s(self.rt.suite.timeout_s)
            if not self.rt.executor.drained(list(self.rt.streams.values()), drain_s):
                self.rt.wedged = True
                log.error(
                    "rank %d: device work of pattern %s still running %g s after it failed; "
                    "leaving without freeing its buffers",
                    self.rt.dist.rank,
                    self.pattern.name,
                    drain_s,
                )
                return
        elif cuda:
            torch.cuda.synchronize(self.rt.dist.device)  # every stream, NCCL's own too
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


def measure_pattern(rt: Runtime, pattern: PatternSpec) -> PatternOutcome:
    """Run every phase of one pattern on this rank and return the aggregated outcome."""
    name = pattern.name
    run = PatternRun(rt, pattern)
    failed = False
    try:
        _phase(rt, "setup", name, run.setup)
        lanes = run.lanes()

        def measure() -> tuple[WindowTimings, HostTimings]:
            nonlocal lanes
            run.warmup(lanes, run.present)
            if pattern.graph and pattern.warmup_iters == 0:
                run.window(lanes, 1, run.present, timed=False)  # communicators exist before capture
            if pattern.graph:
                # Eager warmup first (communicators, library handles), then capture, then a
                # warmup of the replays, which sizes the gate for them. The measured window
                # starts after all of it: capture and warmups never reach the numbers.
                run.capture()
                lanes = run.lanes()
                run.warmup(lanes, run.present)
            return run.window(lanes, pattern.num_iters, run.timed, timed=True)

        timings, host = _phase(rt, "measure", name, measure)
        agg, timeline = _phase(rt, "analysis", name, lambda: run.analyse(timings, host))
        steps = None
        if fidelity.has_traced(pattern):  # an imported step reports every rank's makespan
            steps = _phase(rt, "analysis", name, lambda: run.rank_steps(timings))
        isolated = Isolated.unmeasured(len(run.names))
        if pattern.baseline and len(run.names) > 1:

            def baseline() -> Isolated:
                rows = np.full((len(run.names), pattern.num_iters), np.nan)
                started_s = time.monotonic()
                for b in range(len(run.names)):
                    if rt.note is not None:
                        left_s = estimate_left_s(b, len(run.names), time.monotonic() - started_s)
                        left = "" if left_s is None else f", left ~{left_s:.1f} s"
                        rt.note(f"{name}: baseline, block {b + 1} of {len(run.names)}{left}")
                    if run.idle[b] is not None:
                        continue  # nothing to time (the same on every rank)
                    only = np.zeros(len(run.names), dtype=bool)
                    only[b] = run.timed[b]
                    lanes_b = run.lanes(only=b)
                    # On CUDA a block alone that talks to no other rank needs no cross-rank
                    # start: its iterations follow each other on the device, each after its
                    # gate spin, with no host barrier or alignment collective between them. On
                    # CPU its lane would then run warm where the pattern's ran after a wait.
                    sync = "none" if rt.dist.is_cuda and not run.is_comm[b] else None
                    run.warmup(lanes_b, only, sync)
                    t_b, host_b = run.window(
                        lanes_b, pattern.num_iters, only, timed=True, sync=sync
                    )
                    rows[b] = run.aggregate(t_b, host_b).latency_ns[b]
                return Isolated(latency_ns=rows)

            isolated = _phase(rt, "baseline", name, baseline)
        wrong = None
        if pattern.check:
            wrong = _phase(rt, "check", name, run.check)
        peak = None
        if rt.dist.is_cuda:
            peak_local = np.array([float(torch.cuda.max_memory_allocated(rt.dist.device))])
            peak = int(torch_reducer(rt.sync_group)(peak_local, "max")[0])
    except RunError as err:
        failed = True
        if not err.contained:
            # Some ranks may have collectives in flight that their peers will never join:
            # abort the communicators before teardown waits on them.
            rt.wedged = not rt.comms.abort()
        raise
    finally:
        run.teardown(failed=failed)
    outcome = build_outcome(
        rt.suite,
        pattern,
        run.classes,
        agg,
        isolated,
        wrong,
        peak,
        profiler=rt.profiler.name,
        team_sizes=[rt.comms.axis(b.axis).team_size for b in pattern.blocks],
        notes=run.notes,
        ranks_per_gpu=rt.dist.ranks_per_gpu,
    )
    if steps is not None:
        kernels = main_kernel_names(timings.activities, len(run.names))
        outcome = fidelity.with_fidelity(outcome, pattern, agg, steps, kernels)
    if timeline is not None:
        outcome = dataclasses.replace(outcome, timeline=timeline)
    return outcome
