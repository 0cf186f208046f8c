"""Collectives: each states S (``size``, as nccl-tests defines it: all_gather's output,
reduce_scatter's input, all_to_all's and send_recv's bytes sent per rank, else the buffer), its
buffers, data, launch, nccl-tests' bus factor (busbw = algbw x factor) and its --max-size cap."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import RunError
from .base import Block, Param, TracedCall
from .data import check_values, count_wrong, exact_reduction, fill_random, fill_zero_sum
from .dtypes import DTYPE_SIZES_BYTES

SIZE = Param(name="size", kind="size", doc="message size S in bytes, as nccl-tests defines it")
REDUCE_OP = Param(
    name="reduce_op",
    kind="str",
    default="sum",
    choices=("sum", "avg", "max", "min", "prod"),
    doc="reduction operator (avg needs NCCL)",
)
ROOT = Param(
    name="root",
    kind="int",
    default=0,
    minimum=0,
    doc="root as an index into the team (0 = the team's first rank)",
)
IN_PLACE = Param(
    name="in_place",
    kind="bool",
    default=False,
    doc="use NCCL's in-place layout (the rank's chunk of the larger buffer)",
)


class Collective(Block):
    """Shared rules of every collective: S, element divisibility, and the team's group."""

    category = "comm"
    params = (SIZE,)
    divide_by_team = False  # S must split into team_size equal chunks of whole elements

    @classmethod
    def idle_reason(cls, params: Mapping[str, Any], *, team_size: int, backend: str) -> str | None:
        in_place = params.get("in_place", False)
        copies = issubclass(cls, _OutOfPlace) and not in_place  # a 1-rank call copies its input
        if backend != "nccl" or team_size != 1 or copies:
            return None
        layout = " in place" if in_place else ""
        return (
            f"a 1-rank NCCL {cls.op}{layout} launches no device work, so there is nothing "
            "to time; it needs a team of 2 or more ranks"
        )

    @classmethod
    def check_params(
        cls, params: Mapping[str, Any], *, dtype: str, team_size: int
    ) -> list[tuple[str, str]]:
        size, elem = params["size"], DTYPE_SIZES_BYTES[dtype]
        problems: dict[str, str] = {}
        if cls.divide_by_team and size % (team_size * elem):
            problems["size"] = (
                f"{cls.op} needs a size divisible by team size x element size ({team_size} x "
                f"{elem} = {team_size * elem} bytes for {dtype}), got {size} bytes"
            )
        elif size % elem:
            problems["size"] = (
                f"size must be a whole number of {dtype} elements ({elem} bytes each), got "
                f"{size} bytes"
            )
        if params.get("root", 0) >= team_size:
            problems["root"] = (
                "root is an index into the team and must be below the team size "
                f"{team_size}, got {params['root']}"
            )
        return list(problems.items())

    @classmethod
    def message_size_bytes(cls, params: Mapping[str, Any]) -> int:
        return int(params["size"])

    @classmethod
    def bus_factor(cls, team_size: int) -> float:
        """1: the root's (or the ring neighbour's) S bytes cross one link."""
        return 1.0

    @classmethod
    def traced_elems(cls, call: TracedCall) -> int:
        """Elements of S in a traced call of this collective (its size rule)."""
        return max(call.in_elems, 0)

    @classmethod
    def traced_params(cls, call: TracedCall) -> tuple[dict[str, Any], str | None]:
        params: dict[str, Any] = {"size": cls.traced_elems(call) * call.elem_bytes}
        if any(p.name == "root" for p in cls.params) and 0 < call.root < call.team_size:
            params["root"] = call.root
        return params, None

    @classmethod
    def capped_params(
        cls, params: Mapping[str, Any], *, max_size_bytes: int, dtype: str, team_size: int
    ) -> dict[str, Any]:
        """S capped at ``max_size_bytes``, rounded down to whole elements (or chunks)."""
        if int(params["size"]) <= max_size_bytes:
            return dict(params)
        divide = cls.divide_by_team
        unit = DTYPE_SIZES_BYTES[dtype] * (team_size if divide else 1)
        if max_size_bytes < unit:
            raise ValueError(
                f"its smallest valid size is {unit} bytes "
                f"({'team size x ' if divide else ''}{dtype} element size); "
                f"use --max-size {unit} or more"
            )
        return {**params, "size": max_size_bytes // unit * unit}

    @classmethod
    def buffer_bytes(cls, params: Mapping[str, Any], *, dtype: str, team_size: int) -> int:
        return int(params["size"])

    def numel(self) -> int:
        return self.spec.params["size"] // self.spec.dtype_size_bytes

    def reduce_op(self) -> Any:
        """torch's ReduceOp of ``reduce_op``; avg exists only on NCCL."""
        import torch.distributed as dist

        name = self.spec.params.get("reduce_op", "sum")
        if name == "avg" and self.ctx.backend != "nccl":
            raise RunError(
                f"reduction 'avg' needs the NCCL backend, this run uses {self.ctx.backend}"
            )
        return getattr(dist.ReduceOp, "PRODUCT" if name == "prod" else name.upper())


class _InPlace(Collective):
    """One S-byte buffer, reduced or broadcast in place (torch's API)."""

    def setup(self) -> None:
        self.buf = self.ctx.empty(self.numel())
        if "reduce_op" in self.spec.params:
            # Repeated in-place reductions must stay finite: the team's values cancel exactly.
            fill_zero_sum(self.buf, self.ctx, self.spec.params["reduce_op"])
        else:
            fill_random(self.buf, self.ctx)

    def prepare_check(self) -> None:
        self.buf.copy_(check_values(self.ctx.team_rank, self.numel(), self.buf))

    def verify(self) -> int:
        op, n = self.spec.params["reduce_op"], self.ctx.team_size
        return count_wrong(self.buf, exact_reduction(op, n, self.numel(), self.buf), op, n)


class _OutOfPlace(Collective):
    """An input and an output buffer, S bytes each unless a subclass says otherwise."""

    @classmethod
    def buffer_bytes(cls, params: Mapping[str, Any], *, dtype: str, team_size: int) -> int:
        return 2 * int(params["size"])

    def setup(self) -> None:
        self.inp, self.out = self.ctx.empty(self.numel()), self.ctx.empty(self.numel())
        fill_random(self.inp, self.ctx)
        fill_random(self.out, self.ctx)

    def prepare_check(self) -> None:
        self.out.zero_()
        self.inp.copy_(check_values(self.ctx.team_rank, self.inp.numel(), self.inp))


class AllReduce(_InPlace):
    """In-place all_reduce of an S-byte buffer (torch's API is in place)."""

    op = "all_reduce"
    params = (SIZE, REDUCE_OP)
    trace_names = ("allreduce", "all_reduce", "allreduce_coalesced", "barrier")

    @classmethod
    def traced_elems(cls, call: TracedCall) -> int:
        return max(call.in_elems, 1)  # a barrier reduces one element

    @classmethod
    def bus_factor(cls, team_size: int) -> float:
        """2(n-1)/n: each rank sends and receives (n-1)/n of S twice (reduce-scatter, gather)."""
        return 2 * (team_size - 1) / team_size

    def launch(self) -> None:
        import torch.distributed as dist

        dist.all_reduce(self.buf, op=self.reduce_op(), group=self.ctx.group)


class _Chunked(_OutOfPlace):
    """S split into one chunk per rank; in place the chunk is part of the S-byte buffer."""

    divide_by_team = True

    @classmethod
    def bus_factor(cls, team_size: int) -> float:
        """(n-1)/n: each rank receives the n-1 chunks it does not hold."""
        return (team_size - 1) / team_size

    @classmethod
    def buffer_bytes(cls, params: Mapping[str, Any], *, dtype: str, team_size: int) -> int:
        size = int(params["size"])
        return size if params.get("in_place") else size + size // team_size

    def own_chunk(self, buf: Any) -> Any:
        """This rank's chunk of ``buf``, split into one chunk per team rank."""
        chunk = buf.numel() // self.ctx.team_size
        return buf[self.ctx.team_rank * chunk : (self.ctx.team_rank + 1) * chunk]


class AllGather(_Chunked):
    """all_gather_into_tensor: each rank contributes S / team_size bytes."""

    op = "all_gather"
    params = (SIZE, IN_PLACE)
    trace_names = ("_allgather_base", "allgather", "all_gather", "allgather_coalesced",
                   "allgather_into_tensor_coalesced", "all_gather_into_tensor")  # fmt: skip

    @classmethod
    def traced_elems(cls, call: TracedCall) -> int:
        return max(call.out_elems, call.in_elems * call.team_size, 0)  # S: the gathered output

    def setup(self) -> None:
        self.out = self.ctx.empty(self.numel())
        chunk = self.numel() // self.ctx.team_size
        self.inp = (
            self.own_chunk(self.out) if self.spec.params["in_place"] else self.ctx.empty(chunk)
        )
        fill_random(self.out, self.ctx)
        fill_random(self.inp, self.ctx)

    def launch(self) -> None:
        import torch.distributed as dist

        # torch >= 2.13 renamed all_gather_into_tensor; use whichever this torch has.
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(self.out, self.inp, group=self.ctx.group)

    def verify(self) -> int:
        import torch

        chunk = self.inp.numel()
        expected = torch.cat([check_values(t, chunk, self.out) for t in range(self.ctx.team_size)])
        return count_wrong(self.out, expected, "copy", self.ctx.team_size)


class ReduceScatter(_Chunked):
    """reduce_scatter_tensor: an S-byte input, each rank keeps S / team_size bytes."""

    op = "reduce_scatter"
    params = (SIZE, REDUCE_OP, IN_PLACE)
    trace_names = ("_reduce_scatter_base", "reduce_scatter", "reduce_scatter_tensor",
                   "reduce_scatter_tensor_coalesced")  # fmt: skip

    @classmethod
    def traced_elems(cls, call: TracedCall) -> int:
        return max(call.in_elems, call.out_elems * call.team_size, 0)  # S: the input

    def setup(self) -> None:
        self.inp = self.ctx.empty(self.numel())
        if self.spec.params["in_place"]:
            self.out = self.own_chunk(self.inp)
            # In place, the output chunk is summed into again each time: keep it bounded.
            fill_zero_sum(self.inp, self.ctx, self.spec.params["reduce_op"])
        else:
            self.out = self.ctx.empty(self.numel() // self.ctx.team_size)
            fill_random(self.inp, self.ctx)
            fill_random(self.out, self.ctx)

    def launch(self) -> None:
        import torch.distributed as dist

        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        scatter(self.out, self.inp, op=self.reduce_op(), group=self.ctx.group)

    def verify(self) -> int:
        op, n = self.spec.params["reduce_op"], self.ctx.team_size
        full = exact_reduction(op, n, self.inp.numel(), self.out)
        return count_wrong(self.out, self.own_chunk(full), op, n)


class AllToAll(_Chunked):
    """all_to_all_single: each rank sends S bytes, S / team_size to each peer."""

    op = "all_to_all"
    trace_names = ("all_to_all", "all_to_allv", "alltoall", "alltoall_base")

    @classmethod
    def traced_elems(cls, call: TracedCall) -> int:
        """Whole equal chunks, one per peer, of the elements the rank sends."""
        return max(call.in_elems // call.team_size, 1) * call.team_size

    @classmethod
    def traced_params(cls, call: TracedCall) -> tuple[dict[str, Any], str | None]:
        params, _ = super().traced_params(call)
        elems, splits = cls.traced_elems(call), call.splits
        if (not splits or len(set(splits)) == 1) and elems == call.in_elems:
            return params, None
        shown = list(splits) if len(splits) <= 8 else [*splits[:8], "..."]
        return params, (
            f"uneven all_to_all split sizes {shown} (along dim 0; {call.in_elems} elements in "
            f"all) replayed as {call.team_size} equal chunks of {elems // call.team_size} elements"
        )

    @classmethod
    def buffer_bytes(cls, params: Mapping[str, Any], *, dtype: str, team_size: int) -> int:
        return 2 * int(params["size"])  # S sent, S received

    def launch(self) -> None:
        import torch.distributed as dist

        dist.all_to_all_single(self.out, self.inp, group=self.ctx.group)

    def verify(self) -> int:
        import torch

        n = self.ctx.team_size
        # Chunk j of my output is my chunk of team rank j's input.
        expected = [self.own_chunk(check_values(j, self.numel(), self.out)) for j in range(n)]
        return count_wrong(self.out, torch.cat(expected), "copy", n)


class Broadcast(_InPlace):
    """broadcast of an S-byte buffer from the team's ``root``."""

    op = "broadcast"
    params = (SIZE, ROOT)
    trace_names = ("broadcast", "_broadcast_oop")

    def launch(self) -> None:
        import torch.distributed as dist

        dist.broadcast(self.buf, src=self.ctx.team[self.spec.params["root"]], group=self.ctx.group)

    def verify(self) -> int:
        expected = check_values(self.spec.params["root"], self.numel(), self.buf)
        return count_wrong(self.buf, expected, "copy", self.ctx.team_size)


class Reduce(_InPlace):
    """reduce of an S-byte buffer into the team's ``root`` (in place, torch's API)."""

    op = "reduce"
    params = (SIZE, REDUCE_OP, ROOT)
    trace_names = ("reduce", "_reduce_oop")

    def launch(self) -> None:
        import torch.distributed as dist

        dist.reduce(
            self.buf,
            dst=self.ctx.team[self.spec.params["root"]],
            op=self.reduce_op(),
            group=self.ctx.group,
        )

    def verify(self) -> int:
        # Only the root's buffer is defined after a reduce.
        return super().verify() if self.ctx.team_rank == self.spec.params["root"] else 0


class SendRecv(_OutOfPlace):
    """Ring shift inside each team: send S bytes to the next rank, receive from the previous."""

    op = "send_recv"
    min_team_size = 2
    trace_names = ("send", "recv", "recvAnysource")

    def setup(self) -> None:
        super().setup()
        n, me = self.ctx.team_size, self.ctx.team_rank
        self.next_rank = self.ctx.team[(me + 1) % n]
        self.prev_rank = self.ctx.team[(me - 1) % n]

    def launch(self) -> None:
        import torch.distributed as dist

        ops = [
            dist.P2POp(dist.isend, self.inp, self.next_rank, self.ctx.group),
            dist.P2POp(dist.irecv, self.out, self.prev_rank, self.ctx.group),
        ]
        # Waiting makes the lane depend on the transfer (on CUDA: a stream wait, not a host
        # block), so the lane's next block and the iteration fence cover it.
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    def verify(self) -> int:
        prev = (self.ctx.team_rank - 1) % self.ctx.team_size
        expected = check_values(prev, self.numel(), self.out)
        return count_wrong(self.out, expected, "copy", self.ctx.team_size)
