"""Load a pattern file: safe YAML, complete validation, sweep expansion, frozen SuiteSpec, every
problem in one ConfigError. No process group, no tensor; the only code a file can cause to run is
the module of a custom ``op: package.module:ClassName`` (not even that with ``import_ops=False``)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import Any, Final

from ...errors import ConfigError
from .axes import check_axes, check_env, check_world_size
from .blocks import OpResolver
from .patterns import DEFAULT_KEYS, DEFAULT_VALUES, check_patterns, check_settings
from .problems import Problems, choices
from .spec import SuiteSpec, frozen_mapping
from .yaml_reader import read_file_text, read_yaml

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
    defaults = dict(DEFAULT_VALUES)
    raw_defaults = data.get("defaults", {})
    if isinstance(raw_defaults, dict):
        p.unknown_keys(raw_defaults, "defaults", DEFAULT_KEYS, "in defaults")
        defaults = check_settings(p, raw_defaults, "defaults", defaults)
    else:
        p.add(
            "defaults",
            f"defaults must be a mapping with keys {choices(DEFAULT_KEYS)}, "
            f"got {p.show('defaults', raw_defaults)}",
        )
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
