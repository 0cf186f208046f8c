"""Every shipped pattern file validates at each world size its header states, also capped to
CPU sizes, and one of them runs on CPU.

Each file in ``configs/`` must have a header line ``# World size: N (also runs at: A, B)``
(the part in parentheses only where other sizes work). The files share one code path, so one
run stands for all (``fsdp`` at 2 ranks: ``like`` axes, collectives beside GEMMs; the
``shipped_run`` fixture of tests/conftest.py, whose folders test_run_outputs.py checks too;
meshes and every op run in test_run_cpu.py); the documented commands run more of them
(``docs/recipes.md``: ``nccl_algo_compare`` and ``data_parallel``; the README and
``docs/outputs-trace-plot.md``: ``quickstart``).
"""

from __future__ import annotations

import re

import pytest

from userbenchmark.maestro.blocks.registry import resolve_op
from userbenchmark.maestro.core.config.loader import CONFIGS_DIR, listed_world_sizes, load_suite
from userbenchmark.maestro.core.config.options import RunOptions, apply_max_size, apply_overrides

from .helpers import read_records

pytestmark = pytest.mark.integration

MAX_SIZE_BYTES = 64 * 1024
CONFIGS = sorted(CONFIGS_DIR.glob("*.yaml"))


def test_configs_folder_has_the_shipped_patterns():
    names = {p.stem for p in CONFIGS}
    expected = {
        "quickstart",
        "ag_rs",
        "fsdp",
        "tensor_parallel",
        "tensor_parallel_4",
        "data_parallel",
        "moe",
        "moe_4",
        "pipeline",
        "qos",
        "nccl_algo_compare",
    }
    assert expected <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_validates_at_each_stated_world_size(path):
    sizes = listed_world_sizes(path)
    assert sizes, (
        f"{path.name}: the header must state the world size in a line "
        "'# World size: N (also runs at: A, B)'"
    )
    fixed = re.search(r"^world_size:\s*(\d+)", path.read_text(), re.MULTILINE)
    if fixed:
        assert sizes == (int(fixed.group(1)),), f"{path.name}: header says {sizes}"
    for world_size in sizes:
        suite = load_suite(path, world_size=world_size)
        assert suite.world_size == world_size
        assert suite.name == path.stem  # `-c NAME` and the metric keys' suite name agree
        # What the CPU runs of the docs and tests use: every message fits --max-size 64K.
        capped = apply_max_size(suite, MAX_SIZE_BYTES)
        for pattern in capped.patterns:
            for block in pattern.blocks:
                size = resolve_op(block.op).message_size_bytes(block.params)
                assert size is None or size <= MAX_SIZE_BYTES, (world_size, block.name, size)


def test_moe_capacity_factor_changes_the_shapes():
    # cf 1.25 must scale the all_to_all size and the expert GEMMs' M by exactly 1.25.
    for name, world_size in (("moe", 8), ("moe_4", 4)):
        suite = load_suite(name, world_size=world_size)
        low, high = (next(p for p in suite.patterns if p.name == n) for n in ("cf1.0", "cf1.25"))
        for block in low.blocks:
            other = next(b for b in high.blocks if b.name == block.name)
            key = "size" if block.op == "all_to_all" else "m"
            assert other.params[key] * 4 == block.params[key] * 5, (name, block.name)


def test_a_shipped_config_runs_on_cpu(shipped_run):
    # The documented CPU smoke run of a shipped file: capped sizes, few iterations. What ran is
    # what the loader makes of the file with the run's own options, block for block.
    path = CONFIGS_DIR / f"{shipped_run.config}.yaml"
    nproc = shipped_run.nproc
    assert nproc in listed_world_sizes(path)
    assert shipped_run.proc.returncode == 0, shipped_run.proc.stderr[-3000:]
    options = RunOptions(max_size_bytes=MAX_SIZE_BYTES, iters=2, warmup_iters=1, baseline=False)
    expected = apply_overrides(load_suite(path, world_size=nproc), options)
    blocks = {(p.name, b.name): (p, b) for p in expected.patterns for b in p.blocks}
    records = read_records(shipped_run.out)
    assert {(r["pattern"], r["block"]) for r in records} == set(blocks)
    for record in records:
        pattern, block = blocks[record["pattern"], record["block"]]
        size = resolve_op(block.op).message_size_bytes(block.params)
        assert (record["op"], record["axis"], record["work"]) == (block.op, block.axis, block.work)
        assert record["team_size"] == expected.axes[block.axis].team_size
        assert record["iters"] == pattern.num_iters == 2
        assert record["size_bytes"] == size and (size is None or size <= MAX_SIZE_BYTES)
        assert record["latency_avg_us"] > 0
