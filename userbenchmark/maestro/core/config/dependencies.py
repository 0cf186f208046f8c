"""Blocks that wait for blocks (``after:``): the names a block waits for, checked against its
pattern, and no cycle in its wait-for graph (core/config/spec.py computes the graph)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .problems import Problems, choices, join, suggest
from .spec import BlockSpec, issue_order, predecessors


def after_names(p: Problems, raw: Mapping[Any, Any], path: str) -> tuple[str, ...] | None:
    """The ``after:`` of block ``raw`` (a name or a list of names, repeats dropped); None after a
    problem. Whether the names exist is the pattern's check (:func:`check_after`)."""
    value = raw.get("after", [])
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        where = join(path, "after")
        p.add(
            where,
            f"after must be a block name or a list of block names, got {p.show(where, value)}",
        )
        return None
    return tuple(dict.fromkeys(names))


def find_cycle(blocks: Sequence[BlockSpec]) -> list[int] | None:
    """A cycle of waits (indices, each waiting for the next, the last for the first), or None. Every
    block :func:`issue_order` leaves out waits for another one left out (its lane predecessor or
    one it names), so following those waits must come back."""
    waits, left = predecessors(blocks), set(range(len(blocks))) - set(issue_order(blocks))
    if not left:
        return None
    path = [min(left)]
    while path[-1] not in path[:-1]:
        path.append(next(j for j in waits[path[-1]] if j in left))
    return path[path.index(path[-1]) : -1]


def check_after(
    p: Problems,
    blocks: Sequence[BlockSpec],
    declared: Mapping[str, None],
    homes: Mapping[str, Sequence[str]],
    pattern: Any,
) -> None:
    """Record every ``after:`` name that is not another block of this pattern (``declared``: its
    block names as written; ``homes``: {block name: patterns with such a block}; ``pattern``: this
    one's name), then any cycle of waits, lane order included."""
    before = len(p)
    for block in blocks:
        where = join(block.yaml_path, "after")
        for name in block.after:
            if name == block.name:
                p.add(where, f"block {name!r} waits for itself; after names other blocks")
            elif name not in declared:
                others = [q for q in homes.get(name, ()) if q != pattern]
                p.add(where, _unknown(name, declared, others))
    cycle = None if len(p) > before else find_cycle(blocks)
    if cycle is None:
        return
    steps, named = [], []
    for i, j in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
        a, b = blocks[i], blocks[j]
        if b.name in a.after:
            named.append(i)
        why = "after" if b.name in a.after else f"before it on lane {a.lane!r}"
        steps.append(f"{a.name!r} waits for {b.name!r} ({why})")
    p.add(
        join(blocks[min(named)].yaml_path, "after"),
        f"blocks {', '.join(repr(blocks[i].name) for i in cycle)} wait for each other in a "
        f"cycle: {'; '.join(steps)}; none of them could ever start (blocks of one lane run in "
        "the order written)",
    )


def _unknown(name: str, declared: Mapping[str, None], others: Sequence[str]) -> str:
    if "[" in name:
        return (
            f"{name!r} is a sweep point's name; name the block as written in this "
            "pattern (each sweep point's blocks wait for blocks of the same point)"
        )
    if others:
        return (
            f"block {name!r} is in pattern {others[0]!r}, not in this one; a block waits "
            "only for blocks of its own pattern (patterns run one after another)"
        )
    return (
        f"unknown block {name!r}{suggest(name, declared)}; blocks of this pattern: "
        f"{choices(declared)}"
    )
