"""The importer on synthetic traces: every collective kind, meshes, sync and no-sync
dependencies, point-to-point (pipeline stages, rings), one group on two streams, traces
without shapes, step choice, idle gaps, and files that are not one run's step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from userbenchmark.maestro.blocks.base import TracedCall
from userbenchmark.maestro.blocks.compute import Gemm
from userbenchmark.maestro.core.config.loader import load_suite_text
from userbenchmark.maestro.core.replay.emit import render
from userbenchmark.maestro.core.replay.importer import ImportOptions, import_traces
from userbenchmark.maestro.core.replay.kineto import TraceError

from .replay_scenarios import (
    batched_ring_rank,
    collectives_rank,
    compute_rank,
    ddp_rank,
    mesh_rank,
    pipeline_rank,
    pp_dp_rank,
    ring_rank,
    two_stream_rank,
)
from .replay_traces import TraceBuilder, group, write_all


def imported(folder: Path, builders: list[TraceBuilder], **options):
    write_all(builders, folder)
    imp = import_traces([str(folder)], ImportOptions(**options))
    text = render(imp, name=folder.name, command="python -m userbenchmark.maestro import-trace")
    return imp, text, yaml.safe_load(text)


def blocks_of(data: dict) -> list[dict]:
    return data["patterns"][0]["blocks"]


def by_op(data: dict, op: str) -> list[dict]:
    return [b for b in blocks_of(data) if b["op"] == op]


def check_structure(data: dict) -> None:
    """What every imported file must hold, whatever the loader knows."""
    blocks = blocks_of(data)
    names = [b["name"] for b in blocks]
    assert len(names) == len(set(names))
    seen: set[str] = set()
    lanes: dict[str, set[str]] = {}
    for block in blocks:
        for dep in block.get("after", []):
            assert dep in seen, f"{block['name']} waits for {dep}, which comes later"
        seen.add(block["name"])
        assert block["traced_us"] >= 0
        if block["op"] in ("busy", "sleep"):
            assert block["duration_us"] >= 0
        if block["op"] not in ("busy", "sleep", "gemm"):
            axis = block.get("axis", "world")
            lanes.setdefault(axis, set()).add(block.get("lane", axis))
    assert all(len(v) == 1 for v in lanes.values()), f"one communicator on two lanes: {lanes}"
    pattern = data["patterns"][0]
    assert pattern["traced_us"] > 0
    assert len(pattern["traced_by_rank_us"]) == data["world_size"]
    assert max(pattern["traced_by_rank_us"]) == pattern["traced_us"]
    load_suite_text(yaml.safe_dump(data))


# ---------------------------------------------------------------------------------------------
# What a step becomes
# ---------------------------------------------------------------------------------------------
def test_ddp_step_with_sync_events(tmp_path):
    imp, text, data = imported(tmp_path / "ddp", [ddp_rank(0), ddp_rank(1, skew_us=5)])
    check_structure(data)
    assert data["world_size"] == 2 and data["defaults"]["dtype"] == "bf16"
    ops = [(b["name"], b["op"]) for b in blocks_of(data)]
    assert ops == [
        ("gemm", "gemm"),
        ("gelu", "busy"),
        ("gemm_2", "gemm"),
        ("ddp_bucket_0", "all_reduce"),
        ("optimizer_step_sgd_step_foreach_add", "busy"),
    ]
    gemm, gelu, gemm2, ar, opt = blocks_of(data)
    assert (gemm["m"], gemm["n"], gemm["k"]) == (1024, 2048, 512)
    assert (gemm2["m"], gemm2["n"], gemm2["k"]) == (2048, 512, 1024)
    assert gelu["duration_us"] == 41.0  # gelu and mul merged, the 1 µs gap between them kept
    assert ar["size"] == 4 * 1024 * 1024 * 2 and "axis" not in ar  # S in bytes, on world
    assert ar["after"] == ["gemm_2"] and opt["after"] == ["ddp_bucket_0"]
    assert {b["lane"] for b in (gemm, gelu, gemm2, opt)} == {"compute"}
    assert "from the traces' cuda_sync events" in text
    assert data["patterns"][0]["traced_us"] == 1837.0


def test_ddp_step_without_sync_events_infers_the_same_waits(tmp_path):
    _, text, data = imported(tmp_path / "ddp", [ddp_rank(r, sync=False) for r in range(2)])
    check_structure(data)
    deps = {b["name"]: b.get("after") for b in blocks_of(data) if b.get("after")}
    assert deps == {
        "ddp_bucket_0": ["gemm_2"],
        "optimizer_step_sgd_step_foreach_add": ["ddp_bucket_0"],
    }
    assert "inferred from the device timeline" in text


def test_every_collective_kind(tmp_path):
    _, text, data = imported(tmp_path / "coll", [collectives_rank(r) for r in range(4)])
    check_structure(data)
    comm = [(b["op"], b["size"], b.get("root", 0)) for b in blocks_of(data) if "size" in b]
    assert comm == [
        ("all_reduce", 1024 * 4, 0),
        ("all_gather", 256 * 4 * 4, 0),  # S: the gathered output
        ("reduce_scatter", 1024 * 4, 0),  # S: the input
        ("all_to_all", 1024 * 4, 0),
        ("all_to_all", 1000 * 4, 0),  # uneven splits: 4 chunks of 250 elements
        ("broadcast", 512 * 4, 1),
        ("reduce", 512 * 4, 2),
        ("all_reduce", 4, 0),  # a barrier reduces one element
        ("all_gather", (128 + 64) * 4 * 4, 0),  # two coalesced records, one kernel
    ]
    assert "defaults" not in data  # fp32: the loader's default dtype
    assert "uneven all_to_all split sizes [100, 300, 200, 400]" in text
    uniform = [b for b in by_op(data, "all_to_all")][0]
    assert (
        "uneven"
        not in text.splitlines()[
            text.splitlines().index(
                next(line for line in text.splitlines() if f"name: {uniform['name']}," in line)
            )
        ]
    )


@pytest.mark.parametrize(
    ("shape", "mesh"), [((2, 2), {"dp": 2, "tp": 2}), ((2, 4), {"dp": 2, "tp": 4})]
)
def test_device_mesh_groups_become_a_mesh(tmp_path, shape, mesh):
    world = shape[0] * shape[1]
    _, _, data = imported(tmp_path / "mesh", [mesh_rank(r, shape) for r in range(world)])
    check_structure(data)
    assert data["mesh"] == mesh
    assert [b["axis"] for b in blocks_of(data)] == ["tp", "dp", "expert_group"]
    evens = [r for r in range(world) if r % 2 == 0]
    assert data["axes"]["expert_group"] == {"teams": [evens]}
    tp, dp, ep = blocks_of(data)
    assert (tp["size"], dp["size"], ep["size"]) == (8192, 1024 * 2 * shape[0], 1024)


def test_pipeline_stages_are_roles_with_axes_of_their_own(tmp_path):
    imp, text, data = imported(tmp_path / "pp", [pipeline_rank(r) for r in range(2)])
    check_structure(data)
    assert len(imp.roles) == 2
    assert data["axes"]["stage0"] == {"teams": [[0]]}
    assert data["axes"]["stage1"] == {"teams": [[1]]}
    names = [b["name"] for b in blocks_of(data) if b["op"] != "sleep"]
    assert names == ["gemm", "send_0_to_1", "gemm_2", "send_1_to_0", "gemm_3"]
    sends = by_op(data, "send_recv")
    assert all(b["size"] == 1024 * 1024 * 2 and "axis" not in b for b in sends)  # pair = world
    gemms = {b["name"]: b for b in by_op(data, "gemm")}
    assert gemms["gemm"]["axis"] == "stage0" and gemms["gemm_2"]["axis"] == "stage1"
    assert gemms["gemm_2"]["after"] == ["send_0_to_1"]  # stage 1 computes on what it received
    assert gemms["gemm_3"]["after"] == ["send_1_to_0"]
    assert "one-way sends 0->1 replayed as exchanges" in text
    assert "stage0: rank(s) 0" in text


@pytest.mark.parametrize("make", [ring_rank, batched_ring_rank], ids=["own-kernel", "last-record"])
def test_ring_shift_is_one_send_recv_on_the_ring(tmp_path, make):
    imp, text, data = imported(tmp_path / "ring", [make(r) for r in range(4)])
    check_structure(data)
    assert len(imp.roles) == 1
    (p2p,) = by_op(data, "send_recv")
    assert p2p["size"] == 65536 * 2 and "axis" not in p2p  # world's team is the ring 0-1-2-3
    assert "one-way" not in text


def test_one_group_on_two_streams_gets_a_like_axis(tmp_path):
    _, text, data = imported(tmp_path / "fsdp", [two_stream_rank(r) for r in range(2)])
    check_structure(data)
    assert data["axes"] == {"world_rs": {"like": "world"}}
    rs = by_op(data, "reduce_scatter")[0]
    assert rs["axis"] == "world_rs" and "lane" not in rs
    assert all("axis" not in b for b in by_op(data, "all_gather"))
    assert "its reduce_scatter calls run on axis world_rs" in text


def test_without_record_shapes_gemms_are_stand_ins_and_the_file_says_so(tmp_path):
    _, text, data = imported(tmp_path / "noshape", [ddp_rank(r, shapes=False) for r in range(2)])
    check_structure(data)
    assert not by_op(data, "gemm")
    header = text.replace("\n#     ", " ").replace("\n#   ", " ")
    assert "2 GEMM kernels (by name) replayed as busy stand-ins" in header
    assert "profile with record_shapes=True to replay them as GEMMs" in header
    # The coverage line says how much of the step's GPU time they were.
    assert "busy stand-ins 56.3 % (of the step: GEMM kernels 49.2 %)" in header
    assert sum(b["duration_us"] for b in by_op(data, "busy")) >= 400 + 500


def test_idle_gaps_become_sleeps_unless_dropped(tmp_path):
    builders = [collectives_rank(r) for r in range(4)]
    _, _, kept = imported(tmp_path / "a", builders)
    _, text, dropped = imported(tmp_path / "b", builders, keep_idle=False)
    assert by_op(kept, "sleep") and not by_op(dropped, "sleep")
    assert "dropped (--no-idle)" in text
    _, _, coarse = imported(tmp_path / "c", builders, idle_us=1000.0)
    assert [b["duration_us"] for b in by_op(coarse, "sleep")] == [1530.0]


def test_one_rank_trace_without_distributed_info(tmp_path):
    imp, _, data = imported(tmp_path / "one", [compute_rank()])
    check_structure(data)
    assert data["world_size"] == 1 and imp.roles[0].ranks == (0,)
    assert [b["op"] for b in blocks_of(data)] == ["busy", "gemm", "busy", "gemm", "sleep", "busy"]
    assert by_op(data, "sleep")[0]["duration_us"] == 910 - 703  # the host's launch gap


# ---------------------------------------------------------------------------------------------
# Which step
# ---------------------------------------------------------------------------------------------
def _two_steps(rank: int, *, last_complete: bool) -> TraceBuilder:
    b = ddp_rank(rank)
    b.step(6, 5000, 6000)
    b.launch(stream=7, launch=5010, start=5100, dur=10, with_activity=last_complete)
    return b


def test_default_step_is_the_last_complete_one(tmp_path):
    imp, _, _ = imported(tmp_path / "a", [_two_steps(r, last_complete=True) for r in range(2)])
    assert imp.step_name == "ProfilerStep#6"
    imp, _, _ = imported(tmp_path / "b", [_two_steps(r, last_complete=False) for r in range(2)])
    assert imp.step_name == "ProfilerStep#5"
    imp, text, data = imported(
        tmp_path / "c", [_two_steps(r, last_complete=True) for r in range(2)], step=5
    )
    assert imp.step_name == "ProfilerStep#5" and data["patterns"][0]["name"] == "step5"
    assert "chosen with --step" in text


def test_a_missing_step_names_the_steps_there_are(tmp_path):
    with pytest.raises(TraceError, match=r"rank 0 has no ProfilerStep#9 \(it has: ProfilerStep#5"):
        imported(tmp_path / "a", [ddp_rank(r) for r in range(2)], step=9)


# ---------------------------------------------------------------------------------------------
# Files that are not one run's step
# ---------------------------------------------------------------------------------------------
def test_different_world_sizes(tmp_path):
    with pytest.raises(TraceError, match="different world sizes"):
        imported(tmp_path / "a", [ddp_rank(0, world=2), ddp_rank(1, world=4)])


def test_a_missing_rank_file(tmp_path):
    write_all([ddp_rank(0, world=4), ddp_rank(1, world=4), ddp_rank(3, world=4)], tmp_path)
    with pytest.raises(
        TraceError,
        match=r"rank 2's trace file is missing \(the files hold rank\(s\) 0, 1, 3 of a world of 4\).*--world-size N",
    ):
        import_traces([str(tmp_path)])


def test_two_files_for_one_rank(tmp_path):
    ddp_rank(0).write(tmp_path / "a")
    ddp_rank(0).write(tmp_path / "b")
    with pytest.raises(TraceError, match="two files for rank 0"):
        import_traces([str(tmp_path / "a"), str(tmp_path / "b")])


def test_files_of_runs_far_apart_in_time(tmp_path):
    late = ddp_rank(1)
    late.base_ts += 60e6
    late.events = ddp_rank(1, skew_us=60e6).events
    with pytest.raises(TraceError, match="starts 60.0 s after the earliest rank's"):
        imported(tmp_path / "a", [ddp_rank(0), late])


def test_ranks_with_different_collectives(tmp_path):
    other = ddp_rank(1)
    other.collective(stream=20, launch=90, start=2000, dur=10, in_nelems=8)
    with pytest.raises(
        TraceError,
        match=r"different collectives on group default_pg "
        r"\[0, 1\] in this step \(rank 0: 1, rank 1: 2\)",
    ):
        imported(tmp_path / "a", [ddp_rank(0), other])


def test_ranks_disagreeing_on_a_collective(tmp_path):
    other = ddp_rank(1)
    rec = next(e for e in other.events if e["name"] == "record_param_comms")
    rec["args"]["In msg nelems"] = 8
    rec["args"]["Out msg nelems"] = 8
    with pytest.raises(TraceError, match="disagree on one collective call"):
        imported(tmp_path / "a", [ddp_rank(0), other])


def test_a_send_nobody_receives(tmp_path):
    lonely = pipeline_rank(1)
    lonely.events = [e for e in lonely.events if e["args"].get("Collective name") != "recv"]
    with pytest.raises(TraceError, match="rank 0 sends to rank 1"):
        imported(tmp_path / "a", [pipeline_rank(0), lonely])


def test_groups_with_other_ranks_in_another_file(tmp_path):
    other = ddp_rank(1)
    other.groups = [group("0", "default_pg", [1, 0])]
    with pytest.raises(TraceError, match="has ranks \\[0, 1\\] in .* but \\[1, 0\\]"):
        imported(tmp_path / "a", [ddp_rank(0), other])


def test_several_files_without_distributed_info(tmp_path):
    builders = [ddp_rank(r) for r in range(2)]
    builders[1].distributed = False
    with pytest.raises(TraceError, match="no distributedInfo"):
        imported(tmp_path / "a", builders)


# ---------------------------------------------------------------------------------------------
# The file
# ---------------------------------------------------------------------------------------------
def test_header_names_traces_step_world_and_what_is_approximated(tmp_path):
    _, text, _ = imported(tmp_path / "ddp", [ddp_rank(r) for r in range(2)])
    header = [line for line in text.splitlines() if line.startswith("#")]
    joined = "\n".join(header)
    assert "# Step: ProfilerStep#5 (the last step complete on every rank)\n" in joined
    assert "\n# World size: 2\n" in joined
    assert f"rank 1: {tmp_path / 'ddp' / 'rank1.json.gz'}" in joined
    assert "Approximations:" in joined and "`busy` stand-ins" in joined
    assert "traced_us: the longest of the ranks' own durations" in joined
    assert "Traced on: NVIDIA H200" in joined


def test_names_are_yaml_safe(tmp_path):
    b = ddp_rank(0, world=1)
    b.annotate("yes", 5, 200)  # a YAML 1.1 boolean as an annotation
    _, text, data = imported(tmp_path / "x", [b])
    assert all(isinstance(block["name"], str) for block in blocks_of(data))


def test_imported_file_validates(tmp_path):
    _, text, _ = imported(tmp_path / "ddp", [ddp_rank(r) for r in range(2)])
    load_suite_text(text)


def test_json_of_a_synthetic_trace_is_what_kineto_writes(tmp_path):
    path = ddp_rank(0).write(tmp_path, gz=False)
    doc = json.loads(path.read_text())
    assert {"schemaVersion", "distributedInfo", "traceEvents", "deviceProperties"} <= set(doc)


def test_pipeline_replicated_over_data_parallel_ranks(tmp_path):
    imp, text, data = imported(tmp_path / "ppdp", [pp_dp_rank(r) for r in range(4)])
    check_structure(data)
    assert [role.ranks for role in imp.roles] == [(0, 1), (2, 3)]
    assert data["mesh"] == {"pp": 2, "dp": 2}
    assert data["axes"] == {"stage0": {"teams": [[0, 1]]}, "stage1": {"teams": [[2, 3]]}}
    (send,) = by_op(data, "send_recv")
    assert send["axis"] == "pp" and send["name"] == "send_recv"  # two pairs: 0->2, 1->3
    (all_reduce,) = by_op(data, "all_reduce")  # each stage's on its dp team: one block on dp
    assert all_reduce["axis"] == "dp" and all_reduce["size"] == 8192 * 2
    assert "one-way sends 0->2, 1->3 replayed as exchanges" in text


def test_older_trace_spellings(tmp_path):
    """pg_config as a mapping, a default group listed without ranks, message sizes as
    ``In msg size``."""
    builders = [ddp_rank(r) for r in range(2)]
    for b in builders:
        b.groups = [group("0", "default_pg", [])]
        for event in b.events:
            args = event["args"]
            if "In msg nelems" in args:
                args["In msg size"] = args.pop("In msg nelems")
                args["Out msg size"] = args.pop("Out msg nelems")
    docs = [b.document() for b in builders]
    for b, doc in zip(builders, docs, strict=True):
        doc["distributedInfo"]["pg_config"] = {
            "0": {"pg_name": "0", "pg_desc": "default_pg", "ranks": []}
        }
        (tmp_path / f"rank{b.rank}.json").write_text(json.dumps(doc))
    imp = import_traces([str(tmp_path)])
    data = yaml.safe_load(render(imp, name="old", command="c"))
    (all_reduce,) = by_op(data, "all_reduce")
    assert all_reduce["size"] == 4 * 1024 * 1024 * 2 and "axis" not in all_reduce


def test_fp32_gemm_on_tf32_kernels_keeps_tf32(tmp_path):
    b = compute_rank()
    b.gemm(stream=7, launch=950, start=1000, dur=100, m=64, n=64, k=64, dtype="float")
    b.events[-1]["name"] = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32"
    b.gemm(stream=7, launch=960, start=1101, dur=100, m=32, n=32, k=32, dtype="float")
    _, _, data = imported(tmp_path / "tf32", [b])
    fp32 = [g for g in by_op(data, "gemm") if g.get("dtype") == "fp32"]
    assert [(g["m"], g.get("tf32", False)) for g in fp32] == [(64, True), (32, False)]


def test_pg_config_decides_a_groups_ranks_over_its_records(tmp_path):
    """A record may list other ranks for its group (a one-rank world cut from a larger run):
    the file's pg_config says who is in the group."""
    b = TraceBuilder(rank=0, world_size=1)
    b.step(1, 0, 1000)
    b.collective(stream=20, launch=10, start=20, dur=100, in_nelems=1024)
    record = next(e for e in b.events if e["name"] == "record_param_comms")
    record["args"]["Process Group Ranks"] = "[0, 1]"
    _, _, data = imported(tmp_path / "cut", [b])
    assert by_op(data, "all_reduce")[0]["size"] == 2048 and data["world_size"] == 1


@pytest.mark.parametrize(
    ("name", "dims", "strides", "layout"),
    [
        # x @ W.T: the weight [n, k] contiguous is B read transposed
        ("aten::linear", [[64, 32], [16, 32]], [[32, 1], [32, 1]], (False, True)),
        # backward's grad_x = grad_y @ W: both row-major
        ("aten::mm", [[64, 16], [16, 32]], [[16, 1], [32, 1]], (False, False)),
        # backward's grad_W = grad_y.T @ x: A is a column-major view
        ("aten::mm", [[16, 64], [64, 32]], [[1, 16], [32, 1]], (True, False)),
        ("aten::addmm", [[32], [64, 16], [16, 32]], [[1], [16, 1], [1, 16]], (False, True)),
        # no strides recorded: row-major, as before
        ("aten::mm", [[64, 16], [16, 32]], [], (False, False)),
        # a one-row operand is contiguous either way: not transposed
        ("aten::mm", [[1, 16], [16, 32]], [[16, 1], [32, 1]], (False, False)),
    ],
)
def test_gemm_layouts_come_from_the_input_strides(name, dims, strides, layout):
    call = TracedCall(
        name=name, dtype="bf16", dims=tuple(map(tuple, dims)), strides=tuple(map(tuple, strides))
    )
    found = Gemm.traced_params(call)
    assert found is not None
    params, _ = found
    assert (params.get("a_transposed", False), params.get("b_transposed", False)) == layout


def test_a_transposed_gemm_runs_on_column_major_operands():
    import torch

    from userbenchmark.maestro.blocks.base import BlockContext
    from userbenchmark.maestro.blocks.compute import Gemm
    from userbenchmark.maestro.core.config.summary import describe_params

    text = (
        "name: t\nworld_size: 1\npatterns:\n  - name: p\n    blocks:\n"
        "      - {name: g, op: gemm, m: 8, n: 4, k: 6, a_transposed: true, b_transposed: true}\n"
    )
    spec = load_suite_text(text, file="ok").patterns[0].blocks[0]
    block = Gemm(
        spec, BlockContext(rank=0, device=torch.device("cpu"), dtype=torch.float32, team=(0,))
    )
    block.setup()
    assert block.a.shape == (8, 6) and block.a.stride() == (1, 8)
    assert block.b.shape == (6, 4) and block.b.stride() == (1, 6)
    block.launch()
    assert torch.allclose(block.c, block.a @ block.b)
    # Described (results, compare) when set; left out at their default, as before they existed.
    assert "a_transposed=true b_transposed=true" in describe_params(Gemm, spec.params)
    plain = {**spec.params, "a_transposed": False, "b_transposed": False}
    assert describe_params(Gemm, plain) == "m=8 n=4 k=6 tf32=false"


@pytest.mark.parametrize(
    ("name", "dims", "bias"),
    [
        ("aten::addmm", [[32], [64, 16], [16, 32]], True),  # Linear's forward: a 1-D bias
        ("aten::linear", [[64, 16], [32, 16], [32]], True),
        ("aten::linear", [[64, 16], [32, 16]], False),  # a Linear without a bias
        ("aten::addmm", [[64, 32], [64, 16], [16, 32]], False),  # a 2-D self: no bias vector
        ("aten::mm", [[64, 16], [16, 32]], False),
    ],
)
def test_a_traced_bias_is_kept_since_cublas_picks_another_kernel_for_it(name, dims, bias):
    # On an H200, x @ W.T + b ran nvjet_..._coopA_bias_TNT where the same GEMM without a bias
    # ran nvjet_..._320x128_64x3_..._coopB_TNT, up to 9 % slower (BENCHMARKS.md, 2026-12-03).
    found = Gemm.traced_params(TracedCall(name=name, dtype="bf16", dims=tuple(map(tuple, dims))))
    assert found is not None
    assert found[0].get("bias", False) is bias


def test_a_gemm_with_a_bias_adds_it_to_every_row():
    import torch

    from userbenchmark.maestro.blocks.base import BlockContext

    text = (
        "name: t\nworld_size: 1\npatterns:\n  - name: p\n    blocks:\n"
        "      - {name: g, op: gemm, m: 8, n: 4, k: 6, b_transposed: true, bias: true}\n"
    )
    spec = load_suite_text(text, file="ok").patterns[0].blocks[0]
    block = Gemm(
        spec, BlockContext(rank=0, device=torch.device("cpu"), dtype=torch.float32, team=(0,))
    )
    block.setup()
    block.launch()
    assert block.bias.shape == (4,) and block.bias.abs().sum() > 0
    assert torch.allclose(block.c, block.a @ block.b + block.bias)
    assert Gemm.buffer_bytes(spec.params, dtype="fp32", team_size=1) == (48 + 24 + 32 + 4) * 4


@pytest.mark.parametrize(("std", "check"), [(None, "uniform"), (0.0, "zeros"), (0.02, "normal")])
def test_gemm_and_busy_operand_data(std, check):
    """data_std picks the operands' values (a GEMM's speed depends on them: power); unset,
    a GEMM's are uniform in [-1, 1) and a busy block's zeros, as before the parameter."""
    import torch

    from userbenchmark.maestro.blocks.base import BlockContext
    from userbenchmark.maestro.blocks.compute import Busy

    extra = "" if std is None else f", data_std: {std}"
    text = (
        "name: t\nworld_size: 1\npatterns:\n  - name: p\n    blocks:\n"
        f"      - {{name: g, op: gemm, m: 256, n: 64, k: 256{extra}}}\n"
        f"      - {{name: b, op: busy, duration_us: 5{extra}}}\n"
    )
    g_spec, b_spec = load_suite_text(text, file="ok").patterns[0].blocks
    ctx = BlockContext(rank=0, device=torch.device("cpu"), dtype=torch.float32, team=(0,))
    gemm, busy = Gemm(g_spec, ctx), Busy(b_spec, ctx)
    gemm.setup()
    busy.setup()
    a = gemm.a.flatten()
    if check == "uniform":
        assert a.min() >= -1 and a.max() < 1 and a.std() > 0.5 and not busy.a.any()
    elif check == "zeros":
        assert not a.any() and not busy.a.any()
    else:
        assert abs(float(a.std()) - 0.02) < 0.002 and abs(float(busy.a.std()) - 0.02) < 0.002
