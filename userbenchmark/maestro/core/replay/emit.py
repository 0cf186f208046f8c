"""``import-trace``: the imported pattern as a SuiteSpec, and its file (a header of comments on
where every number came from, what was approximated and what share of the step's GPU time was
kept, then the suite by maestro's dumper), written once maestro's loader accepts it."""

from __future__ import annotations

import itertools
import shlex
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...blocks.base import TracedCall
from ...errors import EXIT_OK, EXIT_USAGE, ConfigError, OptionError, say, user_error_message
from ..analysis.overlap import union_intersection_ns
from ..config.loader import dump_suite, load_suite_text
from ..config.patterns import DEFAULT_VALUES
from ..config.sizes import counted
from ..config.spec import WORLD_AXIS, AxisSpec, BlockSpec, PatternSpec, SuiteSpec, frozen_mapping
from .assemble import PatternBlock
from .group_axes import slug, team_size, widen
from .importer import Imported, ImportOptions, import_traces
from .kineto import GEMM_KERNEL, TraceError
from .step import MAX_MISSING_SHARE, WHOLE

PROG = "python -m userbenchmark.maestro import-trace"
HEADER_WIDTH = 96
"""Characters of a header comment line after ``# `` (the file stays readable at 100)."""
TRACED_US_RULE = (
    "traced_us: the longest of the ranks' own durations in the trace (of a block, first "
    "start to last end of its device work; of the pattern, of the step's device work), as "
    "maestro's latency is the longest of the ranks' (nccl-tests -I); each rank's own step: "
    "traced_by_rank_us; traced_kernel: a block's longest traced kernel; traced_overlap: the "
    "share of a GEMM's traced time a collective or transfer ran beside it on its rank"
)


@dataclass(frozen=True, kw_only=True)
class Coverage:
    """What became of the step's GPU time (kernels, copies and memsets, every rank), µs."""

    gemm_us: float
    comm_us: float
    stand_in_us: float
    dropped_us: float
    dropped: tuple[tuple[str, int, float], ...]
    """Kernels not replayed: (name, count, µs), most time first."""
    within: tuple[tuple[str, float], ...] = ()
    """Stand-ins of GEMM kernels (by name) and of collectives without sizes: (what, µs)."""
    unsized: int = 0
    """NCCL kernels without a call maestro can size, among the stand-ins."""

    def line(self) -> str:
        parts = (self.gemm_us, self.comm_us, self.stand_in_us, self.dropped_us)
        total = sum(parts)
        names = ("GEMMs", "collectives", "busy stand-ins", "dropped")
        tenths = shares_in_tenths(parts)
        shares = [f"{n} {t / 10:.1f} %" for n, t in zip(names, tenths, strict=True)]
        inner = ", ".join(f"{what} {100 * us / total:.1f} %" for what, us in self.within if us)
        shares[2] += f" (of the step: {inner})" * bool(inner)
        return f"coverage of the step's GPU time ({total:.1f} µs on all ranks): {', '.join(shares)}"


def shares_in_tenths(parts: Sequence[float]) -> list[int]:
    """Each part's share of their sum in tenths of a percent, summing to exactly 1000: each
    rounded down, the tenths left given to the largest remainders (Hamilton's method)."""
    total = sum(parts)
    exact = [1000 * p / total if total > 0 else 0.0 for p in parts]
    floors = [int(e) for e in exact]
    left = (1000 if total > 0 else 0) - sum(floors)
    for i in sorted(range(len(parts)), key=lambda i: floors[i] - exact[i])[:left]:
        floors[i] += 1
    return floors


def coverage(imp: Imported) -> Coverage:
    """How the step's device work of every rank was imported, and what was dropped: work
    running during the step that no call of the step launched (launched before it)."""
    by_kind: Counter = Counter()
    dropped: dict[str, list[float]] = {}
    unsized = 0
    for st in imp.steps:
        for item in st.items:
            by_kind[item.kind] += item.busy_us
            if item.kind == "other" and GEMM_KERNEL.search(item.kernel):
                by_kind["GEMM kernels"] += item.busy_us
            elif item.kind == "other" and item.opname.startswith("nccl"):
                by_kind["collectives without sizes"] += item.busy_us
                unsized += 1
        for act in itertools.chain.from_iterable(st.trace.activities.values()):
            if act.corr not in st.launch_items and act.end > st.start and act.ts < st.end:
                during = min(act.end, st.end) - max(act.ts, st.start)
                dropped.setdefault(act.name, []).append(during)
    listed = sorted(((n, len(v), sum(v)) for n, v in dropped.items()), key=lambda d: -d[2])
    return Coverage(
        gemm_us=by_kind["gemm"],
        comm_us=by_kind["comm"] + by_kind["p2p"],
        stand_in_us=by_kind["other"],
        dropped_us=sum(d[2] for d in listed),
        dropped=tuple(listed),
        within=tuple((k, by_kind[k]) for k in ("GEMM kernels", "collectives without sizes")),
        unsized=unsized,
    )


def _ranks_text(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks)


def _comment(block: PatternBlock) -> str:
    """A block's comment: what a stand-in stands for, and what is approximated."""
    notes = list(block.notes)
    if block.kind == "busy":
        rb = block.members[0]
        ops = Counter(rb.role.ref.items[i].opname.split("::")[-1] or "kernel" for i in rb.items)
        shown = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in ops.most_common(4))
        more = ", ..." if len(ops) > 4 else ""
        notes.insert(0, f"{len(rb.items)} kernel(s): {shown}{more}")
    return "; ".join(notes)


def _overlap(block: PatternBlock) -> float | None:
    """The largest share over its ranks of a GEMM's traced time that a collective or transfer
    ran beside it (None for other blocks, and when nothing ran beside it)."""
    shares = [0.0]
    for rb in block.members if block.kind == "gemm" else ():
        for rank, (start, end) in rb.times.items():
            step = rb.role.steps[rank]
            comms = [(it.start, it.end) for it in step.items if it.kind in ("comm", "p2p")]
            if comms and end > start:
                s, e = np.array(comms).T - step.start
                beside = union_intersection_ns([[start]], [[end]], s[:, None], e[:, None])
                shares.append(float(beside[0]) / (end - start))
    return round(max(shares), 3) or None


def _step_lines(imp: Imported) -> list[str]:
    """Which step, how steps were told complete, and what their launches lacked."""
    used, annotation = imp.steps_used, imp.options.annotation
    how = (
        "chosen with --step"
        if imp.options.step is not None
        else "the last step complete on every rank"
    )
    how += f"; spans of --annotation {annotation!r}" if annotation else ""
    if len(used) > 1:
        how += f"; traced durations: the median over the {len(used)} complete steps like it "
        how += f"({', '.join(used)}), their range in traced_min_us and traced_max_us"
    how += f"; left out, their work differing: {', '.join(imp.unlike)}" if imp.unlike else ""
    if imp.step_name == WHOLE:
        how = "the trace has no ProfilerStep#N: its whole profiled span with device work"
    lines = [
        f"Step: {imp.step_name} ({how})",
        "Complete steps: those whose launches have device work as often as the trace's median "
        "step's do, for each kind of call with device work in some step",
    ]
    for rank, census in sorted(imp.census.items()):
        missing, counted = census.missing[imp.step_name], census.counted(imp.step_name)
        skipped = ", ".join(f"{k} x{missing[k]}" for k in census.ignored if missing[k])
        lacking = ", ".join(f"{k} x{n}" for k, n in counted.most_common())
        lines += [f"  rank {rank}: ignored (no device work in any step): {skipped}"] * bool(skipped)
        lines += [f"  rank {rank}: launches without device work in this step (at most "
                  f"{MAX_MISSING_SHARE:.0%} allowed): {lacking}"] * bool(lacking)  # fmt: skip
    return lines


def _world_lines(imp: Imported) -> list[str]:
    run = imp.run
    if not run.subset:
        unsaid = " (the files do not say it: the ranks given)" * (not run.traced_world)
        return [f"World size: {run.world}{unsaid}"]
    of = run.traced_world or "an unknown number of"
    lines = [
        f"World size: {run.world} (--world-size; the files hold rank(s) {_ranks_text(run.given)} "
        f"of {of} ranks, rank {run.given[0]}'s step standing for every rank)",
        *["Process groups (traced -> replayed):"] * bool(imp.traced_groups),
    ]
    for name, (desc, ranks) in sorted(imp.traced_groups.items()):
        axis = imp.axes.axis_of.get(name, "world")
        team = team_size(len(ranks), run.world, desc)
        shown = name or "unnamed (older torch)"
        lines.append(f"  {shown} ({desc}): {len(ranks)} ranks -> axis {axis}, teams of {team}")
    return lines


def _header(imp: Imported, command: str) -> list[str]:
    given = zip(imp.run.given, imp.run.paths, strict=True)
    lines = [
        f"Imported from torch.profiler (Kineto) traces by\n  {command}",
        *_step_lines(imp),
        *_world_lines(imp),
        f"Traced on: {', '.join(sorted({t.device for t in imp.traces} - {''})) or 'not said'}",
        "Traces:",
        *[f"  rank {rank}: {path}" for rank, path in given],
        TRACED_US_RULE,
    ]
    if len(imp.roles) == 1:
        lines.append(f"Ranks: all {imp.run.world} do the same work (one role); a block runs on "
                     "the ranks of its axis's teams")  # fmt: skip
    else:
        lines.append("Ranks do different work (roles, e.g. pipeline stages); compute blocks of "
                     "a role run on an axis whose one team is the role's ranks:")  # fmt: skip
        lines += [f"  stage{r.number}: rank(s) {_ranks_text(r.ranks)}" for r in imp.roles]
    cover = coverage(imp)
    lines += _coverage_lines(cover)
    if any(it.kind == "comm" for st in imp.steps for it in st.items):
        how = (
            "their process group's sequence numbers (record_param_comms' Seq)"
            if imp.by_seq
            else "their order on each process group (the traces carry no sequence numbers)"
        )
        lines.append(f"Collectives matched across ranks by {how}")
    lines += _deps_lines(imp)
    lines.append("Lanes (traced CUDA stream per rank):")
    for lane, streams in imp.layout.lanes.items():
        ranks = "every rank" if imp.run.subset else f"rank(s) {_ranks_text(streams)}"
        where = (
            f"stream {next(iter(streams.values()))} on {ranks}"
            if len(set(streams.values())) == 1
            else ", ".join(f"rank {r}: stream {s}" for r, s in streams.items())
        )
        lines.append(f"  {lane}: {where}")
    lines += ["Approximations:", *(f"  - {text}" for text in _approximations(imp, cover))]
    return [part for line in lines for one in line.split("\n") for part in _wrapped(one)]


def _coverage_lines(cover: Coverage) -> list[str]:
    lines = [cover.line()[0].upper() + cover.line()[1:]]
    if cover.dropped:
        shown = ", ".join(f"{n} x{c} ({us:.1f} µs)" for n, c, us in cover.dropped[:6])
        more = f", and {len(cover.dropped) - 6} more kernels" if len(cover.dropped) > 6 else ""
        lines.append(f"  dropped (running during the step, launched before it): {shown}{more}")
    return lines


def _wrapped(line: str, width: int = HEADER_WIDTH) -> list[str]:
    """A header line wrapped to ``width``, continuations indented under its text."""
    indent = len(line) - len(line.lstrip(" ")) + 2 * line.lstrip().startswith("- ")
    if line.lstrip().startswith("python -m"):
        return [line]  # the command stays one line, to copy
    return textwrap.wrap(
        line, width=width, subsequent_indent=" " * (indent + 2), break_on_hyphens=False
    ) or [""]


def _deps_lines(imp: Imported) -> list[str]:
    methods = Counter(d.method for d in imp.deps.values())
    how = {
        "sync events": "from the traces' cuda_sync events (Stream Wait Event); the stream that "
        "recorded each waited event is inferred (the waiting thread's last launch before its "
        "last event record), checked against the device timeline",
        "timeline": "inferred from the device timeline (no cuda_sync events: a kernel that "
        "started later than its stream and launch allowed, just after another stream's work "
        "ended, waited for it); profile with enable_cuda_sync_events for exact waits",
    }
    said = how[next(iter(methods))] if len(methods) == 1 else ", ".join(
        f"{m} on {n} rank(s)" for m, n in methods.items()
    )  # fmt: skip
    edges = sum(len(b.after) for b in imp.layout.blocks)
    unresolved = sum(d.unresolved for d in imp.deps.values())
    return [
        f"Dependencies (after:, {edges} in all): {said}; host synchronisations order what "
        "follows them behind what had finished",
        *[f"  ({unresolved} waits or held kernels had no source in reach: left out)"]
        * bool(unresolved),
    ]


def _approximations(imp: Imported, cover: Coverage) -> list[str]:
    blocks = imp.layout.blocks
    kinds = Counter(b.kind for b in blocks)
    out = []
    if kinds["busy"]:
        kernels = sum(len(b.members[0].items) for b in blocks if b.kind == "busy")
        out.append(
            f"{kernels} kernels, copies and memsets other than collectives and GEMMs with "
            f"shapes: `busy` stand-ins of their traced duration "
            f"({kinds['busy']} blocks, consecutive ones on a lane merged when nothing waits "
            "between them)"
        )
    if not imp.options.keep_idle:
        out.append("lane idle time (host launch gaps) dropped (--no-idle)")
    elif kinds["idle"]:
        idle = sum(b.traced_us() for b in blocks if b.kind == "idle")
        out.append(
            f"lane idle over {imp.options.idle_us:g} µs that no dependency explains (host "
            f"launch gaps, or waits the trace does not show): `sleep` blocks ({kinds['idle']} "
            f"blocks, {idle:.1f} µs in all); shorter gaps dropped"
        )
    if kinds["gemm"]:
        out.append(
            "GEMM activation epilogues not kept: maestro runs C = A[m,k] @ B[k,n] (plus a 1-D "
            "bias where the op had one: bias: true), with each operand's layout (transposed or "
            "not) from the trace's Input Strides"
        )
    items = [it for role in imp.roles for it in role.ref.items if it.kind == "other"]
    shapeless = sum(it.note == "gemm-shapes" or bool(GEMM_KERNEL.search(it.kernel)) for it in items)
    out += [
        f"{shapeless} GEMM kernels (by name) replayed as busy stand-ins: their ops' shapes are "
        "not in the trace; profile with record_shapes=True to replay them as GEMMs"
    ] * bool(shapeless)
    out += imp.layout.like_notes
    per = (
        "per role; every duration is the longest of the role's ranks"
        if len(imp.roles) > 1
        else "the longest of the ranks'"
    )
    out.append(f"busy and sleep durations: {per}")
    out += [
        "an NCCL kernel without a call maestro can size (no collective or size in the trace, or "
        f"a transfer with a rank outside the files) ({cover.unsized}x): replayed as a busy "
        "stand-in"
    ] * bool(cover.unsized)
    return out


def _block_spec(imp: Imported, index: int, b: PatternBlock, dtype: str) -> BlockSpec:
    median, low, high = imp.spread[index]
    params = b.params  # a stand-in or idle gap lasts its median
    if b.kind in ("busy", "idle"):
        params, _ = b.block.traced_params(TracedCall(duration_us=median))
    several = len(imp.steps_used) > 1
    return BlockSpec(
        name=b.name,
        op=b.op,
        axis=b.axis,
        lane=b.lane,
        dtype=b.dtype or dtype,
        params=frozen_mapping(params),
        after=tuple(a.name for a in b.after),
        traced_us=round(median, 1),
        traced_min_us=round(low, 1) if several else None,
        traced_max_us=round(high, 1) if several else None,
        traced_kernel=b.members[0].first.kernel if b.kind in ("gemm", "comm", "p2p") else None,
        traced_overlap=_overlap(b),
    )


def build_suite(imp: Imported, *, name: str) -> SuiteSpec:
    """The imported pattern as the spec maestro's loader would make of its file."""
    blocks = imp.layout.blocks
    dtypes = Counter(b.dtype for b in blocks if b.dtype)
    dtype = dtypes.most_common(1)[0][0] if dtypes else DEFAULT_VALUES["dtype"]
    world = tuple(range(len(imp.traces)))  # the given ranks (one with --world-size over some)
    likes = imp.layout.likes
    teams = {WORLD_AXIS: (world,), **imp.axes.teams, **imp.layout.teams}
    teams |= {name: teams[base] for name, base in likes.items()}  # a like axis: its base's teams
    used = {WORLD_AXIS, *imp.axes.mesh, *imp.layout.teams, *likes, *(b.axis for b in blocks)}
    axes = {n: AxisSpec(name=n, teams=teams[n], like=likes.get(n)) for n in teams if n in used}
    specs = [_block_spec(imp, i, b, dtype) for i, b in enumerate(blocks)]
    step = slug(imp.step_name.replace("ProfilerStep#", "step"), fallback="step")
    # Each rank's step: its device work's first start to last end (median over the steps).
    by_rank = tuple(round(us, 1) for us in imp.step_spread)
    pattern = PatternSpec(
        name=step,
        base_name=step,
        blocks=tuple(specs),
        num_iters=DEFAULT_VALUES["iters"],
        **{k: DEFAULT_VALUES[k] for k in ("warmup_iters", "baseline", "check", "sync", "graph")},
        traced_us=max(by_rank),
        traced_by_rank_us=by_rank,
    )
    suite = SuiteSpec(
        name=slug(name, fallback="trace"),
        source="",
        world_size=len(imp.traces),
        axes=frozen_mapping(axes),
        mesh=frozen_mapping(imp.axes.mesh),
        patterns=(pattern,),
    )
    if not imp.run.subset:
        return suite
    groups = {imp.axes.axis_of[g]: t for g, t in imp.traced_groups.items() if g in imp.axes.axis_of}
    return widen(suite, imp.run.world, groups)


def render(imp: Imported, *, name: str, command: str) -> str:
    """The pattern file's text."""
    suite = build_suite(imp, name=name)
    step = suite.patterns[0].name
    comments = {(step, b.name): text for b in imp.layout.blocks if (text := _comment(b))}
    return dump_suite(suite, header=_header(imp, command), comments=comments)


def command_line(paths: Sequence[str], output: str, options: ImportOptions) -> str:
    """The command as a user would type it again (for the file's header)."""
    args = [*paths, "-o", output]
    for flag in ("step", "annotation", "world_size"):
        if getattr(options, flag) is not None:
            args += [f"--{flag.replace('_', '-')}", str(getattr(options, flag))]
    if not options.keep_idle:
        args.append("--no-idle")
    elif options.idle_us != ImportOptions().idle_us:
        args += ["--idle-us", f"{options.idle_us:g}"]
    return " ".join([PROG, *(shlex.quote(a) for a in args)])


def import_trace(
    paths: Sequence[str],
    output: str,
    options: ImportOptions | None = None,
    *,
    write: Callable[[Path, bytes], None],
) -> Imported:
    """Import the traces at ``paths`` into the pattern file ``output``, written by ``write``
    (the CLI's atomic writer) once maestro's loader accepts it; TraceError when the traces
    cannot be imported or the file cannot be written (nothing is written then)."""
    options = options or ImportOptions()
    target = Path(output)
    if not target.parent.is_dir() and str(target.parent):
        raise TraceError(f"-o {output}: the folder {target.parent} does not exist")
    imported = import_traces(paths, options)
    text = render(imported, name=target.stem, command=command_line(paths, output, options))
    try:  # what maestro cannot run is never written
        load_suite_text(text, file=output)
    except ConfigError as err:
        first, more = err.issues[0], len(err.issues) - 1
        raise TraceError(
            f"maestro's loader rejects the pattern imported from these traces, so nothing was "
            f"written: {first}" + (f" (and {more} more problems)" if more else "")
        ) from None
    try:
        write(target, text.encode("utf-8"))
    except OSError as err:
        raise TraceError(f"-o {output}: cannot write the file ({err.strerror or err})") from None
    return imported


def run_command(
    *,
    paths: Sequence[str],
    output: str,
    no_idle: bool,
    write: Callable[[Path, bytes], None],
    **options: Any,
) -> int:
    """The ``import-trace`` command: import, print what was written, return the exit status
    (0 written, 2 bad options or traces that cannot be imported: one line on stderr, nothing
    written); ``options``: :class:`ImportOptions`' other fields."""
    try:
        options = ImportOptions(keep_idle=not no_idle, **options)
        imported = import_trace(list(paths), output, options, write=write)
    except (OptionError, TraceError) as err:
        trace = isinstance(err, TraceError)
        say(f"maestro: invalid trace: {err}" if trace else user_error_message(err))
        return EXIT_USAGE
    ops = Counter(b.op for b in imported.layout.blocks).most_common()
    who = "one role" if len(imported.roles) == 1 else f"{len(imported.roles)} roles"
    used = len(imported.steps_used)
    steps = f" (traced durations: median of {used} steps)" if used > 1 else ""
    print(
        f"wrote {output}: {imported.step_name}{steps} of {imported.run.world} rank(s) ({who}) as "
        f"{counted(len(imported.layout.blocks), 'block')} ({', '.join(f'{n} {op}' for op, n in ops)}) "
        f"on {counted(len(imported.layout.lanes), 'lane')}\n{coverage(imported).line()}"
    )
    return EXIT_OK
