"""Every ``validate`` command that docs/pattern-format.md shows runs as written and exits with
the status the page documents: 0, unless the command's own comment says ``exits N``."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "pattern-format.md"
PREFIX = "python -m userbenchmark.maestro validate"


def validate_examples(text: str) -> list[tuple[str, int]]:
    """(command, documented exit status) of each validate command in the page's code blocks,
    comment lines of YAML examples included (``#   python -m ...``)."""
    examples = []
    in_code = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            continue
        command = line.strip().lstrip("#").strip()
        if not command.startswith(PREFIX):
            continue
        command, _, comment = command.partition(" #")
        status = re.search(r"exits (\d+)", comment)
        examples.append((command.strip(), int(status.group(1)) if status else 0))
    return examples


EXAMPLES = validate_examples(PAGE.read_text())


def test_the_page_shows_validate_examples():
    assert len(EXAMPLES) >= 3, EXAMPLES


@pytest.mark.parametrize(("command", "status"), EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_validate_example_runs_as_documented(command, status):
    argv = [sys.executable, *shlex.split(command)[1:]]
    # The limit catches a hang, not speed: validate takes 2-15 s on a loaded machine.
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == status, f"{command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr
