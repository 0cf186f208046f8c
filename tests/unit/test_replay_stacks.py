"""The stacks of tests/data/corpus on traces made by tests/unit/replay_stacks.py: each imports,
or is refused, as its real file is (test_replay_corpus.py), where CI has no real file; and,
where the real file is at hand (MAESTRO_TRACE_CORPUS), the made one has its structure."""

from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from userbenchmark.maestro.core.config.loader import load_suite_text
from userbenchmark.maestro.core.replay.emit import coverage, render
from userbenchmark.maestro.core.replay.importer import ImportOptions, import_traces
from userbenchmark.maestro.core.replay.kineto import TraceError, read_trace
from userbenchmark.maestro.core.replay.step import WHOLE

from . import replay_stacks as stacks

CORPUS = Path(os.environ.get("MAESTRO_TRACE_CORPUS", Path(__file__).parents[1] / "data" / "corpus"))


def _imported(paths, **options):
    imp = import_traces([str(p) for p in paths], ImportOptions(**options))
    text = render(imp, name="stack", command="python -m userbenchmark.maestro import-trace")
    assert load_suite_text(text).world_size == imp.run.world  # the file runs
    blocks = yaml.safe_load(text)["patterns"][0]["blocks"]
    return imp, " ".join(text.replace("\n#  ", " ").split()), blocks


def _ops(blocks) -> dict[str, int]:
    ops: dict[str, int] = defaultdict(int)
    for block in blocks:
        ops[block["op"]] += 1
    return dict(ops)


def test_torch_1_8_categories_without_a_world_size_or_steps(tmp_path):
    path = stacks.write(stacks.torch18_rank1(), tmp_path, "rank1.json")
    with pytest.raises(TraceError, match="a world whose size the files do not say.*--world-size"):
        import_traces([str(path)])
    imp, text, blocks = _imported([path], world_size=2)
    assert imp.step_name == WHOLE and "the trace has no ProfilerStep#N" in text
    assert _ops(blocks) == {"busy": 1} and len(imp.steps[0].items) == 4
    within = dict(coverage(imp).within)
    assert within["GEMM kernels"] == 30  # gemmk1 and cutlass, 15 µs each


def test_rocm_hip_calls_rccl_and_fractional_times_placed_by_the_base_time(tmp_path):
    for rank in (0, 1):  # rank 1's clock starts 30 s later, its base 30 s earlier
        stacks.write(stacks.rocm_rank(rank, late_s=30.0 * rank), tmp_path / "run", f"{rank}.json")
    imp, text, blocks = _imported([tmp_path / "run"])
    assert "Traced on: AMD Radeon Graphics" in text
    assert _ops(blocks) == {"gemm": 1, "busy": 1, "all_reduce": 1}
    gemm = next(b for b in blocks if b["op"] == "gemm")
    assert (gemm["m"], gemm["n"], gemm["k"], gemm["traced_kernel"]) == (128, 128, 5, stacks.ROCBLAS)
    assert gemm["traced_us"] == 300.5 and next(b for b in blocks if b["op"] == "all_reduce")
    for rank in (0, 1):  # the same base time: the ranks' steps 30 s apart, not one run
        doc = stacks.rocm_rank(rank, late_s=30.0 * rank, base_late_s=0.0)
        stacks.write(doc, tmp_path / "apart", f"{rank}.json")
    with pytest.raises(TraceError, match="starts 30.0 s after .* from different runs"):
        import_traces([str(tmp_path / "apart")])


def test_old_record_param_comms_without_sizes_are_stand_ins_named_by_their_op(tmp_path):
    path = stacks.write(stacks.old_comms_rank(1), tmp_path, "rank1.json")
    with pytest.raises(TraceError, match="rank 0's trace file is missing.*--world-size"):
        import_traces([str(path)])
    imp, text, blocks = _imported([path], world_size=2)
    assert (
        _ops(blocks) == {"busy": 3, "sleep": 1}
        and "nccl:all_reduce" in text
        and "nccl:_all" in text
    )
    assert "collectives without sizes 55.6 %" in coverage(imp).line()  # 500 of 900 µs
    # The two NCCL kernels, counted once: the coverage's count is the header's.
    assert coverage(imp).unsized == 2 and "(2x): replayed as a busy stand-in" in text


def test_old_record_param_comms_sized_by_the_c10d_op_around_them(tmp_path):
    """With record_shapes, the all_gather's c10d op gives its output and input (issue 41, item
    5); the all_reduce's op took a TensorList, whose size torch of then did not write."""
    for rank in (0, 1):
        stacks.write(stacks.old_comms_rank(rank, shapes=True), tmp_path, f"rank{rank}.json")
    imp, text, blocks = _imported([tmp_path])
    gather = [b for b in blocks if b["op"] == "all_gather"]
    assert [b["size"] for b in gather] == [2048 * 64 * 4]
    assert _ops(blocks) == {"gemm": 1, "busy": 1, "sleep": 1, "all_gather": 1}
    assert "collectives without sizes" in text and imp.axes.groups == {}  # callers: one team
    imp, text, blocks = _imported([tmp_path / "rank1.json"], world_size=4)  # one rank stands
    gather = next(b for b in blocks if b["op"] == "all_gather")  # for 4: S per rank's input
    assert gather["size"] == 1024 * 64 * 4 * 4 and gather.get("axis", "world") == "world"
    assert "unnamed (older torch) (default_pg): 2 ranks -> axis world, teams of 4" in text
    doc = stacks.old_comms_rank(0, shapes=True)
    for ev in doc["traceEvents"]:
        if ev["name"] == "c10d::_allgather_base_":
            ev["args"]["Input Dims"][0] = [1 << 30, 1 << 30]
    with pytest.raises(TraceError, match="c10d::_allgather_base_ has a tensor of 1152921504606"):
        read_trace(stacks.write(doc, tmp_path, "huge.json"))


def test_a_trace_without_shapes_counts_its_gemm_kernels(tmp_path):
    path = stacks.write(stacks.no_shapes_rank(), tmp_path, "rank3.json")
    with pytest.raises(TraceError, match="of a world of 8.*--world-size"):
        import_traces([str(path)])
    imp, text, blocks = _imported([path], world_size=2)
    assert "gemm" not in _ops(blocks)
    assert "2 GEMM kernels (by name) replayed as busy stand-ins" in text
    assert "profile with record_shapes=True" in text
    line = coverage(imp).line()  # 700 and 200 of 1000 µs
    assert "(of the step: GEMM kernels 70.0 %, collectives without sizes 20.0 %)" in line


def test_a_call_kind_cupti_never_records_counts_against_no_step(tmp_path):
    imp, text, _ = _imported([stacks.write(stacks.unrecorded_memsets_rank(), tmp_path, "r.json")])
    assert imp.step_name == "ProfilerStep#105" and len(imp.steps_used) == 3
    assert "rank 0: ignored (no device work in any step): cudaMemsetAsync x2" in text


MIMICS = {
    "torch18_old_categories_rank1.json.gz": (stacks.torch18_rank1, set()),
    "mi250_rocm6_2_toy_train.json.gz": (lambda: stacks.rocm_rank(0, world=1), set()),
    "v100_rank1_of_2_old_comms.json.gz": (lambda: stacks.old_comms_rank(1), set()),
    "a100_rank0_of_16_all_to_all.json.gz": (lambda: stacks.old_comms_rank(0, shapes=True), set()),
    "a100_rank3_of_8.json.gz": (stacks.no_shapes_rank, set()),
    "v100_one_rank_cudnn_memsets.json.gz": (stacks.unrecorded_memsets_rank, set()),
}


def _shape(doc: dict) -> tuple[set, dict]:
    """The top-level keys, and each event category's argument names (X events)."""
    args: dict[str, set] = defaultdict(set)
    for ev in doc["traceEvents"]:
        if ev.get("ph") == "X":
            args[ev["cat"]] |= set(ev.get("args", {}))
    return set(doc) - {"traceEvents"}, args


@pytest.mark.parametrize("name", sorted(MIMICS))
def test_a_made_trace_has_its_real_files_structure(name, tmp_path):
    """Each made trace's top-level keys, categories and argument names are the real file's (a
    subset: the made ones leave out what the importer never reads), and both read alike."""
    real = CORPUS / name
    if not real.is_file():
        pytest.skip(f"{name} is not in this checkout (tests/data/corpus/README.md)")
    build, extra = MIMICS[name]
    made = build()
    real_keys, real_args = _shape(json.loads(gzip.decompress(real.read_bytes())))
    keys, args = _shape(made)
    assert keys - {"traceName", "schemaVersion"} <= real_keys | extra
    assert set(args) <= set(real_args)
    for cat, names in args.items():
        assert names <= real_args[cat] | {"Input Dims", "Input type", "Input Strides"}, cat
    mine, theirs = read_trace(stacks.write(made, tmp_path, "made.json")), read_trace(real)
    assert (mine.distributed, bool(mine.comms)) == (theirs.distributed, bool(theirs.comms))
