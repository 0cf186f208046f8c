"""What a traced call is in maestro's terms: collectives from ``record_param_comms``, GEMMs from
the shapes of ``aten::mm``-like ops, dtypes from torch's names. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..blocks.dtypes import DTYPES
from .kineto import CommRecord, GemmOp

COLLECTIVE_OPS = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "barrier": "all_reduce",
    "_allgather_base": "all_gather",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all",
    "all_to_allv": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "broadcast": "broadcast",
    "_broadcast_oop": "broadcast",
    "reduce": "reduce",
    "_reduce_oop": "reduce",
}
"""``Collective name`` of a record -> maestro op."""
P2P_NAMES = frozenset({"send", "recv", "recvAnysource"})
MARKER_NAMES = frozenset({"wait", "coalesced", "startCoalescing", "endCoalescing", ""})
"""Records that mark a point of a call and launch nothing of their own."""

TORCH_DTYPES = {
    "Float": ("fp32", 4),
    "float": ("fp32", 4),
    "c10::Float": ("fp32", 4),
    "BFloat16": ("bf16", 2),
    "c10::BFloat16": ("bf16", 2),
    "Half": ("fp16", 2),
    "c10::Half": ("fp16", 2),
    "Double": ("fp64", 8),
    "double": ("fp64", 8),
    "Int": ("int32", 4),
    "int": ("int32", 4),
    "Long": ("int64", 8),
    "long int": ("int64", 8),
    "Char": ("int8", 1),
    "signed char": ("int8", 1),
    "Byte": ("uint8", 1),
    "unsigned char": ("uint8", 1),
    "Bool": ("uint8", 1),
    "bool": ("uint8", 1),
}
"""torch's dtype spellings in traces (records say ``BFloat16``, ops ``c10::BFloat16``)."""
_SIZE_ONLY = {"Short": 2, "short int": 2, "ComplexFloat": 8, "ComplexDouble": 16}
_STAND_IN_BY_SIZE = {1: "uint8", 2: "bf16", 4: "fp32", 8: "fp64", 16: "fp64"}


def maestro_dtype(torch_name: str) -> tuple[str, int, str | None]:
    """(maestro dtype, element bytes, note) for a torch dtype name; a type maestro lacks gets
    one of the same element size (bytes stay exact) and a note saying so."""
    if torch_name in TORCH_DTYPES:
        name, size = TORCH_DTYPES[torch_name]
        return name, size, None
    size = _SIZE_ONLY.get(torch_name)
    if size is None and "Float8" in torch_name:
        size = 1
    if size is None:
        size = 1
        note = f"dtype {torch_name!r} unknown: replayed as uint8, its byte count as traced"
        return "uint8", size, note
    stand_in = _STAND_IN_BY_SIZE[size]
    return stand_in, size, f"dtype {torch_name} replayed as {stand_in} (same bytes per element)"


@dataclass(frozen=True, kw_only=True)
class Collective:
    """A traced collective in maestro's terms."""

    op: str
    size_bytes: int
    dtype: str
    root: int = 0
    note: str | None = None


def collective(rec: CommRecord, team_size: int) -> Collective:
    """The maestro op and message size S (nccl-tests' definition) of a collective record."""
    op = COLLECTIVE_OPS[rec.name]
    dtype, elem, note = maestro_dtype(rec.dtype)
    n_in, n_out = max(rec.in_nelems, 0), max(rec.out_nelems, 0)
    if op == "all_gather":
        elems = max(n_out, n_in * team_size)  # S is the gathered output
    elif op == "reduce_scatter":
        elems = max(n_in, n_out * team_size)  # S is the input
    else:
        elems = max(n_in, 1 if op == "all_reduce" else 0)  # a barrier reduces one element
    if op == "all_to_all":
        elems, split_note = _uniform_all_to_all(n_in, rec.in_splits, team_size)
        note = "; ".join(n for n in (note, split_note) if n) or None
    root = rec.peer if op in ("broadcast", "reduce") and rec.peer is not None else 0
    if not 0 <= root < team_size:
        root = 0
    return Collective(op=op, size_bytes=elems * elem, dtype=dtype, root=root, note=note)


def _uniform_all_to_all(n_in: int, splits: Sequence[int], team_size: int) -> tuple[int, str | None]:
    """Elements each rank sends in maestro's uniform all_to_all (whole chunks per peer)."""
    chunk = max(n_in // team_size, 1)
    elems = chunk * team_size
    uniform = not splits or len(set(splits)) == 1
    if uniform and elems == n_in:
        return elems, None
    shown = list(splits) if len(splits) <= 8 else [*splits[:8], "..."]
    return elems, (
        f"uneven all_to_all split sizes {shown} (along dim 0; {n_in} elements in all) "
        f"replayed as {team_size} equal chunks of {chunk} elements"
    )


@dataclass(frozen=True, kw_only=True)
class Gemm:
    """A traced GEMM in maestro's terms: C[m, n] = A[m, k] @ B[k, n]."""

    m: int
    n: int
    k: int
    dtype: str
    note: str | None = None
    tf32: bool = False
    """An fp32 GEMM whose kernel used TF32 tensor cores (its name says so)."""
    a_transposed: bool = False
    b_transposed: bool = False
    """The operand was stored transposed (column-major), from the trace's ``Input Strides``:
    cuBLAS picks its kernel by layout, so the replay keeps it."""


def _transposed(shape: Sequence[int], stride: Sequence[int] | None) -> bool:
    """A 2-D operand stored column-major (its first dimension is the contiguous one)."""
    return (
        bool(stride)
        and len(shape) == 2
        and len(stride) == 2
        and stride[0] == 1 < shape[0]
        and stride[1] != 1
    )


def _prod(dims: Sequence[int]) -> int:
    return math.prod(dims) if dims else 1


def gemm(op: GemmOp) -> Gemm | None:
    """m, n, k and dtype of a GEMM op from its ``Input Dims``; None when the shapes are not
    recorded or not a GEMM's (the kernels are then replayed as a compute stand-in)."""
    pairs = [(d, op.strides[i] if i < len(op.strides) else None) for i, d in enumerate(op.dims)]
    pairs = [(d, s) for d, s in pairs if d]
    dims = [d for d, _ in pairs]
    name = op.name.removeprefix("aten::")
    layout = {"a_transposed": False, "b_transposed": False}
    try:
        if name in ("mm", "addmm", "_addmm_activation", "matmul") and len(dims[-1]) == 2:
            (a, sa), (b, sb) = pairs[-2], pairs[-1]
            layout = {"a_transposed": _transposed(a, sa), "b_transposed": _transposed(b, sb)}
        if name in ("mm", "addmm", "_addmm_activation"):
            a, b = dims[-2], dims[-1]
            m, k, n, note = a[0], a[1], b[1], None
        elif name in ("bmm", "baddbmm"):
            a, b = dims[-2], dims[-1]
            m, k, n = a[0] * a[1], a[2], b[2]
            note = f"{name} of {a[0]} batches replayed as one GEMM of m = {a[0]} x {a[1]}"
        elif name == "linear":
            (x, sx), (w, sw) = pairs[0], pairs[1]
            m, k, n = _prod(x[:-1]), x[-1], w[0]
            note = None
            # x @ W.T: B is the weight read transposed, unless the weight itself is.
            layout = {"a_transposed": _transposed(x, sx), "b_transposed": not _transposed(w, sw)}
        elif name == "matmul":
            a, b = dims[0], dims[1]
            m, k, n = _prod(a[:-1]), a[-1], b[-1]
            note = f"matmul {list(a)} @ {list(b)} replayed as a 2-D GEMM" if len(a) > 2 else None
        else:
            return None
    except (IndexError, TypeError):
        return None
    types = [t for t in op.types if t]
    dtype, _, dtype_note = maestro_dtype(types[0]) if types else ("fp32", 4, None)
    if dtype not in ("fp32", "fp16", "bf16", "fp64") or min(m, n, k) < 1:
        return None
    return Gemm(m=int(m), n=int(n), k=int(k), dtype=dtype, note=note or dtype_note, **layout)


def dtype_bytes(name: str) -> int:
    """Element size of a maestro dtype."""
    return DTYPES[name].size_bytes
