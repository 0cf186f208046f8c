"""The dtypes a pattern may name, in one table: element size, torch dtype, floating or not."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class DType:
    """One dtype a pattern may name; ``trace_names``: how profiler traces spell it (c10's
    ScalarType and C++ names, ``c10::`` dropped)."""

    name: str
    size_bytes: int
    torch_name: str  # attribute of the ``torch`` module
    floating: bool
    trace_names: tuple[str, ...] = ()


_TABLE = (  # name, bytes, torch attribute, floating, how traces spell it
    ("fp32", 4, "float32", True, ("Float", "float")),
    ("fp16", 2, "float16", True, ("Half",)),
    ("bf16", 2, "bfloat16", True, ("BFloat16",)),
    ("fp64", 8, "float64", True, ("Double", "double")),
    ("int32", 4, "int32", False, ("Int", "int")),
    ("int64", 8, "int64", False, ("Long", "long int")),
    ("int8", 1, "int8", False, ("Char", "signed char")),
    ("uint8", 1, "uint8", False, ("Byte", "unsigned char", "Bool", "bool")),
)
DTYPES: Mapping[str, DType] = MappingProxyType(
    {
        n: DType(name=n, size_bytes=b, torch_name=t, floating=f, trace_names=names)
        for n, b, t, f, names in _TABLE
    }
)
"""Every dtype name a pattern may use, in the order ``list-blocks`` shows them."""

DTYPE_SIZES_BYTES: Mapping[str, int] = MappingProxyType(
    {name: d.size_bytes for name, d in DTYPES.items()}
)

FLOATING_DTYPES: tuple[str, ...] = tuple(name for name, d in DTYPES.items() if d.floating)


def traced_dtype(name: str) -> DType | None:
    """The dtype a trace's type name means (``BFloat16``, ``c10::BFloat16``; a bool as a byte),
    or None when no dtype here has it."""
    name = name.removeprefix("c10::")
    return next((d for d in DTYPES.values() if name in d.trace_names), None)


def torch_dtype(name: str) -> torch.dtype:
    """torch dtype of a pattern dtype name (fp32, fp16, bf16, ...)."""
    import torch

    return getattr(torch, DTYPES[name].torch_name)
