"""The loader's inverse: ``load_suite_text(dump_suite(suite))`` equals ``suite`` but for where
things were written (``source``, ``yaml_path``, ``text_sha256``). The file says only what differs
from the loader's defaults, and no sweep (``import-trace`` makes none)."""

from __future__ import annotations

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
from .spec import WORLD_AXIS, BlockSpec, PatternSpec, SuiteSpec

SETTINGS: Final = ("warmup_iters", "iters", "baseline", "check", "sync", "graph")
"""Run settings a pattern spec holds (``iters`` as ``num_iters``); dtype and
register_buffers are the blocks'."""
_UNPRINTABLE: Final = re.compile(  # and the line breaks YAML folds, and the byte order mark
    f"{yaml.reader.Reader.NON_PRINTABLE.pattern}|[\x85\u2028\u2029\ufeff]"
)
_PLAIN: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+\-]*")


def scalar(value: Any) -> str:
    """``value`` as a YAML scalar that reads back as itself (text quoted where it would not)."""
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
    ({(pattern name, block name): text}) after their blocks. ValueError for a sweep point (a
    file that gives it is a sweep, which this writes not)."""
    swept = [p.name for p in suite.patterns if p.sweep_point]
    if swept:
        raise ValueError(f"pattern {swept[0]!r} is a sweep point: the dumper writes no sweeps")
    defaults = _defaults(suite)
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
    for pattern in suite.patterns:
        lines += _pattern(pattern, defaults, comments or {})
    return "\n".join(lines) + "\n"


def _defaults(suite: SuiteSpec) -> dict[str, Any]:
    blocks = [b for p in suite.patterns for b in p.blocks]
    dtypes = Counter(b.dtype for b in blocks).most_common(1)
    defaults = {
        "dtype": dtypes[0][0] if dtypes else DEFAULT_VALUES["dtype"],
        "register_buffers": bool(blocks) and all(b.register_buffers for b in blocks),
    }
    for key in SETTINGS:
        values = {_setting(p, key) for p in suite.patterns}
        defaults[key] = values.pop() if len(values) == 1 else DEFAULT_VALUES[key]
    return defaults


def _setting(pattern: PatternSpec, key: str) -> Any:
    return getattr(pattern, "num_iters" if key == "iters" else key)


def _axes(suite: SuiteSpec) -> dict[str, dict[str, Any]]:
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


def _pattern(
    pattern: PatternSpec, defaults: dict[str, Any], comments: Mapping[tuple[str, str], str]
) -> list[str]:
    head = {key: value for key in SETTINGS if (value := _setting(pattern, key)) != defaults[key]}
    head |= {"traced_us": pattern.traced_us, "traced_by_rank_us": list(pattern.traced_by_rank_us)}
    lines = [f"  - name: {scalar(pattern.name)}"]
    lines += [f"    {k}: {flow(v)}" for k, v in head.items() if v not in (None, [], {})]
    lines.append("    blocks:")
    for spec in pattern.blocks:
        line = f"      - {flow(_block(spec, defaults))}"
        note = comments.get((pattern.name, spec.name))
        lines.append(f"{line}  # {note}" if note else line)
    return lines


def _block(spec: BlockSpec, defaults: dict[str, Any]) -> dict[str, Any]:
    """A block's entry without what the loader would set anyway."""
    entry: dict[str, Any] = {"name": spec.name, "op": spec.op}
    entry |= {"axis": spec.axis} if spec.axis != WORLD_AXIS else {}
    entry |= {"lane": spec.lane} if spec.lane != spec.axis else {}
    for key in ("dtype", "register_buffers"):
        if getattr(spec, key) != defaults[key]:
            entry[key] = getattr(spec, key)
    try:
        declared = {p.name: p for p in resolve_op(spec.op).params}
    except (KeyError, LookupError):
        declared = {}
    for name, value in spec.params.items():
        value = list(value) if isinstance(value, tuple) else value
        param = declared.get(name)
        if param is None or value != param.default or type(value) is not type(param.default):
            entry[yaml_key(param) if param else name] = value
    entry |= {"after": list(spec.after)} if spec.after else {}
    for key in ("traced_us", "traced_kernel", "traced_overlap"):
        if getattr(spec, key) is not None:
            entry[key] = getattr(spec, key)
    return entry
