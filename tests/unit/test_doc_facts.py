"""What README.md and docs/*.md state about the code holds: the files, modules and tests they
name exist, and their tables of columns, metrics and settings are those of the code."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from tests.docblocks import PAGES, ROOT
from userbenchmark.maestro.core.config.loader import CONFIGS_DIR
from userbenchmark.maestro.core.config.spec import SYNC_MODES
from userbenchmark.maestro.core.output import results
from userbenchmark.maestro.core.output.metric_keys import METRICS, metric_key

PACKAGE = ROOT / "userbenchmark" / "maestro"
DOCS = ROOT / "docs"
# Files of a run's output or of TorchBench's repository, named in the docs but not in this one.
NOT_HERE = (
    "out/",
    "runs/",
    ".userbenchmark/",
    "<root>/",
    "/tmp/",
    "userbenchmark/ADDING_USERBENCHMARKS.md",
    "userbenchmark/utils.py",
    ".github/scripts/userbenchmark/",
    "doc/PERFORMANCE.md",  # nccl-tests'
)
_PATH = re.compile(r"`([\w./<>-]*/[\w.<>-]+\.(?:py|yaml|md|sbatch|txt|toml|json))`")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_MODULE = re.compile(r"`(userbenchmark\.maestro(?:\.\w+)+)")


def _text(page: Path) -> str:
    return page.read_text()


def _exists(name: str, page: Path) -> bool:
    return any((base / name).exists() for base in (ROOT, PACKAGE, page.parent))


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_files_the_page_names_exist(page):
    text = _text(page)
    named = set(_PATH.findall(text)) | {
        link for link in _LINK.findall(text) if not link.startswith(("http:", "https:"))
    }
    missing = sorted(n for n in named if not n.startswith(NOT_HERE) and not _exists(n, page))
    assert not missing, f"{page.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_modules_the_page_names_exist(page):
    for dotted in set(_MODULE.findall(_text(page))):
        try:
            importlib.import_module(dotted)
        except ModuleNotFoundError:
            module, _, attribute = dotted.rpartition(".")
            assert hasattr(importlib.import_module(module), attribute), dotted


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_test_files_and_bench_scripts_the_page_names_exist(page):
    text = _text(page)
    tests = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    for name in set(re.findall(r"\b(test_\w+\.py)\b", text)):
        assert name in tests, f"{page.name} names {name}, which is no test file"
    for name in set(re.findall(r"\bbench[/.](\w+)", text)):
        assert (ROOT / "bench" / f"{name}.py").is_file(), f"{page.name}: bench/{name}.py"


def test_the_architecture_table_names_existing_modules():
    rows = [line for line in _text(DOCS / "architecture.md").splitlines() if line.startswith("| ")]
    checked = 0
    for row in rows[2:]:
        cells = re.split(r"(?<!\\)\|", row)  # `\|` inside a cell is no separator
        folders = [PACKAGE / f for f in re.findall(r"`([\w/]+/)`", cells[2])] or [PACKAGE]
        for name in re.findall(r"`(\w+\.py)`", row):
            assert any((folder / name).is_file() for folder in folders), (name, folders)
            checked += 1
    assert checked > 40


def test_the_results_api_dtype_table_is_that_of_load_results():
    stated: dict[str, str] = {}
    for line in _text(DOCS / "results-api.md").splitlines():
        match = re.match(r"\| (.+?) \| `(Int64|string|boolean|float64)`", line)
        if match and not match.group(1).startswith("every other"):
            for column in re.findall(r"`(\w+)`", match.group(1)):
                stated[column] = match.group(2)
            if "`<figure>_ci_df`" in match.group(1):
                for table in (results.BLOCK_COLUMNS, results.PATTERN_COLUMNS):
                    stated.update(
                        dict.fromkeys((c for c in table if c.endswith("_ci_df")), "Int64")
                    )
    code = {
        column: dtype
        for table in (results.BLOCK_COLUMNS, results.PATTERN_COLUMNS, results.PAIR_COLUMNS)
        for column, dtype in table.items()
        if dtype != "float64"
    }
    assert stated == code


def test_the_metrics_table_is_that_of_metric_keys():
    rows = {}
    for line in _text(DOCS / "torchbench.md").splitlines():
        match = re.match(r"\| `(\w+)` \| (block|pattern|pair) \| ([^|]+) \| ([^|]+) \|", line)
        if match:
            rows[match.group(1)] = [g.strip() for g in match.groups()[1:]]
    assert set(rows) == set(METRICS)
    for name, (level, better, floor) in rows.items():
        spec = METRICS[name]
        assert level == spec.level, name
        assert better == (spec.better or "neither"), name
        if spec.floor is None:
            expected = "not judged"
        elif spec.exact:
            expected = "exact: any increase"
        elif spec.absolute:
            expected = f"{spec.floor:g}" + (" µs" if name.endswith("_us") else "")
        else:
            expected = f"{spec.floor * 100:g} %"
        if spec.harness:  # shown, deciding nothing unless --judge-harness
            expected = "harness" if spec.floor is None else f"harness: {expected}"
        assert floor == expected, name


def test_the_sync_modes_are_those_of_the_loader():
    row = next(
        line
        for line in _text(DOCS / "pattern-format.md").splitlines()
        if line.startswith("| `sync`")
    )
    assert tuple(re.findall(r"`([\w-]+)`", row.split("|")[2])) == SYNC_MODES


@pytest.mark.parametrize("name", ["quickstart", "ag_rs"])
def test_shipped_files_shown_in_the_pattern_format_page_are_the_files(name):
    text = (CONFIGS_DIR / f"{name}.yaml").read_text().strip()
    assert f"```yaml\n{text}\n```" in _text(DOCS / "pattern-format.md")


def test_the_multi_gpu_page_lists_the_multi_gpu_tests():
    tree = ast.parse((ROOT / "tests" / "gpu" / "test_multi_gpu.py").read_text())
    tests = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name[:5] == "test_"}
    listed = set(re.findall(r"^\| `(test_\w+)", _text(DOCS / "multi-gpu.md"), re.MULTILINE))
    assert listed == tests


def test_pattern_names_the_docs_show_are_names_maestro_gives():
    # `@` is no legal name character: a sweep point is `ar_sweep[size=4M]`.
    shown = []
    for page in PAGES:
        text = _text(page)
        assert not re.search(r"`[\w.-]+@\w+", text), f"{page.name}: a name with '@'"
        shown += re.findall(r"\] pattern (\S+)", text)  # the progress line's example
        shown += re.findall(r"`([\w.-]+\[[\w.,=+-]+\])`", text)  # sweep points
    assert len(shown) >= 3, shown
    for name in shown:
        metric_key("quickstart", name, None, "makespan_avg_us")  # ValueError for a bad name


def test_the_readme_names_every_run_option():
    import click

    from userbenchmark.maestro import cli

    readme = _text(ROOT / "README.md")
    for param in cli.run_command.params:
        if isinstance(param, click.Option) and "--help" not in param.opts:
            named = any(f"`{o}" in readme for o in param.opts)
            assert named, f"README.md never names {param.opts}"
