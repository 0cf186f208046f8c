"""Shrink a validated suite for small machines: cap message sizes and GEMM operands (--max-size).
Pure functions on SuiteSpec; sizes round down to what the op's own validation accepts, so a
capped suite is one the loader would have accepted as written."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...blocks.registry import resolve_op
from ...errors import ConfigError
from .spec import BlockSpec, PatternSpec, SuiteSpec, frozen_mapping
from .summary import describe_params


def _capped_block(block: BlockSpec, suite: SuiteSpec, max_size_bytes: int) -> BlockSpec:
    """The block with its op's byte counts capped (the op decides what that means)."""
    cls = resolve_op(block.op)  # validated already: resolves
    team_size, source = suite.axes[block.axis].team_size, suite.source
    where = f"--max-size {max_size_bytes} bytes: {block.op} block {block.name!r}"
    try:
        params = cls.capped_params(
            block.params, max_size_bytes=max_size_bytes, dtype=block.dtype, team_size=team_size
        )
    except ValueError as exc:
        raise ConfigError(
            f"{where} cannot be capped: {exc}", file=source, path=block.yaml_path
        ) from None
    if params == dict(block.params):
        return block
    # The op's own rules decide whether the capped block is valid (custom ops may have more
    # rules than divisibility).
    problems = cls.check_params(params, dtype=block.dtype, team_size=team_size)
    if problems:
        text = "; ".join(message for _, message in problems)
        raise ConfigError(
            f"{where}: the capped parameters are not valid: {text}",
            file=source,
            path=block.yaml_path,
        )
    return dataclasses.replace(
        block, params=frozen_mapping(params), work=describe_params(cls, params)
    )


_NOT_CONTENT = frozenset({"name", "sweep_point", "yaml_path"})
"""Fields that name or locate a pattern or block; every other field is what it measures."""


def _content(spec: Any) -> tuple[Any, ...]:
    """What a pattern (or block) measures: every field of the frozen spec but its names and
    places, in a comparable form. Equal keys measure the same thing; a field added to the
    specs counts without being listed here."""
    values = []
    for f in dataclasses.fields(spec):
        if f.name in _NOT_CONTENT:
            continue
        value = getattr(spec, f.name)
        if f.name == "blocks":
            value = tuple(_content(b) for b in value)
        elif f.name == "params":
            value = tuple(sorted((key, repr(v)) for key, v in value.items()))
        values.append((f.name, value))
    return tuple(values)


def apply_max_size(suite: SuiteSpec, max_size_bytes: int) -> SuiteSpec:
    """``suite`` with every collective's size capped at ``max_size_bytes`` and every GEMM's
    operands scaled below it; sleeps unchanged. Sweep points of one pattern that become
    identical are kept once (the first, under its own name), so result names stay unique.
    ``max_size_bytes`` is ``--max-size``'s, a positive size by then (``parse_size``)."""
    patterns: list[PatternSpec] = []
    seen: set[tuple[Any, ...]] = set()
    for pattern in suite.patterns:
        blocks = tuple(_capped_block(block, suite, max_size_bytes) for block in pattern.blocks)
        capped = dataclasses.replace(pattern, blocks=blocks)
        key = _content(capped)
        if pattern.sweep_point and key in seen:
            continue
        seen.add(key)
        patterns.append(capped)
    return dataclasses.replace(suite, patterns=tuple(patterns))
