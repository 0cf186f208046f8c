"""The op registry: built-in ops by name, custom ops by ``package.module:ClassName``."""

from __future__ import annotations

import importlib

from .base import Block
from .comm import AllGather, AllReduce, AllToAll, Broadcast, Reduce, ReduceScatter, SendRecv
from .compute import Busy, Gemm, Sleep

BUILTIN_BLOCKS: tuple[type[Block], ...] = (AllReduce, AllGather, ReduceScatter, AllToAll,
                                            Broadcast, Reduce, SendRecv, Gemm, Sleep, Busy)  # fmt: skip


def registered_ops() -> dict[str, type[Block]]:
    """Every built-in op, by name."""
    return {cls.op: cls for cls in BUILTIN_BLOCKS}


def traced_op(name: str) -> type[Block] | None:
    """The built-in block that replays a call the profiler named ``name`` (None: no block
    does; ``import-trace`` replays its kernels by their duration)."""
    return next((cls for cls in BUILTIN_BLOCKS if name in cls.trace_names), None)


class BlockImportError(LookupError):
    """A custom ``module:Class`` op could not be imported or is not a Block."""


def custom_op_problem(op: str) -> str | None:
    """Why ``op`` is not a well-formed ``package.module:ClassName``, or None (nothing imported); a
    ``__main__`` module is refused: importing it runs a program."""
    module_name, _, class_name = op.partition(":")
    if not module_name or not class_name:
        return f"custom op {op!r} must be written 'package.module:ClassName'"
    parts = module_name.split(".")
    if not all(part.isidentifier() for part in parts) or not class_name.isidentifier():
        return (
            f"custom op {op!r} must be written 'package.module:ClassName': dotted Python "
            "names, then a class name"
        )
    if "__main__" in parts:
        return (
            f"custom op {op!r} names a __main__ module, which runs a program when imported; "
            "name the module that defines the class"
        )
    return None


def resolve_op(op: str) -> type[Block]:
    """The block class of a registry name (else KeyError) or ``package.module:ClassName``, whose
    import runs user code: anything but KeyboardInterrupt it raises becomes BlockImportError."""
    if ":" not in op:
        return registered_ops()[op]
    problem = custom_op_problem(op)
    if problem is not None:
        raise BlockImportError(problem)
    module_name, _, class_name = op.partition(":")
    failed = f"cannot import module {module_name!r}"
    try:
        module = importlib.import_module(module_name)
        failed = f"cannot get {class_name!r} from module {module_name!r}"
        cls = getattr(module, class_name, None)  # a module-level __getattr__ is user code too
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit, GeneratorExit: user code must not end maestro
        raise BlockImportError(f"{failed}: {type(exc).__name__}: {exc}") from exc
    if cls is None:
        raise BlockImportError(f"module {module_name!r} has no attribute {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Block)):
        raise BlockImportError(f"{op!r} is not a subclass of maestro's Block")
    return cls
