"""Scenarios of synthetic traces for the importer's tests: one function per kind of job, each
returning one rank's :class:`TraceBuilder` (times in µs from the step's start)."""

from __future__ import annotations

from .replay_traces import TraceBuilder, group


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
