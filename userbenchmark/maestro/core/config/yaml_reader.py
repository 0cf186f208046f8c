"""Read a pattern file into plain data, recording each YAML path's line and each scalar as written.
Only YAML core types are built; hostile input (deep nesting, aliases, huge files) meets maestro's
own limits before a tree is built, whatever PyYAML's version."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any, Final

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ...errors import ConfigError
from .problems import Problems, index, join

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
