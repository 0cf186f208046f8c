"""The streaming trace reader: the same records whatever the chunking, and a clear TraceError
(file and what is wrong) for every file that is not a readable Kineto trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from userbenchmark.maestro.core.replay import kineto
from userbenchmark.maestro.core.replay.kineto import TraceError, iter_trace_files, read_trace

from .replay_scenarios import ddp_rank

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
REAL = DATA / "tp_dp_4ranks" / "rank0.json.gz"


def _summary(trace: kineto.RankTrace) -> tuple:
    return (
        trace.rank,
        trace.world_size,
        trace.groups,
        trace.annotations,
        trace.device,
        len(trace.steps),
        sorted(trace.launches.items()),
        trace.activities,
        sorted(trace.comms.items()),
        sorted(trace.gemms.items()),
        trace.syncs,
    )


def test_tiny_chunks_read_the_same_records(monkeypatch):
    whole = read_trace(REAL)
    monkeypatch.setattr(kineto, "CHUNK_CHARS", 97)  # numbers and strings cut at every turn
    assert _summary(read_trace(REAL)) == _summary(whole)


def test_records_match_the_json(tmp_path):
    doc = json.loads(gzip.decompress(REAL.read_bytes()))
    trace = read_trace(REAL)
    events = doc["traceEvents"]
    spans = [e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"]
    assert len(trace.steps) + len(trace.annotations) == len(spans)
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert sum(map(len, trace.activities.values())) == len(kernels)
    comms = [e for e in events if e.get("name") == "record_param_comms"]
    assert len(trace.comms) == len(comms)
    assert trace.world_size == 4 and trace.rank == 0
    assert trace.gemms and all(op.dims for op in trace.gemms.values())
    assert {g.desc: g.ranks for g in trace.groups}["mesh_dp"] == (0, 2)
    rec = next(r for r in trace.comms.values() if r.name == "_allgather_base")
    assert (rec.group_desc, rec.group_ranks, rec.dtype) == ("mesh_dp", (0, 2), "BFloat16")
    assert rec.out_nelems == 2 * rec.in_nelems


def test_top_level_keys_after_the_events_are_read(tmp_path):
    doc = ddp_rank(1).document()
    reordered = {"traceEvents": doc.pop("traceEvents"), **doc}
    path = tmp_path / "rank1.json"
    path.write_text(json.dumps(reordered))
    trace = read_trace(path)
    assert (trace.rank, trace.world_size, trace.distributed) == (1, 2, True)


def test_plain_and_gzip_files_read_alike(tmp_path):
    plain = ddp_rank(0).write(tmp_path / "plain", gz=False)
    packed = ddp_rank(0).write(tmp_path / "gz", gz=True)
    assert _summary(read_trace(plain))[1:] == _summary(read_trace(packed))[1:]


def _bad(tmp_path: Path, name: str, content: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def _truncated_gzip(tmp_path: Path) -> Path:
    data = gzip.compress(json.dumps(ddp_rank(0).document()).encode())
    return _bad(tmp_path, "cut.json.gz", data[: len(data) // 2])


def _corrupt_gzip(tmp_path: Path) -> Path:
    data = bytearray(gzip.compress(json.dumps(ddp_rank(0).document()).encode()))
    data[len(data) // 2 : len(data) // 2 + 64] = b"\x00" * 64
    return _bad(tmp_path, "corrupt.json.gz", bytes(data))


def _cut_json(tmp_path: Path) -> Path:
    text = json.dumps(ddp_rank(0).document())
    return _bad(tmp_path, "cut.json", text[: len(text) // 2].encode())


BAD_FILES = {
    "not json": (lambda p: _bad(p, "a.json", b"hello world"), "not a torch.profiler"),
    "empty": (lambda p: _bad(p, "a.json", b""), "not a torch.profiler"),
    "a list": (lambda p: _bad(p, "a.json", b"[1, 2]"), "not a JSON object"),
    "no events": (lambda p: _bad(p, "a.json", b'{"schemaVersion": 1}'), "no traceEvents"),
    "another chrome trace": (
        lambda p: _bad(
            p,
            "trace.json",
            json.dumps(
                {"traceEvents": [{"ph": "X", "cat": "block", "name": "ag", "ts": 1, "dur": 2}]}
            ).encode(),
        ),
        "no CPU op or CUDA event",
    ),
    "truncated gzip": (_truncated_gzip, "cut short (truncated)"),
    "corrupt gzip": (_corrupt_gzip, "corrupt gzip"),
    "truncated json": (_cut_json, "not valid JSON"),
    "not utf-8": (lambda p: _bad(p, "a.json", b'{"traceEvents": ["\xff\xfe"]}'), "UTF-8"),
    "bad event field": (
        lambda p: _bad(
            p,
            "a.json",
            json.dumps(
                {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "args": {}}]}
            ).encode(),
        ),
        "lacks a field",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_are_refused_naming_the_file(tmp_path, case):
    make, expected = BAD_FILES[case]
    path = make(tmp_path)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    assert expected in message
    assert str(path) in message
    assert "\n" not in message


def test_missing_file_and_empty_folder(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "absent.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="holds no .json or .json.gz"):
        list(iter_trace_files([str(tmp_path / "empty")]))


def test_a_folder_lists_its_trace_files_sorted(tmp_path):
    for name in ("rank1.json.gz", "rank0.json", "notes.txt"):
        (tmp_path / name).write_text("x")
    assert [p.name for p in iter_trace_files([str(tmp_path)])] == ["rank0.json", "rank1.json.gz"]
