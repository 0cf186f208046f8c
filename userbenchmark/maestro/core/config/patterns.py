"""Patterns: run settings (``defaults``, per-pattern overrides), sweeps expanded into one
PatternSpec per point, and each point's blocks, checked even when the name or sweep has problems:
only values unknown without a valid sweep are left alone, so one run reports all the rest."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from .axes import AxisDraft
from .blocks import DTYPES, OpResolver, check_after, check_block
from .problems import Problems, index, join, show
from .sizes import format_size, parse_size
from .spec import SYNC_MODES, WORLD_AXIS, BlockSpec, PatternSpec
from .variants import check_whatif

DEFAULT_VALUES: Final = {
    "dtype": "fp32",
    "warmup_iters": 5,
    "iters": 50,
    "baseline": True,
    "check": False,
    "sync": "barrier",
    "graph": False,
    "register_buffers": False,
}
DEFAULT_KEYS: Final = tuple(DEFAULT_VALUES)
PATTERN_SETTINGS: Final = {"warmup_iters": "warmup_iters", "iters": "num_iters",
                           "baseline": "baseline", "check": "check", "sync": "sync",
                           "graph": "graph"}  # fmt: skip
"""The run settings a PatternSpec holds, each key with its field (dtype and register_buffers are
the blocks')."""
PATTERN_KEYS: Final = ("name", "sweep", "blocks", "traced_us", "traced_by_rank_us", "whatif",
                       *DEFAULT_KEYS)  # fmt: skip
MAX_EXPANDED_BLOCKS: Final = 100_000
"""Most blocks a file may expand to, over all patterns and sweep points."""
MAX_ITERS: Final = 1_000_000
"""Most iterations (measured, and warmup) of one pattern: see ITERS_WHY."""
ITERS_WHY: Final = (
    "iteration numbers must fit the profiler's 24-bit correlation ids, and every iteration's "
    "timings are kept in host memory until the pattern's window ends"
)
MAX_WINDOW_LAUNCHES: Final = 10_000_000
"""Most block launches (blocks x iterations) of one measurement window."""


def window_launches_problem(num_blocks: int, num_iters: int) -> str | None:
    """Why ``num_blocks`` blocks run ``num_iters`` times in one window is too much, or None."""
    launches = num_blocks * num_iters
    if launches <= MAX_WINDOW_LAUNCHES:
        return None
    return (
        f"{num_blocks} blocks x {num_iters} iterations is {launches} block launches in one "
        f"window, more than {MAX_WINDOW_LAUNCHES}: the profiler keeps every launch's timing "
        "records in host memory until the window ends; lower the iterations or split the pattern"
    )


def check_settings(
    p: Problems, raw: dict[Any, Any], path: str, base: dict[str, Any]
) -> dict[str, Any]:
    """``base`` updated with the run settings (dtype, iters, ...) present in ``raw``."""
    checks: dict[str, Callable[[Any, str], Any]] = {
        "dtype": lambda v, s: p.choice(v, s, DTYPES, "dtype"),
        "warmup_iters": lambda v, s: p.integer(v, s, minimum=0, maximum=MAX_ITERS, why=ITERS_WHY),
        "iters": lambda v, s: p.integer(v, s, minimum=1, maximum=MAX_ITERS, why=ITERS_WHY),
        "baseline": p.boolean,
        "check": p.boolean,
        "sync": lambda v, s: p.choice(v, s, SYNC_MODES, "sync mode"),
        "graph": p.boolean,
        "register_buffers": p.boolean,
    }
    return base | {k: v for k in DEFAULT_KEYS if (v := p.get(raw, path, k, checks[k])) is not None}


@dataclass(frozen=True)
class _File:
    defaults: dict[str, Any]
    axes: dict[str, AxisDraft]
    ops: OpResolver
    homes: dict[str, list[str]]  # block name as written -> the patterns with a block of that name
    made_axes: dict[str, AxisDraft] = field(default_factory=dict)  # the variants' own axes


def check_patterns(
    p: Problems,
    data: dict[Any, Any],
    defaults: dict[str, Any],
    axes: dict[str, AxisDraft],
    ops: OpResolver,
) -> list[PatternSpec]:
    """Every pattern of the file after sweep expansion (complete only when ``p`` is empty)."""
    if p.missing(data, "", "patterns", " (a list of patterns, each with a name and blocks)"):
        return []
    raw = data["patterns"]
    if not p.non_empty(raw, "patterns", list, "patterns must be a non-empty list"):
        return []
    homes: dict[str, list[str]] = {}
    for entry in raw:
        for block in _listed(entry.get("blocks")) if isinstance(entry, dict) else ():
            name = block.get("name") if isinstance(block, dict) else None
            if isinstance(name, str) and isinstance(entry.get("name"), str):
                homes.setdefault(name, []).append(entry["name"])
    file = _File(defaults, axes, ops, homes)
    patterns: list[PatternSpec] = []
    names: dict[str, str] = {}
    total_blocks = 0
    for i, entry in enumerate(raw):
        path = index("patterns", i)
        if not p.mapping(entry, path, "a pattern is a mapping with name and blocks"):
            continue
        p.unknown_keys(entry, path, PATTERN_KEYS, "in a pattern")
        base = None
        if not p.missing(entry, path, "name") and not check_references(entry["name"], [])[1]:
            base = p.name(entry["name"], join(path, "name"), "a pattern name")  # else: sweep's
        if base in names:
            p.add(join(path, "name"), f"duplicate pattern name {base!r} (also {names[base]})")
        if base is not None:
            names[base] = path
        points, unresolved = _sweep_points(p, entry, path)
        total_blocks += len(points) * len(_listed(entry.get("blocks")))
        if total_blocks > MAX_EXPANDED_BLOCKS:
            p.add(
                path,
                f"the patterns expand to more than {MAX_EXPANDED_BLOCKS} blocks in "
                "total; split the file or shrink the sweeps",
            )
            break
        specs = _expand(p, file, entry, path, base or "", points, unresolved)
        if base is not None:
            patterns.extend(specs)
    axes.update(file.made_axes)
    return patterns


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _body(entry: dict[Any, Any]) -> dict[Any, Any]:
    return {k: v for k, v in entry.items() if k not in ("name", "sweep")}


def _sweep_points(p: Problems, entry: dict[Any, Any], path: str) -> tuple[list[Point], set[str]]:
    """The points to check the pattern at, and the paths of values referring to a variable without
    values: their problems are reported once, as sweep problems, not again at every point."""
    variables: tuple[SweepVariable, ...] = ()
    ok = True
    raw_sweep = entry.get("sweep")
    if "sweep" in entry:
        start = len(p)
        variables = parse_sweep(p, raw_sweep, join(path, "sweep"))
        ok = len(p) == start
    # Names declared even when their values are bad, so references are not reported twice.
    names = [k for k in raw_sweep if isinstance(k, str)] if isinstance(raw_sweep, dict) else []
    if "name" in entry and check_references(entry["name"], [])[1]:
        p.add(
            join(path, "name"),
            "a pattern name cannot use sweep variables; each "
            "point is named automatically, e.g. base[size=4M]",
        )
        ok = False
    used, found = check_references(_body(entry), names, path)
    if "sweep" in entry and not isinstance(raw_sweep, dict):
        found = []  # the sweep itself is reported; its references cannot be judged
    for where, message in found:
        p.add(where, message)
    for name in names if ok and not found else ():
        if name not in used:
            p.add(
                join(join(path, "sweep"), name),
                f"sweep variable {name!r} is not "
                'used by any block (reference it as "${' + name + '}")',
            )
    # An unused variable only repeats the same points: check the pattern without it.
    kept = tuple(v for v in variables if v.name in used)
    if num_points(kept) > MAX_SWEEP_POINTS:
        kept = ()  # reported by parse_sweep; expanding it would only cost time
    _, unresolvable = check_references(_body(entry), [v.name for v in kept], path)
    return list(sweep_points(kept)), {where for where, _ in unresolvable}


def _expand(
    p: Problems,
    file: _File,
    entry: dict[Any, Any],
    path: str,
    base: str,
    points: list[Point],
    unresolved: set[str],
) -> list[PatternSpec]:
    """One PatternSpec per point; a problem found at only some points names the first."""
    found: dict[tuple[str, str], list[str]] = {}
    specs: list[PatternSpec] = []
    for point in points:
        problems = Problems(p.file, like=p)  # merged below, once per problem
        body = substitute(_body(entry), point)
        spec = _pattern_point(problems, file, body, path, base, point, entry.get("name"))
        for sub, message, _line in problems.items:
            if not any(sub == r or sub.startswith((r + ".", r + "[")) for r in unresolved):
                found.setdefault((sub, message), []).append(point_label(point))
        if spec is not None:
            specs.append(spec)
    for (sub, message), labels in found.items():
        if len(points) > 1 and len(labels) < len(points):
            more = f" and {len(labels) - 1} other points" if len(labels) > 1 else ""
            message = f"{message} (at sweep point {labels[0]}{more})"
        p.add(sub, message)
    return specs


def _off_its_axis_lane(p: Problems, spec: BlockSpec, raw: dict[Any, Any], lanes: dict) -> bool:
    """Whether a collective is on another lane than its axis's first collective (recorded as a
    problem); ``lanes``: {axis: (lane, block, path) of its first collective}."""
    lane, other, other_path = lanes.setdefault(spec.axis, (spec.lane, spec.name, spec.yaml_path))
    if lane == spec.lane:
        return False
    p.add(
        join(spec.yaml_path, "lane" if "lane" in raw else "axis"),
        f"block {spec.name!r} is on lane {spec.lane!r} "
        f"but block {other!r} ({other_path}) uses the same axis {spec.axis!r} on "
        f"lane {lane!r}: one axis is one communicator, whose operations must be "
        "issued in one order on every rank, so its blocks must share a lane; to "
        "overlap them, put one on a second communicator, an axis defined with "
        f"like: {spec.axis}",
    )
    return True


def _pattern_point(
    p: Problems, file: _File, body: dict[Any, Any], path: str, base: str, point: Point, written: Any
) -> PatternSpec | None:
    """The pattern ``body`` at one sweep ``point`` (``written``: the pattern's name as written)."""
    settings = check_settings(p, body, path, file.defaults)
    traced_us = p.get(body, path, "traced_us", p.number, minimum=0.0)
    world = file.axes[WORLD_AXIS].teams
    traced_by_rank = p.get(
        body, path, "traced_by_rank_us", _traced_by_rank_us, p, world, default=()
    )
    raw_blocks = body.get("blocks")
    if p.missing(body, path, "blocks", " (a list of blocks)"):
        return None
    if not p.non_empty(raw_blocks, join(path, "blocks"), list, "blocks must be a non-empty list"):
        return None
    blocks: list[BlockSpec] = []
    names: dict[str, str] = {}
    lanes: dict[str, tuple[str, str, str]] = {}
    for i, raw in enumerate(raw_blocks):
        block_path = index(join(path, "blocks"), i)
        spec = check_block(p, raw, block_path, settings, file.axes, file.ops)
        if spec is None:
            continue
        if spec.name in names:
            p.add(
                join(block_path, "name"),
                f"duplicate block name {spec.name!r} in this pattern (also {names[spec.name]})",
            )
            continue
        names[spec.name] = block_path
        # Only blocks that talk through the axis's communicator are bound to one order.
        comm = getattr(file.ops.resolve(spec.op), "category", "") == "comm"
        if comm and _off_its_axis_lane(p, spec, raw, lanes):
            continue
        blocks.append(spec)
    names_written = (b.get("name") if isinstance(b, dict) else None for b in raw_blocks)
    declared = {name: None for name in names_written if isinstance(name, str)}
    check_after(p, blocks, declared, file.homes, written)
    if blocks and not p:
        num_iters = max(settings["iters"], settings["warmup_iters"])
        problem = window_launches_problem(len(blocks), num_iters)
        if problem is not None:
            key = "iters" if settings["iters"] >= settings["warmup_iters"] else "warmup_iters"
            p.add(join(path, key), problem)
    if p:
        return None
    spec = PatternSpec(
        name=point_name(base, point),
        base_name=base,
        sweep_point=tuple((name, label) for name, _, label in point),
        blocks=tuple(blocks),
        **{field: settings[key] for key, field in PATTERN_SETTINGS.items()},
        traced_us=traced_us,
        traced_by_rank_us=traced_by_rank,
        yaml_path=path,
    )

    def validate(q: Problems, variant: dict[Any, Any], axes: dict[str, AxisDraft]) -> Any:
        at = replace(file, axes=file.axes | axes)  # the variant's own axes too
        return _pattern_point(q, at, variant, path, base, point, written)

    return check_whatif(p, body, spec, file, validate)


def _traced_by_rank_us(value: Any, where: str, p: Problems, world: Any) -> tuple[float, ...]:
    """Each rank's own traced step (µs), one per rank."""
    size = len(world[0]) if world else None
    if not isinstance(value, list) or len(value) != (size or len(value)):
        count = f"{size} durations" if size else "durations"
        p.add(where, f"expected a list of {count} in µs, one per rank, got {p.show(where, value)}")
        return ()
    return tuple(p.number(v, index(where, i), minimum=0.0) or 0.0 for i, v in enumerate(value))


# ---- sweep expansion: functions of plain YAML data, recording their problems in a Problems ----
MAX_SWEEP_POINTS: Final = 10_000
"""Most points one pattern may expand to (the product over its variables)."""

Point = tuple[tuple[str, Any, str], ...]  # one sweep point: (variable, value, label) per variable

_REFERENCE = re.compile(r"\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Values become part of the pattern name (``base[var=value]``): keep its separators unambiguous.
_VALUE_TEXT = re.compile(r"[A-Za-z0-9_.+-]+")
_GEOMETRIC_KEYS: Final = ("from", "to", "factor")


@dataclass(frozen=True, kw_only=True)
class SweepVariable:
    """One sweep variable: the values substituted for ``${name}`` and how each is written."""

    name: str
    values: tuple[Any, ...]
    """What a whole-value ``"${name}"`` becomes (sizes of a geometric size sweep in bytes)."""
    labels: tuple[str, ...]
    """Each value as written in the file (format_size for geometric size sweeps)."""


def parse_sweep(p: Problems, raw: Any, path: str) -> tuple[SweepVariable, ...]:
    """The variables of the ``sweep:`` mapping ``raw`` at ``path``, in declaration order."""
    if not isinstance(raw, Mapping) or not raw:
        message = (
            "sweep must be a mapping of variable names to a list of values or "
            "{from, to, factor}, e.g. sweep: {size: [1K, 4M]}"
        )
        p.add(path, message)
        return ()
    variables: list[SweepVariable] = []
    start = len(p)
    for name, spec in raw.items():
        sub, before = join(path, name), len(p)
        if not isinstance(name, str) or not _VAR_NAME.fullmatch(name):
            message = (
                f"sweep variable name {name!r} must be a letter or _ "
                "followed by letters, digits or _"
            )
            p.add(sub, message)
        elif isinstance(spec, Mapping):
            values, labels = _geometric(p, spec, sub)
        elif isinstance(spec, list):
            values, labels = _list_values(p, spec, sub)
        else:
            message = f"expected a list of values or {{from, to, factor}}, got {show(spec)}"
            p.add(sub, message)
        if len(p) == before:
            variables.append(SweepVariable(name=name, values=values, labels=labels))
    if len(p) == start and (total := num_points(variables)) > MAX_SWEEP_POINTS:
        message = (
            f"sweep expands to {total} points, more than the limit of "
            f"{MAX_SWEEP_POINTS} per pattern"
        )
        p.add(path, message)
    return tuple(variables)


def _list_values(
    p: Problems, spec: list[Any], path: str
) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    if not spec or len(spec) > MAX_SWEEP_POINTS:
        many = f"{len(spec)} values, more than the limit of {MAX_SWEEP_POINTS} points per pattern"
        p.add(path, many if spec else "a sweep list needs at least one value")
        return (), ()
    labels: list[str] = []
    for i, value in enumerate(spec):
        label = value_label(value)
        if label is None:
            message = f"sweep values must be strings, numbers or booleans, got {show(value)}"
        elif not _VALUE_TEXT.fullmatch(label):
            message = (
                f"sweep value {label!r} becomes part of the pattern name and "
                "may only contain letters, digits and _ . + -"
            )
        elif label in labels:
            message = f"sweep value {label!r} is listed twice"
        else:
            labels.append(label)
            continue
        p.add(index(path, i), message)
    return tuple(spec), tuple(labels)


def value_label(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return None


def _geometric(
    p: Problems, spec: Mapping[Any, Any], path: str
) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    before = len(p)
    p.unknown_keys(spec, path, _GEOMETRIC_KEYS, "in a geometric sweep")
    for key in _GEOMETRIC_KEYS:
        if key not in spec:
            p.add(path, f"a geometric sweep needs {key!r} (keys: from, to, factor)")
    if len(p) > before:
        return (), ()
    start, stop, factor = spec["from"], spec["to"], spec["factor"]
    sizes = isinstance(start, str) or isinstance(stop, str)
    bounds: list[float | int] = []
    for key, value in (("from", start), ("to", stop)):
        try:
            bounds.append(parse_size(value) if sizes else _positive_number(value))
        except ValueError as exc:
            p.add(join(path, key), str(exc))
    if (
        isinstance(factor, bool)
        or not isinstance(factor, int | float)
        or not 1 < factor < math.inf  # not math.isfinite: an int past float range is fine
    ):
        p.add(join(path, "factor"), f"factor must be a number greater than 1, got {show(factor)}")
    if len(p) > before:
        return (), ()
    try:
        values = geometric_values(bounds[0], bounds[1], factor)
    except ValueError as exc:
        p.add(path, str(exc))
        return (), ()
    labels = (
        format_size(v) if sizes and isinstance(v, int) else value_label(v) or repr(v)
        for v in values
    )
    return tuple(values), tuple(labels)


def _positive_number(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) < math.inf:
        raise ValueError(f"expected a positive number or a size such as 4M, got {show(value)}")
    if value <= 0:
        raise ValueError(f"a geometric sweep needs a positive start and end, got {value}")
    return value


def geometric_values(
    start: int | float, stop: int | float, factor: int | float, *, limit: int = MAX_SWEEP_POINTS
) -> list[int | float]:
    """start, start*factor, ... up to stop (included when hit exactly), at most ``limit`` values
    (ValueError past it): exact integers when start and factor are integers, else floats rounded
    to 12 significant digits, whole ones given as ints."""
    if stop < start:
        raise ValueError(f"a geometric sweep needs to >= from, got from {start} and to {stop}")
    exact = isinstance(start, int) and isinstance(factor, int)
    described = f"geometric sweep from {start} to {stop} by {factor}"
    if not exact:
        try:
            start, stop, factor = float(start), float(stop), float(factor)
        except OverflowError as exc:
            raise ValueError("geometric sweep bounds are too large for floating point") from exc
    values: list[int | float] = []
    for i in itertools.count():
        try:
            value = start * factor**i
        except OverflowError:  # floats only
            break
        if value > stop * (1 if exact else 1 + 1e-12) or (not exact and not math.isfinite(value)):
            break
        if not exact:
            value = float(f"{value:.12g}")
            value = int(value) if value.is_integer() else value
        if len(values) >= limit:
            raise ValueError(f"{described} has more than {limit} points")
        values.append(value)
    return values


def num_points(variables: Sequence[SweepVariable]) -> int:
    """Points of the Cartesian product of ``variables`` (1 when there are none)."""
    return math.prod(len(v.values) for v in variables)


def sweep_points(variables: Sequence[SweepVariable]) -> Iterator[Point]:
    """Each point as (name, value, label) triples; the first variable varies slowest."""
    for combo in itertools.product(*(zip(v.values, v.labels, strict=True) for v in variables)):
        yield tuple((v.name, *pair) for v, pair in zip(variables, combo, strict=True))


def point_label(point: Point) -> str:
    """``size=4M,dtype=bf16`` for a point."""
    return ",".join(f"{name}={label}" for name, _, label in point)


def point_name(base: str, point: Point) -> str:
    """Stable pattern name of a point: ``base[size=4M,dtype=bf16]`` (just ``base`` without one)."""
    return f"{base}[{point_label(point)}]" if point else base


def check_references(
    data: Any, names: Sequence[str], path: str = ""
) -> tuple[set[str], list[tuple[str, str]]]:
    """Variables that ``data`` (at ``path``) references with ``${var}``, and the problems of its
    references as (path, message)."""
    used: set[str] = set()
    problems: list[tuple[str, str]] = []
    defined = ", ".join(names) if names else "none: this pattern has no sweep"
    for where, text in _strings(data, path):
        for match in _REFERENCE.finditer(text):
            name = match.group(1)
            if not _VAR_NAME.fullmatch(name):
                message = (
                    f"bad sweep reference {match.group(0)!r}: write ${{name}} with a variable name"
                )
                problems.append((where, message))
            elif name not in names:
                problems.append((where, f"undefined sweep variable {name!r} (defined: {defined})"))
            else:
                used.add(name)
    return used, problems


def substitute(data: Any, point: Point) -> Any:
    """A copy of ``data`` with ``"${var}"`` replaced by the point's value (typed) and ``${var}``
    inside a longer string by its label; mapping keys are left alone."""
    if not point:
        return data
    values = {name: value for name, value, _ in point}
    labels = {name: label for name, _, label in point}

    def replace(node: Any) -> Any:
        if isinstance(node, str):
            whole = _REFERENCE.fullmatch(node)
            if whole and whole.group(1) in values:
                return values[whole.group(1)]
            return _REFERENCE.sub(lambda m: labels.get(m.group(1), m.group(0)), node)
        if isinstance(node, Mapping):
            return {key: replace(value) for key, value in node.items()}
        if isinstance(node, list):
            return [replace(item) for item in node]
        return node

    return replace(data)


def _strings(node: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, str):
        if "${" in node:
            yield path, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _strings(value, join(path, key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _strings(item, index(path, i))
