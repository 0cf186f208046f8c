"""Synthetic torch.profiler (Kineto) traces for the importer's tests, built event by event with
the fields Kineto writes (as in real H200 traces): CPU ops with External ids, runtime launches
with correlation ids, kernels on streams, record_param_comms, cuda_sync events."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAIN_TID = 100
GROUPS = {"0": ("default_pg", None)}


@dataclass
class TraceBuilder:
    """One rank's trace; times in µs from the step's start."""

    rank: int
    world_size: int
    groups: list[dict[str, Any]] = field(default_factory=list)
    sync_events: bool = True
    record_shapes: bool = True
    base_ts: float = 1_000_000.0
    events: list[dict[str, Any]] = field(default_factory=list)
    next_ext: int = 1
    next_corr: int = 1000
    distributed: bool = True

    def __post_init__(self) -> None:
        if not self.groups:
            self.groups = [group("0", "default_pg", list(range(self.world_size)))]

    # ---- low level ----
    def _ext(self) -> int:
        self.next_ext += 1
        return self.next_ext

    def _corr(self) -> int:
        self.next_corr += 1
        return self.next_corr

    def _x(self, cat: str, name: str, ts: float, dur: float, tid: Any, args: dict, pid=1):
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": self.base_ts + ts,
                "dur": dur,
                "args": args,
            }
        )

    def step(self, number: int, start: float, end: float) -> None:
        self._x("user_annotation", f"ProfilerStep#{number}", start, end - start, MAIN_TID, {})

    def annotate(self, name: str, start: float, end: float, tid: int = MAIN_TID) -> None:
        self._x("user_annotation", name, start, end - start, tid, {"External id": self._ext()})

    def launch(
        self,
        *,
        stream: int,
        launch: float,
        start: float,
        dur: float,
        kernel: str = "void elementwise_kernel<float>()",
        op: str | None = "aten::add",
        op_args: dict | None = None,
        ext: int | None = None,
        tid: int = MAIN_TID,
        cat: str = "kernel",
        with_activity: bool = True,
    ) -> int:
        """A CPU op launching one device activity; returns the op's External id."""
        if ext is None:
            ext = self._ext()
            if op is not None:
                args = {"External id": ext, **(op_args or {})}
                self._x("cpu_op", op, launch - 1, 8, tid, args)
        corr = self._corr()
        self._x(
            "cuda_runtime",
            "cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync",
            launch,
            4,
            tid,
            {"External id": ext, "cbid": 211, "correlation": corr},
        )
        if with_activity:
            self._x(cat, kernel, start, dur, stream, {"stream": stream, "correlation": corr}, 0)
        return ext

    def gemm(
        self,
        *,
        stream: int,
        launch: float,
        start: float,
        dur: float,
        m: int,
        n: int,
        k: int,
        op: str = "aten::mm",
        dtype: str = "c10::BFloat16",
    ) -> int:
        dims = [[m, k], [k, n]] if op == "aten::mm" else [[n], [m, k], [k, n], [], []]
        types = [dtype, dtype] if op == "aten::mm" else [dtype, dtype, dtype, "Scalar", "Scalar"]
        args = {"Input Dims": dims, "Input type": types} if self.record_shapes else {}
        return self.launch(
            stream=stream,
            launch=launch,
            start=start,
            dur=dur,
            op=op,
            op_args=args,
            kernel="nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
        )

    def collective(
        self,
        *,
        stream: int,
        launch: float,
        start: float,
        dur: float,
        name: str = "allreduce",
        in_nelems: int,
        out_nelems: int | None = None,
        dtype: str = "BFloat16",
        group_name: str = "0",
        peer: int | None = None,
        in_splits: list[int] | None = None,
        kernel: str | None = None,
        launches_kernel: bool = True,
        tid: int = MAIN_TID,
    ) -> int:
        """A record_param_comms call (and its NCCL kernel when ``launches_kernel``)."""
        g = next(g for g in self.groups if g["pg_name"] == group_name)
        ext = self._ext()
        self._x(
            "cpu_op",
            "record_param_comms",
            launch - 2,
            20,
            tid,
            {
                "External id": ext,
                "Collective name": name,
                "Process Group Description": g["pg_desc"],
                "Process Group Name": group_name,
                "Process Group Ranks": str(g["ranks"]),
                "Group size": len(g["ranks"]),
                "dtype": dtype,
                "In msg nelems": in_nelems,
                "Out msg nelems": in_nelems if out_nelems is None else out_nelems,
                "Rank": g["ranks"].index(self.rank) if peer is None else peer,
                "In split size": str(in_splits or []),
                "Out split size": "[]",
            },
        )
        if launches_kernel:
            self.launch(
                stream=stream,
                launch=launch,
                start=start,
                dur=dur,
                ext=ext,
                op=None,
                tid=tid,
                kernel=kernel or f"ncclDevKernel_{name}_RING(ncclDevKernelArgsStorage<4096ul>)",
            )
        return ext

    def nccl_kernel(self, *, stream: int, launch: float, start: float, dur: float) -> None:
        """An NCCL kernel launched for earlier records without kernels (batched p2p)."""
        self.launch(
            stream=stream,
            launch=launch,
            start=start,
            dur=dur,
            ext=self._ext(),
            op=None,
            kernel="ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
        )

    def record(self, ts: float, tid: int = MAIN_TID) -> None:
        self._x(
            "cuda_runtime",
            "cudaEventRecord",
            ts,
            1,
            tid,
            {"cbid": 135, "correlation": self._corr()},
        )

    def wait(self, stream: int, ts: float, event_id: int = 7, tid: int = MAIN_TID) -> None:
        """cudaStreamWaitEvent(stream, event): the sync event only with ``sync_events``."""
        corr = self._corr()
        self._x(
            "cuda_runtime", "cudaStreamWaitEvent", ts, 1, tid, {"cbid": 147, "correlation": corr}
        )
        if self.sync_events:
            self._x(
                "cuda_sync",
                "Stream Wait Event",
                ts + 0.1,
                0.5,
                stream,
                {
                    "External id": corr,
                    "cuda_sync_kind": "Stream Wait Event",
                    "wait_on_stream": -1,
                    "wait_on_cuda_event_record_corr_id": -1,
                    "wait_on_cuda_event_id": event_id,
                    "stream": stream,
                    "correlation": corr,
                    "device": 0,
                    "context": 1,
                },
                0,
            )

    def host_sync(self, ts: float, dur: float, tid: int = MAIN_TID) -> None:
        self._x(
            "cuda_runtime",
            "cudaStreamSynchronize",
            ts,
            dur,
            tid,
            {"cbid": 131, "correlation": self._corr()},
        )

    # ---- output ----
    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
            "record_shapes": 1 if self.record_shapes else 0,
        }
        if self.distributed:
            doc["distributedInfo"] = {
                "backend": "nccl",
                "rank": self.rank,
                "world_size": self.world_size,
                "pg_count": len(self.groups),
                "pg_config": [g for g in self.groups if self.rank in g["ranks"]],
                "nccl_version": "2.28.9",
            }
        doc["baseTimeNanoseconds"] = 1790857026000000000
        doc["traceEvents"] = self.events + [
            {
                "name": "process_name",
                "ph": "M",
                "ts": self.base_ts,
                "pid": 1,
                "tid": 0,
                "args": {"name": "python3"},
            },
            {
                "ph": "f",
                "id": 1,
                "pid": 1,
                "tid": MAIN_TID,
                "ts": self.base_ts,
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            },
        ]
        doc["traceName"] = f"rank{self.rank}.json"
        return doc

    def write(self, folder: Path, *, gz: bool = True) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}.json{'.gz' if gz else ''}"
        text = json.dumps(self.document(), indent=1)
        if gz:
            with gzip.open(path, "wt", encoding="utf-8") as handle:
                handle.write(text)
        else:
            path.write_text(text, encoding="utf-8")
        return path


def group(name: str, desc: str, ranks: list[int]) -> dict[str, Any]:
    return {
        "pg_name": name,
        "pg_desc": desc,
        "backend_config": "cuda:nccl",
        "pg_size": len(ranks),
        "ranks": ranks,
    }


def write_all(builders: list[TraceBuilder], folder: Path, *, gz: bool = True) -> Path:
    for b in builders:
        b.write(folder, gz=gz)
    return folder


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------
def ddp_rank(
    rank: int, world: int = 2, *, sync: bool = True, shapes: bool = True, skew_us: float = 0.0
) -> TraceBuilder:
    """A DDP-like step: two GEMMs and an elementwise kernel on stream 7, the gradient bucket's
    all_reduce on stream 20 waiting for the backward GEMM, the optimizer after it."""
    b = TraceBuilder(rank=rank, world_size=world, sync_events=sync, record_shapes=shapes)
    t = skew_us
    b.step(5, t, t + 3000)
    b.gemm(stream=7, launch=t + 10, start=t + 20, dur=400, m=1024, n=2048, k=512)
    b.launch(stream=7, launch=t + 20, start=t + 421, dur=30, op="aten::gelu")
    b.launch(stream=7, launch=t + 25, start=t + 452, dur=10, op="aten::mul")
    b.gemm(stream=7, launch=t + 30, start=t + 463, dur=500, m=2048, n=512, k=1024, op="aten::addmm")
    b.record(t + 40)
    b.wait(20, t + 41)
    b.annotate("DDP::bucket (0)", t + 42, t + 60)
    b.collective(stream=20, launch=t + 45, start=t + 964, dur=800, in_nelems=4 * 1024 * 1024)
    b.record(t + 70)
    b.wait(7, t + 71)
    b.annotate("Optimizer.step#SGD.step", t + 72, t + 100)
    b.launch(stream=7, launch=t + 80, start=t + 1766, dur=50, op="aten::_foreach_add_")
    b.launch(stream=7, launch=t + 85, start=t + 1817, dur=40, op="aten::_foreach_add_")
    return b


def collectives_rank(rank: int, world: int = 4) -> TraceBuilder:
    """Every collective kind on the default group, one after another on stream 20."""
    b = TraceBuilder(rank=rank, world_size=world)
    b.step(2, 0, 5000)
    calls = [
        ("allreduce", 1024, 1024, None, None),
        ("_allgather_base", 256, 256 * world, None, None),
        ("_reduce_scatter_base", 1024, 1024 // world, None, None),
        ("all_to_allv", 1024, 1024, None, [256] * world),
        ("all_to_allv", 1000, 1000, None, [100, 300, 200, 400][:world]),
        ("broadcast", 512, 512, 1, None),
        ("reduce", 512, 512, 2 % world, None),
        ("barrier", 1, 1, None, None),
    ]
    t = 10.0
    for name, n_in, n_out, peer, splits in calls:
        b.collective(
            stream=20,
            launch=t,
            start=t + 100,
            dur=50,
            name=name,
            in_nelems=n_in,
            out_nelems=n_out,
            peer=peer,
            in_splits=splits,
            dtype="Float",
        )
        t += 200
    # Two records, one kernel: a coalesced all_gather.
    b.collective(
        stream=20,
        launch=t,
        start=0,
        dur=0,
        name="allgather_into_tensor_coalesced",
        in_nelems=128,
        out_nelems=128 * world,
        launches_kernel=False,
        dtype="Float",
    )
    b.collective(
        stream=20,
        launch=t + 5,
        start=0,
        dur=0,
        name="allgather_into_tensor_coalesced",
        in_nelems=64,
        out_nelems=64 * world,
        launches_kernel=False,
        dtype="Float",
    )
    b.launch(
        stream=20,
        launch=t + 10,
        start=t + 100,
        dur=40,
        op=None,
        ext=b._ext(),
        kernel="ncclDevKernel_AllGather_RING(ncclDevKernelArgsStorage<4096ul>)",
    )
    b.launch(stream=7, launch=t + 20, start=t + 30, dur=20, op="aten::zero_")
    return b


def mesh_rank(rank: int, shape: tuple[int, int] = (2, 2)) -> TraceBuilder:
    """A dp x tp DeviceMesh (tp innermost): a tp all_reduce and a dp all_gather per rank."""
    dp, tp = shape
    world = dp * tp
    groups = [group("0", "default_pg", list(range(world)))]
    for i in range(dp):  # tp teams: consecutive ranks
        groups.append(group(f"tp{i}", "mesh_tp", list(range(i * tp, (i + 1) * tp))))
    for j in range(tp):  # dp teams: stride tp
        groups.append(group(f"dp{j}", "mesh_dp", list(range(j, world, tp))))
    groups.append(group("ep", "expert_group", [r for r in range(world) if r % 2 == 0]))
    b = TraceBuilder(rank=rank, world_size=world, groups=groups)
    b.step(1, 0, 2000)
    tp_group = f"tp{rank // tp}"
    dp_group = f"dp{rank % tp}"
    b.collective(stream=24, launch=10, start=50, dur=100, in_nelems=4096, group_name=tp_group)
    b.collective(
        stream=21,
        launch=20,
        start=60,
        dur=200,
        name="_allgather_base",
        in_nelems=1024,
        out_nelems=1024 * dp,
        group_name=dp_group,
    )
    if rank % 2 == 0:
        b.collective(stream=26, launch=30, start=70, dur=80, in_nelems=512, group_name="ep")
    return b


def pipeline_rank(rank: int) -> TraceBuilder:
    """Two pipeline stages, one microbatch: stage 0 computes and sends activations to stage
    1; stage 1 receives, computes, and sends gradients back; stage 0 receives them."""
    b = TraceBuilder(rank=rank, world_size=2)
    b.step(4, 0, 4000)
    act = 1024 * 1024
    if rank == 0:
        b.gemm(stream=7, launch=10, start=20, dur=300, m=512, n=512, k=512)
        b.record(15)
        b.wait(30, 16)
        b.collective(stream=30, launch=20, start=321, dur=100, name="send", in_nelems=act, peer=1)
        b.collective(stream=30, launch=30, start=900, dur=100, name="recv", in_nelems=act, peer=1)
        b.record(40)
        b.wait(7, 41)
        b.gemm(stream=7, launch=50, start=1001, dur=300, m=512, n=512, k=1024)
    else:
        b.collective(stream=31, launch=10, start=321, dur=100, name="recv", in_nelems=act, peer=0)
        b.record(15)
        b.wait(7, 16)
        b.gemm(stream=7, launch=20, start=422, dur=400, m=512, n=1024, k=512)
        b.record(25)
        b.wait(31, 26)
        b.collective(stream=31, launch=30, start=900, dur=100, name="send", in_nelems=act, peer=0)
    return b


def ring_rank(rank: int, world: int = 4) -> TraceBuilder:
    """A ring shift (context parallel): each rank sends to the next and receives from the
    previous in one batched NCCL kernel, while computing on stream 7."""
    b = TraceBuilder(rank=rank, world_size=world)
    b.step(1, 0, 2000)
    nbytes = 65536
    b.collective(
        stream=40,
        launch=10,
        start=0,
        dur=0,
        name="send",
        in_nelems=nbytes,
        peer=(rank + 1) % world,
        launches_kernel=False,
    )
    b.collective(
        stream=40,
        launch=12,
        start=0,
        dur=0,
        name="recv",
        in_nelems=nbytes,
        peer=(rank - 1) % world,
        launches_kernel=False,
    )
    b.nccl_kernel(stream=40, launch=14, start=30, dur=200)
    b.gemm(stream=7, launch=20, start=40, dur=150, m=256, n=256, k=256)
    return b


def two_stream_rank(rank: int) -> TraceBuilder:
    """FSDP's pattern: all_gather and reduce_scatter of one group on two NCCL streams."""
    b = TraceBuilder(rank=rank, world_size=2)
    b.step(3, 0, 3000)
    b.collective(
        stream=21,
        launch=10,
        start=20,
        dur=500,
        name="_allgather_base",
        in_nelems=2048,
        out_nelems=4096,
    )
    b.collective(
        stream=25,
        launch=20,
        start=30,
        dur=400,
        name="_reduce_scatter_base",
        in_nelems=4096,
        out_nelems=2048,
    )
    b.collective(
        stream=21,
        launch=30,
        start=521,
        dur=500,
        name="_allgather_base",
        in_nelems=2048,
        out_nelems=4096,
    )
    b.gemm(stream=7, launch=40, start=50, dur=600, m=128, n=128, k=128)
    return b


def compute_rank() -> TraceBuilder:
    """A one-rank compute-only step, without torch.distributed (no distributedInfo)."""
    b = TraceBuilder(rank=0, world_size=1, distributed=False)
    b.step(3, 0, 2000)
    b.launch(stream=7, launch=5, start=10, dur=30, op="aten::native_layer_norm")
    b.gemm(stream=7, launch=10, start=41, dur=300, m=4096, n=4096, k=1024, op="aten::addmm")
    b.launch(stream=7, launch=15, start=342, dur=80, op="aten::gelu")
    b.gemm(stream=7, launch=20, start=423, dur=280, m=4096, n=1024, k=4096)
    b.launch(stream=7, launch=900, start=910, dur=60, op="aten::_foreach_add_")
    return b


def batched_ring_rank(rank: int, world: int = 4) -> TraceBuilder:
    """The ring shift of :func:`ring_rank` as torch may record it: the batch's NCCL kernel
    launched under its last record (the recv), the send's record without a kernel."""
    b = TraceBuilder(rank=rank, world_size=world)
    b.step(1, 0, 2000)
    nbytes = 65536
    b.collective(
        stream=40,
        launch=10,
        start=0,
        dur=0,
        name="send",
        in_nelems=nbytes,
        peer=(rank + 1) % world,
        launches_kernel=False,
    )
    b.collective(
        stream=40,
        launch=12,
        start=30,
        dur=200,
        name="recv",
        in_nelems=nbytes,
        peer=(rank - 1) % world,
        kernel="ncclDevKernel_SendRecv(ncclDevKernelArgs)",
    )
    b.gemm(stream=7, launch=20, start=40, dur=150, m=256, n=256, k=256)
    return b


def pp_dp_rank(rank: int) -> TraceBuilder:
    """A 2-stage pipeline replicated twice (mesh pp 2 x dp 2): stage 0 (ranks 0, 1) computes
    and sends to its stage-1 peer (ranks 2, 3); each stage all_reduces over its dp team."""
    groups = [
        group("0", "default_pg", [0, 1, 2, 3]),
        group("pp0", "mesh_pp", [0, 2]),
        group("pp1", "mesh_pp", [1, 3]),
        group("dp0", "mesh_dp", [0, 1]),
        group("dp1", "mesh_dp", [2, 3]),
    ]
    b = TraceBuilder(rank=rank, world_size=4, groups=groups)
    b.step(2, 0, 3000)
    pp, dp = f"pp{rank % 2}", f"dp{rank // 2}"
    if rank < 2:
        b.gemm(stream=7, launch=10, start=20, dur=300, m=512, n=512, k=512)
        b.collective(
            stream=30,
            launch=20,
            start=321,
            dur=100,
            name="send",
            in_nelems=4096,
            peer=1,
            group_name=pp,
        )
        b.collective(stream=20, launch=30, start=430, dur=200, in_nelems=8192, group_name=dp)
    else:
        b.collective(
            stream=30,
            launch=10,
            start=321,
            dur=100,
            name="recv",
            in_nelems=4096,
            peer=0,
            group_name=pp,
        )
        b.gemm(stream=7, launch=20, start=422, dur=400, m=512, n=1024, k=512)
        b.collective(stream=20, launch=30, start=830, dur=200, in_nelems=8192, group_name=dp)
    return b
