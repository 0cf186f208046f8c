"""The fenced ``bash`` blocks of the docs, read so that tests run their commands as written.

A block may be preceded by one marker line saying how tests treat it (an HTML comment, which
a rendered page does not show):

- none: every command runs as written and exits 0, or N where its comment says ``# exits N``
  (``# exits 0, or 1 when ...``: either);
- ``<!-- doc-test: skip: REASON -->``: not run, with the reason (a GPU, a cluster, ...);
- ``<!-- doc-test: run by TEST_FILE -->``: TEST_FILE reads this block and runs its commands
  (with what it states it changes, such as a free port);
- ``<!-- doc-test: synopsis -->``: usage lines with placeholders; each option they name must be
  in the command's ``--help``;
- ``<!-- doc-test: run with OPTIONS -->``: run with OPTIONS (``--name value`` pairs) replacing
  the value of the same option in each command, or appended to it: the small sizes the page
  itself says a CPU run uses.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))


def user_checkout(folder: Path, *top_files: str) -> Path:
    """``folder`` made a checkout of what a user runs, outside this repository: the package
    (without caches or a run's metrics files) and ``top_files`` beside it."""
    folder.mkdir()
    for name in top_files:
        shutil.copy2(ROOT / name, folder)
    shutil.copytree(
        ROOT / "userbenchmark",
        folder / "userbenchmark",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".userbenchmark"),
    )
    return folder


_MARKER = re.compile(
    r"<!--\s*doc-test:\s*(?P<kind>skip|synopsis|run with|run by)\s*:?\s*(?P<text>.*?)\s*-->"
)
_EXITS = re.compile(r"#.*\bexits (\d+(?:,? or \d+)*)")


@dataclass(frozen=True, kw_only=True)
class BashBlock:
    """One fenced bash block: where it is, its marker and its commands (continuations joined)."""

    page: Path
    line: int
    kind: str  # "run", "skip", "synopsis", "run with" or "run by"
    text: str  # the skip reason, the options of "run with" or the test file of "run by"
    commands: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def bash_blocks(page: Path) -> list[BashBlock]:
    """Every ```bash block of ``page``, in order."""
    lines = page.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        previous = lines[i - 1].strip() if i else ""
        marker = _MARKER.fullmatch(previous)
        body = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j])
            j += 1
        blocks.append(
            BashBlock(
                page=page,
                line=i + 1,
                kind=marker["kind"] if marker else "run",
                text=marker["text"] if marker else "",
                commands=tuple(_logical_lines(body)),
            )
        )
        i = j + 1
    return blocks


def _logical_lines(body: list[str]) -> list[str]:
    commands, pending = [], ""
    for raw in body:
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            commands.append(command)
    return commands


def documented_statuses(command: str) -> frozenset[int]:
    """{0}, or the statuses the command's comment gives: ``# exits 2``, ``# exits 0, or 1 when
    ...`` (a comparison of two noisy runs may or may not find a regression)."""
    found = _EXITS.search(command)
    if not found:
        return frozenset({0})
    return frozenset(int(n) for n in re.findall(r"\d+", found.group(1)))


def run_documented(
    command: str, *, cwd: Path, env: dict[str, str], hang_s: float, where: str = ""
) -> subprocess.CompletedProcess[str]:
    """``command`` run in bash as a user would; asserts an exit status its page gives it and
    no traceback. ``hang_s`` catches a hang, not slowness."""
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=hang_s,
        stdin=subprocess.DEVNULL,
    )
    status = documented_statuses(command)
    assert done.returncode in status, (
        f"{where}: `{command}` exited {done.returncode}, documented {sorted(status)}\n"
        f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    assert "Traceback" not in done.stderr, f"{where}: `{command}`\n{done.stderr[-4000:]}"
    return done


def with_options(command: str, options: str) -> str:
    """``command`` with each ``--name value`` of ``options`` replacing that option's value, or
    appended to the command (before its comment) where it has no such option."""
    code, hash_, comment = command.partition(" #")
    words = shlex.split(code)
    extra = shlex.split(options)
    for name, value in zip(extra[::2], extra[1::2], strict=True):
        if name in words:
            words[words.index(name) + 1] = value
        else:
            words += [name, value]
    return shlex.join(words) + (f" {hash_}{comment}" if hash_ else "")


def launchers_here(bin_dir: Path) -> None:
    """``python`` and ``torchrun`` in ``bin_dir`` that run this interpreter, in its environment:
    scripts that exec it by the path it was started as (a symlink would not do: a virtual
    environment's python found through a link from elsewhere no longer sees its packages).
    ``torchrun`` is ``python -m torch.distributed.run``, the program its console script starts,
    so a console script whose first line names an interpreter that is gone (a Python image
    whose packages were installed elsewhere) does not decide what the docs' commands do."""
    python = shlex.quote(sys.executable)
    for name, argv in (("python", python), ("torchrun", f"{python} -m torch.distributed.run")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        (bin_dir / name).chmod(0o755)
