"""Traced calls in the terms blocks map from (``blocks.base.TracedCall``): each block class
says which traced names it replays and its size rule; here the trace's records become calls,
and a dtype maestro lacks gets one of the same element size. Pure functions."""

from __future__ import annotations

from ..blocks.base import TracedCall
from ..blocks.dtypes import traced_dtype
from .kineto import CommRecord, GemmOp

MARKER_NAMES = frozenset({"wait", "coalesced", "startCoalescing", "endCoalescing", ""})
"""Records that mark a point of a call and launch nothing of their own."""
_OTHER_SIZES = {"Short": 2, "short int": 2, "ComplexFloat": 8, "ComplexDouble": 16}


def maestro_dtype(torch_name: str) -> tuple[str, int, str | None]:
    """(maestro dtype, element bytes, note) for a traced dtype; a type maestro lacks gets one
    of the same element size (bytes stay exact) and a note saying so."""
    found = traced_dtype(torch_name)
    if found is not None:
        return found.name, found.size_bytes, None
    size = _OTHER_SIZES.get(torch_name.removeprefix("c10::"))
    if size is None and "Float8" in torch_name:
        size = 1
    if size is None:
        return (
            "uint8",
            1,
            f"dtype {torch_name!r} unknown: replayed as uint8, its byte count as traced",
        )
    stand_in = {1: "uint8", 2: "bf16", 4: "fp32"}.get(size, "fp64")
    return stand_in, size, f"dtype {torch_name} replayed as {stand_in} (its bytes as traced)"


def comm_call(rec: CommRecord, team_size: int) -> TracedCall:
    """A ``record_param_comms`` record as a call (element counts in the dtype's elements)."""
    dtype, elem, _ = maestro_dtype(rec.dtype)
    root = rec.peer if rec.peer is not None and 0 <= rec.peer < team_size else 0
    return TracedCall(
        name=rec.name,
        dtype=dtype,
        elem_bytes=elem,
        in_elems=max(rec.in_nelems, 0),
        out_elems=max(rec.out_nelems, 0),
        team_size=team_size,
        root=root,
        splits=rec.in_splits,
    )


def gemm_call(op: GemmOp, kernels: tuple[str, ...]) -> tuple[TracedCall, str | None]:
    """A GEMM op as a call, and a note when its dtype is replayed as another."""
    types = [t for t in op.types if t]
    dtype, _, note = maestro_dtype(types[0]) if types else ("fp32", 4, None)
    call = TracedCall(name=op.name, dtype=dtype, dims=op.dims, strides=op.strides, kernels=kernels)
    return call, note
