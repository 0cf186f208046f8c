"""Shrink a validated suite for small machines: cap message sizes and GEMM operands (``--max-size``).

Pure functions on SuiteSpec. Sizes are rounded down to what the op's own validation accepts, so
a capped suite is one the loader would have accepted as written.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Final

from ...blocks.base import Block
from ...blocks.registry import resolve_op
from ...errors import ConfigError
from .spec import BlockSpec, PatternSpec, SuiteSpec, frozen_mapping

__all__ = ["apply_max_size", "cap_gemm_dims", "cap_message_size"]

_BISECT_STEPS: Final = 64
"""Bisection steps of the GEMM scale factor: far below one element at any 2**48-byte size."""


def cap_message_size(
    size_bytes: int, max_size_bytes: int, *, elem_bytes: int, team_size: int, divide_by_team: bool
) -> int | None:
    """``size_bytes`` capped at ``max_size_bytes``, rounded down to whole elements (and to
    team_size chunks when the op splits S across the team); None when no valid size fits."""
    if size_bytes <= max_size_bytes:
        return size_bytes
    unit = elem_bytes * (team_size if divide_by_team else 1)
    capped = max_size_bytes // unit * unit
    return capped or None


def _gemm_operand_elems(m: int, n: int, k: int) -> int:
    return max(m * k, k * n, m * n)


def cap_gemm_dims(m: int, n: int, k: int, max_elems: int) -> tuple[int, int, int]:
    """(m, n, k) scaled by one common factor so that A[m,k], B[k,n] and C[m,n] each hold at
    most ``max_elems`` elements; every dim stays >= 1 and ratios hold up to rounding."""
    if max_elems < 1:
        raise ValueError(f"max_elems must be at least 1, got {max_elems}")
    if _gemm_operand_elems(m, n, k) <= max_elems:
        return m, n, k

    def scaled(factor: float) -> tuple[int, int, int]:
        return (
            max(1, math.floor(m * factor)),
            max(1, math.floor(n * factor)),
            max(1, math.floor(k * factor)),
        )

    # Operand sizes only grow with the factor, so bisect for the largest one that fits. A dim
    # clamped to 1 breaks the closed form sqrt(max / largest operand), hence no closed form.
    low, high = 0.0, 1.0
    for _ in range(_BISECT_STEPS):
        mid = (low + high) / 2
        if _gemm_operand_elems(*scaled(mid)) <= max_elems:
            low = mid
        else:
            high = mid
    return scaled(low)


def _capped_block(
    block: BlockSpec, cls: type[Block], team_size: int, max_size_bytes: int, source: str
) -> BlockSpec:
    params: dict[str, Any] = dict(block.params)
    elem = block.dtype_size_bytes
    if block.op == "gemm":
        max_elems = max_size_bytes // elem
        if max_elems < 1:
            raise ConfigError(
                f"--max-size {max_size_bytes} bytes is smaller than one {block.dtype} element "
                f"({elem} bytes) of gemm block {block.name!r}",
                file=source,
                path=block.yaml_path,
            )
        params["m"], params["n"], params["k"] = cap_gemm_dims(
            params["m"], params["n"], params["k"], max_elems
        )
    elif getattr(cls, "category", "") == "comm" and isinstance(params.get("size"), int):
        divide = bool(getattr(cls, "divide_by_team", False))
        capped = cap_message_size(
            params["size"],
            max_size_bytes,
            elem_bytes=elem,
            team_size=team_size,
            divide_by_team=divide,
        )
        if capped is None:
            unit = elem * (team_size if divide else 1)
            raise ConfigError(
                f"--max-size {max_size_bytes} bytes is below the smallest valid size of "
                f"{block.op} block {block.name!r}: {unit} bytes "
                f"({'team size x ' if divide else ''}{block.dtype} element size); "
                f"use --max-size {unit} or more",
                file=source,
                path=block.yaml_path,
            )
        params["size"] = capped
        # The op's own rules decide (custom comm ops may have more than divisibility).
        problems = cls.check_params(params, dtype=block.dtype, team_size=team_size)
        if problems:
            text = "; ".join(message for _, message in problems)
            raise ConfigError(
                f"block {block.name!r} capped to {capped} bytes by --max-size is not valid: {text}",
                file=source,
                path=block.yaml_path,
            )
    else:
        return block  # sleep and other blocks carry no bytes to cap
    if params == dict(block.params):
        return block
    return dataclasses.replace(block, params=frozen_mapping(params))


def _content_key(pattern: PatternSpec) -> tuple[Any, ...]:
    """What a pattern measures, ignoring names: equal keys measure the same thing."""
    blocks = tuple(
        (b.op, b.axis, b.lane, b.dtype, b.register_buffers, tuple(sorted(_items(b.params))))
        for b in pattern.blocks
    )
    return (
        pattern.base_name,
        blocks,
        pattern.warmup_iters,
        pattern.num_iters,
        pattern.baseline,
        pattern.check,
        pattern.sync,
    )


def _items(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(key, repr(value)) for key, value in params.items()]


def apply_max_size(suite: SuiteSpec, max_size_bytes: int) -> SuiteSpec:
    """``suite`` with every collective's size capped at ``max_size_bytes`` and every GEMM's
    operands scaled below it; sleeps unchanged. Sweep points of one pattern that become
    identical are kept once (the first, under its own name), so result names stay unique."""
    if isinstance(max_size_bytes, bool) or not isinstance(max_size_bytes, int):
        raise ConfigError(f"--max-size must be a whole number of bytes, got {max_size_bytes!r}")
    if max_size_bytes < 1:
        raise ConfigError(f"--max-size must be positive, got {max_size_bytes}")
    classes: dict[str, type[Block]] = {}
    patterns: list[PatternSpec] = []
    seen: set[tuple[Any, ...]] = set()
    for pattern in suite.patterns:
        blocks = []
        for block in pattern.blocks:
            if block.op not in classes:
                classes[block.op] = resolve_op(block.op)  # validated already: resolves
            team_size = suite.axes[block.axis].team_size
            blocks.append(
                _capped_block(block, classes[block.op], team_size, max_size_bytes, suite.source)
            )
        capped = dataclasses.replace(pattern, blocks=tuple(blocks))
        key = _content_key(capped)
        if pattern.sweep_point and key in seen:
            continue
        seen.add(key)
        patterns.append(capped)
    return dataclasses.replace(suite, patterns=tuple(patterns))
