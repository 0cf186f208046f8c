"""Load a pattern file: safe YAML within maestro's own limits (nesting, aliases, size) with the line
of every path, complete validation, sweep expansion, every problem in one ConfigError. The only code
a file can cause to run is a custom op's module (not even that with ``import_ops=False``)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import re
from pathlib import Path
from typing import Any, Final

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ...errors import ConfigError
from .axes import check_axes, check_env, check_world_size
from .blocks import OpResolver
from .patterns import DEFAULT_KEYS, DEFAULT_VALUES, check_patterns, check_settings
from .problems import Problems, choices, index, join
from .spec import SuiteSpec, frozen_mapping

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
    if not isinstance(data, dict):
        p.add(
            "",
            "the file must be a mapping with keys such as name, world_size, mesh, axes "
            f"and patterns, got {p.show('', data)}",
        )
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
    if not isinstance(raw_defaults, dict):
        p.add(
            "defaults",
            f"defaults must be a mapping with keys {choices(DEFAULT_KEYS)}, "
            f"got {p.show('defaults', raw_defaults)}",
        )
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
    return _Converter(problems).convert(root, "")


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


class _Converter:
    """Turns a composed node tree into plain data, recording the line of every path and the
    text of every scalar that did not become a string."""

    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        self._scalars = SafeConstructor()

    def _issue(self, path: str, message: str, node: Node) -> None:
        self.problems.add(path, message, line=node.start_mark.line + 1)

    def _scalar(self, node: ScalarNode, path: str, *, record: bool = True) -> Any:
        if node.tag == _BOOL_TAG and node.value.lower() not in ("true", "false"):
            # YAML 1.1 reads yes/no/on/off as booleans; here they are text (as in YAML 1.2),
            # so `sync: yes` is reported as written and `baseline: yes` is not silently true.
            if record:
                self.problems.yaml11_words.add(path)
            return node.value
        try:
            value = self._scalars.construct_object(node, deep=True)
        except Exception as exc:  # noqa: BLE001 - any constructor failure is a config problem
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            self._issue(path, f"unsupported YAML value ({problem})", node)
            return None
        if record and not isinstance(value, str):
            self.problems.written.setdefault(path, (node.value, value))
        return value

    def convert(self, node: Node, path: str) -> Any:
        self.problems.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, ScalarNode):
            return self._scalar(node, path)
        if (type(node), node.tag) not in ((SequenceNode, _SEQ_TAG), (MappingNode, _MAP_TAG)):
            self._issue(path, f"unsupported YAML tag {node.tag!r}", node)
            return None
        if isinstance(node, SequenceNode):
            return [self.convert(child, index(path, i)) for i, child in enumerate(node.value)]
        result: dict[Any, Any] = {}
        merges: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.append(value_node)
                continue
            if not isinstance(key_node, ScalarNode):
                self._issue(
                    path, "mapping keys must be plain names, not lists or mappings", key_node
                )
                continue
            key = self._scalar(key_node, path, record=False)  # safe scalars are all hashable
            sub = join(path, key)
            if key in result:
                # Reported, and the first value kept, so the rest of the file is still checked.
                self._issue(sub, f"duplicate key {key!r}", key_node)
                continue
            self.problems.lines.setdefault(sub, key_node.start_mark.line + 1)
            result[key] = self.convert(value_node, sub)
        # YAML merge keys (<<: *anchor): explicit keys win, then earlier merged mappings.
        for value_node in merges:
            sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
            for source in sources:
                merged = self.convert(source, path) if isinstance(source, MappingNode) else None
                if not isinstance(merged, dict):
                    self._issue(
                        path, "a merge key (<<) needs a mapping or a list of mappings", source
                    )
                    continue
                for key, value in merged.items():
                    result.setdefault(key, value)
        return result
