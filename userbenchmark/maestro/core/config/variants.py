"""A pattern's ``whatif:`` variants: each the pattern with some blocks' keys changed (a value, or
a factor ``x1.5`` of a number or size) and some axes' communicator options changed (on an axis of
its own), checked by the pattern's own checks, each problem at the ``whatif:`` entry behind it."""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from ...blocks.dtypes import DTYPE_SIZES_BYTES
from .axes import AxisDraft, check_nccl
from .blocks import BLOCK_KEYS, OpResolver, block_entry, yaml_key
from .problems import Problems, choices, join, suggest
from .spec import PRIORITIES, AxisSpec, BlockSpec, PatternSpec, whatif_label

AXES_KEY: Final = "axes"
"""The key of a variant that changes axes' options rather than a block (a block named ``axes``
is reached with a glob: ``"[a]xes"``)."""
AXIS_KEYS: Final = ("priority", "nccl")
FIXED_KEYS: Final = {
    "name": "its results are matched to the pattern's by name",
    **dict.fromkeys(
        ("traced_us", "traced_kernel", "traced_overlap"),
        "a variant is measured against its pattern, not against a trace, and keeps no traced "
        "figures",
    ),
}
_FACTOR: Final = re.compile(r"x([0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
_GLOB: Final = re.compile(r"[*?\[]")
_NUMBER_KINDS: Final = ("int", "float", "size")

Validate = Callable[[Problems, dict[Any, Any], dict[str, AxisDraft]], PatternSpec | None]
"""The pattern's own checks on a variant: (problems, its pattern as a file's entry, its own
axes) to its spec, or None after recording problems at the pattern's own paths."""


@dataclasses.dataclass(frozen=True)
class _File:
    axes: Mapping[str, AxisDraft]
    made: dict[str, AxisDraft]
    ops: OpResolver
    body: dict[Any, Any]
    """The pattern's keys but its blocks, whatif and traced figures."""
    validate: Validate


@dataclasses.dataclass
class _Source:
    """Where a variant changed a block: each key's ``whatif:`` path and note (the factor behind
    a value), and the entry that matched it."""

    entry_path: str = ""
    entry_key: str = ""
    keys: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


def check_whatif(
    p: Problems,
    body: dict[Any, Any],
    base: PatternSpec,
    axes: Mapping[str, AxisDraft],
    made: dict[str, AxisDraft],
    ops: OpResolver,
    validate: Validate,
) -> PatternSpec:
    """``base`` (a valid pattern, ``body`` as its file gives it) with the variants of its
    ``whatif:``; their own axes are added to ``made`` (name -> draft, shared by the file)."""
    raw, path = body.get("whatif"), join(base.yaml_path, "whatif")
    expected = (
        "whatif must be a mapping of variant names to what each changes, e.g. "
        "whatif: {bigger: {gemm: {m: x1.1}}}"
    )
    if raw is None or not p.mapping(raw, path, expected):
        return base
    plain = {k: v for k, v in body.items() if k not in ("whatif", "traced_us", "traced_by_rank_us")}
    file, variants = _File(axes, made, ops, plain, validate), []
    for name, changes in raw.items():
        where = join(path, name)
        if p.name(name, where, "a variant name") is not None:
            variant = _variant(p, name, changes, where, base, file)
            variants += [variant] if variant is not None else []
    return dataclasses.replace(base, variants=tuple(variants))


def _variant(
    p: Problems,
    name: str,
    raw: Any,
    path: str,
    base: PatternSpec,
    file: _File,
) -> PatternSpec | None:
    expected = (
        "a variant maps block names (or globs of names) to the keys it changes, and axes: to "
        "axes' options, e.g. {gemm: {m: x1.1}, axes: {dp: {nccl: {max_ctas: 4}}}}; {} for an "
        "identical copy"
    )
    if raw is not None and not p.mapping(raw, path, expected):
        return None
    raw, start = raw or {}, len(p)
    entries = [block_entry(b) for b in base.blocks]
    sources = [_Source() for _ in base.blocks]
    for key, changes in raw.items():
        if key != AXES_KEY:
            for i in _matched(p, key, join(path, key), base.blocks):
                sources[i].entry_path, sources[i].entry_key = join(path, key), str(key)
                _change(p, entries[i], sources[i], changes, base.blocks[i], file.ops)
    own = _own_axes(p, raw.get(AXES_KEY), join(path, AXES_KEY), name, entries, file)
    found = Problems(p.file, like=p)
    spec = file.validate(found, file.body | {"blocks": entries}, own)
    for sub, message, _ in found.items:
        p.add(*_moved(sub, message, base, path, sources))
    if spec is None or len(p) > start:
        return None
    blocks = tuple(
        dataclasses.replace(b, yaml_path=s.entry_path) if s.entry_path else b
        for b, s in zip(spec.blocks, sources, strict=True)
    )
    return dataclasses.replace(
        spec, variant=name, blocks=blocks, traced_us=None, traced_by_rank_us=(), yaml_path=path
    )


def _matched(p: Problems, key: Any, path: str, blocks: Sequence[BlockSpec]) -> list[int]:
    """Indices of the blocks ``key`` names (a name, or a glob of names), after recording why
    there are none."""
    names = [b.name for b in blocks]
    valid = f"blocks of this pattern: {choices(names)}; or {AXES_KEY}: for axes' options"
    if isinstance(key, bool) or not isinstance(key, str | int):
        p.add(path, f"expected a block name or a glob of block names, got {p.show(path, key)}")
        return []
    key = str(key)
    if _GLOB.search(key):
        found = [i for i, name in enumerate(names) if fnmatch.fnmatchcase(name, key)]
        if not found:
            p.add(path, f"{key!r} matches no block; {valid}")
        return found
    if key not in names:
        p.add(path, f"unknown block {key!r}{suggest(key, names)}; {valid}")
        return []
    return [names.index(key)]


def _change(
    p: Problems,
    entry: dict[str, Any],
    source: _Source,
    changes: Any,
    block: BlockSpec,
    ops: OpResolver,
) -> None:
    """Apply ``changes`` (a mapping of block keys to values or factors) to ``entry``."""
    path = source.entry_path
    if not p.mapping(changes, path, "expected a mapping of the keys it changes, e.g. {m: x1.1}"):
        return
    if isinstance(changes.get("op"), str) and changes["op"] != block.op:
        _keep_declared(entry, changes["op"], ops)
    # Plain values first: a factor of a size counts the elements of the variant's dtype.
    for key, value in sorted(changes.items(), key=lambda kv: _factor_text(kv[1]) is not None):
        sub = join(path, key)
        if key in FIXED_KEYS:
            p.add(sub, f"{key} cannot change in a variant: {FIXED_KEYS[key]}")
        elif key in source.keys:
            p.add(
                sub,
                f"{key!r} of block {block.name!r} is changed twice in this variant (also at "
                f"{source.keys[key][0]})",
            )
        else:
            note = ""
            if (text := _factor_text(value)) is not None:
                value, note = _scaled(p, sub, text, entry, key, ops)
            if value is not None:
                entry[key] = value
                source.keys[key] = (sub, note)
    moved = "axis" in source.keys and isinstance(entry["axis"], str) and "lane" not in source.keys
    if moved and block.lane == block.axis:  # a lane the file left to its axis follows it
        entry["lane"] = entry["axis"]


def _factor_text(value: Any) -> str | None:
    return value if isinstance(value, str) and _FACTOR.fullmatch(value) else None


def _keep_declared(entry: dict[str, Any], op: str, ops: OpResolver) -> None:
    """Drop the parameters the block's new ``op`` does not declare (all kept when it cannot be
    resolved: its problem is reported where the block is checked)."""
    cls = ops.resolve(op)
    if isinstance(cls, type):
        declared = {yaml_key(param) for param in getattr(cls, "params", ())}
        for key in [k for k in entry if k not in BLOCK_KEYS and k not in declared]:
            del entry[key]


def _scaled(
    p: Problems, path: str, text: str, entry: dict[str, Any], key: str, ops: OpResolver
) -> tuple[Any, str]:
    """(``text``'s factor times the block's ``key``, a note saying so), or (None, "") after
    recording why it cannot be: an int stays whole, a size whole elements of the dtype."""
    factor = float(text[1:])
    cls = ops.resolve(entry["op"])
    params = getattr(cls, "params", ()) if isinstance(cls, type) else ()
    param = next((q for q in params if yaml_key(q) == key), None)
    if param is None or param.kind not in _NUMBER_KINDS:
        p.add(path, f"a factor ({text}) scales a number or a size; {key!r} is neither here")
        return None, ""
    if entry.get(key) is None:
        p.add(path, f"{text} scales the block's {key}, which it does not set")
        return None, ""
    if not 0 < factor < math.inf:
        p.add(path, f"a factor must be a finite number above 0, got {text}")
        return None, ""
    base = entry[key]
    value: Any = base * factor
    if param.kind == "size":
        element = DTYPE_SIZES_BYTES.get(entry["dtype"], 1)
        value = round(value / element) * element
    else:
        value = round(value) if param.kind == "int" else float(f"{value:.12g}")
    return value, f" ({text} of the pattern's {base})"


def _own_axes(
    p: Problems, raw: Any, path: str, variant: str, entries: list[dict[str, Any]], file: _File
) -> dict[str, AxisDraft]:
    """The axes ``raw`` (a variant's ``axes:``, or None) gives new options, by their new names,
    and the ``entries`` on them moved there."""
    new_axes = _axes(p, raw, path, file.axes) if raw is not None else {}
    for axis in new_axes:
        if not any(entry["axis"] == axis for entry in entries):
            p.add(
                join(path, axis),
                f"no block of this variant runs on axis {axis!r}: its options would change nothing",
            )
    renamed = {axis: _register(draft, variant, file.made) for axis, draft in new_axes.items()}
    for entry in entries:
        entry["axis"] = renamed.get(entry["axis"], entry["axis"])
    return {draft.name: draft for draft in new_axes.values()}


def _axes(p: Problems, raw: Any, path: str, axes: Mapping[str, AxisDraft]) -> dict[str, AxisDraft]:
    """Drafts of the axes a variant gives new options: the same teams, like the axis."""
    expected = "axes in a variant maps axis names to their new options, e.g. {dp: {nccl: {...}}}"
    if not p.mapping(raw, path, expected):
        return {}
    out = {}
    for name, spec in raw.items():
        sub = join(path, name)
        axis = axes.get(p.choice(name, sub, tuple(axes), "axis", "axes") or "")
        if axis is None or not p.mapping(spec, sub, f"expected options: {choices(AXIS_KEYS)}"):
            continue
        p.unknown_keys(spec, sub, AXIS_KEYS, "in a variant's axis (it keeps the axis's teams)")
        priority = p.get(spec, sub, "priority", p.choice, PRIORITIES, "priority", "priorities")
        nccl = p.get(spec, sub, "nccl", check_nccl, p, axis.nccl, default=axis.nccl)
        if axis.teams is not None:
            out[name] = AxisDraft(
                name=name,
                path=sub,
                teams=axis.teams,
                like=name,
                priority=priority or axis.priority,
                nccl=nccl,
            )
    return out


def _register(draft: AxisDraft, variant: str, made: dict[str, AxisDraft]) -> str:
    """Name ``draft`` ``dp[whatif=variant]`` (``,2``... when another pattern's variant of that
    name gave the axis other options) and add it to ``made``; returns the name."""
    options = (draft.teams, draft.like, draft.priority, draft.nccl)
    n = 1
    while True:
        draft.name = whatif_label(draft.like or "", variant if n == 1 else f"{variant},{n}")
        other = made.setdefault(draft.name, draft)
        if (other.teams, other.like, other.priority, other.nccl) == options:
            return draft.name
        n += 1


_BLOCK_PATH = re.compile(r"\.blocks\[([0-9]+)\]\.?([^.\[]*)")


def _moved(
    sub: str, message: str, base: PatternSpec, path: str, sources: Sequence[_Source]
) -> tuple[str, str]:
    """A problem the pattern's checks found at ``sub`` of the variant, at the ``whatif:`` entry
    that caused it: the changed key, the block's entry, or the variant (``path``)."""
    match = _BLOCK_PATH.match(sub, len(base.yaml_path))
    if match is None:
        return path, message
    i, key = int(match[1]), match[2]
    block, source = base.blocks[i].name, sources[i]
    if key in source.keys:
        where, note = source.keys[key]
        return where, message + note + ("" if source.entry_key == block else f" (block {block!r})")
    what = f"{key!r} of block {block!r}" if key else f"block {block!r}"
    return source.entry_path or path, f"{message} ({what})"


def whatif_changes(
    base: PatternSpec, variant: PatternSpec, axes: Mapping[str, AxisSpec]
) -> dict[str, Any]:
    """What ``variant`` changes of ``base``, as its ``whatif:`` entry (the loader's inverse)."""
    changes: dict[str, Any] = {}
    moved: dict[str, AxisSpec] = {}
    for old, new in zip(base.blocks, variant.blocks, strict=True):
        before, after = block_entry(old), block_entry(new)
        if "[" in new.axis:  # an axis of the variant's own (no file names one so): under axes
            like = after["axis"] = axes[new.axis].like or ""
            moved[like] = axes[new.axis]
        diff = {key: value for key, value in after.items() if before.get(key) != value}
        if diff:
            changes["[a]xes" if old.name == AXES_KEY else old.name] = diff
    for name, axis in moved.items():
        same = {"priority": axes[name].priority, "nccl": dict(axes[name].nccl)}
        body = {"priority": axis.priority, "nccl": dict(axis.nccl)}
        changes.setdefault(AXES_KEY, {})[name] = {k: v for k, v in body.items() if v != same[k]}
    return changes
