"""The summary ``validate`` prints: axes and their teams, patterns after sweep expansion, each
block's work, and the bytes each rank allocates per pattern (from Block.buffer_bytes); and the
list of ops ``list-blocks`` prints."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from tabulate import tabulate

from ...blocks.base import Block
from ...blocks.dtypes import DTYPES
from ...blocks.registry import registered_ops, resolve_op
from .sizes import format_size
from .spec import AxisSpec, BlockSpec, PatternSpec, SuiteSpec

_MAX_TEAMS_SHOWN = 8
_MAX_RANKS_SHOWN = 8
_FLOP_UNITS = ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP")
_CHANGEABLE = ("axis", "lane", "dtype", "register_buffers", "after")  # and the parameters


def _with_unit(count: int, units: Sequence[str], step: int) -> str:
    value, i = float(count), 0
    while value >= step and i < len(units) - 1:
        value, i = value / step, i + 1
    return f"{count} {units[0]}" if i == 0 else f"{value:.3g} {units[i]}"


def human_bytes(num_bytes: int) -> str:
    """``num_bytes`` with a binary unit and three significant digits: ``1.50 MiB``."""
    return _with_unit(num_bytes, ("B", "KiB", "MiB", "GiB", "TiB"), 1024)


def op_class(op: str, import_ops: bool = True) -> type[Block] | None:
    """The block class of the validated ``op``; None when it cannot be resolved here."""
    if ":" in op and not import_ops:
        return None  # a custom op left unimported: its bytes are unknown
    try:
        return resolve_op(op)
    except Exception:  # noqa: BLE001 - validated already; a summary must not fail on it
        return None


def rank_buffer_bytes(
    suite: SuiteSpec, pattern: PatternSpec, *, import_ops: bool = True
) -> tuple[int, ...]:
    """Bytes each rank (index = global rank) allocates for ``pattern``'s blocks: nothing for a
    block whose axis has no team holding the rank, and 0 for custom ops left unimported
    (``import_ops`` False)."""
    return _per_rank(suite, pattern, lambda block: _block_bytes(suite, block, import_ops))


def _per_rank(
    suite: SuiteSpec, pattern: PatternSpec, amount: Callable[[BlockSpec], int | None]
) -> tuple[int, ...]:
    per_rank = [0] * suite.world_size
    for block in pattern.blocks:
        num = amount(block) or 0
        for team in suite.axes[block.axis].teams:
            for rank in team:
                per_rank[rank] += num
    return tuple(per_rank)


def _flops(cls: type[Block] | None, block: BlockSpec) -> int:
    try:
        flops = cls.flop_count(block.params) if cls is not None else 0
    except Exception:  # noqa: BLE001 - a summary must not fail on a custom block
        flops = 0
    return flops if isinstance(flops, int) and flops > 0 else 0


LARGE_FOR_CPU_BYTES: Final = 2**30
"""Buffers per rank over which a CPU run says, before it starts, that it is large."""
LARGE_FOR_CPU_FLOP: Final = 10**12
"""GEMM work per rank over a pattern's iterations (warmup and baseline included) over which a
CPU run says so: 10 s at 100 GFLOP/s, more than one core of most CPUs does."""


def large_for_cpu(suite: SuiteSpec) -> str:
    """Why ``suite`` is large for a CPU run (each such pattern's buffers and GEMM work per rank,
    naming ``--max-size``), or ``""``."""
    large = []
    for p in suite.patterns:
        num_bytes = max(rank_buffer_bytes(suite, p))
        runs = (p.warmup_iters + p.num_iters) * (2 if p.baseline else 1)
        flops = runs * max(_per_rank(suite, p, lambda b: _flops(op_class(b.op), b)))
        if num_bytes > LARGE_FOR_CPU_BYTES or flops > LARGE_FOR_CPU_FLOP:
            work = f"{_with_unit(flops, _FLOP_UNITS, 1000)} of GEMM work" if flops else "no GEMM"
            large.append(f"{p.name} ({human_bytes(num_bytes)} of buffers, {work})")
    if not large:
        return ""
    shown = ", ".join(large[:3]) + (f" and {len(large) - 3} more" if len(large) > 3 else "")
    return (
        f"large for a CPU run, per rank: {shown}; a CPU core does about 10 to 100 GFLOP/s, so "
        "expect minutes or more: --max-size 64K runs every pattern at tiny sizes"
    )


def _block_bytes(suite: SuiteSpec, block: BlockSpec, import_ops: bool) -> int | None:
    """Bytes one rank allocates for ``block``; None for an op that cannot be resolved here."""
    cls = op_class(block.op, import_ops)
    if cls is None:
        return None
    team_size = suite.axes[block.axis].team_size
    return int(cls.buffer_bytes(block.params, dtype=block.dtype, team_size=team_size))


def _ranks(ranks: Sequence[int]) -> str:
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    if len(ranks) > _MAX_RANKS_SHOWN:
        head = ", ".join(str(r) for r in ranks[: _MAX_RANKS_SHOWN - 1])
        return f"{head}, ..., {ranks[-1]}"
    return ", ".join(str(r) for r in ranks)


def _teams(axis: AxisSpec) -> str:
    shown = " ".join(f"[{_ranks(team)}]" for team in axis.teams[:_MAX_TEAMS_SHOWN])
    more = len(axis.teams) - _MAX_TEAMS_SHOWN
    return shown + (f" ... and {more} more" if more > 0 else "")


def _axis_options(axis: AxisSpec) -> str:
    parts = [f"like {axis.like}"] if axis.like else []
    parts += [f"priority {axis.priority}"] if axis.priority != "normal" else []
    parts += (
        ["nccl " + " ".join(f"{k}={_value(v)}" for k, v in axis.nccl.items())] if axis.nccl else []
    )
    return "; ".join(parts)


def _value(value: Any, kind: str = "") -> str:
    if kind == "size" and isinstance(value, int):
        return format_size(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def describe_params(cls: type[Block] | None, params: Mapping[str, Any]) -> str:
    """A block's parameters as the file spells them (``size=4M reduce_op=sum``,
    ``m=4096 n=2048 k=1024 tf32=false``): what it measured, after any ``--max-size`` cap."""
    declared = {p.name: p for p in getattr(cls, "params", ())}
    hidden = {
        n for n, p in declared.items() if not p.described_at_default and p.default is not None
    }
    return " ".join(
        f"{k}={_value(v, declared[k].kind if k in declared else '')}"
        for k, v in params.items()
        if v is not None and not (k in hidden and v == declared[k].default)
    )


def _pattern(suite: SuiteSpec, pattern: PatternSpec, import_ops: bool) -> list[str]:
    flags = [
        f"warmup {pattern.warmup_iters}",
        f"iters {pattern.num_iters}",
        "baseline" if pattern.baseline else "no baseline",
        "check" if pattern.check else "no check",
        f"sync {pattern.sync}",
        "CUDA graphs" if pattern.graph else "eager",
    ]
    lines = [f"  {pattern.name}  ({', '.join(flags)})"]
    rows = []
    for block in pattern.blocks:
        covered = sum(len(t) for t in suite.axes[block.axis].teams)
        ranks = "all" if covered == suite.world_size else f"{covered} of {suite.world_size}"
        flops = _flops(op_class(block.op, import_ops), block)
        work = block.work + (f" ({_with_unit(flops, _FLOP_UNITS, 1000)})" if flops else "")
        num_bytes = _block_bytes(suite, block, import_ops)
        size = "?" if num_bytes is None else human_bytes(num_bytes)
        rows.append([block.name, block.op, block.axis, block.lane, block.dtype, work, ranks, size])
    headers = ["block", "op", "axis", "lane", "dtype", "work", "ranks", "bytes/rank"]
    lines += _table(rows, headers, "    ")
    waits = [f"{b.name} after {', '.join(b.after)}" for b in pattern.blocks if b.after]
    if waits:
        lines.append("    each iteration: " + "; ".join(waits))
    lines += [f"    whatif {v.variant}: {_changes(pattern, v)}" for v in pattern.variants]
    per_rank = rank_buffer_bytes(suite, pattern, import_ops=import_ops)
    top, low = max(per_rank), min(per_rank)
    at = [r for r, b in enumerate(per_rank) if b == top]
    text = (
        f"    buffers per rank: max {human_bytes(top)} "
        f"({'rank' if len(at) == 1 else 'ranks'} {_ranks(at)})"
    )
    if low != top:
        text += f", min {human_bytes(low)}"
    if not import_ops and any(":" in block.op for block in pattern.blocks):
        text += "; custom ops not imported, not counted"
    lines.append(text)
    return lines


def _changes(pattern: PatternSpec, variant: PatternSpec) -> str:
    """What a variant changes: ``ag size=4M -> size=8M; rs axis dp -> dp[whatif=x]``."""
    changes = []
    for a, b in zip(pattern.blocks, variant.blocks, strict=True):
        pairs = [(key, getattr(a, key), getattr(b, key)) for key in _CHANGEABLE]
        changes += [f"{a.name} {key} {_value(x)} -> {_value(y)}" for key, x, y in pairs if x != y]
        old, new = a.work.split(), b.work.split()  # its parameters, as the file spells them
        gone, came = [t for t in old if t not in new], [t for t in new if t not in old]
        if gone or came:
            changes.append(f"{a.name} {' '.join(gone)} -> {' '.join(came)}")
    return "; ".join(changes) or "nothing changed (the pattern again: its noise)"


def _table(rows: list[list[str]], headers: list[str], indent: str) -> list[str]:
    table = tabulate(rows, headers=headers, tablefmt="plain", disable_numparse=True)
    return [indent + line for line in table.splitlines()]


def suite_summary(suite: SuiteSpec, *, import_ops: bool = True) -> str:
    """What ``validate`` prints for a valid suite; with ``import_ops=False`` (for a suite loaded
    that way) no custom op is imported: their work and bytes show as ``?``."""
    lines = [
        f"suite {suite.name}: {suite.source}",
        f"world size {suite.world_size}, timeout {suite.timeout_s:g} s, "
        f"{'stop' if suite.stop_on_error else 'go on'} on error",
    ]
    if suite.env:
        lines.append("env: " + " ".join(f"{k}={v}" for k, v in suite.env.items()))
    lines += ["", f"axes ({len(suite.axes)}):"]
    rows = [
        [a.name, f"{len(a.teams)} x {a.team_size}", _teams(a), _axis_options(a)]
        for a in suite.axes.values()
    ]
    lines += _table(rows, ["axis", "teams x size", "teams", "options"], "  ")
    lines.append("")
    num_bases = len({p.base_name for p in suite.patterns})
    lines.append(
        f"patterns ({len(suite.patterns)} after sweep expansion, from {num_bases} in the file):"
    )
    for pattern in suite.patterns:
        lines += _pattern(suite, pattern, import_ops)
    every = [q for p in suite.patterns for q in (p, *p.variants)]
    peak = max((max(rank_buffer_bytes(suite, p, import_ops=import_ops)) for p in every), default=0)
    lines.append("")
    uncounted = not import_ops and any(":" in b.op for p in suite.patterns for b in p.blocks)
    lines.append(
        f"largest per-rank allocation of any pattern or variant: {human_bytes(peak)}"
        + (" (custom ops not imported, not counted)" if uncounted else "")
    )
    return "\n".join(lines)


def ops_summary() -> str:
    """What ``list-blocks`` prints: the keys of every block, then each op with its parameters,
    types and defaults."""
    common = [
        ("name", "str", "required", "block name, unique in its pattern"),
        ("op", "str", "required", "a name below, or package.module:ClassName"),
        ("axis", "str", "world", "axis whose teams run the block"),
        ("lane", "str", "the axis", "in-order queue the block is issued on"),
        ("dtype", "str", "defaults.dtype", " | ".join(DTYPES)),
        ("register_buffers", "bool", "defaults.register_buffers", "registered NCCL buffers"),
    ]
    lines = [
        "Keys of every block:",
        tabulate(common, headers=["key", "type", "default", "meaning"]),
    ]
    for name, cls in registered_ops().items():
        doc = " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split()).replace(
            "``", "`"
        )
        lines += ["", f"{name} ({cls.category}): {doc}"]
        rows = []
        for p in cls.params:
            default = "required" if p.required else ("-" if p.default is None else p.default)
            meaning = p.doc + (f" (one of {', '.join(map(str, p.choices))})" if p.choices else "")
            rows.append((p.name, p.kind, default, meaning))
        if rows:
            lines.append(tabulate(rows, headers=["param", "type", "default", "meaning"]))
    return "\n".join(lines)
