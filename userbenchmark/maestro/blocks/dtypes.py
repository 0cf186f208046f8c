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
    """One dtype a pattern may name."""

    name: str
    size_bytes: int
    torch_name: str
    """Attribute of the ``torch`` module (``bfloat16`` for ``bf16``)."""
    floating: bool


DTYPES: Mapping[str, DType] = MappingProxyType(
    {
        d.name: d
        for d in (
            DType(name="fp32", size_bytes=4, torch_name="float32", floating=True),
            DType(name="fp16", size_bytes=2, torch_name="float16", floating=True),
            DType(name="bf16", size_bytes=2, torch_name="bfloat16", floating=True),
            DType(name="fp64", size_bytes=8, torch_name="float64", floating=True),
            DType(name="int32", size_bytes=4, torch_name="int32", floating=False),
            DType(name="int64", size_bytes=8, torch_name="int64", floating=False),
            DType(name="int8", size_bytes=1, torch_name="int8", floating=False),
            DType(name="uint8", size_bytes=1, torch_name="uint8", floating=False),
        )
    }
)
"""Every dtype name a pattern may use, in the order ``list-blocks`` shows them."""

DTYPE_SIZES_BYTES: Mapping[str, int] = MappingProxyType(
    {name: d.size_bytes for name, d in DTYPES.items()}
)
"""Element size of every dtype name (a view of :data:`DTYPES`)."""

FLOATING_DTYPES: tuple[str, ...] = tuple(name for name, d in DTYPES.items() if d.floating)


def torch_dtype(name: str) -> torch.dtype:
    """torch dtype of a pattern dtype name (fp32, fp16, bf16, ...)."""
    import torch

    return getattr(torch, DTYPES[name].torch_name)
