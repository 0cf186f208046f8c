"""Load a pattern file: safe YAML, complete validation, sweep expansion, frozen SuiteSpec.

Every problem found is collected into one ConfigError naming file, YAML path and line. Nothing
here creates a process group or a tensor; the only code a file can cause to run is the module
named by a custom ``op: package.module:ClassName``.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ...blocks.base import REQUIRED, Block, Param
from ...blocks.dtypes import DTYPE_SIZES_BYTES
from ...blocks.registry import BlockImportError, registered_ops, resolve_op
from ...errors import ConfigError, ConfigIssue
from .sizes import MAX_SIZE_BYTES, parse_size
from .spec import (
    PRIORITIES,
    SYNC_MODES,
    WORLD_AXIS,
    AxisSpec,
    BlockSpec,
    PatternSpec,
    SuiteSpec,
    frozen_mapping,
)
from .sweep import (
    MAX_SWEEP_POINTS,
    check_references,
    num_points,
    parse_sweep,
    point_label,
    point_name,
    substitute,
    sweep_points,
)

__all__ = [
    "CONFIGS_DIR",
    "MAX_FILE_BYTES",
    "NCCL_OPTIONS",
    "load_suite",
    "load_suite_text",
    "mesh_teams",
    "resolve_config_path",
    "shipped_configs",
]

logger = logging.getLogger("maestro.config")

CONFIGS_DIR: Final = Path(__file__).resolve().parents[2] / "configs"
"""Where the shipped pattern files live (``--config NAME`` looks here)."""

MAX_FILE_BYTES: Final = 4 * 1024 * 1024
MAX_NODES: Final = 1_000_000
"""Most YAML nodes a file may expand to, aliases counted at every use (billion laughs)."""
MAX_DEPTH: Final = 100
MAX_WORLD_SIZE: Final = 1 << 17
MAX_EXPANDED_BLOCKS: Final = 100_000
MAX_ISSUES: Final = 100

NAME_RE: Final = re.compile(r"[A-Za-z0-9_.-]+")
ENV_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

TOP_KEYS: Final = (
    "name",
    "world_size",
    "defaults",
    "env",
    "mesh",
    "axes",
    "patterns",
    "timeout_s",
    "stop_on_error",
)
OPTIONAL_SECTIONS: Final = ("defaults", "env", "mesh", "axes")
DEFAULT_KEYS: Final = (
    "dtype",
    "warmup_iters",
    "iters",
    "baseline",
    "check",
    "sync",
    "register_buffers",
)
PATTERN_KEYS: Final = ("name", "sweep", "blocks", *DEFAULT_KEYS)
AXIS_KEYS: Final = ("teams", "like", "priority", "nccl", "env")
BLOCK_KEYS: Final = ("name", "op", "axis", "lane", "dtype", "register_buffers")
DEFAULT_VALUES: Final = {
    "dtype": "fp32",
    "warmup_iters": 5,
    "iters": 50,
    "baseline": True,
    "check": False,
    "sync": "barrier",
    "register_buffers": False,
}

# A Param named like a block key cannot be written under its own name; it gets this YAML key.
PARAM_YAML_ALIASES: Final = {"op": "reduce_op"}

NCCL_OPTIONS: Final = {
    # name: (kind, minimum) -- ProcessGroupNCCL.Options.config fields
    "max_ctas": ("int", 1),
    "min_ctas": ("int", 1),
    "cga_cluster_size": ("int", 0),
    "net_name": ("str", None),
    "traffic_class": ("int", 0),
    "cta_policy": ("int", 0),
    "blocking": ("bool", None),
    "split_share": ("bool", None),
}

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# ---------------------------------------------------------------------------------------------
# Finding the file
# ---------------------------------------------------------------------------------------------
def shipped_configs() -> list[str]:
    """Names of the pattern files shipped in ``configs/`` (without .yaml)."""
    if not CONFIGS_DIR.is_dir():
        return []
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))


def resolve_config_path(name_or_path: str | Path) -> Path:
    """The file for ``name_or_path``: an existing path, or the name of a shipped config.

    Raises ConfigError naming the path, and listing the shipped configs for unknown names.
    """
    text = str(name_or_path)
    try:
        path = Path(name_or_path)
        if path.is_file():
            return path
        if path.exists():
            raise ConfigError(f"{text!r} is not a file", file=text)
        looks_like_name = "/" not in text and "\\" not in text and text not in ("", ".", "..")
        if looks_like_name:
            for candidate in (CONFIGS_DIR / text, CONFIGS_DIR / f"{text}.yaml"):
                if candidate.is_file():
                    return candidate
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, no permission
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"cannot use {text!r} as a pattern file: {exc}", file=text) from exc
    shipped = ", ".join(shipped_configs()) or "none"
    raise ConfigError(
        f"pattern file not found: {text!r} is neither a file nor the name of a "
        f"shipped config (shipped: {shipped})",
        file=text,
    )


def load_suite(source: str | Path, *, world_size: int | None = None) -> SuiteSpec:
    """Load, validate and expand the pattern file ``source`` (a path or a shipped config name).

    ``world_size`` is the size of the run; it must agree with the file's ``world_size``.
    Raises ConfigError carrying every problem found.
    """
    path = resolve_config_path(source)
    file = str(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the pattern file: {exc.strerror or exc}", file=file
        ) from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(
            f"file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; a pattern "
            "file is a few kilobytes",
            file=file,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"file is not UTF-8 text: {exc}", file=file) from exc
    return load_suite_text(text, file=file, world_size=world_size)


def load_suite_text(
    text: str, *, file: str = "<string>", world_size: int | None = None
) -> SuiteSpec:
    """Like :func:`load_suite` for YAML given as a string (``file`` names it in messages)."""
    if not isinstance(text, str):
        raise ConfigError("pattern text must be a string", file=file)
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError(
            f"file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; a pattern "
            "file is a few kilobytes",
            file=file,
        )
    data, lines = _read_yaml(text, file)
    return _Validator(file=file, lines=lines).suite(data, world_size)


# ---------------------------------------------------------------------------------------------
# YAML: bounded, safe, with the line of every path
# ---------------------------------------------------------------------------------------------
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


def _read_yaml(text: str, file: str) -> tuple[Any, dict[str, int]]:
    """Plain data and {YAML path: line} for ``text``; refuses hostile nesting and expansion."""
    # A streaming pass first: nesting depth and node count are known before any tree is built
    # (the composer recurses once per nesting level).
    depth = nodes = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ConfigError(
                        f"nesting deeper than {MAX_DEPTH} levels",
                        file=file,
                        line=event.start_mark.line + 1,
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            if isinstance(event, yaml.NodeEvent):
                nodes += 1
                if nodes > MAX_NODES:
                    raise ConfigError(
                        f"more than {MAX_NODES} YAML nodes",
                        file=file,
                        line=event.start_mark.line + 1,
                    )
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file) from None
    except RecursionError:  # pragma: no cover - prevented by the depth pass
        raise ConfigError(f"nesting deeper than {MAX_DEPTH} levels", file=file) from None
    if root is None:
        raise ConfigError(
            "the file is empty; a pattern file is a mapping with at least 'name' and 'patterns'",
            file=file,
            line=1,
        )
    _measure(root, file)
    converter = _Converter(file)
    data = converter.convert(root, "")
    if converter.issues:
        raise ConfigError(converter.issues[:MAX_ISSUES])
    return data, converter.lines


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _measure(root: Node, file: str) -> None:
    """Refuse alias expansion past MAX_NODES or MAX_DEPTH, and recursive aliases.

    Memoized per node, so it costs the size of the file, not of the expansion.
    """
    memo: dict[int, tuple[int, int]] = {}
    active: set[int] = set()

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
                    raise ConfigError(
                        f"nesting deeper than {MAX_DEPTH} levels (counting aliases)",
                        file=file,
                        line=child.start_mark.line + 1,
                    )
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
            raise ConfigError(
                f"nesting deeper than {MAX_DEPTH} levels (counting aliases)", file=file, line=line
            )
        return size, height

    visit(root, 0)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _index(path: str, i: int) -> str:
    return f"{path}[{i}]"


class _Converter:
    """Turns a composed node tree into plain data, recording the line of every path."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.lines: dict[str, int] = {}
        self.issues: list[ConfigIssue] = []
        self._scalars = SafeConstructor()

    def _issue(self, path: str, message: str, node: Node) -> None:
        self.issues.append(
            ConfigIssue(message, path=path, file=self.file, line=node.start_mark.line + 1)
        )

    def _scalar(self, node: ScalarNode, path: str) -> Any:
        try:
            return self._scalars.construct_object(node, deep=True)
        except Exception as exc:  # noqa: BLE001 - any constructor failure is a config problem
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            self._issue(path, f"unsupported YAML value ({problem})", node)
            return None

    def convert(self, node: Node, path: str) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, ScalarNode):
            return self._scalar(node, path)
        if isinstance(node, SequenceNode):
            if node.tag != _SEQ_TAG:
                self._issue(path, f"unsupported YAML tag {node.tag!r}", node)
                return None
            return [self.convert(child, _index(path, i)) for i, child in enumerate(node.value)]
        if not isinstance(node, MappingNode) or node.tag != _MAP_TAG:
            self._issue(path, f"unsupported YAML tag {node.tag!r}", node)
            return None
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
            key = self._scalar(key_node, path)
            try:
                hash(key)
            except TypeError:
                self._issue(path, "mapping keys must be plain names", key_node)
                continue
            sub = _join(path, key)
            if key in result:
                self._issue(sub, f"duplicate key {key!r}", key_node)
                continue
            self.lines.setdefault(sub, key_node.start_mark.line + 1)
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


# ---------------------------------------------------------------------------------------------
# Axes
# ---------------------------------------------------------------------------------------------
def mesh_teams(shape: Sequence[int], dim: int) -> tuple[tuple[int, ...], ...]:
    """DeviceMesh teams of dimension ``dim``: ranks laid out row-major over ``shape``, each team
    the ranks that differ only in their index along ``dim``.

    ``mesh_teams([2, 2], 1) == ((0, 1), (2, 3))`` and ``mesh_teams([2, 2], 0) == ((0, 2), (1, 3))``.
    """
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    others = [i for i in range(len(shape)) if i != dim]
    teams = []
    for index in itertools.product(*(range(shape[i]) for i in others)):
        base = sum(j * strides[i] for i, j in zip(others, index, strict=True))
        teams.append(tuple(base + j * strides[dim] for j in range(shape[dim])))
    return tuple(teams)


@dataclass
class _AxisDraft:
    name: str
    path: str
    teams: tuple[tuple[int, ...], ...] | None = None
    """None while unknown (no world size, invalid teams, or an unresolved like)."""
    like: str | None = None
    priority: str = "normal"
    nccl: dict[str, Any] = field(default_factory=dict)
    valid: bool = True


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
def _show(value: Any) -> str:
    """A value as the user wrote it, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    if len(text) <= 60:
        return text
    if isinstance(value, dict | list):
        return f"a {'mapping' if isinstance(value, dict) else 'list'} of {len(value)} items"
    return text[:57] + "..."


def _choices(values: Sequence[Any]) -> str:
    return ", ".join(str(v) for v in values)


def _suggest(value: Any, valid: Sequence[str]) -> str:
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [v for v in valid if isinstance(v, str)], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Problems:
    """(path, message) pairs found while validating one part of the file."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, path: str, message: str) -> None:
        self.items.append((path, message))

    def __bool__(self) -> bool:
        return bool(self.items)

    def unknown_keys(
        self, raw: Mapping[Any, Any], path: str, valid: Sequence[str], what: str
    ) -> None:
        for key in raw:
            if key not in valid:
                self.add(
                    _join(path, key),
                    f"unknown key {_show(key)} in {what}"
                    f"{_suggest(key, valid)}; valid keys: {_choices(valid)}",
                )

    # Typed getters: return the value, or None after recording a problem.
    def integer(
        self, value: Any, path: str, *, minimum: int | None = None, maximum: int | None = None
    ) -> int | None:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(path, f"expected an integer, got {_show(value)}")
            return None
        if minimum is not None and value < minimum:
            self.add(path, f"must be at least {minimum}, got {value}")
            return None
        if maximum is not None and value > maximum:
            self.add(path, f"must be at most {maximum}, got {value}")
            return None
        return value

    def number(
        self, value: Any, path: str, *, minimum: float | None = None, positive: bool = False
    ) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.add(path, f"expected a number, got {_show(value)}")
            return None
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            self.add(path, f"expected a finite number, got {_show(value)}")
            return None
        if positive and number <= 0:
            self.add(path, f"must be greater than 0, got {_show(value)}")
            return None
        if minimum is not None and number < minimum:
            self.add(path, f"must be at least {minimum:g}, got {_show(value)}")
            return None
        return number

    def boolean(self, value: Any, path: str) -> bool | None:
        if not isinstance(value, bool):
            self.add(path, f"expected true or false, got {_show(value)}")
            return None
        return value

    def choice(
        self, value: Any, path: str, valid: Sequence[str], what: str, plural: str = ""
    ) -> str | None:
        if not isinstance(value, str) or value not in valid:
            self.add(
                path,
                f"unknown {what} {_show(value)}{_suggest(value, valid)}; valid "
                f"{plural or what + 's'}: {_choices(valid)}",
            )
            return None
        return value

    def name(
        self, value: Any, path: str, what: str, pattern: re.Pattern[str] = NAME_RE
    ) -> str | None:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            allowed = (
                "letters, digits and _ . -"
                if pattern is NAME_RE
                else "a letter or _, then letters, digits and _"
            )
            self.add(path, f"{what} must be a non-empty string of {allowed}, got {_show(value)}")
            return None
        return value


def _env_value(problems: _Problems, value: Any, path: str) -> str | None:
    if isinstance(value, bool):
        return "1" if value else "0"  # what NCCL and most tools read as true/false
    if isinstance(value, int | float | str):
        return str(value)
    problems.add(path, f"environment values must be strings or numbers, got {_show(value)}")
    return None


class _Validator:
    """Validates plain data into a SuiteSpec, collecting every problem it can."""

    def __init__(self, *, file: str, lines: Mapping[str, int]) -> None:
        self.file = file
        self.lines = lines
        self.problems = _Problems()
        self.issues: list[ConfigIssue] = []
        self._ops: dict[str, type[Block] | str] = {}

    # ---- issue bookkeeping ----
    def _line(self, path: str) -> int | None:
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            cut = max(path.rfind("."), path.rfind("["))
            path = path[:cut] if cut > 0 else ""

    def _flush(self, problems: _Problems | Sequence[tuple[str, str]]) -> None:
        items = problems.items if isinstance(problems, _Problems) else problems
        for path, message in items:
            self.issues.append(
                ConfigIssue(message, path=path, file=self.file, line=self._line(path))
            )
        if isinstance(problems, _Problems):
            problems.items.clear()

    def _raise_if_any(self) -> None:
        self._flush(self.problems)
        if self.issues:
            issues = self.issues[:MAX_ISSUES]
            if len(self.issues) > MAX_ISSUES:
                issues.append(
                    ConfigIssue(
                        f"... and {len(self.issues) - MAX_ISSUES} more problems", file=self.file
                    )
                )
            raise ConfigError(issues)

    # ---- the whole file ----
    def suite(self, data: Any, world_size_arg: Any) -> SuiteSpec:
        p = self.problems
        if not isinstance(data, dict):
            p.add(
                "",
                "the file must be a mapping with keys such as name, world_size, mesh, axes "
                f"and patterns, got {_show(data)}",
            )
            self._raise_if_any()
        p.unknown_keys(data, "", TOP_KEYS, "the top level")
        # An optional section left empty (`env:` with every entry commented out) is absent.
        data = {k: v for k, v in data.items() if not (v is None and k in OPTIONAL_SECTIONS)}
        name = None
        if "name" not in data:
            p.add("name", "missing required key 'name' (the suite name, part of every metric key)")
        else:
            name = p.name(data["name"], "name", "name")
        world_size = self._world_size(data.get("world_size"), "world_size" in data, world_size_arg)
        timeout_s = 45.0
        if "timeout_s" in data:
            timeout_s = p.number(data["timeout_s"], "timeout_s", positive=True) or timeout_s
        stop_on_error = True
        if "stop_on_error" in data:
            value = p.boolean(data["stop_on_error"], "stop_on_error")
            stop_on_error = True if value is None else value
        env = self._env(data.get("env"), "env") if "env" in data else {}
        defaults = dict(DEFAULT_VALUES)
        raw_defaults = data.get("defaults", {})
        if isinstance(raw_defaults, dict):
            p.unknown_keys(raw_defaults, "defaults", DEFAULT_KEYS, "defaults")
            defaults = self._settings(p, raw_defaults, "defaults", defaults)
        else:
            p.add(
                "defaults",
                f"defaults must be a mapping with keys {_choices(DEFAULT_KEYS)}, "
                f"got {_show(raw_defaults)}",
            )
        axes = self._axes(data, world_size)
        patterns = self._patterns(data, defaults, axes)
        self._raise_if_any()
        assert name is not None and world_size is not None  # guaranteed by no issues
        return SuiteSpec(
            name=name,
            source=self.file,
            world_size=world_size,
            env=frozen_mapping(env),
            axes=frozen_mapping(
                {
                    a.name: AxisSpec(
                        name=a.name,
                        teams=a.teams,
                        like=a.like,
                        priority=a.priority,
                        nccl=frozen_mapping(a.nccl),
                        yaml_path=a.path,
                    )
                    for a in axes.values()
                    if a.teams is not None
                }
            ),
            patterns=tuple(patterns),
            timeout_s=timeout_s,
            stop_on_error=stop_on_error,
        )

    def _world_size(self, file_value: Any, in_file: bool, arg: Any) -> int | None:
        p = self.problems
        from_file = from_arg = None
        if in_file:
            from_file = p.integer(file_value, "world_size", minimum=1, maximum=MAX_WORLD_SIZE)
        if arg is not None:
            from_arg = p.integer(arg, "--world-size", minimum=1, maximum=MAX_WORLD_SIZE)
        if from_file is not None and from_arg is not None and from_file != from_arg:
            p.add(
                "world_size",
                f"the file sets world_size {from_file} but the run has world "
                f"size {from_arg} (--world-size or the launcher); they must agree",
            )
            return None
        if from_file is None and from_arg is None and not in_file and arg is None:
            p.add(
                "world_size",
                "the world size is unknown: the file sets no world_size, so "
                "pass --world-size N (or launch with N ranks)",
            )
        return from_file if from_file is not None else from_arg

    def _env(self, raw: Any, path: str) -> dict[str, str]:
        p = self.problems
        if not isinstance(raw, dict):
            p.add(path, f"expected a mapping of environment variables, got {_show(raw)}")
            return {}
        env: dict[str, str] = {}
        for key, value in raw.items():
            sub = _join(path, key)
            if not isinstance(key, str) or not ENV_NAME_RE.fullmatch(key):
                p.add(
                    sub,
                    f"{_show(key)} is not an environment variable name (letters, digits "
                    "and _, not starting with a digit)",
                )
                continue
            text = _env_value(p, value, sub)
            if text is not None:
                env[key] = text
        return env

    @staticmethod
    def _settings(
        p: _Problems, raw: dict[Any, Any], path: str, base: dict[str, Any]
    ) -> dict[str, Any]:
        """``base`` updated with the run settings (dtype, iters, ...) present in ``raw``."""
        checks: dict[str, Callable[[Any, str], Any]] = {
            "dtype": lambda v, s: p.choice(v, s, tuple(DTYPE_SIZES_BYTES), "dtype"),
            "warmup_iters": lambda v, s: p.integer(v, s, minimum=0),
            "iters": lambda v, s: p.integer(v, s, minimum=1),
            "baseline": p.boolean,
            "check": p.boolean,
            "sync": lambda v, s: p.choice(v, s, SYNC_MODES, "sync mode"),
            "register_buffers": p.boolean,
        }
        settings = dict(base)
        for key in DEFAULT_KEYS:
            if key in raw:
                value = checks[key](raw[key], _join(path, key))
                if value is not None:
                    settings[key] = value
        return settings

    # ---- axes ----
    def _axes(self, data: dict[Any, Any], world_size: int | None) -> dict[str, _AxisDraft]:
        p = self.problems
        world = _AxisDraft(
            name=WORLD_AXIS, path="", teams=(tuple(range(world_size)),) if world_size else None
        )
        axes: dict[str, _AxisDraft] = {WORLD_AXIS: world}
        if "mesh" in data:
            self._mesh(data["mesh"], world_size, axes)
        raw_axes = data.get("axes", {})
        if not isinstance(raw_axes, dict):
            p.add(
                "axes",
                f"axes must be a mapping of axis names to {{teams: ...}} or "
                f"{{like: <axis>}}, got {_show(raw_axes)}",
            )
            raw_axes = {}
        mesh_dims = [n for n in axes if n != WORLD_AXIS]
        for name, spec in raw_axes.items():
            path = _join("axes", name)
            if p.name(name, path, "an axis name") is None:
                continue
            if name == WORLD_AXIS:
                p.add(
                    path,
                    "'world' is the built-in axis of all ranks and cannot be redefined; "
                    "pick another name",
                )
                continue
            if not isinstance(spec, dict):
                p.add(
                    path, f"an axis is a mapping with keys {_choices(AXIS_KEYS)}, got {_show(spec)}"
                )
                continue
            p.unknown_keys(spec, path, AXIS_KEYS, f"axis {name!r}")
            if name in mesh_dims:
                draft = axes[name]
                for key in ("teams", "like"):
                    if key in spec:
                        p.add(
                            _join(path, key),
                            f"axis {name!r} is a mesh dimension and takes "
                            f"its teams from mesh; remove {key!r} or use another axis name",
                        )
            else:
                draft = _AxisDraft(name=name, path=path)
                axes[name] = draft
                if "teams" in spec and "like" in spec:
                    p.add(path, "give either teams or like, not both")
                    draft.valid = False
                elif "teams" in spec:
                    draft.teams = self._teams(spec["teams"], _join(path, "teams"), world_size)
                    draft.valid = draft.teams is not None or world_size is None
                elif "like" in spec:
                    draft.like = spec["like"]
                else:
                    p.add(
                        path,
                        "an axis needs teams (a list of lists of ranks) or like: <axis> "
                        "(a second communicator on another axis's teams)",
                    )
                    draft.valid = False
            if "priority" in spec:
                priority = p.choice(
                    spec["priority"], _join(path, "priority"), PRIORITIES, "priority", "priorities"
                )
                draft.priority = priority or draft.priority
            if "nccl" in spec:
                draft.nccl = self._nccl(spec["nccl"], _join(path, "nccl"))
            if "env" in spec:
                self._axis_env(spec["env"], _join(path, "env"), name)
        self._resolve_likes(axes)
        return axes

    def _mesh(self, raw: Any, world_size: int | None, axes: dict[str, _AxisDraft]) -> None:
        p = self.problems
        if not isinstance(raw, dict) or not raw:
            p.add(
                "mesh",
                "mesh must be a mapping of dimension names to degrees, outer to inner, "
                f"e.g. {{dp: 2, tp: 4}}, got {_show(raw)}",
            )
            return
        dims: dict[str, int] = {}
        for name, degree in raw.items():
            path = _join("mesh", name)
            if p.name(name, path, "a mesh dimension name") is None:
                continue
            if name == WORLD_AXIS:
                p.add(
                    path,
                    "'world' is the built-in axis of all ranks; name the mesh dimension "
                    "differently",
                )
                continue
            value = p.integer(degree, path, minimum=1, maximum=MAX_WORLD_SIZE)
            if value is not None:
                dims[name] = value
        if len(dims) != len(raw):
            return
        product = math.prod(dims.values())
        if world_size is not None and product != world_size:
            shape = " x ".join(f"{n}={d}" for n, d in dims.items())
            p.add(
                "mesh",
                f"mesh degrees multiply to {product} ({shape}) but the world size is {world_size}",
            )
            return
        shape = list(dims.values())
        for i, name in enumerate(dims):
            axes[name] = _AxisDraft(
                name=name,
                path=_join("mesh", name),
                teams=mesh_teams(shape, i) if world_size is not None else None,
            )

    def _teams(
        self, raw: Any, path: str, world_size: int | None
    ) -> tuple[tuple[int, ...], ...] | None:
        p = self.problems
        if not isinstance(raw, list) or not raw:
            p.add(
                path,
                f"teams must be a non-empty list of lists of ranks, e.g. [[0, 1], "
                f"[2, 3]], got {_show(raw)}",
            )
            return None
        before = len(p.items)
        teams: list[tuple[int, ...]] = []
        seen: dict[int, str] = {}
        for i, team in enumerate(raw):
            team_path = _index(path, i)
            if not isinstance(team, list) or not team:
                p.add(team_path, f"a team must be a non-empty list of ranks, got {_show(team)}")
                continue
            ranks = []
            for j, rank in enumerate(team):
                rank_path = _index(team_path, j)
                if isinstance(rank, bool) or not isinstance(rank, int):
                    p.add(rank_path, f"a rank must be an integer, got {_show(rank)}")
                    continue
                if rank < 0:
                    p.add(rank_path, f"ranks are 0 or more, got {rank}")
                    continue
                if world_size is not None and rank >= world_size:
                    p.add(
                        rank_path,
                        f"rank {rank} is out of range: ranks are 0 to "
                        f"{world_size - 1} for world size {world_size}",
                    )
                    continue
                if rank in seen:
                    p.add(
                        rank_path,
                        f"rank {rank} appears twice in this axis (also at "
                        f"{seen[rank]}); a rank may be in at most one team of an axis",
                    )
                    continue
                seen[rank] = rank_path
                ranks.append(rank)
            teams.append(tuple(ranks))
        sizes = sorted({len(t) for t in raw if isinstance(t, list) and t})
        if len(sizes) > 1:
            shown = ", ".join(str(len(t)) if isinstance(t, list) else "?" for t in raw)
            p.add(path, f"teams must all have the same size, got sizes {shown}")
        if len(p.items) > before:
            return None
        return tuple(teams)

    def _nccl(self, raw: Any, path: str) -> dict[str, Any]:
        p = self.problems
        if not isinstance(raw, dict):
            p.add(path, f"nccl must be a mapping of ProcessGroupNCCL options, got {_show(raw)}")
            return {}
        options: dict[str, Any] = {}
        for key, value in raw.items():
            sub = _join(path, key)
            if key not in NCCL_OPTIONS:
                p.add(
                    sub,
                    f"unknown nccl option {_show(key)}{_suggest(key, NCCL_OPTIONS)}; "
                    f"valid options: {_choices(NCCL_OPTIONS)}",
                )
                continue
            kind, minimum = NCCL_OPTIONS[key]
            if kind == "int":
                checked = p.integer(value, sub, minimum=minimum, maximum=2**31 - 1)
            elif kind == "bool":
                checked = p.boolean(value, sub)
            elif isinstance(value, str) and value:
                checked = value
            else:
                p.add(sub, f"expected a non-empty string, got {_show(value)}")
                checked = None
            if checked is not None:
                options[key] = checked
        if options.get("min_ctas", 0) > options.get("max_ctas", math.inf):
            p.add(
                _join(path, "min_ctas"),
                f"min_ctas {options['min_ctas']} is larger than max_ctas {options['max_ctas']}",
            )
        return options

    def _axis_env(self, raw: Any, path: str, axis: str) -> None:
        """Accept a per-axis env but warn: it cannot be applied (values are process-wide)."""
        env = self._env(raw, path)
        nccl_keys = sorted(k for k in env if k.startswith("NCCL_"))
        if nccl_keys:
            logger.warning(
                "%s: %s: %s not applied: NCCL reads NCCL_* variables once per process, so "
                "per-axis values cannot take effect on axis %r; move them to the top-level env, "
                "or use the axis's nccl: options (max_ctas, min_ctas, traffic_class, ...)",
                self.file,
                path,
                ", ".join(nccl_keys),
                axis,
            )
        others = sorted(k for k in env if not k.startswith("NCCL_"))
        if others:
            logger.warning(
                "%s: %s: %s not applied: environment variables are process-wide; "
                "set them in the top-level env",
                self.file,
                path,
                ", ".join(others),
            )

    def _resolve_likes(self, axes: dict[str, _AxisDraft]) -> None:
        p = self.problems
        valid = list(axes)
        for draft in axes.values():
            if draft.like is None:
                continue
            chain = [draft.name]
            current = draft
            while current.like is not None:
                target_name = current.like
                like_path = _join(current.path, "like")
                if not isinstance(target_name, str) or target_name not in axes:
                    if current is draft:
                        p.add(
                            like_path,
                            f"unknown axis {_show(target_name)}"
                            f"{_suggest(target_name, valid)}; valid axes: {_choices(valid)}",
                        )
                    draft.valid = False
                    break
                if target_name in chain:
                    if current is draft or draft.name == target_name:
                        cycle = " -> ".join([*chain, target_name])
                        p.add(_join(draft.path, "like"), f"like cycle: {cycle}")
                    draft.valid = False
                    break
                chain.append(target_name)
                current = axes[target_name]
            if draft.valid and current.valid:
                draft.teams = current.teams
            else:
                draft.valid = False
                draft.teams = None

    # ---- patterns ----
    def _patterns(
        self, data: dict[Any, Any], defaults: dict[str, Any], axes: dict[str, _AxisDraft]
    ) -> list[PatternSpec]:
        p = self.problems
        if "patterns" not in data:
            p.add(
                "patterns",
                "missing required key 'patterns' (a list of patterns, each with a name and blocks)",
            )
            return []
        raw = data["patterns"]
        if not isinstance(raw, list) or not raw:
            p.add("patterns", f"patterns must be a non-empty list, got {_show(raw)}")
            return []
        patterns: list[PatternSpec] = []
        names: dict[str, str] = {}
        total_blocks = 0
        for i, entry in enumerate(raw):
            path = _index("patterns", i)
            if not isinstance(entry, dict):
                p.add(path, f"a pattern is a mapping with name and blocks, got {_show(entry)}")
                continue
            p.unknown_keys(entry, path, PATTERN_KEYS, "a pattern")
            if "name" not in entry:
                p.add(_join(path, "name"), "missing required key 'name'")
                base = None
            elif check_references(entry["name"], [])[1]:
                base = None  # reported with the sweep references
            else:
                base = p.name(entry["name"], _join(path, "name"), "a pattern name")
            if base is not None:
                if base in names:
                    p.add(
                        _join(path, "name"), f"duplicate pattern name {base!r} (also {names[base]})"
                    )
                names[base] = path
            points = self._sweep_points(entry, path)
            if points is None or base is None:
                continue
            blocks = entry.get("blocks")
            num_blocks = len(blocks) if isinstance(blocks, list) else 0
            total_blocks += len(points) * num_blocks
            if total_blocks > MAX_EXPANDED_BLOCKS:
                p.add(
                    path,
                    f"the patterns expand to more than {MAX_EXPANDED_BLOCKS} blocks in "
                    "total; split the file or shrink the sweeps",
                )
                break
            patterns.extend(self._expand(entry, path, base, points, defaults, axes))
        return patterns

    def _sweep_points(
        self, entry: dict[Any, Any], path: str
    ) -> list[tuple[tuple[str, Any, str], ...]] | None:
        """Every sweep point of a pattern ([()] without a sweep); None after a problem."""
        p = self.problems
        variables: tuple[Any, ...] = ()
        ok = True
        if "sweep" in entry:
            variables, found = parse_sweep(entry["sweep"])
            for rel, message in found:
                sub = _join(path, "sweep")
                for part in rel:
                    sub = _index(sub, part) if isinstance(part, int) else _join(sub, part)
                p.add(sub, message)
            ok = not found
        raw_sweep = entry.get("sweep")
        # Names declared even when their values are bad, so references are not reported twice.
        names = [k for k in raw_sweep if isinstance(k, str)] if isinstance(raw_sweep, dict) else []
        if "name" in entry:
            _, found = check_references(entry["name"], [])
            if found:
                p.add(
                    _join(path, "name"),
                    "a pattern name cannot use sweep variables; each "
                    "point is named automatically, e.g. base[size=4M]",
                )
                ok = False
        body = {k: v for k, v in entry.items() if k not in ("name", "sweep")}
        used, found = check_references(body, names)
        if "sweep" in entry and not isinstance(raw_sweep, dict):
            found = []  # the sweep itself is reported; its references cannot be judged
        for rel, message in found:
            sub = path
            for part in rel:
                sub = _index(sub, part) if isinstance(part, int) else _join(sub, part)
            p.add(sub, message)
            ok = False
        if ok:
            for name in names:
                if name not in used:
                    p.add(
                        _join(_join(path, "sweep"), name),
                        f"sweep variable {name!r} is not "
                        'used by any block (reference it as "${' + name + '}")',
                    )
                    ok = False
        if not ok:
            return None
        if num_points(variables) > MAX_SWEEP_POINTS:  # pragma: no cover - parse_sweep checks
            return None
        return list(sweep_points(variables))

    def _expand(
        self,
        entry: dict[Any, Any],
        path: str,
        base: str,
        points: list[tuple[tuple[str, Any, str], ...]],
        defaults: dict[str, Any],
        axes: dict[str, _AxisDraft],
    ) -> list[PatternSpec]:
        """One PatternSpec per point; a problem found at only some points names the first."""
        body = {k: v for k, v in entry.items() if k not in ("name", "sweep")}
        found: dict[tuple[str, str], list[str]] = {}
        specs: list[PatternSpec] = []
        for point in points:
            problems = _Problems()
            spec = self._pattern_point(
                substitute(body, point), path, base, point, defaults, axes, problems
            )
            for item in problems.items:
                found.setdefault(item, []).append(point_label(point))
            if spec is not None:
                specs.append(spec)
        for (sub, message), labels in found.items():
            if len(points) > 1 and len(labels) < len(points):
                more = f" and {len(labels) - 1} other points" if len(labels) > 1 else ""
                message = f"{message} (at sweep point {labels[0]}{more})"
            self.problems.add(sub, message)
        return specs

    def _pattern_point(
        self,
        body: dict[Any, Any],
        path: str,
        base: str,
        point: tuple[tuple[str, Any, str], ...],
        defaults: dict[str, Any],
        axes: dict[str, _AxisDraft],
        p: _Problems,
    ) -> PatternSpec | None:
        settings = self._settings(p, body, path, defaults)
        raw_blocks = body.get("blocks")
        if "blocks" not in body:
            p.add(_join(path, "blocks"), "missing required key 'blocks' (a list of blocks)")
            return None
        if not isinstance(raw_blocks, list) or not raw_blocks:
            p.add(
                _join(path, "blocks"), f"blocks must be a non-empty list, got {_show(raw_blocks)}"
            )
            return None
        blocks: list[BlockSpec] = []
        names: dict[str, str] = {}
        lanes: dict[str, tuple[str, str, str]] = {}
        for i, raw in enumerate(raw_blocks):
            block_path = _index(_join(path, "blocks"), i)
            spec = self._block(raw, block_path, settings, axes, p)
            if spec is None:
                continue
            if spec.name in names:
                p.add(
                    _join(block_path, "name"),
                    f"duplicate block name {spec.name!r} in this pattern (also {names[spec.name]})",
                )
                continue
            names[spec.name] = block_path
            # Only blocks that talk through the axis's communicator are bound to one order.
            if getattr(self._resolve(spec.op), "category", "") != "comm":
                blocks.append(spec)
                continue
            if spec.axis in lanes and lanes[spec.axis][0] != spec.lane:
                lane, other, other_path = lanes[spec.axis]
                where = "lane" if isinstance(raw, dict) and "lane" in raw else "axis"
                p.add(
                    _join(block_path, where),
                    f"block {spec.name!r} is on lane {spec.lane!r} "
                    f"but block {other!r} ({other_path}) uses the same axis {spec.axis!r} on "
                    f"lane {lane!r}: one axis is one communicator, whose operations must be "
                    "issued in one order on every rank, so its blocks must share a lane; to "
                    "overlap them, put one on a second communicator, an axis defined with "
                    f"like: {spec.axis}",
                )
                continue
            lanes.setdefault(spec.axis, (spec.lane, spec.name, block_path))
            blocks.append(spec)
        if p:
            return None
        return PatternSpec(
            name=point_name(base, point),
            base_name=base,
            sweep_point=tuple((name, label) for name, _, label in point),
            blocks=tuple(blocks),
            warmup_iters=settings["warmup_iters"],
            num_iters=settings["iters"],
            baseline=settings["baseline"],
            check=settings["check"],
            sync=settings["sync"],
            yaml_path=path,
        )

    # ---- blocks ----
    def _resolve(self, op: str) -> type[Block] | str:
        """The block class of ``op``, or the message saying why there is none (cached)."""
        if op not in self._ops:
            try:
                self._ops[op] = resolve_op(op)
            except KeyError:
                valid = sorted(registered_ops())
                self._ops[op] = (
                    f"unknown op {op!r}{_suggest(op, valid)}; valid ops: "
                    f"{_choices(valid)}, or a custom 'package.module:ClassName'"
                )
            except BlockImportError as exc:
                self._ops[op] = str(exc)
            except Exception as exc:  # noqa: BLE001 - resolving imports user code
                self._ops[op] = f"cannot resolve op {op!r}: {type(exc).__name__}: {exc}"
        return self._ops[op]

    def _block(
        self,
        raw: Any,
        path: str,
        settings: dict[str, Any],
        axes: dict[str, _AxisDraft],
        p: _Problems,
    ) -> BlockSpec | None:
        if not isinstance(raw, dict):
            p.add(
                path,
                f"a block is a mapping with name, op, axis and the op's parameters, got "
                f"{_show(raw)}",
            )
            return None
        start = len(p.items)
        name = None
        if "name" not in raw:
            p.add(_join(path, "name"), "missing required key 'name'")
        else:
            name = p.name(raw["name"], _join(path, "name"), "a block name")
        cls: type[Block] | None = None
        op = raw.get("op")
        if "op" not in raw:
            p.add(
                _join(path, "op"),
                f"missing required key 'op'; valid ops: "
                f"{_choices(sorted(registered_ops()))}, or a custom 'package.module:ClassName'",
            )
        elif not isinstance(op, str) or not op:
            p.add(_join(path, "op"), f"op must be an op name, got {_show(op)}")
        else:
            resolved = self._resolve(op)
            if isinstance(resolved, str):
                p.add(_join(path, "op"), resolved)
            else:
                cls = resolved
        axis_name = raw.get("axis", WORLD_AXIS)
        axis: _AxisDraft | None = None
        if not isinstance(axis_name, str) or axis_name not in axes:
            p.add(
                _join(path, "axis"),
                f"unknown axis {_show(axis_name)}"
                f"{_suggest(axis_name, list(axes))}; valid axes: {_choices(axes)}",
            )
        else:
            axis = axes[axis_name]
        lane = raw.get("lane", axis_name)
        if "lane" in raw:
            lane = p.name(raw["lane"], _join(path, "lane"), "a lane name")
        dtype = settings["dtype"]
        if "dtype" in raw:
            dtype = p.choice(raw["dtype"], _join(path, "dtype"), tuple(DTYPE_SIZES_BYTES), "dtype")
        register = settings["register_buffers"]
        if "register_buffers" in raw:
            register = p.boolean(raw["register_buffers"], _join(path, "register_buffers"))
        if cls is None:
            return None
        params = self._params(cls, op, raw, path, p)
        if params is None or len(p.items) > start or axis is None or dtype is None:
            return None
        params = self._op_checks(cls, op, params, path, dtype, axis, p)
        if params is None or len(p.items) > start:
            return None
        assert name is not None and lane is not None and register is not None
        return BlockSpec(
            name=name,
            op=op,
            axis=axis.name,
            lane=lane,
            dtype=dtype,
            params=frozen_mapping(params),
            register_buffers=register,
            yaml_path=path,
        )

    def _params(
        self, cls: type[Block], op: str, raw: dict[Any, Any], path: str, p: _Problems
    ) -> dict[str, Any] | None:
        declared = cls.params if isinstance(cls.params, tuple | list) else ()
        by_key = {_yaml_key(param): param for param in declared if isinstance(param, Param)}
        valid = [*BLOCK_KEYS, *by_key]
        ok = True
        for key in raw:
            if key not in BLOCK_KEYS and key not in by_key:
                p.add(
                    _join(path, key),
                    f"unknown key {_show(key)} for op {op!r}"
                    f"{_suggest(key, valid)}; valid keys: {_choices(valid)}",
                )
                ok = False
        params: dict[str, Any] = {}
        for key, param in by_key.items():
            sub = _join(path, key)
            if key not in raw:
                if param.default is REQUIRED:
                    p.add(sub, f"missing required key {key!r} for op {op!r}: {param.doc}")
                    ok = False
                else:
                    params[param.name] = param.default
                continue
            value = _param_value(param, raw[key], sub, p)
            if value is None:
                ok = False
            else:
                params[param.name] = value
        return params if ok else None

    def _op_checks(
        self,
        cls: type[Block],
        op: str,
        params: dict[str, Any],
        path: str,
        dtype: str,
        axis: _AxisDraft,
        p: _Problems,
    ) -> dict[str, Any] | None:
        declared = cls.params if isinstance(cls.params, tuple | list) else ()
        keys = {param.name: _yaml_key(param) for param in declared if isinstance(param, Param)}

        def where(name: Any) -> str:
            if name in keys:
                return _join(path, keys[name])
            if name in BLOCK_KEYS:
                return _join(path, name)
            return path

        def report(found: Any) -> bool:
            try:
                items = [(str(name), str(message)) for name, message in found]
            except Exception:  # noqa: BLE001 - a custom block returned something else
                p.add(path, f"op {op!r} returned malformed problems from its parameter check")
                return True
            for name, message in items:
                p.add(where(name), message)
            return bool(items)

        try:
            normalized, found = cls.normalize_params(dict(params))
            if report(found):
                return None
            team_size = len(axis.teams[0]) if axis.teams else None
            if team_size is None:
                return dict(normalized)  # the world size or the axis is invalid: reported
            min_team = getattr(cls, "min_team_size", 1)
            if isinstance(min_team, int) and team_size < min_team:
                p.add(
                    _join(path, "axis"),
                    f"op {op!r} needs teams of at least {min_team} ranks; "
                    f"axis {axis.name!r} has teams of {team_size}",
                )
                return None
            if report(cls.check_params(normalized, dtype=dtype, team_size=team_size)):
                return None
            allocated = cls.buffer_bytes(normalized, dtype=dtype, team_size=team_size)
        except Exception as exc:  # noqa: BLE001 - custom blocks are user code
            p.add(
                path, f"op {op!r} failed while checking its parameters: {type(exc).__name__}: {exc}"
            )
            return None
        if isinstance(allocated, int) and allocated > MAX_SIZE_BYTES:
            p.add(
                path,
                f"this block would allocate {allocated} bytes per rank, larger than any "
                "machine's address space (at most 2**48 bytes)",
            )
            return None
        return dict(normalized)


def _yaml_key(param: Param) -> str:
    """The key a parameter is written under in YAML (``reduce_op`` for a Param named ``op``)."""
    if param.name in BLOCK_KEYS:
        return PARAM_YAML_ALIASES.get(param.name, f"{param.name}_param")
    return param.name


def _param_value(param: Param, value: Any, path: str, p: _Problems) -> Any:
    """``value`` checked and converted by the parameter's kind; None after a problem."""
    kind = param.kind
    if kind == "size":
        try:
            result: Any = parse_size(value)
        except ValueError as exc:
            p.add(path, str(exc))
            return None
    elif kind == "int":
        result = p.integer(value, path)
    elif kind == "float":
        result = p.number(value, path)
    elif kind == "bool":
        result = p.boolean(value, path)
    elif kind == "str":
        if not isinstance(value, str):
            p.add(path, f"expected a string, got {_show(value)}")
            return None
        result = value
    else:  # shape
        if (
            not isinstance(value, list)
            or not value
            or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in value)
        ):
            p.add(
                path,
                f"expected a shape: a list of positive integers such as [4096, 1024], "
                f"got {_show(value) if not isinstance(value, list) else value}",
            )
            return None
        result = tuple(value)
    if result is None:
        return None
    if param.choices is not None and result not in param.choices:
        p.add(
            path,
            f"unknown value {_show(value)}{_suggest(value, param.choices)}; valid "
            f"values: {_choices(param.choices)}",
        )
        return None
    if param.minimum is not None and kind in ("int", "float") and result < param.minimum:
        p.add(path, f"must be at least {param.minimum:g}, got {_show(value)}")
        return None
    return result
