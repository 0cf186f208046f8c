"""What an import says it kept: the share of the step's GPU time imported as GEMMs, collectives
and busy stand-ins, and what was dropped (named, counted, timed); how collectives were matched
across ranks (sequence numbers where the trace has them, else order); each GEMM's and
collective's traced kernel and each GEMM's overlap with collectives; the file's mode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from userbenchmark.maestro import cli
from userbenchmark.maestro.core.replay.emit import coverage, render
from userbenchmark.maestro.core.replay.importer import import_traces
from userbenchmark.maestro.core.replay.kineto import TraceError

from .replay_scenarios import ddp_rank
from .replay_traces import TraceBuilder, write_all

pytestmark = pytest.mark.usefixtures("cli_here")  # tests/conftest.py


def _import(folder: Path, builders: list[TraceBuilder]):
    """(the import, its header as one line, the file's data)."""
    write_all(builders, folder)
    imp = import_traces([str(folder)])
    text = render(imp, name="t", command="python -m userbenchmark.maestro import-trace")
    header = " ".join(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    return imp, header, yaml.safe_load(text)


def _with_earlier_kernel(rank: int) -> TraceBuilder:
    """The DDP step, and a copy launched before the step that runs during it on stream 30."""
    b = ddp_rank(rank)
    b.launch(stream=30, launch=-50, start=600, dur=20, kernel="void copy_kernel<float>()")
    return b


def test_coverage_splits_the_step_gpu_time_and_lists_what_was_dropped(tmp_path, capsys):
    imp, text, _ = _import(tmp_path / "t", [_with_earlier_kernel(r) for r in range(2)])
    c = coverage(imp)
    # Per rank: GEMMs 400 + 500 µs, the all_reduce 800, other kernels 30 + 10 + 50 + 40, and
    # the earlier copy 20 µs: dropped.
    assert (c.gemm_us, c.comm_us, c.stand_in_us, c.dropped_us) == pytest.approx(
        (1800, 1600, 260, 40)
    )
    assert c.dropped == (("void copy_kernel<float>()", 2, pytest.approx(40.0)),)
    line = c.line()
    assert line == (
        "coverage of the step's GPU time (3700.0 µs on all ranks): GEMMs 48.7 %, "
        "collectives 43.2 %, busy stand-ins 7.0 %, dropped 1.1 %"
    )
    assert "Coverage of the step's GPU time (3700.0 µs on all ranks): GEMMs 48.7 %" in text
    assert "void copy_kernel<float>() x2 (40.0 µs)" in text
    out = tmp_path / "x.yaml"
    assert cli.main(["import-trace", str(tmp_path / "t"), "-o", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == line


def _seq_rank(rank: int, seqs: tuple[int, ...] | None) -> TraceBuilder:
    """Two all_reduces of one size on the default group, with these sequence numbers (as
    newer torch records them) or none."""
    b = TraceBuilder(rank=rank, world_size=2)
    b.step(1, 0, 2000)
    for i, seq in enumerate(seqs or (None, None)):
        t = 10 + 500 * i
        b.collective(stream=20, launch=t, start=t + 50, dur=100, in_nelems=1024, seq=seq)
    return b


def test_collectives_are_matched_by_sequence_number_where_the_trace_has_them(tmp_path):
    _, text, _ = _import(tmp_path / "a", [_seq_rank(0, (7, 8)), _seq_rank(1, (7, 8))])
    assert "Collectives matched across ranks by their process group's sequence numbers" in text
    _, text, _ = _import(tmp_path / "b", [_seq_rank(0, None), _seq_rank(1, None)])
    assert "by their order on each process group (the traces carry no sequence numbers)" in text
    # Rank 1's step window began one call later: by order, its calls 8 and 9 would pass for
    # rank 0's 7 and 8; their sequence numbers tell they are not the same calls.
    ranks = [_seq_rank(0, (7, 8)), _seq_rank(1, (8, 9))]
    with pytest.raises(TraceError, match="rank.s. 1 lack the call of sequence number 7"):
        _import(tmp_path / "c", ranks)


def _overlap_rank(rank: int) -> TraceBuilder:
    """A GEMM on stream 7 [20, 420) and an all_reduce on stream 20 [220, 620): half the
    GEMM ran beside the collective."""
    b = TraceBuilder(rank=rank, world_size=2)
    b.step(1, 0, 1000)
    b.gemm(stream=7, launch=10, start=20, dur=400, m=64, n=64, k=64)
    b.collective(stream=20, launch=12, start=220, dur=400, in_nelems=1024)
    return b


def test_gemms_and_collectives_keep_their_traced_kernel_and_gemms_their_overlap(tmp_path):
    _, _, data = _import(tmp_path / "t", [_overlap_rank(r) for r in range(2)])
    blocks = {b["op"]: b for b in data["patterns"][0]["blocks"]}
    gemm, ar = blocks["gemm"], blocks["all_reduce"]
    assert gemm["traced_overlap"] == 0.5
    assert gemm["traced_kernel"] == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    assert ar["traced_kernel"].startswith("ncclDevKernel_allreduce") and "traced_overlap" not in ar
    _, _, data = _import(tmp_path / "ddp", [ddp_rank(r) for r in range(2)])
    assert all("traced_overlap" not in b for b in data["patterns"][0]["blocks"])  # ran alone


def test_the_written_file_follows_the_umask(tmp_path):
    write_all([ddp_rank(0), ddp_rank(1)], tmp_path / "t")
    old = os.umask(0o027)
    try:
        assert cli.main(["import-trace", str(tmp_path / "t"), "-o", str(tmp_path / "x.yaml")]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "x.yaml").stat().st_mode & 0o777 == 0o640


def test_attention_kernels_are_busy_stand_ins_and_3d_linears_gemms(tmp_path):
    """A transformer layer's trace (bench/attention_trace_gpu.py makes a real one): the QKV
    projection is aten::linear on a [batch, seq, d] input, a GEMM of batch x seq rows; the
    flash attention kernels (forward, backward) replay as busy stand-ins of their duration."""
    b = TraceBuilder(rank=0, world_size=1, distributed=False)
    b.step(1, 0, 3000)
    dims = [[4, 2048, 2048], [6144, 2048], [6144]]
    strides = [[4194304, 2048, 1], [2048, 1], [1]]
    args = {"Input Dims": dims, "Input Strides": strides, "Input type": ["c10::BFloat16"] * 3}
    b.launch(stream=7, launch=10, start=20, dur=300, op="aten::linear", op_args=args,
             kernel="nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT")  # fmt: skip
    flash = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>(Params)"
    b.launch(stream=7, launch=20, start=321, dur=250, op="aten::_scaled_dot_product_flash_attention", kernel=flash)  # fmt: skip
    backward = "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>(Params)"
    b.launch(stream=7, launch=30, start=572, dur=600, op="aten::_scaled_dot_product_flash_attention_backward", kernel=backward)  # fmt: skip
    imp, _, data = _import(tmp_path / "t", [b])
    gemm, attention = data["patterns"][0]["blocks"]
    assert (gemm["op"], gemm["m"], gemm["n"], gemm["k"]) == ("gemm", 8192, 6144, 2048)
    assert gemm["b_transposed"] is True
    # Consecutive stand-ins merge: first start to last end of both kernels.
    assert (attention["op"], attention["duration_us"]) == ("busy", 851.0)
    text = render(imp, name="t", command="python -m userbenchmark.maestro import-trace")
    assert (
        "# 2 kernel(s): _scaled_dot_product_flash_attention, "
        "_scaled_dot_product_flash_attention_backward"
    ) in text
    assert coverage(imp).stand_in_us == pytest.approx(850)
