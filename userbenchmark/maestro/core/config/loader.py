"""Load a pattern file: safe YAML within maestro's own limits (nesting, aliases, size) with the line
of every path, complete validation, sweep expansion, every problem in one ConfigError. The only code
a file can cause to run is a custom op's module (not even that with ``import_ops=False``)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ...errors import ConfigError
from .axes import check_axes, check_env, check_world_size
from .blocks import OpResolver, block_entry, yaml_key
from .patterns import DEFAULT_KEYS, DEFAULT_VALUES, PATTERN_SETTINGS, check_patterns, check_settings
from .problems import YAML11_BOOLEAN_WORDS, Problems, choices, index, join
from .spec import TRACED_KEYS, WORLD_AXIS, BlockSpec, PatternSpec, SuiteSpec, frozen_mapping
from .summary import op_class
from .variants import whatif_changes

logger = logging.getLogger("maestro.config")

CONFIGS_DIR: Final = Path(__file__).resolve().parents[2] / "configs"
"""Where the shipped pattern files live (``--config NAME`` looks here)."""

TOP_KEYS: Final = ("name", "world_size", "defaults", "env", "mesh", "axes", "patterns",
                   "timeout_s", "stop_on_error")  # fmt: skip
OPTIONAL_SECTIONS: Final = ("defaults", "env", "mesh", "axes")

DEFAULT_TIMEOUT_S: Final = 45.0
MIN_TIMEOUT_S: Final = 1.0
MAX_TIMEOUT_S: Final = 86400.0
TIMEOUT_WHY: Final = (
    "the seconds ranks wait for the rendezvous, a communicator operation and each other: under "
    "1 s a healthy start-up can time out, over a day a hung rank goes unnoticed, and torch's "
    "timers overflow near 1e10 s"
)


def shipped_configs() -> list[str]:
    """Names of the pattern files shipped in ``configs/`` (without .yaml)."""
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))  # none without the folder


def resolve_config_path(name_or_path: str | Path) -> Path:
    """The file for ``name_or_path``: an existing path, or the name of a shipped config;
    ConfigError naming the path (and listing the shipped configs for an unknown name)."""
    text = str(name_or_path)
    path = Path(name_or_path)
    named = "/" not in text and "\\" not in text and text not in ("", ".", "..")
    shipped = (CONFIGS_DIR / text, CONFIGS_DIR / f"{text}.yaml") if named else ()
    try:  # a name too long, a NUL byte, no permission
        found = next((c for c in (path, *shipped) if c.is_file()), None)
        other = found is not path and path.exists()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot use {text!r} as a pattern file: {exc}", file=text) from exc
    if other:
        raise ConfigError(f"{text!r} is not a file", file=text)
    if found is not None:
        return found
    raise ConfigError(
        f"pattern file not found: {text!r} is neither a file nor the name of a "
        f"shipped config (shipped: {', '.join(shipped_configs()) or 'none'})",
        file=text,
    )


_HEADER_SIZES: Final = re.compile(
    r"#\s*world size:\s*(\d+)(?:\s*\(also runs at:((?:\s*\d+\s*,?)+))?", re.IGNORECASE
)


def listed_world_sizes(source: str | Path) -> tuple[int, ...]:
    """The world sizes the leading comments of the pattern file ``source`` list, the main one
    first (``# World size: 8 (also runs at: 2, 4)``: 8, 2, 4), as every shipped file states
    them; empty when they list none."""
    path = resolve_config_path(source)
    for line in read_file_text(path, str(path)).splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break  # past the header
        found = _HEADER_SIZES.match(line.strip())
        if found:
            also = (found[2] or "").replace(",", " ").split()
            return tuple(dict.fromkeys(int(n) for n in (found[1], *also)))
    return ()


def load_suite(
    source: str | Path, *, world_size: int | None = None, import_ops: bool = True
) -> SuiteSpec:
    """Load, validate and expand the pattern file ``source`` (a path or a shipped config
    name) for a run of ``world_size`` ranks; ConfigError carries every problem found.
    ``import_ops=False`` checks a custom op by name only (for inspecting, never running)."""
    path = resolve_config_path(source)
    text = read_file_text(path, str(path))
    return load_suite_text(text, file=str(path), world_size=world_size, import_ops=import_ops)


def load_suite_text(
    text: str, *, file: str = "<string>", world_size: int | None = None, import_ops: bool = True
) -> SuiteSpec:
    """Like :func:`load_suite` for YAML given as a string (``file`` names it in messages)."""
    if not isinstance(text, str):
        raise ConfigError("pattern text must be a string", file=file)
    problems = Problems(file)
    data = read_yaml(text, problems)
    ops = OpResolver(import_ops=import_ops)
    try:
        suite = _suite(problems, data, world_size, ops)
        return dataclasses.replace(suite, text_sha256=hashlib.sha256(text.encode()).hexdigest())
    finally:  # said whether the file is valid or not: those blocks are only partly checked
        for op, op_path in ops.not_imported.items():
            logger.warning(
                "%s: %s: custom op %r was not imported: only its name was checked, not its "
                "parameters nor whether it communicates (its lane)",
                file,
                op_path,
                op,
            )


def _suite(p: Problems, data: Any, world_size_arg: Any, ops: OpResolver) -> SuiteSpec:
    expected = (
        "the file must be a mapping with keys such as name, world_size, mesh, axes and patterns"
    )
    if not p.mapping(data, "", expected):
        raise ConfigError(p.issues())
    p.unknown_keys(data, "", TOP_KEYS, "in the top level")
    # An optional section left empty (`env:` with every entry commented out) is absent.
    data = {k: v for k, v in data.items() if not (v is None and k in OPTIONAL_SECTIONS)}
    p.missing(data, "", "name", " (the suite name, part of every metric key)")
    name = p.get(data, "", "name", p.name, "name")
    world_size = check_world_size(p, data, world_size_arg)
    limits = {"minimum": MIN_TIMEOUT_S, "maximum": MAX_TIMEOUT_S, "why_min": TIMEOUT_WHY}
    timeout_s = p.get(data, "", "timeout_s", p.number, **limits, why=TIMEOUT_WHY)
    stop_on_error = p.boolean(data.get("stop_on_error", True), "stop_on_error") is not False
    env = check_env(p, data.get("env"), "env") if "env" in data else {}
    raw_defaults = data.get("defaults", {})
    expected = f"defaults must be a mapping with keys {choices(DEFAULT_KEYS)}"
    if not p.mapping(raw_defaults, "defaults", expected):
        raw_defaults = {}
    p.unknown_keys(raw_defaults, "defaults", DEFAULT_KEYS, "in defaults")
    defaults = check_settings(p, raw_defaults, "defaults", DEFAULT_VALUES)
    axes = check_axes(p, data, world_size)
    patterns = check_patterns(p, data, defaults, axes, ops)
    if p:
        raise ConfigError(p.issues())
    real = [a for a in axes.values() if a.teams is not None]
    return SuiteSpec(
        name=name,
        source=p.file,
        world_size=world_size,
        env=frozen_mapping(env),
        axes=frozen_mapping({a.name: a.spec() for a in real}),
        mesh=frozen_mapping({a.name: len(a.teams[0]) for a in real if a.path.startswith("mesh.")}),
        patterns=tuple(patterns),
        timeout_s=timeout_s or DEFAULT_TIMEOUT_S,
        stop_on_error=stop_on_error,
    )


MAX_FILE_BYTES: Final = 4 * 1024 * 1024
"""Largest pattern file read (a pattern file is a few kilobytes)."""
MAX_NODES: Final = 1_000_000
"""Most YAML nodes a file may expand to, aliases counted at every use (billion laughs)."""
MAX_DEPTH: Final = 100
"""Deepest nesting of mappings and lists, aliases followed."""

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_FLOW_BRACKET = re.compile(r"[\[\]{}]")
_TOO_LARGE = (
    f"file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; a pattern file is a few kilobytes"
)


def read_file_text(path: Path, file: str) -> str:
    """The text of the pattern file at ``path``; ConfigError when unreadable, too large or
    not UTF-8 (``file`` names it in messages)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        message = f"cannot read the pattern file: {exc.strerror or exc}"
        raise ConfigError(message, file=file) from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(_TOO_LARGE, file=file)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"file is not UTF-8 text: {exc}", file=file) from exc


def read_yaml(text: str, problems: Problems) -> Any:
    """Plain data of the YAML ``text``, filling ``problems``' lines and written values; a syntax
    error, hostile nesting or expansion, or an empty file raise ConfigError at once."""
    file = problems.file
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError(_TOO_LARGE, file=file)
    _refuse_deep_flow(text, file)
    try:
        _refuse_deep_or_large(yaml.parse(text, Loader=_LOADER), file)
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file) from None
    if root is None:
        message = (
            "the file is empty; a pattern file is a mapping with at least 'name' and 'patterns'"
        )
        raise ConfigError(message, file=file, line=1)
    _measure(root, file)
    return _convert(problems, root, "")


def _yaml_error(exc: yaml.YAMLError, file: str) -> ConfigError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if problem:
        message = f"{context}, {problem}" if context else str(problem)
    else:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ConfigError(f"YAML syntax error: {message}", file=file, line=line)


def _refuse_deep_or_large(events: Any, file: str) -> None:
    """The streaming pass: nesting depth and node count, known before any tree is built (the
    composer recurses once per nesting level)."""
    depth = nodes = 0
    for event in events:
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                message = f"nesting deeper than {MAX_DEPTH} levels"
                raise ConfigError(message, file=file, line=event.start_mark.line + 1)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        if isinstance(event, yaml.NodeEvent) and (nodes := nodes + 1) > MAX_NODES:
            message = f"more than {MAX_NODES} YAML nodes"
            raise ConfigError(message, file=file, line=event.start_mark.line + 1)


def _refuse_deep_flow(text: str, file: str) -> None:
    """Refuse flow nesting past MAX_DEPTH before libyaml (PyYAML 6.0.4+) stops at 1000 levels with
    its own message; every bracket, quoted or not, bounds the depth from above."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    depth = 0
    for match in _FLOW_BRACKET.finditer(text):
        if match.group() not in "[{":
            depth = max(depth - 1, 0)
        elif (depth := depth + 1) > MAX_DEPTH:
            # The cut-off prefix ends mid-document; the full parse reports real syntax errors.
            with contextlib.suppress(yaml.YAMLError):
                _refuse_deep_or_large(yaml.parse(text[: match.end()], Loader=_LOADER), file)
            return


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _measure(root: Node, file: str) -> None:
    """Refuse alias expansion past MAX_NODES or MAX_DEPTH, and recursive aliases; memoized per
    node, so it costs the size of the file, not of the expansion."""
    memo: dict[int, tuple[int, int]] = {}
    active: set[int] = set()
    too_deep = f"nesting deeper than {MAX_DEPTH} levels (counting aliases)"

    def visit(node: Node, level: int) -> tuple[int, int]:
        key = id(node)
        line = node.start_mark.line + 1
        if key in active:
            raise ConfigError(
                "an alias refers to a node that contains it (recursive alias)", file=file, line=line
            )
        if key in memo:
            size, height = memo[key]
        else:
            active.add(key)
            size, height = 1, 0
            for child in _children(node):
                if level + 1 > MAX_DEPTH:
                    raise ConfigError(too_deep, file=file, line=child.start_mark.line + 1)
                child_size, child_height = visit(child, level + 1)
                size += child_size
                height = max(height, child_height + 1)
                if size > MAX_NODES:
                    raise ConfigError(
                        f"aliases expand to more than {MAX_NODES} YAML nodes", file=file, line=line
                    )
            active.discard(key)
            memo[key] = (size, height)
        if level + height > MAX_DEPTH:
            raise ConfigError(too_deep, file=file, line=line)
        return size, height

    visit(root, 0)


def _scalar(p: Problems, node: ScalarNode, path: str, *, record: bool = True) -> Any:
    if node.tag == _BOOL_TAG and node.value.lower() not in ("true", "false"):
        # YAML 1.1 reads yes/no/on/off as booleans; here they are text (as in YAML 1.2),
        # so `sync: yes` is reported as written and `baseline: yes` is not silently true.
        if record:
            p.yaml11_words.add(path)
        return node.value
    try:
        value = SafeConstructor().construct_object(node, deep=True)
    except Exception as exc:  # noqa: BLE001 - any constructor failure is a config problem
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        p.add(path, f"unsupported YAML value ({problem})", line=node.start_mark.line + 1)
        return None
    if record and not isinstance(value, str):
        p.written.setdefault(path, (node.value, value))
    return value


def _convert(p: Problems, node: Node, path: str) -> Any:
    """Plain data of a composed node tree, recording in ``p`` the line of every path and the
    text of every scalar that did not become a string."""
    p.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, ScalarNode):
        return _scalar(p, node, path)
    if (type(node), node.tag) not in ((SequenceNode, _SEQ_TAG), (MappingNode, _MAP_TAG)):
        p.add(path, f"unsupported YAML tag {node.tag!r}", line=node.start_mark.line + 1)
        return None
    if isinstance(node, SequenceNode):
        return [_convert(p, child, index(path, i)) for i, child in enumerate(node.value)]
    result: dict[Any, Any] = {}
    merges: list[Node] = []
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE_TAG:
            merges.append(value_node)
            continue
        if not isinstance(key_node, ScalarNode):
            message = "mapping keys must be plain names, not lists or mappings"
            p.add(path, message, line=key_node.start_mark.line + 1)
            continue
        key = _scalar(p, key_node, path, record=False)  # safe scalars are all hashable
        sub = join(path, key)
        if key in result:
            # Reported, and the first value kept, so the rest of the file is still checked.
            p.add(sub, f"duplicate key {key!r}", line=key_node.start_mark.line + 1)
            continue
        p.lines.setdefault(sub, key_node.start_mark.line + 1)
        result[key] = _convert(p, value_node, sub)
    # YAML merge keys (<<: *anchor): explicit keys win, then earlier merged mappings.
    for value_node in merges:
        sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
        for source in sources:
            merged = _convert(p, source, path) if isinstance(source, MappingNode) else None
            if not isinstance(merged, dict):
                message = "a merge key (<<) needs a mapping or a list of mappings"
                p.add(path, message, line=source.start_mark.line + 1)
                continue
            for key, value in merged.items():
                result.setdefault(key, value)
    return result


# ---- the loader's inverse: ``load_suite_text(dump_suite(suite))`` equals ``suite`` but for where
# things were written (source, yaml_path, text_sha256); only what differs from the defaults, no sweep
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
        changes = {v.variant: whatif_changes(pattern, v, suite.axes) for v in pattern.variants}
        lines += ["    whatif:"] * bool(changes)
        for name, change in changes.items():  # block names quoted where YAML would read others
            text = ", ".join(f"{scalar(key)}: {flow(value)}" for key, value in change.items())
            lines.append(f"      {name}: {{{text}}}")
    return "\n".join(lines) + "\n"


def _defaults(suite: SuiteSpec) -> dict[str, Any]:
    blocks = [b for p in suite.patterns for b in p.blocks]
    dtypes = Counter(b.dtype for b in blocks).most_common(1)
    defaults = {
        "dtype": dtypes[0][0] if dtypes else DEFAULT_VALUES["dtype"],
        "register_buffers": bool(blocks) and all(b.register_buffers for b in blocks),
    }
    for key, field in PATTERN_SETTINGS.items():
        values = {getattr(p, field) for p in suite.patterns}
        defaults[key] = values.pop() if len(values) == 1 else DEFAULT_VALUES[key]
    return defaults


def _axes(suite: SuiteSpec) -> dict[str, dict[str, Any]]:
    out = {}
    for name, axis in suite.axes.items():
        if "[" in name:  # a whatif variant's own axis: its whatif: entry gives it
            continue
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
    settings = {key: getattr(pattern, field) for key, field in PATTERN_SETTINGS.items()}
    head = {key: value for key, value in settings.items() if value != defaults[key]}
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
    cls = op_class(spec.op)
    implied = {yaml_key(p): p.default for p in cls.params} if cls is not None else {}
    implied |= {"axis": WORLD_AXIS, "lane": spec.axis, "after": []}
    implied |= {key: defaults[key] for key in ("dtype", "register_buffers")}
    entry = {
        key: value
        for key, value in block_entry(spec).items()
        if key not in implied or value != implied[key] or type(value) is not type(implied[key])
    }
    traced = {key: getattr(spec, key) for key in TRACED_KEYS}
    return entry | {key: value for key, value in traced.items() if value is not None}
