"""The loader's inverse: a SuiteSpec as the pattern file that loads back into it.

``load_suite_text(dump_suite(suite))`` equals ``suite`` but for where things were written
(``source``, ``yaml_path``, ``text_sha256``). The file says only what differs from the loader's
defaults: a block's parameters at their declared default, its lane when it is its axis, its
dtype when it is the file's. Sweep points of one pattern become that pattern's ``sweep`` again,
each value that changes with a point written as the ``${variable}`` that gives it.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

import yaml

from ...blocks.registry import resolve_op
from .blocks import yaml_key
from .loader import DEFAULT_TIMEOUT_S
from .patterns import DEFAULT_VALUES
from .problems import YAML11_BOOLEAN_WORDS
from .sizes import parse_size
from .spec import WORLD_AXIS, BlockSpec, PatternSpec, SuiteSpec
from .sweep import value_label

SETTINGS: Final = ("warmup_iters", "iters", "baseline", "check", "sync", "graph")
"""Run settings a pattern spec holds (``iters`` as ``num_iters``); dtype and
register_buffers are the blocks'."""
_UNPRINTABLE: Final = re.compile(  # and the line breaks YAML folds, and the byte order mark
    f"{yaml.reader.Reader.NON_PRINTABLE.pattern}|[\x85\u2028\u2029\ufeff]"
)
_PLAIN: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+\-]*")


class _SweepValue(str):
    """A sweep value as its label: written plain where it reads back as that label."""


def scalar(value: Any) -> str:
    """``value`` as a YAML scalar that reads back as itself (text quoted where it would not)."""
    if isinstance(value, _SweepValue) and value_label(yaml.safe_load(value)) == value:
        return str(value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ("-.inf" if value < 0 else ".inf")
    if isinstance(value, int | float):
        mantissa, e, exponent = repr(value).partition("e")
        if e and "." not in mantissa:  # YAML 1.1 reads 1e-05 as text
            return f"{mantissa}.0e{exponent if exponent[0] in '+-' else '+' + exponent}"
        return repr(value)
    text = str(value)
    plain = _PLAIN.fullmatch(text) and text.lower() not in YAML11_BOOLEAN_WORDS
    if plain and yaml.safe_load(text) == text:
        return text
    # A JSON string is a YAML double-quoted one; YAML escapes what it may not hold raw.
    body = _UNPRINTABLE.sub(_escape, json.dumps(text, ensure_ascii=False)[1:-1])
    return f'"{body}"'


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def flow(value: Any) -> str:
    """``value`` (scalars, lists and mappings of them) in YAML flow style, on one line."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key}: {flow(v)}" for key, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    return scalar(value)


def dump_suite(
    suite: SuiteSpec,
    *,
    header: Sequence[str] = (),
    comments: Mapping[tuple[str, str], str] | None = None,
) -> str:
    """The pattern file of ``suite``: ``header`` as comment lines first, and ``comments``
    ({(pattern name, block name): text}) after their blocks. ValueError for a suite no file
    can give (sweep points no ``${variable}`` explains)."""
    blocks = [b for p in suite.patterns for b in p.blocks]
    dtypes = Counter(b.dtype for b in blocks).most_common(1)
    defaults = {
        "dtype": dtypes[0][0] if dtypes else DEFAULT_VALUES["dtype"],
        "register_buffers": bool(blocks) and all(b.register_buffers for b in blocks),
    }
    for key in SETTINGS:
        values = {_setting(p, key) for p in suite.patterns}
        defaults[key] = values.pop() if len(values) == 1 else DEFAULT_VALUES[key]
    top = {
        "name": suite.name,
        "world_size": suite.world_size,
        "defaults": {k: v for k, v in defaults.items() if v != DEFAULT_VALUES[k]},
        "env": dict(suite.env),
        "timeout_s": suite.timeout_s if suite.timeout_s != DEFAULT_TIMEOUT_S else None,
        "stop_on_error": None if suite.stop_on_error else False,
        "mesh": dict(suite.mesh),
    }
    lines = [f"# {line}".rstrip() for line in header]
    lines += [f"{key}: {flow(value)}" for key, value in top.items() if value not in (None, {})]
    axes = _axes(suite)
    lines += ["axes:"] * bool(axes) + [f"  {name}: {flow(body)}" for name, body in axes.items()]
    lines.append("patterns:")
    for (_, swept), group in itertools.groupby(
        suite.patterns, key=lambda p: (p.base_name, bool(p.sweep_point))
    ):
        points = list(group)
        for one in [points] if swept else [[p] for p in points]:
            lines += _pattern(one, defaults, comments or {})
    return "\n".join(lines) + "\n"


def _setting(pattern: PatternSpec, key: str) -> Any:
    return getattr(pattern, "num_iters" if key == "iters" else key)


def _axes(suite: SuiteSpec) -> dict[str, dict[str, Any]]:
    """What ``axes:`` says of each axis: teams or like, and its options when not the defaults."""
    out = {}
    for name, axis in suite.axes.items():
        body: dict[str, Any] = {"like": axis.like} if axis.like is not None else {}
        if axis.like is None and name != WORLD_AXIS and name not in suite.mesh:
            body["teams"] = [list(team) for team in axis.teams]
        body |= {"priority": axis.priority} if axis.priority != "normal" else {}
        body |= {"nccl": dict(axis.nccl)} if axis.nccl else {}
        if body:
            out[name] = body
    return out


# ---------------------------------------------------------------------------------------------
# Patterns and their blocks
# ---------------------------------------------------------------------------------------------
def _pattern(
    points: list[PatternSpec], defaults: dict[str, Any], comments: Mapping[tuple[str, str], str]
) -> list[str]:
    """One pattern entry: a spec of its own, or the sweep points of one base pattern."""
    first = points[0]
    variables = [name for name, _ in first.sweep_point]
    labels = {v: list(dict.fromkeys(dict(p.sweep_point)[v] for p in points)) for v in variables}
    product = [tuple(zip(variables, c, strict=True)) for c in itertools.product(*labels.values())]
    if first.sweep_point and [p.sweep_point for p in points] != product:
        raise ValueError(f"pattern {first.base_name!r}: its points are not one sweep's")
    body = _merge([_full(p) for p in points], [dict(p.sweep_point) for p in points])
    head: dict[str, Any] = {"sweep": {v: [_SweepValue(x) for x in xs] for v, xs in labels.items()}}
    head |= {k: v for k, v in body.pop("settings").items() if v != defaults[k]}
    entries = body.pop("blocks")
    lines = [f"  - name: {scalar(first.base_name)}"]
    lines += [f"    {k}: {flow(v)}" for k, v in (head | body).items() if v not in (None, [], {})]
    lines.append("    blocks:")
    for spec, entry in zip(first.blocks, entries, strict=True):
        line = f"      - {flow(_compact(entry, spec.op, defaults))}"
        note = comments.get((first.name, spec.name))
        lines.append(f"{line}  # {note}" if note else line)
    return lines


def _full(pattern: PatternSpec) -> dict[str, Any]:
    """Everything a pattern says, every key written (defaults are dropped later)."""
    return {
        "settings": {key: _setting(pattern, key) for key in SETTINGS},
        "traced_us": pattern.traced_us,
        "traced_by_rank_us": list(pattern.traced_by_rank_us),
        "blocks": [_block(b) for b in pattern.blocks],
    }


def _block(spec: BlockSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": spec.name, "op": spec.op, "axis": spec.axis}
    entry |= {"lane": spec.lane, "dtype": spec.dtype, "register_buffers": spec.register_buffers}
    keys = _param_keys(spec.op)
    for name, value in spec.params.items():
        entry[keys.get(name, (name, None))[0]] = list(value) if isinstance(value, tuple) else value
    if spec.after:
        entry["after"] = list(spec.after)
    for key in ("traced_us", "traced_kernel", "traced_overlap"):
        if getattr(spec, key) is not None:
            entry[key] = getattr(spec, key)
    return entry


def _param_keys(op: str) -> dict[str, tuple[str, Any]]:
    """Parameter name -> (its YAML key, its default) for ``op`` ({} when it cannot be told)."""
    try:
        cls = resolve_op(op)
    except (KeyError, LookupError):
        return {}
    return {p.name: (yaml_key(p), p.default) for p in cls.params}


def _compact(entry: dict[str, Any], op: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """``entry`` without what the loader would set anyway."""
    params = {key: default for key, default in _param_keys(op).values()}
    out = {}
    for key, value in entry.items():
        implied = (
            (key == "axis" and value == WORLD_AXIS)
            or (key == "lane" and value == entry.get("axis"))
            or (key in ("dtype", "register_buffers") and value == defaults[key])
            or (key in params and value == params[key] and type(value) is type(params[key]))
        )
        if not implied:
            out[key] = value
    return out


def _merge(values: list[Any], points: list[dict[str, str]]) -> Any:
    """The one value that gives each point's ``values[i]``: the value itself when every point
    has it, else ``${variable}`` (whole, or inside text)."""
    first = values[0]
    if all(type(v) is type(first) and v == first for v in values):
        return first
    if all(isinstance(v, dict) and v.keys() == first.keys() for v in values):
        return {k: _merge([v[k] for v in values], points) for k in first}
    if all(isinstance(v, list) and len(v) == len(first) for v in values):
        return [_merge([v[i] for v in values], points) for i in range(len(first))]
    for var in points[0]:
        if all(_reads_as(p[var], v) for p, v in zip(points, values, strict=True)):
            return f"${{{var}}}"
    if all(isinstance(v, str) for v in values):
        texts = list(values)
        for var in points[0]:
            texts = [t.replace(p[var], f"${{{var}}}") for p, t in zip(points, texts, strict=True)]
        if "${" in texts[0] and all(t == texts[0] for t in texts):
            return texts[0]
    raise ValueError(f"sweep points differ in a way no ${{variable}} explains: {values[:3]}")


def _reads_as(label: str, value: Any) -> bool:
    """Whether the sweep value written as ``label`` becomes ``value`` where it stands whole."""
    read = yaml.safe_load(label)
    if isinstance(read, bool) != isinstance(value, bool):
        return False
    if read == value:
        return True
    try:
        return isinstance(value, int) and parse_size(read) == value
    except ValueError:
        return False
