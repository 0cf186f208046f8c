"""The op registry: built-in ops by name, custom ops by ``package.module:ClassName``."""

from __future__ import annotations

import importlib

from .base import Block
from .comm import AllGather, AllReduce, AllToAll, Broadcast, Reduce, ReduceScatter, SendRecv
from .compute import Gemm, Sleep

BUILTIN_BLOCKS: tuple[type[Block], ...] = (
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    Reduce,
    SendRecv,
    Gemm,
    Sleep,
)
"""Every built-in block class; each names its op in ``Block.op``."""


def registered_ops() -> dict[str, type[Block]]:
    """Every built-in op, by name."""
    return {cls.op: cls for cls in BUILTIN_BLOCKS}


class BlockImportError(LookupError):
    """A custom ``module:Class`` op could not be imported or is not a Block."""


def resolve_op(op: str) -> type[Block]:
    """The block class of ``op``: a registry name or ``package.module:ClassName``.

    Raises KeyError for an unknown registry name and BlockImportError for a bad custom op.
    """
    if ":" not in op:
        ops = registered_ops()
        if op not in ops:
            raise KeyError(op)
        return ops[op]
    module_name, _, class_name = op.partition(":")
    if not module_name or not class_name:
        raise BlockImportError(f"custom op {op!r} must be written 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import of user code can raise anything
        raise BlockImportError(f"cannot import module {module_name!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise BlockImportError(f"module {module_name!r} has no attribute {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Block)):
        raise BlockImportError(f"{op!r} is not a subclass of maestro's Block")
    return cls
