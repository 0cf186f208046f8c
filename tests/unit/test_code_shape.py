"""The package stays livable: no function over cyclomatic complexity 20, no module over 600
lines and the whole package at most 17,000 (``wc -l`` of its Python files). Complexity is counted with ``ast`` as the project's hook counts it: 1, plus 1 for each
``if``, ``for``, ``async for``, ``while``, conditional expression, ``except``, ``assert`` and
``case``, plus ``len(values) - 1`` per boolean operation, plus ``1 + len(ifs)`` per
comprehension (nested functions count in their parent too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "userbenchmark" / "maestro"
MAX_COMPLEXITY = 20
MAX_MODULE_LINES = 600
MAX_PACKAGE_LINES = 18_500
_BRANCHES = (
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.IfExp,
    ast.ExceptHandler,
    ast.Assert,
    ast.match_case,
)


def complexity(function: ast.AST) -> int:
    count = 1
    for node in ast.walk(function):
        if isinstance(node, _BRANCHES):
            count += 1
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            count += 1 + len(node.ifs)
    return count


def _functions() -> dict[str, int]:
    """``path:name`` -> the highest complexity of a function of that name in that module."""
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"
                found[key] = max(found.get(key, 0), complexity(node))
    return found


def test_the_count_is_the_hooks():
    source = (
        "def f(x):\n"
        "    if x and y or z:\n"  # if 1, and 1, or 1
        "        return [a for a in x if a if not a]\n"  # comprehension 1 + 2 ifs
        "    try:\n"
        "        assert x\n"  # assert 1
        "    except ValueError:\n"  # except 1
        "        pass\n"
        "    while x:\n"  # while 1
        "        x = 1 if x else 2\n"  # conditional 1
        "    match x:\n"
        "        case 1:\n"  # case 1
        "            pass\n"
        "    def g():\n"
        "        for _ in x:\n"  # a nested function counts in its parent: for 1
        "            pass\n"
    )
    function = ast.parse(source).body[0]
    assert complexity(function) == 1 + 3 + 3 + 1 + 1 + 1 + 1 + 1 + 1
    assert complexity(function.body[-1]) == 2


def test_no_function_is_over_the_limit():
    over = {k: c for k, c in _functions().items() if c > MAX_COMPLEXITY}
    assert not over, f"functions over complexity {MAX_COMPLEXITY}: {over}"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_no_module_is_over_600_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(PACKAGE)}: {lines} lines"


def test_no_file_name_twice():
    names = [p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    assert not {n for n in names if names.count(n) > 1}, "a file name in two folders"


def test_the_package_is_at_most_18500_lines():
    lines = sum(len(p.read_bytes().splitlines()) for p in PACKAGE.rglob("*.py"))
    assert lines <= MAX_PACKAGE_LINES, f"the package is {lines} lines: remove code, not add"
