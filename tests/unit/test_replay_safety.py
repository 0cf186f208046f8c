"""``import-trace`` on hostile or odd files: every size read from a trace bounded before use,
numbers typed, JSON nested past the decoder, names too long for the file system, files of other
profiling requests; each one ``maestro: invalid ...`` line, exit status 2, nothing written. And
what a big step must not cost: merges the loader accepts, block naming linear in the blocks,
coverage shares that sum to 100 %."""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

import pytest

from userbenchmark.maestro import cli
from userbenchmark.maestro.core.replay.emit import shares_in_tenths
from userbenchmark.maestro.core.replay.group_axes import Names, fresh_name
from userbenchmark.maestro.core.replay.kineto import TraceError, read_trace

from .replay_scenarios import ddp_rank
from .replay_traces import TraceBuilder
from .test_replay_import import by_op, imported
from .test_replay_validation import _kernel, _refused

pytestmark = pytest.mark.usefixtures("cli_here")  # tests/conftest.py
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "replay"


def _with_info(**info) -> TraceBuilder:
    b = ddp_rank(0, world=1)
    doc = b.document()
    doc["distributedInfo"].update(info)
    b.document = lambda: doc  # type: ignore[method-assign]
    return b


def test_a_world_size_of_2_to_the_40_is_refused_when_read(tmp_path, capsys):
    path = _with_info(world_size=2**40).write(tmp_path / "r")
    with pytest.raises(TraceError, match=r"distributedInfo.world_size is 1099511627776"):
        read_trace(path)  # before any set or team of that size exists
    err = _refused(tmp_path / "cli", capsys, [_with_info(world_size=2**40)])
    assert err.startswith("maestro: invalid trace: ") and "from 1 to 1048575" in err


def test_a_rank_past_the_bound_and_a_message_past_2_to_the_48_are_refused(tmp_path, capsys):
    assert "distributedInfo.rank" in _refused(tmp_path / "a", capsys, [_with_info(rank=2**30)])
    b = ddp_rank(0, world=1)
    comm = next(e for e in b.events if e["name"] == "record_param_comms")
    comm["args"]["In msg nelems"] = 2**60
    assert "In msg nelems 1152921504606846976" in _refused(tmp_path / "b", capsys, [b])


def _raw(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir(parents=True)
    (folder / "rank0.json").write_text(text)
    return folder


def _cli_refusal(capsys, *argv: str) -> str:
    status = cli.main(["import-trace", *argv])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("maestro: invalid "), err
    return err


def _json_of(b: TraceBuilder) -> str:
    return json.dumps(b.document())


def test_a_duration_of_10_to_the_400_is_refused_without_overflow(tmp_path, capsys):
    b = ddp_rank(0, world=1)
    _kernel(b, "elementwise")["dur"] = 12345.0
    text = _json_of(b).replace('"dur": 12345.0', '"dur": 1' + "0" * 400)
    err = _cli_refusal(capsys, str(_raw(tmp_path, text)), "-o", str(tmp_path / "o.yaml"))
    assert "has dur 1000000000000000000000000000000000000000: not finite" in err
    assert not (tmp_path / "o.yaml").exists()


def test_a_number_of_5000_digits_is_refused_in_one_line(tmp_path, capsys):
    """Python's decoder refuses integers past 4300 digits with a ValueError of its own."""
    text = _json_of(ddp_rank(0, world=1)).replace(
        '"ph": "X"', '"n": 1' + "0" * 5000 + ', "ph": "X"', 1
    )
    err = _cli_refusal(capsys, str(_raw(tmp_path, text)), "-o", str(tmp_path / "o.yaml"))
    assert "invalid JSON: Exceeds the limit (4300 digits)" in err


def test_json_nested_100000_deep_is_refused_in_one_line(tmp_path, capsys):
    deep = "[" * 100_000 + "]" * 100_000
    text = _json_of(ddp_rank(0, world=1)).replace('"traceEvents": [', f'"traceEvents": [{deep}, ')
    err = _cli_refusal(capsys, str(_raw(tmp_path, text)), "-o", str(tmp_path / "o.yaml"))
    assert "nested deeper than" in err


def test_a_path_component_over_255_characters_is_refused_in_one_line(tmp_path, capsys):
    long = tmp_path / ("x" * 300) / "rank0.json"
    err = _cli_refusal(capsys, str(long), "-o", str(tmp_path / "o.yaml"))
    assert "cannot be read (File name too long)" in err and len(err) < 300
    traces = ddp_rank(0, world=1).write(tmp_path / "t")
    err = _cli_refusal(capsys, str(traces), "-o", str(tmp_path / ("y" * 300) / "o.yaml"))
    assert "too long" in err


@pytest.mark.parametrize(
    ("value", "why"),
    [("12", "not a number (a JSON number of µs)"), (True, "not a number"), (-3, "negative")],
)
def test_a_duration_must_be_a_number_of_microseconds(tmp_path, capsys, value, why):
    b = ddp_rank(0, world=1)
    _kernel(b, "elementwise")["dur"] = value
    err = _refused(tmp_path, capsys, [b])
    assert f"has dur {value!r}: {why}" in err and "lacks a field" not in err


def test_files_of_different_profiling_requests_are_refused(tmp_path, capsys):
    """Every rank of one on-demand request shares its group_trace_id (each rank's own trace_id
    is drawn per process, so it differs between the ranks of one run: not checked)."""
    ranks = [ddp_rank(0), ddp_rank(1)]
    for rank, gid in zip(ranks, ("A1", "B2"), strict=True):
        doc = rank.document() | {"group_trace_id": gid, "trace_id": f"T{gid}"}
        rank.document = lambda doc=doc: doc  # type: ignore[method-assign]
    err = _refused(tmp_path, capsys, ranks)
    assert "different group_trace_ids" in err and "A1" in err and "B2" in err


def test_merged_stand_ins_never_exceed_what_the_loader_accepts(tmp_path):
    """2,100 back-to-back 50 µs kernels (105 ms) were one busy block the loader refuses."""
    b = TraceBuilder(rank=0, world_size=1)
    b.step(1, 0, 120_000)
    for i in range(2100):
        b.launch(stream=7, launch=i, start=100 + 50 * i, dur=50)
    _, _, data = imported(tmp_path / "m", [b])
    durations = [blk["duration_us"] for blk in by_op(data, "busy")]
    assert len(durations) == 2 and max(durations) <= 100_000 and sum(durations) == 105_000


class _Counted(Names):
    checks = 0

    def __contains__(self, name: object) -> bool:
        type(self).checks += 1
        return super().__contains__(name)


def test_naming_blocks_is_linear_in_their_number():
    """100,000 GEMMs named gemm, gemm_2, ...: each name costs a few look-ups, not one per name
    taken before it (the old loop was quadratic: 8,000 kernels took 8.8 s)."""
    taken = _Counted()
    names = [fresh_name("gemm", taken) for _ in range(100_000)]
    assert names[:3] == ["gemm", "gemm_2", "gemm_3"] and names[-1] == "gemm_100000"
    assert _Counted.checks <= 3 * 100_000
    taken.add("ar_2")  # a name taken by hand is skipped
    assert [fresh_name("ar", taken) for _ in range(3)] == ["ar", "ar_3", "ar_4"]


def test_coverage_shares_sum_to_exactly_100_percent():
    rng = random.Random(7)
    for _ in range(2000):
        parts = [rng.choice((0.0, rng.uniform(0, 1e6), rng.uniform(0, 10))) for _ in range(4)]
        tenths = shares_in_tenths(parts)
        assert sum(tenths) == (1000 if sum(parts) > 0 else 0), parts
        exact = [1000 * p / sum(parts) for p in parts] if sum(parts) else [0] * 4
        assert all(abs(t - e) < 1 for t, e in zip(tenths, exact, strict=True))
    # The lines once pinned at 99.9 % and 100.1 %, and every golden file's.
    assert shares_in_tenths([1800, 1600, 260, 40]) == [487, 432, 70, 11]
    for golden in GOLDEN.glob("*.yaml"):
        header = " ".join(line[1:].strip() for line in golden.read_text().splitlines()[:40])
        line = re.search(r"Coverage of the step's GPU time .*?dropped [\d.]+ %", header)[0]
        shares = re.findall(r"(?:GEMMs|collectives|stand-ins|dropped) ([\d.]+) %", line)
        assert round(sum(map(float, shares)), 1) == 100.0, golden.name


def test_gzip_input_is_read_the_same(tmp_path):
    """The safety limits hold for compressed files too (the reader streams both)."""
    path = _with_info(world_size=2**40).write(tmp_path)
    assert gzip.decompress(path.read_bytes()).startswith(b"{")
    with pytest.raises(TraceError):
        read_trace(path)
