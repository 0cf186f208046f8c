"""Error types: ConfigError for bad pattern files, OptionError for bad command-line options,
LaunchError for bad launcher variables, RunError for failures while measuring."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
"""Process exit statuses: success, a failed pattern or comparison, invalid input, interrupted."""


class MaestroError(Exception):
    """Base class of every error maestro raises on purpose."""


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a pattern file: where it is (file, YAML path, line) and what is wrong."""

    message: str
    path: str = ""
    file: str = ""
    line: int | None = None

    def __str__(self) -> str:
        where = (self.file or "<config>") + ("" if self.line is None else f":{self.line}")
        parts = (where, self.path, self.message) if self.path else (where, self.message)
        return ": ".join(map(printable, parts))


class ConfigError(MaestroError, ValueError):
    """A pattern file is invalid; carries every issue found."""

    def __init__(
        self,
        issues: list[ConfigIssue] | str,
        *,
        path: str = "",
        file: str = "",
        line: int | None = None,
    ) -> None:
        if isinstance(issues, str):
            issues = [ConfigIssue(issues, path=path, file=file, line=line)]
        self.issues: tuple[ConfigIssue, ...] = tuple(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class RunError(MaestroError, RuntimeError):
    """A failure while running: names the rank, phase, pattern and block where it happened."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        phase: str = "",
        pattern: str = "",
        block: str = "",
        contained: bool = False,
        missing: tuple[int, ...] | None = None,
        interrupted: bool = False,
    ) -> None:
        self.rank, self.phase, self.pattern, self.block = rank, phase, pattern, block
        self.detail = message
        # contained: every communicator is still usable (the agreement step says; False when
        # unknown); missing: ranks that never reached it (None: no agreement took place).
        self.contained = contained
        self.missing = missing
        self.interrupted = interrupted
        where = [f"rank {rank}"] if rank is not None else []
        where += [f"phase {phase}"] if phase else []
        where += [f"pattern {pattern!r}"] if pattern else []
        where += [f"block {block!r}"] if block else []
        super().__init__(f"{', '.join(where)}: {message}" if where else message)

    @property
    def everyone_answered(self) -> bool:
        """Every rank reached the agreement step, so knows this error."""
        return self.missing == ()


class OptionError(MaestroError, ValueError):
    """A command-line option is invalid, or cannot work on this machine (exit status 2)."""


class LaunchError(MaestroError, ValueError):
    """The launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK, SLURM_*, MASTER_*) cannot describe
    a run (exit status 2, before any worker starts)."""


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on escaped as Python writes it
    (``\\x1b``, ``\\n``): a user's string in a message can neither move the cursor, clear the
    screen, nor start a line of its own."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def user_error_message(err: ConfigError | OptionError | LaunchError) -> str:
    """The one message an input error prints (exit status 2): what kind, then what and where
    (one line but for a ConfigError's one line per problem)."""
    if isinstance(err, ConfigError):
        return f"maestro: invalid configuration:\n{err}"
    kind = "launch environment" if isinstance(err, LaunchError) else "option"
    return f"maestro: invalid {kind}: {printable(str(err))}"


def cause_of(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line (the first of a long C++ message, without its
    ``[enforce fail at file:line]`` prefix); ``SystemExit`` says which call raised it."""
    if isinstance(exc, SystemExit):
        return f"sys.exit({exc.code!r})"
    lines = str(exc).strip().splitlines()
    text = re.sub(r"^\[enforce fail at [^\]]*\]\s*", "", lines[0]) if lines else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


STREAM_GONE = (BrokenPipeError, ConnectionResetError, ValueError, OSError)
"""What writing to a stream whose reader went away raises (ValueError: a closed file)."""


def say(line: str) -> None:
    """Print one message on stderr (every process's), each of its lines :func:`printable`; a
    closed stderr loses the line only."""
    try:
        print("\n".join(map(printable, line.split("\n"))), file=sys.stderr, flush=True)
    except STREAM_GONE:
        detach_stream(sys.stderr)


def detach_stream(stream: Any) -> None:
    """Point ``stream``'s descriptor at /dev/null: what is still buffered, and the
    interpreter's last flush, then go nowhere instead of failing."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def interrupted_message(*, saved: bool) -> str:
    """The one line a run prints when SIGINT/SIGTERM stopped it."""
    return "maestro: interrupted" + ("; patterns that finished are saved" if saved else "")
