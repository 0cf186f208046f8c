"""``import-trace``: traces in, a pattern file out, checked by maestro's own loader."""

from __future__ import annotations

import shlex
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.config.loader import load_suite_text
from ..errors import EXIT_OK, EXIT_USAGE, ConfigError, OptionError, user_error_message
from .emit import coverage, render
from .importer import Imported, ImportOptions, import_traces
from .kineto import TraceError

PROG = "python -m userbenchmark.maestro import-trace"


@dataclass(frozen=True, kw_only=True)
class ImportReport:
    """What ``import-trace`` wrote (a file maestro's loader accepts)."""

    path: str
    imported: Imported
    text: str

    def summary(self) -> str:
        blocks = self.imported.layout.blocks
        ops = Counter(b.op for b in blocks)
        shown = ", ".join(f"{n} {op}" for op, n in ops.most_common())
        roles = len(self.imported.roles)
        who = "one role" if roles == 1 else f"{roles} roles"
        return (
            f"wrote {self.path}: {self.imported.step_name} of {self.imported.world_size} "
            f"rank(s) ({who}) as {len(blocks)} blocks ({shown}) on "
            f"{len(self.imported.layout.lanes)} lanes\n{coverage(self.imported).line()}"
        )


def command_line(paths: Sequence[str], output: str, options: ImportOptions) -> str:
    """The command as a user would type it again (for the file's header)."""
    args = [*paths, "-o", output]
    if options.step is not None:
        args += ["--step", str(options.step)]
    if not options.keep_idle:
        args.append("--no-idle")
    elif options.idle_us != ImportOptions().idle_us:
        args += ["--idle-us", f"{options.idle_us:g}"]
    return " ".join([PROG, *(shlex.quote(a) for a in args)])


def import_trace(
    paths: Sequence[str],
    output: str,
    options: ImportOptions | None = None,
    *,
    write: Callable[[Path, bytes], None],
) -> ImportReport:
    """Import the traces at ``paths`` into the pattern file ``output``, written by ``write``
    (the CLI's atomic writer) once maestro's loader accepts it; TraceError when the traces
    cannot be imported or the file cannot be written (nothing is written then)."""
    options = options or ImportOptions()
    target = Path(output)
    if target.is_dir():
        raise TraceError(f"-o {output}: is a folder; name the pattern file to write")
    if not target.parent.is_dir() and str(target.parent):
        raise TraceError(f"-o {output}: the folder {target.parent} does not exist")
    imported = import_traces(paths, options)
    text = render(imported, name=target.stem, command=command_line(paths, output, options))
    try:  # what maestro cannot run is never written
        load_suite_text(text, file=output)
    except ConfigError as err:
        first, more = err.issues[0], len(err.issues) - 1
        raise TraceError(
            f"maestro's loader rejects the pattern imported from these traces, so nothing was "
            f"written: {first}" + (f" (and {more} more problems)" if more else "")
        ) from None
    try:
        write(target, text.encode("utf-8"))
    except OSError as err:
        raise TraceError(f"-o {output}: cannot write the file ({err.strerror or err})") from None
    return ImportReport(path=output, imported=imported, text=text)


def run_command(
    *,
    paths: Sequence[str],
    output: str,
    step: int | None,
    idle_us: float,
    no_idle: bool,
    write: Callable[[Path, bytes], None],
) -> int:
    """The ``import-trace`` command: import, print what was written, return the exit status
    (0 written, 2 bad options or traces that cannot be imported: one line on stderr, nothing
    written)."""
    try:
        options = ImportOptions(step=step, idle_us=idle_us, keep_idle=not no_idle)
        report = import_trace(list(paths), output, options, write=write)
    except OptionError as err:
        print(user_error_message(err), file=sys.stderr, flush=True)
        return EXIT_USAGE
    except TraceError as err:
        print(f"maestro: invalid trace: {err}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    print(report.summary())
    return EXIT_OK
