"""A pattern's ``whatif:`` variants: each the pattern with some blocks' keys changed (a value, or
a factor ``x1.5`` of a number or size) and some axes' communicator options changed (on an axis of
its own), checked by the pattern's own checks, each problem at the ``whatif:`` entry behind it."""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from ...blocks.dtypes import DTYPE_SIZES_BYTES
from .axes import AxisDraft, check_nccl
from .blocks import OpResolver, block_entry, yaml_key
from .problems import Problems, choices, join, suggest
from .spec import PRIORITIES, TRACED_KEYS, AxisSpec, BlockSpec, PatternSpec, whatif_label

AXES_KEY: Final = "axes"
"""The key of a variant that changes axes' options (a block named ``axes`` is ``"[a]xes"``)."""
AXIS_KEYS: Final = ("priority", "nccl")
_TRACED = "a variant is measured against its pattern, not a trace"
FIXED_KEYS: Final = {
    "name": "its blocks are matched to the pattern's by name",
    "op": "a variant changes how a block runs, not what it is",
    **dict.fromkeys(TRACED_KEYS, _TRACED),
}
_FACTOR: Final = re.compile(r"x([0-9]{1,9}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})")  # below 1e9
_BLOCK_PATH: Final = re.compile(r"\.blocks\[([0-9]+)\]\.?([^.\[]*)")

# The pattern's own checks on a variant: (problems, its entry, its own axes) to its spec, or None.
Validate = Callable[[Problems, dict[Any, Any], dict[str, AxisDraft]], PatternSpec | None]


@dataclasses.dataclass
class _Changed:
    """What a variant changed of one block: the entry that did (its path and key as written),
    and each key's path and note (the factor behind a value)."""

    path: str = ""
    key: str = ""
    keys: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


def check_whatif(
    p: Problems, body: dict[Any, Any], base: PatternSpec, file: Any, validate: Validate
) -> PatternSpec:
    """The valid pattern ``base`` (``body``: its entry) with the variants of its ``whatif:``, if
    any; ``file`` holds the file's ``axes``, ``ops`` and the variants' own axes (``made_axes``)."""
    raw, path = body.get("whatif"), join(base.yaml_path, "whatif")
    expected = "whatif must map variant names to their changes, e.g. {bigger: {gemm: {m: x2}}}"
    if raw is None or not p.mapping(raw, path, expected):
        return base
    plain = {k: v for k, v in body.items() if k not in ("whatif", "traced_us", "traced_by_rank_us")}

    def check(q: Problems, entries: list[Any], own: dict[str, AxisDraft]) -> PatternSpec | None:
        return validate(q, plain | {"blocks": entries}, own)

    variants = [
        _variant(p, name, changes, join(path, name), base, file, check)
        for name, changes in raw.items()
        if p.name(name, join(path, name), "a variant name") is not None
    ]
    return dataclasses.replace(base, variants=tuple(v for v in variants if v is not None))


def _variant(
    p: Problems, name: str, raw: Any, path: str, base: PatternSpec, file: Any, check: Any
) -> PatternSpec | None:
    expected = "a variant maps block names or globs to the keys it changes (and axes: to options)"
    if raw is not None and not p.mapping(raw, path, expected):
        return None
    raw, start = raw or {}, len(p)
    entries = [block_entry(b) for b in base.blocks]
    changed = [_Changed() for _ in base.blocks]
    for key, changes in raw.items():
        for i in _matched(p, key, join(path, key), base.blocks) if key != AXES_KEY else ():
            changed[i].path, changed[i].key = join(path, key), str(key)
            _change(p, entries[i], changed[i], changes, base.blocks[i], file.ops)
    own = _own_axes(p, raw.get(AXES_KEY), join(path, AXES_KEY), name, entries, file)
    found = Problems(p.file, like=p)
    spec = check(found, entries, own)
    for sub, message, _ in found.items:
        p.add(*_moved(sub, message, base, path, changed))
    if spec is None or len(p) > start:
        return None
    blocks = tuple(
        dataclasses.replace(b, yaml_path=c.path or b.yaml_path)
        for b, c in zip(spec.blocks, changed, strict=True)
    )
    return dataclasses.replace(spec, variant=name, blocks=blocks, yaml_path=path)


def _matched(p: Problems, key: Any, path: str, blocks: Sequence[BlockSpec]) -> list[int]:
    """The blocks ``key`` names (a name, or a glob of names), after recording why none."""
    names = [b.name for b in blocks]
    found = [i for i, name in enumerate(names) if fnmatch.fnmatchcase(name, str(key))]
    if not found:
        p.add(
            path,
            f"{key!r} names no block{suggest(key, names)}; blocks of this pattern: "
            f"{choices(names)} (or {AXES_KEY}: for axes' options)",
        )
    return found


def _change(
    p: Problems, entry: dict[str, Any], changed: _Changed, raw: Any, block: BlockSpec, ops: Any
) -> None:
    """Apply the changes ``raw`` (block keys to values or factors) to the block's ``entry``."""
    if not p.mapping(raw, changed.path, "expected a mapping of the keys it changes, e.g. {m: x2}"):
        return
    # Plain values first: a factor of a size counts elements of the variant's dtype.
    for key, value in sorted(raw.items(), key=lambda kv: _factor(kv[1]) is not None):
        sub, note = join(changed.path, key), ""
        if key in FIXED_KEYS:
            p.add(sub, f"{key} cannot change in a variant: {FIXED_KEYS[key]}")
            continue
        if key in changed.keys:
            also = changed.keys[key][0]
            p.add(sub, f"{key!r} of block {block.name!r} is changed twice (also at {also})")
            continue
        if _factor(value) is not None:
            value, note = _scaled(p, sub, value, entry, key, ops)
        if value is not None:
            entry[key], changed.keys[key] = value, (sub, note)
    if "axis" in changed.keys and "lane" not in changed.keys and block.lane == block.axis:
        entry["lane"] = entry["axis"]  # a lane the file left to its axis follows the axis


def _factor(value: Any) -> float | None:
    match = _FACTOR.fullmatch(value) if isinstance(value, str) else None
    return float(match[1]) if match else None


def _scaled(
    p: Problems, path: str, text: str, entry: dict[str, Any], key: str, ops: OpResolver
) -> tuple[Any, str]:
    """(``text``'s factor times the block's ``key``, a note saying so), or (None, "") after a
    problem; an int stays whole, a size whole elements of the block's dtype."""
    cls = ops.resolve(entry["op"])
    params = getattr(cls, "params", ()) if isinstance(cls, type) else ()
    kind = next((q.kind for q in params if yaml_key(q) == key), None)
    if kind not in ("int", "float", "size") or entry.get(key) is None:
        p.add(path, f"a factor ({text}) scales a number or a size the block sets; {key!r} is not")
        return None, ""
    value, note = entry[key] * (_factor(text) or 0.0), f" ({text} of the pattern's {entry[key]})"
    if kind == "size":
        element = DTYPE_SIZES_BYTES.get(entry["dtype"], 1)
        return round(value / element) * element, note
    return (round(value) if kind == "int" else float(f"{value:.12g}")), note


def _own_axes(
    p: Problems, raw: Any, path: str, variant: str, entries: list[dict[str, Any]], file: Any
) -> dict[str, AxisDraft]:
    """The axes a variant's ``axes:`` (``raw``) gives options over their own, on their teams,
    named ``dp[whatif=variant]``; the blocks on them (``entries``) move there."""
    expected = "axes in a variant maps axis names to new options, e.g. {dp: {nccl: {...}}}"
    if raw is None or not p.mapping(raw, path, expected):
        return {}
    own = {}
    for name, options in raw.items():
        sub, axis = join(path, name), file.axes.get(name) if isinstance(name, str) else None
        if axis is None or not any(entry["axis"] == name for entry in entries):
            used = choices(dict.fromkeys(entry["axis"] for entry in entries))
            p.add(sub, f"no block of this variant runs on axis {name!r}; its blocks' axes: {used}")
            continue
        if not p.mapping(options, sub, f"expected options: {choices(AXIS_KEYS)}"):
            continue
        p.unknown_keys(options, sub, AXIS_KEYS, "in a variant's axis (it keeps the axis's teams)")
        priority = p.get(options, sub, "priority", p.choice, PRIORITIES, "priority", "priorities")
        nccl = p.get(options, sub, "nccl", check_nccl, p, axis.nccl, default=axis.nccl)
        draft = AxisDraft(name=whatif_label(name, variant), path=sub, teams=axis.teams, like=name)
        draft.priority, draft.nccl = priority or axis.priority, nccl
        other = file.made_axes.setdefault(draft.name, draft)
        if (other.priority, other.nccl) != (draft.priority, draft.nccl):
            why = "name the variants apart (each variant's axis is named after it)"
            p.add(
                sub,
                f"a variant {variant!r} gives axis {name!r} other options at {other.path}: {why}",
            )
        own[draft.name] = draft
        for entry in entries:
            entry["axis"] = draft.name if entry["axis"] == name else entry["axis"]
    return own


def _moved(
    sub: str, message: str, base: PatternSpec, path: str, changed: Sequence[_Changed]
) -> tuple[str, str]:
    """A problem the pattern's checks found at ``sub`` of the variant, moved to the ``whatif:``
    entry behind it: the key changed, else the block's entry, else the variant (``path``)."""
    match = _BLOCK_PATH.match(sub, len(base.yaml_path))
    if match is None:
        return path, message
    block, c, key = base.blocks[int(match[1])].name, changed[int(match[1])], match[2]
    if key in c.keys:
        where, note = c.keys[key]
        return where, message + note + ("" if c.key == block else f" (block {block!r})")
    what = f"{key!r} of block {block!r}" if key else f"block {block!r}"
    return c.path or path, f"{message} ({what})"


def whatif_changes(
    base: PatternSpec, variant: PatternSpec, axes: Mapping[str, AxisSpec]
) -> dict[str, Any]:
    """What ``variant`` changes of ``base``, as its ``whatif:`` entry (the loader's inverse)."""
    changes: dict[str, Any] = {}
    for old, new in zip(base.blocks, variant.blocks, strict=True):
        before, after = block_entry(old), block_entry(new)
        if "[" in new.axis:  # an axis of the variant's own (no file can name one so)
            axis = axes[new.axis]
            after["axis"] = axis.like
            options = {"priority": axis.priority, "nccl": dict(axis.nccl)}
            changes.setdefault(AXES_KEY, {})[axis.like] = options
        diff = {key: value for key, value in after.items() if before.get(key) != value}
        if diff:
            changes["[a]xes" if old.name == AXES_KEY else old.name] = diff
    return changes
