"""The importer on real H200 traces (tests/data/traces/README.md says how each was made).

Each import is checked against the trace read independently (plain ``json``): every rank runs
the collectives it traced (count and message bytes per op), its sends, its GEMMs, on the teams
of its process groups; and what each kind of job must look like (mesh, like axes, roles,
dependencies).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
import yaml

from userbenchmark.maestro.core.config.loader import load_suite_text
from userbenchmark.maestro.core.replay.emit import import_trace, render
from userbenchmark.maestro.core.replay.importer import import_traces

from .test_replay_import import blocks_of, by_op, check_structure

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
GOLDEN = DATA.parent / "golden" / "replay"
FOLDERS = sorted(p.name for p in DATA.iterdir() if p.is_dir())
ELEM = {"BFloat16": 2, "Float": 4, "Half": 2, "Long": 8, "Int": 4, "Byte": 1}
S_RULE = {
    "_allgather_base": ("all_gather", "Out msg nelems"),
    "_reduce_scatter_base": ("reduce_scatter", "In msg nelems"),
    "allreduce": ("all_reduce", "In msg nelems"),
    "all_to_allv": ("all_to_all", "In msg nelems"),
    "send": ("send", "In msg nelems"),
}
ONE_WAY = re.compile(r"\{name: ([^,]+),.*one-way sends ([0-9>, -]+?) replayed")


@cache
def imported(folder: str):
    imp = import_traces([str(DATA / folder)])
    text = render(imp, name=folder, command="python -m userbenchmark.maestro import-trace")
    return imp, text, yaml.safe_load(text)


def traced_calls(path: Path, step: str) -> tuple[Counter, Counter, int]:
    """(calls per op, S bytes per op, GEMM launches) of one rank's step, from the raw JSON."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    window = max(
        (e for e in events if e.get("name") == step and e.get("cat") == "user_annotation"),
        key=lambda e: e["dur"],
    )
    lo, hi = window["ts"], window["ts"] + window["dur"]
    launched = {
        e["args"].get("External id")
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and lo <= e["ts"] <= hi
    }
    calls, size = Counter(), Counter()
    gemms = 0
    for e in events:
        if e.get("cat") != "cpu_op" or e["args"].get("External id") not in launched:
            continue
        if e["name"] in ("aten::mm", "aten::addmm"):
            gemms += 1
        rule = S_RULE.get(e["args"].get("Collective name"))
        if e["name"] == "record_param_comms" and rule:
            op, field = rule
            calls[op] += 1
            size[op] += e["args"][field] * ELEM[e["args"]["dtype"]]
    return calls, size, gemms


def replayed_calls(text: str, data: dict, rank: int) -> tuple[Counter, Counter, int]:
    """The same per rank from the imported file: what the blocks this rank runs add up to
    (a send_recv sends on every rank of its team, a one-way one only where the file says)."""
    one_way = {
        m[1]: [tuple(int(r) for r in e.split("->")) for e in m[2].split(", ")]
        for m in ONE_WAY.finditer(text)
    }
    spec = load_suite_text(yaml.safe_dump(data))
    calls, size = Counter(), Counter()
    gemms = 0
    for block in spec.patterns[0].blocks:
        if spec.axes[block.axis].team_of(rank) is None:
            continue
        if block.op == "gemm":
            gemms += 1
        elif block.op == "send_recv":
            sends = (
                1
                if block.name not in one_way
                else sum(1 for src, _ in one_way[block.name] if src == rank)
            )
            calls["send"] += sends
            size["send"] += block.params["size"] * sends
        elif block.op not in ("sleep", "busy"):
            calls[block.op] += 1
            size[block.op] += block.params["size"]
    return calls, size, gemms


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_rank_replays_its_traced_calls(folder):
    imp, text, data = imported(folder)
    check_structure(data)
    for trace in imp.traces:
        calls, size, gemms = traced_calls(Path(trace.path), imp.step_name)
        got_calls, got_size, got_gemms = replayed_calls(text, data, trace.rank)
        assert got_calls == calls, f"rank {trace.rank}"
        assert got_gemms == gemms, f"rank {trace.rank}"
        for op, nbytes in size.items():
            if op == "all_to_all":  # uneven splits become whole equal chunks: a little less
                assert 0 <= nbytes - got_size[op] < 4 * 64 * calls[op], f"rank {trace.rank}"
            else:
                assert got_size[op] == nbytes, f"rank {trace.rank} {op}"


def test_fsdp_all_gathers_and_reduce_scatters_on_two_communicators():
    _, text, data = imported("fsdp2_2ranks")
    assert data["axes"] == {"world_rs": {"like": "world"}}
    assert [b["size"] for b in by_op(data, "all_gather")] == [67129344] * 8
    assert {b["axis"] for b in by_op(data, "reduce_scatter")} == {"world_rs"}
    assert "from the traces' cuda_sync events" in text
    # FSDP's copy-in on its own stream comes before each all_gather of the forward.
    first = by_op(data, "all_gather")[1]
    assert first["after"] == ["fsdp_all_gather_1_foreach_copy"]
    # The copy-out on the compute stream waits for its all_gather.
    copy_out = next(b for b in blocks_of(data) if b["name"] == "fsdp_all_gather_copy_out_0_copy")
    assert copy_out["after"] == ["fsdp_all_gather_0"]


def test_fsdp_without_sync_events_infers_from_the_timeline():
    _, text, data = imported("fsdp2_2ranks_nosync")
    assert "inferred from the device timeline" in text
    copy_out = next(b for b in blocks_of(data) if b["name"] == "fsdp_all_gather_copy_out_0_copy")
    assert copy_out["after"] == ["fsdp_all_gather_0"]


def test_tensor_and_data_parallel_mesh():
    imp, _, data = imported("tp_dp_4ranks")
    assert len(imp.roles) == 1
    assert data["mesh"] == {"dp": 2, "tp": 2}
    assert data["axes"] == {"dp_rs": {"like": "dp"}}
    assert Counter(b["axis"] for b in blocks_of(data) if "size" in b) == {
        "dp": 8,
        "tp": 7,
        "dp_rs": 4,
    }


def test_ddp_bucket_copies_wait_for_their_all_reduce():
    _, _, data = imported("ddp")
    names = [b["name"] for b in by_op(data, "all_reduce")]
    assert len(names) == 8
    waited = {dep for b in blocks_of(data) for dep in b.get("after", []) if dep in names}
    assert waited == set(names)


def test_moe_all_to_all_with_uneven_splits():
    _, text, data = imported("moe")
    assert len(by_op(data, "all_to_all")) == 4
    assert text.count("uneven all_to_all split sizes") == 4


def test_pipeline_stages_and_their_transfers():
    imp, _, data = imported("pipeline")
    assert [role.ranks for role in imp.roles] == [(0,), (1,), (2,), (3,)]
    teams = {b["axis"]: data["axes"][b["axis"]]["teams"] for b in by_op(data, "send_recv")}
    assert sorted(teams.values()) == [[[0, 1]], [[1, 2]], [[2, 3]]]
    assert len(by_op(data, "send_recv")) == 24  # 4 micro-batches x 3 links x 2 ways
    lanes = {b.get("lane", b["axis"]) for b in by_op(data, "send_recv")}
    assert len(lanes) == 1  # each rank's sends and receives shared one stream


@pytest.mark.parametrize("folder", ["onerank", "onerank_sync"])
def test_one_rank_compute_step(folder):
    _, _, data = imported(folder)
    assert data["world_size"] == 1
    assert {b.get("lane") for b in blocks_of(data)} == {"compute"}
    assert len(by_op(data, "gemm")) == 24


def test_five_traced_steps_give_each_block_their_median_and_range():
    imp, _, data = imported("onerank_attention_steps")  # made with --active 5
    assert imp.steps_used == tuple(f"ProfilerStep#{n}" for n in (7, 6, 5, 4, 3))
    blocks = blocks_of(data)
    assert len(by_op(data, "gemm")) == 48
    for b in blocks:
        assert b["traced_min_us"] <= b["traced_us"] <= b["traced_max_us"], b
    assert sum(b["traced_min_us"] < b["traced_max_us"] for b in blocks) > len(blocks) / 2


def test_the_shipped_imported_pattern_is_what_import_trace_writes(monkeypatch):
    """configs/fsdp2_replay.yaml: its own preamble, then exactly the file `import-trace` writes
    today from tests/data/traces/fsdp2_2ranks with the command its header names."""
    repo = DATA.parents[2]
    shipped = (repo / "userbenchmark" / "maestro" / "configs" / "fsdp2_replay.yaml").read_text()
    command = re.search(r"^#   (python -m userbenchmark\.maestro import-trace .*)$", shipped, re.M)
    assert command is not None
    args = command[1].split()
    assert args[4:] == [
        "tests/data/traces/fsdp2_2ranks",
        "-o",
        "userbenchmark/maestro/configs/fsdp2_replay.yaml",
    ]
    monkeypatch.chdir(repo)  # the header names the traces as the command gave them
    fresh = render(import_traces([args[4]]), name="fsdp2_replay", command=command[1])
    preamble, body = shipped.split("\n#\n", 1)
    assert body == fresh and "time-sharing one H200" in preamble


@pytest.mark.parametrize("folder", FOLDERS)
def test_import_trace_writes_the_golden_pattern(folder, monkeypatch):
    """The file `import-trace tests/data/traces/<folder> -o <folder>.yaml` writes, byte for
    byte. Regenerate only for an intended change: ``MAESTRO_WRITE_GOLDEN=1 python -m pytest
    tests/unit/test_replay_real.py``."""
    monkeypatch.chdir(DATA.parents[2])  # the header names the traces as the command gave them
    written = {}
    import_trace([f"tests/data/traces/{folder}"], f"{folder}.yaml", write=written.__setitem__)
    [text] = written.values()
    golden = GOLDEN / f"{folder}.yaml"
    if os.environ.get("MAESTRO_WRITE_GOLDEN") == "1":
        golden.write_bytes(text)
    assert text == golden.read_bytes()
