"""One block of a pattern: its op (built-in, or a custom ``package.module:ClassName``), axis, lane,
dtype and the op's own parameters, checked by their declarations and by the op's class; and the
blocks it waits for (``after:``), with no cycle in its pattern's wait-for graph (spec.py's)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from ...blocks.base import Block, Param
from ...blocks.dtypes import DTYPE_SIZES_BYTES
from ...blocks.registry import BlockImportError, custom_op_problem, registered_ops, resolve_op
from .axes import AxisDraft
from .problems import Problems, choices, join, suggest
from .sizes import MAX_SIZE_BYTES, parse_size
from .spec import TRACED_KEYS, WORLD_AXIS, BlockSpec, frozen_mapping, issue_order, predecessors
from .summary import describe_params

BLOCK_KEYS: Final = ("name", "op", "axis", "lane", "dtype", "register_buffers", "after",
                     *TRACED_KEYS)  # fmt: skip

# A Param named like a block key cannot be written under its own name; it gets this YAML key.
PARAM_YAML_ALIASES: Final = {"op": "reduce_op"}

_CUSTOM: Final = "a custom 'package.module:ClassName'"
_ANNOUNCED: set[str] = set()  # custom ops' modules this process said it imports
logger = logging.getLogger("maestro.config")
DTYPES: Final = tuple(DTYPE_SIZES_BYTES)


class OpResolver:
    """The block class of each op a file names, resolved once per op. With ``import_ops`` False a
    custom op's module is not imported: only its name is checked, and it is listed in
    :attr:`not_imported` (its parameters cannot be checked without it)."""

    def __init__(self, *, import_ops: bool = True) -> None:
        self.import_ops = import_ops
        self._ops: dict[str, type[Block] | str | None] = {}
        self.not_imported: dict[str, str] = {}
        """Custom ops left unimported: op -> YAML path of its first block."""

    def resolve(self, op: str, path: str = "") -> type[Block] | str | None:
        """The class of ``op``, the message saying why there is none, or None for a custom op
        that is well-formed but not imported."""
        if op not in self._ops:
            self._ops[op] = self._resolve(op)
        if self._ops[op] is None:
            self.not_imported.setdefault(op, path)
        return self._ops[op]

    def _resolve(self, op: str) -> type[Block] | str | None:
        if ":" in op and not self.import_ops:
            return custom_op_problem(op)
        module = op.partition(":")[0]
        if ":" in op and module not in _ANNOUNCED and custom_op_problem(op) is None:
            _ANNOUNCED.add(module)  # said once per process
            logger.warning(
                "custom op %r: importing module %r runs its code as yours (trusted code; "
                "validate --no-import checks a file without importing it)",
                op,
                module,
            )
        try:
            return resolve_op(op)
        except KeyError:
            valid = sorted(registered_ops())
            return (
                f"unknown op {op!r}{suggest(op, valid)}; valid ops: {choices(valid)}, or {_CUSTOM}"
            )
        except BlockImportError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - resolving imports user code
            return f"cannot resolve op {op!r}: {type(exc).__name__}: {exc}"


def check_block(
    p: Problems,
    raw: Any,
    path: str,
    settings: dict[str, Any],
    axes: dict[str, AxisDraft],
    ops: OpResolver,
) -> BlockSpec | None:
    """The BlockSpec of the block ``raw`` at ``path``, or None after recording its problems."""
    if not p.mapping(raw, path, "a block is a mapping with name, op, axis and the op's parameters"):
        return None
    start = len(p)
    p.missing(raw, path, "name")
    name = p.get(raw, path, "name", p.name, "a block name")
    cls, unchecked = _block_class(p, raw, path, ops)
    axis_name = raw.get("axis", WORLD_AXIS)
    axis = axes.get(p.choice(axis_name, join(path, "axis"), tuple(axes), "axis", "axes") or "")
    lane = p.get(raw, path, "lane", p.name, "a lane name", default=axis_name)
    dtype = p.get(raw, path, "dtype", p.choice, DTYPES, "dtype", default=settings["dtype"])
    register = p.get(raw, path, "register_buffers", p.boolean, default=settings["register_buffers"])
    after = after_names(p, raw, path)
    kernel = raw.get("traced_kernel")
    if kernel is not None and not isinstance(kernel, str):
        where = join(path, "traced_kernel")
        p.add(where, f"expected a kernel name, got {p.show(where, kernel)}")
    overlap = p.get(raw, path, "traced_overlap", p.number, minimum=0.0, maximum=1.0)
    durations = ("traced_us", "traced_min_us", "traced_max_us")
    traced = {key: p.get(raw, path, key, p.number, minimum=0.0) for key in durations}
    # A custom op left unimported keeps its parameters as written; a known op's are checked,
    # and against its dtype and axis when nothing else of the block was wrong.
    ready = len(p) == start and axis is not None and dtype is not None
    if unchecked:
        params = {k: v for k, v in raw.items() if k not in BLOCK_KEYS}
    elif (params := None if cls is None else _params(p, cls, raw, path)) is not None and ready:
        params = _op_checks(p, cls, raw["op"], params, path, dtype, axis)
    if params is None or len(p) > start:
        return None
    return BlockSpec(
        name=name,
        op=raw["op"],
        axis=axis.name,
        lane=lane,
        dtype=dtype,
        params=frozen_mapping(params),
        work=describe_params(cls, params),
        register_buffers=register,
        after=after,
        **traced,
        traced_kernel=kernel,
        traced_overlap=overlap,
        yaml_path=path,
    )


def _block_class(
    p: Problems, raw: dict[Any, Any], path: str, ops: OpResolver
) -> tuple[type[Block] | None, bool]:
    """(the block's op class or None, whether it is a custom op left unimported and unchecked),
    after recording what is wrong with its ``op``."""
    op, op_path = raw.get("op"), join(path, "op")
    if p.missing(
        raw, path, "op", f"; valid ops: {choices(sorted(registered_ops()))}, or {_CUSTOM}"
    ):
        return None, False
    if not isinstance(op, str) or not op:
        p.add(op_path, f"op must be an op name, got {p.show(op_path, op)}")
        return None, False
    resolved = ops.resolve(op, op_path)
    if isinstance(resolved, str):
        p.add(op_path, resolved)
        return None, False
    return resolved, resolved is None


def _declared(cls: type[Block]) -> list[Param]:
    declared = cls.params if isinstance(cls.params, tuple | list) else ()
    return [param for param in declared if isinstance(param, Param)]


def yaml_key(param: Param | str) -> str:
    """The key a parameter (or a parameter's name) is written under in YAML (``reduce_op`` for a
    Param named ``op``)."""
    name = param if isinstance(param, str) else param.name
    return PARAM_YAML_ALIASES.get(name, f"{name}_param") if name in BLOCK_KEYS else name


def block_entry(spec: BlockSpec) -> dict[str, Any]:
    """The block as a file entry that gives every key and parameter (none of the traced ones),
    which check_block turns back into ``spec``: what a ``whatif:`` variant changes."""
    entry = {"name": spec.name, "op": spec.op, "axis": spec.axis, "lane": spec.lane}
    entry |= {"dtype": spec.dtype, "register_buffers": spec.register_buffers}
    for name, value in spec.params.items():
        if value is not None:
            entry[yaml_key(name)] = list(value) if isinstance(value, tuple) else value
    return entry | {"after": list(spec.after)}


def _params(p: Problems, cls: type[Block], raw: dict[Any, Any], path: str) -> dict[str, Any] | None:
    op = raw["op"]
    by_key = {yaml_key(param): param for param in _declared(cls)}
    start = len(p)
    p.unknown_keys(raw, path, [*BLOCK_KEYS, *by_key], f"for op {op!r}")
    params: dict[str, Any] = {}
    for key, param in by_key.items():
        sub = join(path, key)
        if key not in raw:
            if param.required:
                p.add(sub, f"missing required key {key!r} for op {op!r}: {param.doc}")
            params[param.name] = param.default
        elif (value := _param_value(p, param, raw[key], sub)) is not None:
            params[param.name] = value
    return params if len(p) == start else None


def _op_checks(
    p: Problems,
    cls: type[Block],
    op: str,
    params: dict[str, Any],
    path: str,
    dtype: str,
    axis: AxisDraft,
) -> dict[str, Any] | None:
    keys = {param.name: yaml_key(param) for param in _declared(cls)}

    def where(name: Any) -> str:
        key = keys.get(name, name if name in BLOCK_KEYS else None)
        return path if key is None else join(path, key)

    def report(found: Iterable[Any]) -> bool:
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
        if not axis.teams:
            return dict(normalized)  # the world size or the axis is invalid: reported
        team_size = len(axis.teams[0])
        min_team = getattr(cls, "min_team_size", 1)
        if isinstance(min_team, int) and team_size < min_team:
            p.add(
                join(path, "axis"),
                f"op {op!r} needs teams of at least {min_team} ranks; "
                f"axis {axis.name!r} has teams of {team_size}",
            )
            return None
        if report(cls.check_params(normalized, dtype=dtype, team_size=team_size)):
            return None
        allocated = cls.buffer_bytes(normalized, dtype=dtype, team_size=team_size)
    except Exception as exc:  # noqa: BLE001 - custom blocks are user code
        p.add(path, f"op {op!r} failed while checking its parameters: {type(exc).__name__}: {exc}")
        return None
    if isinstance(allocated, int) and allocated > MAX_SIZE_BYTES:
        p.add(
            path,
            f"this block would allocate {allocated} bytes per rank, larger than any "
            "machine's address space (at most 2**48 bytes)",
        )
        return None
    return dict(normalized)


def _param_value(p: Problems, param: Param, value: Any, path: str) -> Any:
    kind = param.kind
    typed = {"int": p.integer, "float": p.number, "bool": p.boolean}
    if kind in typed:
        result: Any = typed[kind](value, path)
    elif kind == "size":
        try:
            result = parse_size(value)
        except ValueError as exc:
            p.add(path, str(exc))
            return None
    elif kind == "str":
        if not isinstance(value, str):
            p.add(path, f"expected a string, got {p.show(path, value)}")
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
                f"got {p.show(path, value) if not isinstance(value, list) else value}",
            )
            return None
        result = tuple(value)
    if result is None:
        return None
    if param.choices is not None and p.choice(result, path, param.choices, "value") is None:
        return None
    bounded, why = kind in ("int", "float"), f"{yaml_key(param)}: {param.doc}"
    if bounded and not p.within(result, value, path, param.minimum, param.maximum, why):
        return None
    return result


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
