"""Real traces made elsewhere (tests/data/corpus/README.md: other GPUs and torch releases, one
rank of bigger jobs, no ProfilerStep, no shapes, old record_param_comms), each imported as a
user would: refused with one line naming what to do, then imported with that option, with
what its kind of trace must show. A file not in this checkout is skipped (the README says
where each comes from)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from userbenchmark.maestro.core.config.loader import load_suite_text
from userbenchmark.maestro.core.replay.emit import coverage, render, shares_in_tenths
from userbenchmark.maestro.core.replay.importer import ImportOptions, import_traces
from userbenchmark.maestro.core.replay.kineto import TraceError

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"
ENTRIES = json.loads((CORPUS / "corpus.json").read_text())
FILES = Path(os.environ.get("MAESTRO_TRACE_CORPUS", CORPUS))
"""Where the files are: tests/data/corpus, or a folder named by MAESTRO_TRACE_CORPUS."""


def _path(entry: dict) -> str:
    path = FILES / entry["file"]
    if not path.is_file():
        pytest.skip(f"{entry['file']} is not in this checkout (tests/data/corpus/README.md)")
    return str(path)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"].split(".")[0] for e in ENTRIES])
def test_a_real_trace_imports_or_says_what_to_do(entry):
    path, expect = _path(entry), entry["expect"]
    if entry["refused_without"]:
        with pytest.raises(TraceError, match="--world-size N") as refusal:
            import_traces([path])
        assert entry["refused_without"] in str(refusal.value)
    options = ImportOptions(**entry["options"])
    if "refused" in expect:
        with pytest.raises(TraceError, match=expect["refused"]):
            import_traces([path], options)
        return
    imp = import_traces([path], options)
    text = render(imp, name="corpus", command="python -m userbenchmark.maestro import-trace")
    header = " ".join(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    assert imp.step_name == expect["step"]
    assert len(imp.steps_used) == expect.get("steps_used", 1)
    assert all(
        words in text.replace("\n#     ", " ").replace("\n#   ", " ")
        for words in expect.get("contains", ())
    )
    data = yaml.safe_load(text)
    ops = {
        op: sum(b["op"] == op for b in data["patterns"][0]["blocks"])
        for op in expect.get("ops", {})
    }
    assert ops == expect.get("ops", {})
    world = entry["options"].get("world_size", 1)
    assert data["world_size"] == world and load_suite_text(text).world_size == world
    cover = coverage(imp)
    parts = (cover.gemm_us, cover.comm_us, cover.stand_in_us, cover.dropped_us)
    assert sum(shares_in_tenths(parts)) == 1000 and cover.line()[1:] in header


def test_the_readme_lists_every_file_with_its_source_and_licence():
    readme = (CORPUS / "README.md").read_text()
    for entry in ENTRIES:
        assert f"`{entry['file']}`" in readme and entry["source"] in readme
        assert entry["licence"] in ("MIT", "BSD-3-Clause")
