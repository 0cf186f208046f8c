"""Read one torch.profiler (Kineto) chrome trace into compact records, streaming: ``json.load``
builds several times a trace's size in Python objects (BENCHMARKS.md), so the top-level object is
walked by hand and each event of ``traceEvents`` is decoded alone, reduced to what we read, and
dropped. Every number read is typed and bounded before use."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
import stat
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ...blocks.comm import SendRecv
from ...blocks.compute import Gemm
from ...blocks.dtypes import traced_dtype
from ...blocks.registry import traced_op
from ...errors import MaestroError

CHUNK_CHARS = 1 << 22
"""Characters read from the file at a time (4 Mi): large enough to amortise the reads."""

GEMM_OPS = frozenset(Gemm.trace_names)
"""CPU ops whose ``Input Dims`` give a GEMM's m, n and k."""
GEMM_KERNEL = re.compile(r"gemm|nvjet|Cijk_|cutlass|xmma|_hmma|_s\d+gemm", re.IGNORECASE)
"""Kernel names of cuBLAS, cuBLASLt, CUTLASS and rocBLAS/hipBLASLt GEMMs (a trace without
shapes still names them)."""

MAX_DURATION_US = 3.6e9
"""An hour: no kernel, call or profiled step lasts longer; a longer duration is a broken trace."""
MAX_TIMESTAMP_US = float(2**53)
"""Past 2**53 µs (year 2255 since the epoch) a float64 timestamp is no longer exact to the µs."""
MAX_RANKS = 1 << 20
"""World sizes and ranks are bounded before use: no job has a million ranks, and a larger
number read from a file would size sets and teams."""
MAX_ELEMENTS = 1 << 48
"""A message of more elements (256 TiB of bytes) is not a real collective's."""

_KEPT_CALLS = re.compile(r"Launch|Memcpy|Memset|Prefetch|EventRecord|WaitEvent|Synchronize")
"""Runtime and driver calls that launch device work or order it (the others are not kept)."""
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
OLD_CATS = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset",
            "Runtime": "cuda_runtime", "Driver": "cuda_driver", "Operator": "cpu_op"}  # fmt: skip
"""Category names of torch's first Kineto traces (1.8-1.9), as later releases write them."""


class TraceError(MaestroError, ValueError):
    """A trace file cannot be imported: names the file and what is wrong (exit status 2)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """A CUDA runtime or driver call on the host: launches, event records, waits, syncs."""

    corr: int
    ts: float
    end: float
    tid: int
    ext: int | None
    name: str


@dataclass(frozen=True, slots=True)
class Activity:
    """A kernel, memcpy or memset on the device."""

    corr: int
    stream: int
    ts: float
    end: float
    name: str


@dataclass(frozen=True, slots=True)
class Span:
    """A CPU-side annotation (``user_annotation``) or op: name and interval on one thread."""

    name: str
    ts: float
    end: float
    tid: int


@dataclass(frozen=True, slots=True)
class CommRecord:
    """A ``record_param_comms`` op: one collective or point-to-point call."""

    ext: int
    ts: float
    tid: int
    name: str
    in_nelems: int
    out_nelems: int
    dtype: str
    group_name: str
    group_desc: str
    group_ranks: tuple[int, ...]
    peer: int | None
    """``Rank`` of the record: the peer's group rank for send/recv, the root for
    broadcast/reduce, this rank's group rank otherwise."""
    in_splits: tuple[int, ...]
    seq: int | None = None
    """The process group's sequence number of the call (``Seq``, newer torch), the same on
    every rank of the group."""


@dataclass(frozen=True, slots=True)
class ShapedOp:
    """A GEMM or c10d op with its input shapes and types (empty without ``record_shapes``)."""

    name: str
    dims: tuple[tuple[int, ...], ...]
    types: tuple[str, ...]
    strides: tuple[tuple[int, ...], ...] = ()
    """``Input Strides``, one per entry of ``dims`` (empty when the trace has none)."""


@dataclass(frozen=True, slots=True)
class SyncEvent:
    """A ``cuda_sync`` event: a stream waiting for an event, or the host waiting."""

    kind: str
    stream: int
    corr: int
    ts: float


@dataclass(frozen=True, kw_only=True)
class ProcessGroup:
    """One entry of ``distributedInfo.pg_config``."""

    name: str
    desc: str
    ranks: tuple[int, ...]


@dataclass(kw_only=True)
class RankTrace:
    """What the importer keeps of one rank's trace file."""

    path: str
    rank: int = 0
    world_size: int | None = 1
    """None: the file names a rank but no world size."""
    distributed: bool = False
    groups: tuple[ProcessGroup, ...] = ()
    device: str = ""
    base_time_us: float = 0.0
    steps: list[Span] = field(default_factory=list)
    annotations: list[Span] = field(default_factory=list)
    op_names: dict[int, str] = field(default_factory=dict)
    launches: dict[int, Launch] = field(default_factory=dict)
    """By correlation id, in time order."""
    activities: dict[int, list[Activity]] = field(default_factory=dict)
    """By the correlation id of the call that launched them."""
    comms: dict[int, CommRecord] = field(default_factory=dict)
    gemms: dict[int, ShapedOp] = field(default_factory=dict)
    syncs: list[SyncEvent] = field(default_factory=list)
    group_trace_id: str = ""
    """The id a multi-rank profiling request gives every rank (``group_trace_id``); each rank's
    own ``trace_id`` is drawn per process, so it differs between the ranks of one run."""


_WS = re.compile(r"[ \t\n\r]*")


class _Stream:
    """A text buffer over a file, refilled as the decoder walks it."""

    def __init__(self, handle: IO[str], path: str) -> None:
        self.handle = handle
        self.path = path
        self.buf = ""
        self.pos = 0
        self.decoder = json.JSONDecoder()

    def _fill(self) -> bool:
        more = self.handle.read(CHUNK_CHARS)
        if more:
            self.buf, self.pos = self.buf[self.pos :] + more, 0
        return bool(more)

    def peek(self) -> str:
        """The next non-blank character ('' at the end of the file)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                return ""

    def expect(self, chars: str) -> str:
        char = self.peek()
        if not char or char not in chars:
            found = repr(char) if char else "the end of the file"
            raise TraceError(
                f"{self.path}: not JSON as torch.profiler writes it: expected one of "
                f"{' '.join(repr(c) for c in chars)}, found {found}"
            )
        self.pos += 1
        return char

    def value(self) -> Any:
        """Decode the JSON value at the cursor, reading more of the file while it is cut."""
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise TraceError(
                    f"{self.path}: invalid JSON: nested deeper than Python's decoder goes "
                    "(a torch.profiler trace nests a few levels)"
                ) from None
            except ValueError as err:  # no JSON error: a number of over 4300 digits
                if not isinstance(err, json.JSONDecodeError):
                    raise TraceError(f"{self.path}: invalid JSON: {err}") from None
                if not self._fill():
                    raise TraceError(
                        f"{self.path}: not valid JSON ({err.msg} near character "
                        f"{err.pos}); the file may be cut short"
                    ) from None
                continue
            cut = end == len(self.buf) and not isinstance(value, dict | list)
            if cut and self._fill():
                continue  # a number or literal may go on in the next chunk: decode it again
            self.pos = end
            return value


def _walk(stream: _Stream, on_key: Callable[[str, Any], None], on_event: Callable) -> None:
    """Walk the top-level object: ``on_event`` for each trace event, ``on_key`` for the rest."""
    if stream.peek() != "{":
        raise TraceError(
            f"{stream.path}: not a torch.profiler (Kineto) trace: the file is not a JSON object"
        )
    stream.expect("{")
    done = stream.peek() == "}" and stream.expect("}")
    while not done:
        key = stream.value()
        stream.expect(":")
        if key == "traceEvents":
            stream.expect("[")
            ended = stream.peek() == "]" and stream.expect("]")
            while not ended:
                event = stream.value()
                if isinstance(event, dict):
                    on_event(event)
                ended = stream.expect(",]") == "]"
            on_key(key, None)
        else:
            on_key(key, stream.value())
        done = stream.expect(",}") == "}"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def shown(value: Any) -> str:
    """A value read from a file, as a message shows it: its repr, cut to 40 characters (the
    decoder refuses integers of over 4300 digits, so every repr can be made)."""
    return repr(value)[:40]


def _ranks(text: Any) -> tuple[int, ...]:
    if isinstance(text, list):
        return tuple(int(r) for r in text if isinstance(r, int))
    if isinstance(text, str):
        return tuple(int(t) for t in re.findall(r"-?\d+", text))
    return ()


class _Collector:
    def __init__(self, trace: RankTrace) -> None:
        self.t = trace
        self.saw_kineto = False
        self.saw_events = False
        self.c10d: dict[int, tuple[Span, ShapedOp]] = {}
        """The last ``c10d::`` op of each thread (old traces' collectives are sized by it)."""

    def event(self, ev: dict[str, Any]) -> None:
        cat = ev.get("cat")
        cat = OLD_CATS.get(cat, cat) if isinstance(cat, str) else None
        handler = _HANDLERS.get(cat) if ev.get("ph") == "X" and cat else None
        if handler is None:
            return
        self.saw_kineto |= cat not in ("user_annotation", "cuda_sync")
        try:
            handler(self, {**ev, "cat": cat}, ev.get("args") or {})
        except TraceError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            raise TraceError(
                f"{self.t.path}: event {ev.get('name', '?')!r} ({cat}) lacks a field torch.profiler writes: "
                f"{type(err).__name__}: {err}"
            ) from None

    def time(self, ev: dict[str, Any], key: str, default: float | None = None) -> float:
        """``ev[key]`` (a timestamp or duration in µs), refused naming the event when it cannot
        be one: not a number, negative, infinite, or absurd."""
        value = ev.get(key, default) if default is not None else ev[key]
        typed = isinstance(value, int | float) and not isinstance(value, bool)
        try:
            number = float(value) if typed else math.nan
        except OverflowError:  # an integer past float's range
            number = math.inf
        limit = MAX_DURATION_US if key == "dur" else MAX_TIMESTAMP_US
        if 0 <= number <= limit:  # NaN fails too
            return number
        why = next(text for bad, text in (
            (not typed, "not a number (a JSON number of µs)"),
            (math.isnan(number), "not a number"),
            (number < 0, "negative: a trace's times and durations are 0 or more"),
            (math.isinf(number), "not finite"),
            (key == "dur", f"longer than an hour ({limit:g} µs): no kernel, call or step lasts that long"),
            (True, f"beyond {limit:g} µs, where µs are no longer exact"),
        ) if bad)  # fmt: skip
        cat = ev.get("cat", "?")
        stream = (ev.get("args") or {}).get("stream") if cat in DEVICE_CATS else None
        where = f"{cat}, stream {stream}" if stream is not None else cat
        raise TraceError(
            f"{self.t.path}: event {ev.get('name', '?')!r} ({where}) has {key} {shown(value)}: {why}; "
            "the trace is broken"
        )

    def annotation(self, ev: dict[str, Any], args: dict[str, Any]) -> None:
        ts = self.time(ev, "ts")
        span = Span(sys.intern(str(ev["name"])), ts, ts + self.time(ev, "dur"), int(ev["tid"]))
        if span.name.startswith("ProfilerStep#"):
            self.t.steps.append(span)
        else:
            self.t.annotations.append(span)

    def cpu_op(self, ev: dict[str, Any], args: dict[str, Any]) -> None:
        ext, name = _int_or_none(args.get("External id")), str(ev["name"])
        if name.startswith("ProfilerStep#"):  # an op in torch's first Kineto traces
            self.annotation(ev, args)
        if ext is None or name.startswith("ProfilerStep#"):
            return
        if name == "record_param_comms":
            self.comm(ev, args, ext)
            return
        self.t.op_names[ext] = sys.intern(name)
        if name not in GEMM_OPS and not name.startswith("c10d::"):
            return
        types = args.get("Input type")
        op = ShapedOp(
            name=sys.intern(name),
            dims=_shapes(args.get("Input Dims")),
            types=tuple(str(t) for t in types) if isinstance(types, list) else (),
            strides=_shapes(args.get("Input Strides")),
        )
        if name in GEMM_OPS:
            self.t.gemms[ext] = op
        else:
            ts, tid = self.time(ev, "ts"), int(ev["tid"])
            self.c10d[tid] = Span(op.name, ts, ts + self.time(ev, "dur"), tid), op

    def comm(self, ev: dict[str, Any], args: dict[str, Any], ext: int) -> None:
        rec = CommRecord(
            ext=ext,
            ts=self.time(ev, "ts"),
            tid=int(ev["tid"]),
            name=sys.intern(str(args.get("Collective name", ""))),
            in_nelems=self.count(args, "In msg nelems", "In msg size"),
            out_nelems=self.count(args, "Out msg nelems", "Out msg size"),
            dtype=sys.intern(str(args.get("dtype", ""))),
            group_name=sys.intern(str(args.get("Process Group Name", ""))),
            group_desc=sys.intern(str(args.get("Process Group Description", ""))),
            group_ranks=_ranks(args.get("Process Group Ranks")),
            peer=_int_or_none(args.get("Rank")),
            in_splits=_ranks(args.get("In split size")),
            seq=_int_or_none(args.get("Seq")),
        )
        span, op = self.c10d.get(rec.tid) or (None, None)
        if not rec.name and span and span.ts <= rec.ts <= span.end:
            rec = self.sized(rec, op)
        self.t.comms[ext] = rec

    def sized(self, rec: CommRecord, op: ShapedOp) -> CommRecord:
        """A record of older torch, without the collective's name or sizes, sized by the c10d
        op around it where that op's tensors were recorded: (output, input) for the ``*_base_``
        ops, one tensor both for the others; unchanged without them (a stand-in, then)."""
        name = op.name.removeprefix("c10d::").removesuffix("_")
        if len(op.dims) != len(op.types):  # an input's dims not a list: which is which is unknown
            return rec
        tensors = zip(op.dims, op.types, strict=True)
        sizes = [math.prod(d) if d and traced_dtype(t) else 0 for d, t in tensors]
        if traced_op(name) in (None, SendRecv) or not sizes or not sizes[0]:
            return rec
        out = ins = self.elements(sizes[0], f"{op.name} has a tensor of")
        if len(sizes) > 1 and sizes[1]:
            ins = self.elements(sizes[1], f"{op.name} has a tensor of")
        return dataclasses.replace(
            rec, name=sys.intern(name), in_nelems=ins, out_nelems=out, dtype=op.types[0]
        )

    def count(self, args: dict[str, Any], key: str, old_key: str) -> int:
        return self.elements(args.get(key, args.get(old_key)), f"record_param_comms has {key}")

    def elements(self, value: Any, what: str) -> int:
        """A message's element count (0 when not written), refused past :data:`MAX_ELEMENTS`;
        ``what``: where the file writes it."""
        value = value or 0
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ELEMENTS:
            raise TraceError(
                f"{self.t.path}: {what} {shown(value)}: expected a "
                f"whole number of elements from 0 to 2**48; the trace is broken"
            )
        return value

    def runtime(self, ev: dict[str, Any], args: dict[str, Any]) -> None:
        name = str(ev["name"])
        corr = _int_or_none(args.get("correlation"))
        if corr is None or not _KEPT_CALLS.search(name):
            return
        ts = self.time(ev, "ts")
        end, tid = ts + self.time(ev, "dur", 0.0), int(ev["tid"])
        ext = _int_or_none(args.get("External id"))
        self.t.launches[corr] = Launch(corr, ts, end, tid, ext, sys.intern(name))

    def device(self, ev: dict[str, Any], args: dict[str, Any]) -> None:
        ts = self.time(ev, "ts")
        corr, stream = int(args["correlation"]), int(args["stream"])
        end = ts + self.time(ev, "dur")
        activity = Activity(corr, stream, ts, end, sys.intern(str(ev["name"])))
        self.t.activities.setdefault(corr, []).append(activity)

    def sync(self, ev: dict[str, Any], args: dict[str, Any]) -> None:
        kind = sys.intern(str(args.get("cuda_sync_kind") or ev["name"]))
        stream, corr = int(args.get("stream", -1)), int(args.get("correlation", -1))
        self.t.syncs.append(SyncEvent(kind, stream, corr, self.time(ev, "ts")))

    def top_level(self, key: str, value: Any) -> None:
        """A key of the file's top-level object (``traceEvents`` was walked by then)."""
        trace = self.t
        self.saw_events = self.saw_events or key == "traceEvents"
        if key == "distributedInfo" and isinstance(value, dict):
            trace.distributed = True
            trace.rank = _rank_field(trace, value, "rank", 0)
            trace.world_size = _rank_field(trace, value, "world_size", None)
            config = value.get("pg_config") or ()
            trace.groups = tuple(
                ProcessGroup(
                    name=str(entry.get("pg_name", "")),
                    desc=str(entry.get("pg_desc", "")),
                    ranks=_ranks(entry.get("ranks")),
                )
                for entry in (config.values() if isinstance(config, dict) else config)
                if isinstance(entry, dict)
            )
        elif key == "deviceProperties" and isinstance(value, list) and value:
            first = value[0]
            trace.device = str(first.get("name", "")) if isinstance(first, dict) else ""
        elif key == "baseTimeNanoseconds" and isinstance(value, int | float):
            trace.base_time_us = float(value) / 1000.0
        elif key == "group_trace_id":
            trace.group_trace_id = str(value)


_HANDLERS: dict[str, Callable[[_Collector, dict[str, Any], dict[str, Any]], None]] = {
    "user_annotation": _Collector.annotation,
    "cpu_op": _Collector.cpu_op,
    "cuda_runtime": _Collector.runtime,
    "cuda_driver": _Collector.runtime,
    "cuda_sync": _Collector.sync,
    **dict.fromkeys(DEVICE_CATS, _Collector.device),
}


def _rank_field(trace: RankTrace, info: dict[str, Any], key: str, default: int | None) -> Any:
    value = info.get(key, default)
    minimum = 1 if key == "world_size" else 0
    if value is None and default is None:
        return None  # some traces write a rank and no world size
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value < MAX_RANKS:
        raise TraceError(
            f"{trace.path}: distributedInfo.{key} is {shown(value)}: expected an integer "
            f"from {minimum} to {MAX_RANKS - 1}, as torch.distributed writes it"
        )
    return value


def read_trace(path: str | Path) -> RankTrace:
    """Read one trace file (``.json`` or gzip-compressed): raises TraceError naming the file."""
    path = Path(path)
    collector = _Collector(RankTrace(path=str(path)))
    try:  # a FIFO or a device would block the read, or never end; stat fails as open would
        if not stat.S_ISREG(path.stat().st_mode):
            raise TraceError(
                f"{path}: not a regular file (a FIFO, socket or device): give trace files"
            )
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
        with (gzip.open if gzipped else open)(path, "rt", encoding="utf-8") as handle:
            _walk(_Stream(handle, str(path)), collector.top_level, collector.event)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except EOFError:
        raise TraceError(f"{path}: the gzip file is cut short (truncated)") from None
    except (gzip.BadGzipFile, zlib.error) as err:
        raise TraceError(f"{path}: corrupt gzip data ({err})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a torch.profiler (Kineto) trace: not UTF-8 text") from None
    except OSError as err:
        raise TraceError(f"{path}: cannot be read ({err.strerror or err})") from None
    if not collector.saw_events or not collector.saw_kineto:
        what = "no traceEvents list" if not collector.saw_events else "no CPU op or CUDA event"
        raise TraceError(
            f"{path}: not a torch.profiler (Kineto) trace: {what} (export one with "
            "torch.profiler.profile(activities=[CPU, CUDA]) and export_chrome_trace)"
        )
    launches = sorted(collector.t.launches.items(), key=lambda pair: pair[1].ts)
    collector.t.launches = dict(launches)
    return collector.t


def iter_trace_files(paths: list[str]) -> Iterator[Path]:
    """Each file named, and each ``.json``/``.json.gz`` file of each folder named, sorted."""
    for text in paths:
        path = Path(text)
        try:
            found = sorted(
                p for p in path.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz"))
            ) if path.is_dir() else [path]  # fmt: skip
        except OSError as err:  # a name too long, a folder that cannot be listed
            raise TraceError(f"{shown(text)}: cannot be read ({err.strerror or err})") from None
        if not found:
            raise TraceError(f"{path}: the folder holds no .json or .json.gz trace file")
        yield from found


def _shapes(value: Any) -> tuple[tuple[int, ...], ...]:
    """Each shape of a list of shapes; one that is not a list of element counts is unknown, ()."""
    if not isinstance(value, list):
        return ()
    return tuple(
        tuple(d) if all(_int_or_none(n) is not None and 0 <= n <= MAX_ELEMENTS for n in d) else ()
        for d in value
        if isinstance(d, list)
    )
