"""One profiler step of one rank: its device work as items (a collective, a GEMM, or one other
kernel/copy) per CUDA stream, each tied to the host call that launched it."""

from __future__ import annotations

import bisect
import dataclasses
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ...blocks.base import Block, TracedCall
from ...blocks.comm import AllToAll, SendRecv
from ...blocks.compute import Gemm
from ...blocks.dtypes import DTYPES, traced_dtype
from ...blocks.registry import traced_op
from .kineto import Activity, CommRecord, Launch, RankTrace, ShapedOp, Span, TraceError

_LAUNCHING = re.compile(r"Launch|Memcpy|Memset", re.IGNORECASE)
"""Host calls that put work on the device (a call of a step without its activity means the
trace ended before that work ran)."""
CLOCK_TOLERANCE_US = 1.0
"""Timestamps of one device may disagree by this much (clock conversion and rounding)."""
OVERLAP_US = 20.0
"""Kernels of one stream overlapping by less are in order: older CUPTI releases' timestamps of
one stream overlap by several µs (docs/replay.md); more is a broken trace."""
LAUNCH_SKEW_US = 1000.0
"""A kernel may start at most this long before the host call that launched it (the profiler's
host and device clocks disagree by µs); earlier is a broken trace."""
Meaning = tuple[CommRecord, ...] | ShapedOp | str
"""What a step's item is: the collective or p2p calls it runs, a GEMM op, or another op's name."""
MARKER_NAMES = frozenset({"wait", "coalesced", "startCoalescing", "endCoalescing", ""})
"""Records that mark a point of a call and launch nothing of their own."""
_OTHER_SIZES = {"Short": 2, "short int": 2, "ComplexFloat": 8, "ComplexDouble": 16}


def maestro_dtype(torch_name: str) -> tuple[str, int, str | None]:
    """(maestro dtype, element bytes, note) for a traced dtype; a type maestro lacks gets one
    of the same element size (bytes stay exact) and a note saying so."""
    found = traced_dtype(torch_name)
    if found is not None:
        return found.name, found.size_bytes, None
    bare = torch_name.removeprefix("c10::")
    size = _OTHER_SIZES.get(bare, 1)  # Float8 and the unknown: 1
    widest = max(d.size_bytes for d in DTYPES.values())
    stand_in = next(d.name for d in DTYPES.values() if d.size_bytes == min(size, widest))
    known = "" if bare in _OTHER_SIZES or "Float8" in torch_name else " (unknown)"
    note = f"dtype {torch_name!r}{known} replayed as {stand_in}, its bytes as traced"
    return stand_in, size, note


def comm_call(rec: CommRecord, team_size: int) -> TracedCall:
    """A ``record_param_comms`` record as a call (element counts in the dtype's elements)."""
    dtype, elem, _ = maestro_dtype(rec.dtype)
    root = rec.peer if rec.peer is not None and 0 <= rec.peer < team_size else 0
    return TracedCall(
        name=rec.name,
        dtype=dtype,
        elem_bytes=elem,
        in_elems=max(rec.in_nelems, 0),
        out_elems=max(rec.out_nelems, 0),
        team_size=team_size,
        root=root,
        splits=rec.in_splits,
    )


@dataclass(kw_only=True)
class Item:
    """Device work of one traced call on one stream of one rank (times in µs, device clock)."""

    index: int
    """Position in the rank's launch order."""
    stream: int
    start: float
    end: float
    busy_us: float
    launch: float
    kind: str
    """``comm`` (a collective), ``p2p``, ``gemm`` or ``other`` (merged into stand-ins)."""
    label: str
    """The innermost annotation around the launch ('' when none)."""
    opname: str
    signature: tuple
    block: type[Block] | None = None
    """The block replaying it (a collective or a GEMM; None: a stand-in's kernel)."""
    params: dict = field(default_factory=dict)
    dtype: str = ""
    kernel: str = ""
    """Its longest kernel's name."""
    group: str = ""
    seq: int | None = None
    """The group's sequence number of a collective (``Seq``; None: not traced)."""
    sends: tuple[tuple[int, int], ...] = ()
    """Point-to-point transfers of one NCCL launch: (peer global rank, bytes) each way."""
    recvs: tuple[tuple[int, int], ...] = ()
    note: str | None = None


@dataclass(kw_only=True)
class RankStep:
    """One rank's step: its items per stream in stream order, and what the deps need."""

    trace: RankTrace
    items: list[Item]
    streams: dict[int, list[Item]]
    start: float
    end: float
    launches: list[Launch] = field(default_factory=list)
    """Host calls of the step in time order (launches, event records, waits, syncs)."""
    launch_items: dict[int, Item] = field(default_factory=dict)
    """Correlation id of a launch -> the item its device work belongs to."""

    @property
    def rank(self) -> int:
        return self.trace.rank

    @property
    def program(self) -> dict[int, tuple]:
        """Its work, stream by stream: what another rank or step must match item for item."""
        return {s: tuple(it.signature for it in items) for s, items in self.streams.items()}


MAX_MISSING_SHARE = 0.1
"""A step may lack the device work of at most this share of its launches (of the kinds CUPTI
records in some step; real traces lack a few): past it, idle gaps would fill the holes: refused."""
WHOLE = "the whole trace"
"""The step of a trace without ProfilerStep#N: the whole profiled span with device work."""


def step_number(name: str) -> int:
    tail = name.rpartition("#")[2]
    return int(tail) if tail.isdigit() else -1


def set_windows(trace: RankTrace, annotation: str | None) -> None:
    """The trace's steps: ``annotation``'s spans (``NAME#0``, ``NAME#1``... in time order) when
    one is named, else its ProfilerStep#N spans, else the whole profiled span with device work."""
    if annotation is not None:
        spans = sorted((a for a in trace.annotations if a.name == annotation), key=lambda a: a.ts)
        trace.steps = [Span(f"{annotation}#{i}", a.ts, a.end, a.tid) for i, a in enumerate(spans)]
        if not trace.steps:
            names = sorted({a.name for a in trace.annotations})[:8]
            raise TraceError(f"{trace.path}: no record_function span named {annotation!r} "
                             f"(--annotation); it has {', '.join(map(repr, names))}, ...")  # fmt: skip
    elif not trace.steps:
        calls = [c for c in trace.launches.values() if c.corr in trace.activities]
        if not calls:
            raise TraceError(f"{trace.path}: no device work in the trace: nothing to replay")
        first = min(calls, key=lambda c: c.ts)
        trace.steps = [Span(WHOLE, first.ts, max(c.end for c in calls), first.tid)]


class Census:
    """Launches without device work, per step, of the kinds (call names) CUPTI recorded device
    work for in some step; kinds it recorded in no step are ignored."""

    def __init__(self, trace: RankTrace) -> None:
        calls = [c for c in trace.launches.values() if _LAUNCHING.search(c.name)]
        times = [c.ts for c in calls]
        self.missing: dict[str, Counter] = {}
        self.launches: dict[str, int] = {}
        share: dict[str, dict[str, float]] = defaultdict(dict)
        for span in trace.steps:
            inside = calls[
                bisect.bisect_left(times, span.ts) : bisect.bisect_right(times, span.end)
            ]
            total = Counter(c.name for c in inside)
            self.missing[span.name] = Counter(
                c.name for c in inside if c.corr not in trace.activities
            )
            self.launches[span.name] = len(inside) - sum(self.missing[span.name].values())
            for kind, n in total.items():
                share[kind][span.name] = 1 - self.missing[span.name][kind] / n
        self.ignored = sorted(kind for kind, by in share.items() if not any(by.values()))
        # A step is complete when each counted kind has its device work as often as the median
        # step of the trace does (the last steps may be cut by the profiler's stop).
        self.complete = {
            span.name
            for span in trace.steps
            if self.launches[span.name]
            and all(
                by.get(span.name, 1.0) >= statistics.median(by.values())
                for kind, by in share.items()
                if kind not in self.ignored
            )
        }

    def counted(self, step: str) -> Counter:
        """The step's launches without device work, of the kinds that count."""
        return Counter({k: n for k, n in self.missing[step].items() if k not in self.ignored})


def _listed(traces: Sequence[RankTrace], complete: dict[int, set[str]]) -> str:
    return "; ".join(
        f"rank {t.rank}: {', '.join(sorted(complete[t.rank], key=step_number)) or 'none'}"
        for t in traces
    )


def choose_steps(
    traces: Sequence[RankTrace], census: dict[int, Census], wanted: int | None, what: str
) -> list[str]:
    """The steps to import: ``what#wanted``, else every step complete on every rank (the last
    first); ``what`` is ``ProfilerStep`` or the annotation that makes the steps."""
    complete = {rank: c.complete for rank, c in census.items()}
    if wanted is not None:
        name = f"{what}#{wanted}"
        for t in traces:
            names = sorted({s.name for s in t.steps}, key=step_number)
            if name not in names:
                raise TraceError(
                    f"{t.path}: rank {t.rank} has no {name} (it has: {', '.join(names)})"
                )
        return [name]
    common = set.intersection(*complete.values())
    if not common:
        raise TraceError(
            "no step is complete on every rank (a complete step has device work for its launches "
            f"as often as the trace's other steps do); complete steps: {_listed(traces, complete)}"
            "; name one with --step N"
        )
    return sorted(common, key=step_number, reverse=True)


def check_missing(census: Census, trace: RankTrace, step: str) -> None:
    """Refuse a step lacking device work for more than :data:`MAX_MISSING_SHARE` of its
    launches; fewer are named in the header."""
    missing = census.counted(step)
    launches = census.launches[step] + sum(missing.values())
    if sum(missing.values()) > MAX_MISSING_SHARE * launches:
        shown = ", ".join(f"{k} x{n}" for k, n in missing.most_common(3))
        raise TraceError(
            f"{trace.path}: rank {trace.rank}'s {step}: {sum(missing.values())} of its {launches} "
            f"launches have no device work in the trace ({shown}), over {MAX_MISSING_SHARE:.0%}: "
            "the profiler lost device records; profile again, or pick a step with --step N"
        )


def step_span(trace: RankTrace, name: str) -> Span:
    """The longest span of step ``name`` on this rank."""
    return max((s for s in trace.steps if s.name == name), key=lambda s: s.end - s.ts)


def innermost(spans: Sequence[Span], queries: Iterable[tuple[int, float]]) -> dict[float, str]:
    """For each (tid, ts), the name of the innermost span of that thread around ts."""
    by_tid: dict[int, list[Span]] = defaultdict(list)
    for s in sorted(spans, key=lambda s: (s.ts, -s.end)):
        by_tid[s.tid].append(s)
    starts = {tid: [s.ts for s in group] for tid, group in by_tid.items()}
    out: dict[float, str] = {}
    for tid, ts in queries:
        group = by_tid.get(tid, [])
        # Spans are nested: the innermost one around ts started last among those that hold ts.
        last = bisect.bisect_right(starts.get(tid, []), ts) - 1
        out[ts] = next((group[i].name for i in range(last, -1, -1) if group[i].end >= ts), "")
    return out


class _Owner:
    """What launched a device activity: a collective/p2p call, a GEMM op, or anything else."""

    def __init__(self, trace: RankTrace, calls: list[Launch]) -> None:
        self.trace = trace
        usable = {ext: r for ext, r in trace.comms.items() if r.name not in MARKER_NAMES}
        self.direct = {c.ext for c in calls if c.ext in usable and c.corr in trace.activities}
        self.pending: dict[int, list[CommRecord]] = defaultdict(list)
        others = (r for r in usable.values() if r.ext not in self.direct)
        self.records = sorted(others, key=lambda r: r.ts)
        self.cursor = 0

    def comm_records(self, call: Launch, nccl: bool) -> tuple[CommRecord, ...]:
        """The records a launch belongs to: its own, or (an NCCL kernel launched for calls
        that had none, as batched send/recv) the records issued since the last NCCL launch."""
        # Records without their own kernel, up to this call, wait for the next NCCL launch.
        while self.cursor < len(self.records) and self.records[self.cursor].ts <= call.ts:
            rec = self.records[self.cursor]
            self.pending[rec.tid].append(rec)
            self.cursor += 1
        if call.ext in self.direct:
            # A batch (batch_isend_irecv, coalesced calls) may launch under its last record:
            # the records before it, of the same kind, are part of it; others launched nothing.
            own = self.trace.comms[call.ext]
            batch = (own.group_name, traced_op(own.name))
            earlier = self.pending.pop(call.tid, [])
            same = [r for r in earlier if batch[1] and (r.group_name, traced_op(r.name)) == batch]
            return (*same, own)
        return tuple(self.pending.pop(call.tid, ())) if nccl else ()


def build_step(trace: RankTrace, name: str, group_sizes: dict[str, int]) -> RankStep:
    """The items of step ``name`` of one rank; ``group_sizes`` gives each group's size."""
    span = step_span(trace, name)
    calls = [c for c in trace.launches.values() if span.ts <= c.ts <= span.end]
    # Each call's innermost annotation, and its innermost nccl:<op> span (an NCCL kernel
    # without its collective's record takes its op from it).
    spans = [[a for a in trace.annotations if a.name.startswith("nccl:") == n] for n in (0, 1)]
    labels, nccl = (innermost(group, ((c.tid, c.ts) for c in calls)) for group in spans)
    groups = _grouped(trace, calls, nccl)
    ordered = sorted(groups.values(), key=lambda g: g[1][0][0].ts)
    items = [_item(i, *group, labels, group_sizes) for i, group in enumerate(ordered)]
    if not items:
        raise TraceError(
            f"{trace.path}: rank {trace.rank}'s {name} launched no device work (complete "
            f"steps: {_listed([trace], {trace.rank: Census(trace).complete})})"
        )
    _check_times([pair for _, parts in groups.values() for pair in parts], trace)
    streams: dict[int, list[Item]] = defaultdict(list)
    for item in sorted(items, key=lambda it: (it.start, it.index)):
        streams[item.stream].append(item)
    return RankStep(
        trace=trace,
        items=items,
        streams=dict(streams),
        start=min(i.start for i in items),
        end=max(i.end for i in items),
        launches=calls,
        launch_items={
            call.corr: items[i] for i, (_, parts) in enumerate(ordered) for call, _ in parts
        },
    )


def _grouped(
    trace: RankTrace,
    calls: list[Launch],
    nccl_ops: dict[float, str],
) -> dict[tuple, tuple[Meaning, list[tuple[Launch, Activity]]]]:
    """The step's device work by item (one key per GEMM, collective call or kernel run), in
    launch order: what the item is, and its (launch, activity) pairs."""
    owner = _Owner(trace, calls)
    groups: dict[tuple, tuple[Meaning, list[tuple[Launch, Activity]]]] = {}
    for call in calls:
        for act in trace.activities.get(call.corr, ()):
            nccl = "nccl" in act.name[:16].lower()  # ncclDevKernel_*, ncclKernel_*
            records = owner.comm_records(call, nccl)
            op = trace.gemms.get(call.ext)
            meaning: Meaning
            key: tuple = ("other", act.stream, call.corr, act.ts)
            if records:
                key, meaning = ("comm", act.stream, tuple(r.ext for r in records)), records
            elif nccl:  # older torch writes record_param_comms without a name or sizes
                meaning = nccl_ops.get(call.ts) or "nccl"  # nccl:all_reduce
            elif op is not None:
                key, meaning = ("gemm", act.stream, call.ext), op
            else:
                meaning = trace.op_names.get(call.ext) or act.name
            groups.setdefault(key, (meaning, []))[1].append((call, act))
    return groups


def _check_times(parts: list[tuple[Launch, Activity]], trace: RankTrace) -> None:
    by_stream: dict[int, list[Activity]] = defaultdict(list)
    for call, act in parts:
        if act.ts < call.ts - LAUNCH_SKEW_US:
            raise TraceError(
                f"{trace.path}: {act.name!r} (stream {act.stream}) starts "
                f"{(call.ts - act.ts) / 1e6:.3g} s before the call that launched it: the trace is "
                "broken"
            )
        by_stream[act.stream].append(act)
    for stream, acts in by_stream.items():
        acts.sort(key=lambda a: (a.ts, a.end))
        for a, b in zip(acts, acts[1:], strict=False):
            if b.ts < a.end - OVERLAP_US:
                raise TraceError(
                    f"{trace.path}: {b.name!r} starts {a.end - b.ts:.1f} µs before {a.name!r} "
                    f"ends, and both ran on stream {stream}: kernels of one stream cannot "
                    "overlap (the trace is broken)"
                )


def _item(
    index: int,
    meaning: Meaning,
    parts: list[tuple[Launch, Activity]],
    labels: dict[float, str],
    sizes: dict[str, int],
) -> Item:
    first_call = min((c for c, _ in parts), key=lambda c: c.ts)
    item = Item(
        index=index,
        stream=parts[0][1].stream,
        start=min(a.ts for _, a in parts),
        end=max(a.end for _, a in parts),
        busy_us=sum(a.end - a.ts for _, a in parts),
        launch=first_call.ts,
        kind="other",
        label=labels.get(first_call.ts, ""),
        opname=meaning if isinstance(meaning, str) else "",
        signature=("other", parts[0][1].name),
        kernel=max((a for _, a in parts), key=lambda a: a.end - a.ts).name,
    )
    if isinstance(meaning, tuple):
        _comm_item(item, meaning, sizes)
    elif isinstance(meaning, ShapedOp):
        op = meaning
        item.opname = op.name.removeprefix("aten::")
        types = [t for t in op.types if t]
        dtype, _, note = maestro_dtype(types[0]) if types else ("fp32", 4, None)
        kernels = tuple(a.name for _, a in parts)
        call = TracedCall(
            name=op.name, dtype=dtype, dims=op.dims, strides=op.strides, kernels=kernels
        )
        found = Gemm.traced_params(call)
        if found is None:
            item.note = "gemm-shapes"
        else:
            item.kind, item.block, item.params, item.dtype = "gemm", Gemm, found[0], call.dtype
            item.note = found[1] or note
            item.signature = ("gemm", *(found[0][d] for d in "mnk"), call.dtype)
    return item


def _comm_item(item: Item, records: tuple[CommRecord, ...], sizes: dict[str, int]) -> None:
    rec = records[0]
    item.group, item.seq = rec.group_name, rec.seq
    team = sizes.get(rec.group_name) or len(rec.group_ranks) or 1
    classes = {traced_op(r.name) for r in records}
    if classes == {SendRecv}:
        item.kind, item.opname = "p2p", SendRecv.op
        _p2p(item, records)
        item.signature = ("p2p", rec.group_desc, team, tuple(sorted(r.name for r in records)))
        return
    cls = classes.pop() if len(classes) == 1 else None
    if cls is None or cls.category != "comm":
        names = sorted({r.name for r in records})
        item.opname = names[0]
        what = ", ".join(names)
        item.note = (
            f"coalesced collectives of different kinds ({what})"
            if None not in classes and cls is None
            else f"collective {what} has no maestro op"
        )
        return
    calls = [comm_call(r, team) for r in records]
    call = calls[0]
    if len(calls) > 1:  # coalesced calls of one kernel: one block of their summed bytes
        in_bytes = sum(c.in_elems * c.elem_bytes for c in calls)
        out_bytes = sum(c.out_elems * c.elem_bytes for c in calls)
        call = dataclasses.replace(call, elem_bytes=1, in_elems=in_bytes, out_elems=out_bytes)
    item.params, note = cls.traced_params(call)
    item.kind, item.opname, item.block, item.dtype = "comm", cls.op, cls, call.dtype
    item.note = "; ".join(n for n in (maestro_dtype(rec.dtype)[2], note) if n) or None
    size_key = None if cls is AllToAll else cls.message_size_bytes(item.params)
    item.signature = ("comm", cls.op, rec.group_desc, team, size_key, item.dtype)


def _p2p(item: Item, records: tuple[CommRecord, ...]) -> None:
    for rec in records:
        item.dtype, elem, _ = maestro_dtype(rec.dtype)
        peer = rec.peer if rec.peer is not None else -1
        glob = rec.group_ranks[peer] if 0 <= peer < len(rec.group_ranks) else peer
        transfer = ((glob, rec.in_nelems * elem),)
        if rec.name == "send":
            item.sends += transfer
        else:
            item.recvs += transfer
