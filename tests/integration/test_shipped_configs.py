"""Every shipped pattern file validates at each world size its header states and runs on CPU.

Each file in ``configs/`` must have a header line ``# World size: N (also runs at: A, B)``
(the part in parentheses only where other sizes work). The runs use ``--max-size 64K`` so real
model sizes fit a CPU; ``--no-baseline`` keeps the isolated re-runs (covered by test_run_cpu.py)
out of this file's time budget. Each file runs at the smallest stated world size of at least 2:
files fixed at 8 ranks (their shapes assume it) run at 8, the others at 2.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from userbenchmark.maestro.core.config.capping import apply_max_size
from userbenchmark.maestro.core.config.loader import CONFIGS_DIR, load_suite

from .helpers import QUICK_HANG_S, RUN_HANG_S, read_records, run_maestro

pytestmark = pytest.mark.integration

MAX_SIZE_BYTES = 64 * 1024
_HEADER_RE = re.compile(r"^# World size: (\d+)(?: \(also runs at: ([0-9, ]+))?", re.MULTILINE)
CONFIGS = sorted(CONFIGS_DIR.glob("*.yaml"))


def stated_world_sizes(path: Path) -> tuple[int, ...]:
    """(stated, *also runs at) from the file's header; () when the header has no such line."""
    match = _HEADER_RE.search(path.read_text())
    if match is None:
        return ()
    more = [int(n) for n in re.findall(r"\d+", match.group(2) or "")]
    return (int(match.group(1)), *more)


def run_world_size(path: Path) -> int:
    sizes = stated_world_sizes(path)
    return min(n for n in sizes if n >= 2)


def _validate_params() -> list:
    params = []
    for path in CONFIGS:
        sizes = stated_world_sizes(path) or (None,)
        for n in sizes:
            params.append(pytest.param(path, n, id=f"{path.stem}-{n}"))
    return params


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


@pytest.mark.parametrize(("path", "world_size"), _validate_params())
def test_shipped_config_validates_at_each_stated_world_size(path, world_size):
    assert world_size is not None, (
        f"{path.name}: the header must state the world size in a line "
        "'# World size: N (also runs at: A, B)'"
    )
    suite = load_suite(path, world_size=world_size)
    assert suite.world_size == world_size
    assert suite.name == path.stem  # `-c NAME` and the metric keys' suite name agree
    # The CLI's validate command agrees (exit 0, a summary).
    proc = run_maestro(
        ["validate", path.stem, "--world-size", str(world_size)], timeout=QUICK_HANG_S
    )
    assert proc.returncode == 0, proc.stderr
    assert f"suite {suite.name}" in proc.stdout


def test_a_fixed_world_size_in_the_file_matches_the_header():
    for path in CONFIGS:
        sizes = stated_world_sizes(path)
        fixed = re.search(r"^world_size:\s*(\d+)", path.read_text(), re.MULTILINE)
        if fixed:
            assert sizes == (int(fixed.group(1)),), f"{path.name}: header says {sizes}"


def test_moe_capacity_factor_changes_the_shapes():
    # cf 1.25 must scale the all_to_all size and the expert GEMMs' M by exactly 1.25.
    for name, world_size in (("moe", 8), ("moe_4", 4)):
        suite = load_suite(name, world_size=world_size)
        low, high = (next(p for p in suite.patterns if p.name == n) for n in ("cf1.0", "cf1.25"))
        for block in low.blocks:
            other = high.block(block.name)
            key = "size" if block.op == "all_to_all" else "m"
            assert other.params[key] * 4 == block.params[key] * 5, (name, block.name)


def _run_cpu(path: Path, out: Path, *, nproc: int, env: dict[str, str] | None = None) -> None:
    """The documented CPU smoke run of a shipped file; asserts exit status 0."""
    proc = run_maestro(
        [
            "run",
            "-c",
            path.stem,
            "--nproc",
            str(nproc),
            "--max-size",
            "64K",
            "--iters",
            "2",
            "--warmup-iters",
            "1",
            "--no-baseline",
            "--output-dir",
            str(out),
            "--no-metrics",
        ],
        env=env,
        timeout=RUN_HANG_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory):
    """Results folder of each shipped file's CPU run, run once per module (the NCCL recipe test
    reuses the nccl_algo_compare run as its NCCL_ALGO=Ring side)."""
    done: dict[str, Path] = {}

    def get(path: Path) -> Path:
        if path.stem not in done:
            out = tmp_path_factory.mktemp(path.stem) / "out"
            _run_cpu(path, out, nproc=run_world_size(path), env={"NCCL_ALGO": "Ring"})
            done[path.stem] = out
        return done[path.stem]

    return get


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_runs_on_cpu(cpu_runs, path):
    nproc = run_world_size(path)
    out = cpu_runs(path)
    expected = apply_max_size(load_suite(path, world_size=nproc), MAX_SIZE_BYTES)
    records = read_records(out)
    got = {(r["pattern"], r["block"]) for r in records}
    assert got == {(p.name, b.name) for p in expected.patterns for b in p.blocks}
    for record in records:
        assert record["team_size"] <= nproc
        assert record["iters"] == 2
        assert record["latency_avg_us"] > 0
        if record["size_bytes"] is not None:
            assert record["size_bytes"] <= MAX_SIZE_BYTES


def test_nccl_algo_recipe_runs_and_compares(cpu_runs, tmp_path):
    # docs/recipes.md: the same file under NCCL_ALGO=Ring and NCCL_ALGO=Tree, then `compare`.
    # gloo ignores NCCL_ALGO; this checks that the recipe's commands and files fit together.
    path = CONFIGS_DIR / "nccl_algo_compare.yaml"
    ring = cpu_runs(path) / "results.json"
    tree = tmp_path / "tree"
    _run_cpu(path, tree, nproc=run_world_size(path), env={"NCCL_ALGO": "Tree"})
    proc = run_maestro(["compare", str(ring), str(tree / "results.json")], timeout=QUICK_HANG_S)
    # 0 or 1 (a regression between two noisy CPU runs); 2 would mean the files do not compare.
    assert proc.returncode in (0, 1), proc.stderr
    for key in ("ar_sweep[size=64K]/allreduce/busbw_gbps", "ar_gemm/gemm/tflops"):
        assert f"nccl_algo_compare/{key}" in proc.stdout
