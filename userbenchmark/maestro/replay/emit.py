"""The imported pattern as a YAML file: a header of comments saying where every number came
from and what was approximated, then the suite (one pattern: the step)."""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from collections.abc import Iterable

from .assemble import PatternBlock
from .axes import slug
from .importer import Imported

HEADER_WIDTH = 96
"""Characters of a header comment line after ``# `` (the file stays readable at 100)."""
DEFAULT_ITERS = 20
DEFAULT_WARMUP_ITERS = 5
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}
TRACED_US_RULE = (
    "traced_us: the longest of the ranks' own durations in the trace (of a block, first "
    "start to last end of its device work; of the pattern, of the step's device work), as "
    "maestro's latency is the longest of the ranks' (nccl-tests -I); each rank's own step: "
    "traced_by_rank_us"
)


def scalar(value: object) -> str:
    """``value`` as a YAML scalar that reads back as itself."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(round(value, 1))
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return "'" + text.replace("'", "''") + "'"


def flow(mapping: dict[str, object]) -> str:
    parts = []
    for key, value in mapping.items():
        if isinstance(value, list | tuple):
            shown = "[" + ", ".join(flow_item(v) for v in value) + "]"
        else:
            shown = scalar(value)
        parts.append(f"{key}: {shown}")
    return "{" + ", ".join(parts) + "}"


def flow_item(value: object) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(flow_item(v) for v in value) + "]"
    return scalar(value)


def _ranks_text(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks)


def _block_entry(block: PatternBlock, default_dtype: str) -> tuple[dict[str, object], str]:
    entry: dict[str, object] = {"name": block.name, "op": block.op}
    if block.axis != "world":
        entry["axis"] = block.axis
    if block.lane != block.axis:
        entry["lane"] = block.lane
    if block.dtype and block.dtype != default_dtype and block.op not in ("busy", "sleep"):
        entry["dtype"] = block.dtype
    entry.update(block.params)
    if block.after:
        entry["after"] = [b.name for b in block.after]
    entry["traced_us"] = round(block.traced_us(), 1)
    notes = list(block.notes)
    if block.kind == "busy":
        rb = block.members[0]
        ops = Counter(rb.role.ref.items[i].opname.split("::")[-1] or "kernel" for i in rb.items)
        shown = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in ops.most_common(4))
        more = ", ..." if len(ops) > 4 else ""
        notes.insert(0, f"{len(rb.items)} kernel(s): {shown}{more}")
    return entry, "; ".join(notes)


def _header(imp: Imported, command: str) -> list[str]:
    chosen = (
        "chosen with --step"
        if imp.options.step is not None
        else "the last step complete on every rank"
    )
    lines = [
        "Imported from torch.profiler (Kineto) traces by",
        f"  {command}",
        f"Step: {imp.step_name} ({chosen})",
        f"World size: {imp.world_size}",
    ]
    devices = sorted({t.device for t in imp.traces if t.device})
    if devices:
        lines.append(f"Traced on: {', '.join(devices)}")
    lines.append("Traces:")
    lines += [f"  rank {t.rank}: {t.path}" for t in imp.traces]
    lines.append(TRACED_US_RULE)
    lines += _roles_lines(imp)
    lines += _deps_lines(imp)
    lines.append("Lanes (traced CUDA stream per rank):")
    for lane, streams in imp.layout.lanes.items():
        same = len(set(streams.values())) == 1
        where = (
            f"stream {next(iter(streams.values()))} on rank(s) {_ranks_text(streams)}"
            if same
            else ", ".join(f"rank {r}: stream {s}" for r, s in streams.items())
        )
        lines.append(f"  {lane}: {where}")
    lines.append("Approximations:")
    lines += [f"  - {text}" for text in _approximations(imp)]
    return [f"# {part}" for line in lines for part in _wrapped(line)]


def _wrapped(line: str, width: int = HEADER_WIDTH) -> list[str]:
    """A header line wrapped to ``width``, continuations indented under its text."""
    indent = len(line) - len(line.lstrip(" "))
    if line.lstrip().startswith("python -m"):
        return [line]  # the command stays one line, to copy
    if line.lstrip().startswith("- "):
        indent += 2
    return textwrap.wrap(
        line, width=width, subsequent_indent=" " * (indent + 2), break_on_hyphens=False
    ) or [""]


def _roles_lines(imp: Imported) -> list[str]:
    if len(imp.roles) == 1:
        return [
            f"Ranks: all {imp.world_size} do the same work (one role); a block runs on "
            "the ranks of its axis's teams"
        ]
    lines = [
        "Ranks do different work (roles, e.g. pipeline stages); compute blocks of a role "
        "run on an axis whose one team is the role's ranks:"
    ]
    for role in imp.roles:
        lines.append(f"  stage{role.number}: rank(s) {_ranks_text(role.ranks)}")
    return lines


def _deps_lines(imp: Imported) -> list[str]:
    methods = Counter(d.method for d in imp.deps.values())
    edges = sum(len(b.after) for b in imp.layout.blocks)
    if set(methods) == {"sync events"}:
        how = (
            "from the traces' cuda_sync events (Stream Wait Event); the stream that "
            "recorded each waited event is inferred (the waiting thread's last launch "
            "before its last event record), checked against the device timeline"
        )
    elif set(methods) == {"timeline"}:
        how = (
            "inferred from the device timeline (no cuda_sync events: a kernel that started "
            "later than its stream and launch allowed, just after another stream's work "
            "ended, waited for it); profile with enable_cuda_sync_events for exact waits"
        )
    else:
        how = ", ".join(f"{m} on {n} rank(s)" for m, n in methods.items())
    unresolved = sum(d.unresolved for d in imp.deps.values())
    lines = [
        f"Dependencies (after:, {edges} in all): {how}; host synchronisations order "
        "what follows them behind what had finished"
    ]
    if unresolved:
        lines.append(f"  ({unresolved} waits or held kernels had no source in reach: left out)")
    return lines


def _approximations(imp: Imported) -> list[str]:
    blocks = imp.layout.blocks
    kinds = Counter(b.kind for b in blocks)
    out = []
    busy_kernels = sum(len(b.members[0].items) for b in blocks if b.kind == "busy")
    if kinds["busy"]:
        out.append(
            f"{busy_kernels} kernels, copies and memsets other than collectives and GEMMs "
            f"with shapes: `busy` stand-ins of their traced duration ({kinds['busy']} blocks, "
            f"consecutive ones on a lane merged when nothing waits between them)"
        )
    if imp.options.keep_idle and kinds["idle"]:
        idle = sum(b.traced_us() for b in blocks if b.kind == "idle")
        out.append(
            f"lane idle over {imp.options.idle_us:g} µs that no dependency explains (host "
            f"launch gaps, or waits the trace does not show): `sleep` blocks ({kinds['idle']} "
            f"blocks, {idle:.1f} µs in all); shorter gaps dropped"
        )
    elif not imp.options.keep_idle:
        out.append("lane idle time (host launch gaps) dropped (--no-idle)")
    if kinds["gemm"]:
        out.append(
            "GEMM bias/activation epilogues not kept: maestro runs C = A[m,k] @ B[k,n], with "
            "each operand's layout (transposed or not) from the trace's Input Strides"
        )
    stand_in_gemms = sum(
        1 for role in imp.roles for it in role.ref.items if it.note == "gemm-shapes"
    )
    if stand_in_gemms:
        why = (
            "the traces were recorded without record_shapes"
            if any(t.record_shapes is False for t in imp.traces)
            else "their shapes are not recorded"
        )
        out.append(f"{stand_in_gemms} GEMM launches replayed as busy stand-ins: {why}")
    out += imp.layout.like_notes
    if len(imp.roles) > 1:
        out.append(
            "busy and sleep durations are per role; every duration is the longest of "
            "the role's ranks"
        )
    else:
        out.append("busy and sleep durations: the longest of the ranks'")
    notes = Counter(n for st in imp.steps for n in st.notes)
    out += [f"{text} ({n}x): replayed as a busy stand-in" for text, n in notes.items()]
    return out


def render(imp: Imported, *, name: str, command: str) -> str:
    """The pattern file's text."""
    blocks = imp.layout.blocks
    dtypes = Counter(b.dtype for b in blocks if b.dtype and b.op not in ("busy", "sleep"))
    default_dtype = dtypes.most_common(1)[0][0] if dtypes else "bf16"
    lines = _header(imp, command)
    lines += [
        f"name: {scalar(slug(name, fallback='trace'))}",
        f"world_size: {imp.world_size}",
        "defaults:",
        f"  dtype: {default_dtype}",
        f"  warmup_iters: {DEFAULT_WARMUP_ITERS}",
        f"  iters: {DEFAULT_ITERS}",
    ]
    if imp.axes.mesh:
        lines.append(f"mesh: {flow(dict(imp.axes.mesh))}")
    if imp.layout.axes:
        lines.append("axes:")
        for axis in imp.layout.axes:
            body = {"like": axis.like} if axis.like else {"teams": [list(t) for t in axis.teams]}
            lines.append(f"  {axis.name}: {flow(body)}")
    step = slug(imp.step_name.replace("ProfilerStep#", "step"), fallback="step")
    lines += [
        "patterns:",
        f"  - name: {scalar(step)}",
        f"    traced_us: {scalar(round(max(imp.step_us().values()), 1))}",
        f"    traced_by_rank_us: {flow_item([round(us, 1) for _, us in sorted(imp.step_us().items())])}",
        "    blocks:",
    ]
    for block in blocks:
        entry, comment = _block_entry(block, default_dtype)
        lines.append(f"      - {flow(entry)}" + (f"  # {comment}" if comment else ""))
    return "\n".join(lines) + "\n"
