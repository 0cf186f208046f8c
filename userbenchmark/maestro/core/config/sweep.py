"""Sweep expansion: a pattern's ``sweep`` variables, their points, ``${var}`` substitution. Pure
functions on plain YAML data; problems come back as (relative path, message), a relative path
being a tuple of mapping keys and list indices, so the loader can name the place."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .problems import show
from .sizes import format_size, parse_size

MAX_SWEEP_POINTS: Final = 10_000
"""Most points one pattern may expand to (the product over its variables)."""

RelPath = tuple[Any, ...]
Problem = tuple[RelPath, str]
Point = tuple[tuple[str, Any, str], ...]
"""One sweep point: a (variable, value, label) triple per variable."""

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


def parse_sweep(raw: Any) -> tuple[tuple[SweepVariable, ...], list[Problem]]:
    """The variables of a ``sweep:`` mapping, in declaration order, and any problems."""
    if not isinstance(raw, Mapping) or not raw:
        message = (
            "sweep must be a mapping of variable names to a list of values or "
            "{from, to, factor}, e.g. sweep: {size: [1K, 4M]}"
        )
        return (), [((), message)]
    variables: list[SweepVariable] = []
    problems: list[Problem] = []
    for name, spec in raw.items():
        found: list[Problem] = []  # paths below the variable
        if not isinstance(name, str) or not _VAR_NAME.fullmatch(name):
            message = (
                f"sweep variable name {name!r} must be a letter or _ "
                "followed by letters, digits or _"
            )
            found.append(((), message))
        elif isinstance(spec, Mapping):
            values, labels = _geometric(spec, found)
        elif isinstance(spec, list):
            values, labels = _listed(spec, found)
        else:
            message = f"expected a list of values or {{from, to, factor}}, got {_show(spec)}"
            found.append(((), message))
        problems += [((name, *path), message) for path, message in found]
        if not found:
            variables.append(SweepVariable(name=name, values=values, labels=labels))
    if not problems and (total := num_points(variables)) > MAX_SWEEP_POINTS:
        message = (
            f"sweep expands to {total} points, more than the limit of "
            f"{MAX_SWEEP_POINTS} per pattern"
        )
        problems.append(((), message))
    return tuple(variables), problems


def _listed(spec: list[Any], found: list[Problem]) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    if not spec or len(spec) > MAX_SWEEP_POINTS:
        many = f"{len(spec)} values, more than the limit of {MAX_SWEEP_POINTS} points per pattern"
        found.append(((), many if spec else "a sweep list needs at least one value"))
        return (), ()
    labels: list[str] = []
    for i, value in enumerate(spec):
        label = value_label(value)
        if label is None:
            message = f"sweep values must be strings, numbers or booleans, got {_show(value)}"
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
        found.append(((i,), message))
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
    spec: Mapping[Any, Any], found: list[Problem]
) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    found.extend(
        ((key,), f"unknown key {key!r} in a geometric sweep; valid keys: from, to, factor")
        for key in spec
        if key not in _GEOMETRIC_KEYS
    )
    found.extend(
        ((), f"a geometric sweep needs {key!r} (keys: from, to, factor)")
        for key in _GEOMETRIC_KEYS
        if key not in spec
    )
    if found:
        return (), ()
    start, stop, factor = spec["from"], spec["to"], spec["factor"]
    sizes = isinstance(start, str) or isinstance(stop, str)
    bounds: list[float | int] = []
    for key, value in (("from", start), ("to", stop)):
        try:
            bounds.append(parse_size(value) if sizes else _positive_number(value))
        except ValueError as exc:
            found.append(((key,), str(exc)))
    if (
        isinstance(factor, bool)
        or not isinstance(factor, int | float)
        or not 1 < factor < math.inf  # not math.isfinite: an int past float range is fine
    ):
        message = f"factor must be a number greater than 1, got {_show(factor)}"
        found.append((("factor",), message))
    if found:
        return (), ()
    try:
        values = geometric_values(bounds[0], bounds[1], factor)
    except ValueError as exc:
        found.append(((), str(exc)))
        return (), ()
    labels = (
        format_size(v) if sizes and isinstance(v, int) else value_label(v) or repr(v)
        for v in values
    )
    return tuple(values), tuple(labels)


def _positive_number(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) < math.inf:
        raise ValueError(f"expected a positive number or a size such as 4M, got {_show(value)}")
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
    columns = (zip(v.values, v.labels, strict=True) for v in variables)
    for combo in itertools.product(*columns):
        yield tuple((v.name, *pair) for v, pair in zip(variables, combo, strict=True))


def point_label(point: Point) -> str:
    """``size=4M,dtype=bf16`` for a point."""
    return ",".join(f"{name}={label}" for name, _, label in point)


def point_name(base: str, point: Point) -> str:
    """Stable pattern name of a point: ``base[size=4M,dtype=bf16]`` (just ``base`` without one)."""
    return f"{base}[{point_label(point)}]" if point else base


def check_references(data: Any, names: Sequence[str]) -> tuple[set[str], list[Problem]]:
    """Variables that ``data`` references with ``${var}``, and problems with its references."""
    used: set[str] = set()
    problems: list[Problem] = []
    defined = ", ".join(names) if names else "none: this pattern has no sweep"
    for path, text in _strings(data, ()):
        for match in _REFERENCE.finditer(text):
            name = match.group(1)
            if not _VAR_NAME.fullmatch(name):
                message = (
                    f"bad sweep reference {match.group(0)!r}: write ${{name}} with a variable name"
                )
                problems.append((path, message))
            elif name not in names:
                problems.append((path, f"undefined sweep variable {name!r} (defined: {defined})"))
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


def _strings(node: Any, path: RelPath) -> Iterator[tuple[RelPath, str]]:
    if isinstance(node, str):
        if "${" in node:
            yield path, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _strings(value, (*path, key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _strings(item, (*path, i))


def _show(value: Any) -> str:
    if isinstance(value, Mapping | list):
        return "a mapping" if isinstance(value, Mapping) else "a list"
    return show(value)
