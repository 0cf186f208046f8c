"""``import-trace``: traces in, a pattern file out, checked by maestro's own loader."""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from ..core.config.loader import load_suite_text
from ..errors import EXIT_OK, EXIT_USAGE, ConfigError, OptionError, say, user_error_message
from .emit import coverage, render
from .importer import Imported, ImportOptions, import_traces
from .kineto import TraceError

PROG = "python -m userbenchmark.maestro import-trace"


def _summary(path: str, imp: Imported) -> str:
    ops = Counter(b.op for b in imp.layout.blocks)
    shown = ", ".join(f"{n} {op}" for op, n in ops.most_common())
    who = "one role" if len(imp.roles) == 1 else f"{len(imp.roles)} roles"
    return (
        f"wrote {path}: {imp.step_name} of {imp.world_size} rank(s) ({who}) as "
        f"{len(imp.layout.blocks)} blocks ({shown}) on {len(imp.layout.lanes)} lanes\n"
        f"{coverage(imp).line()}"
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
) -> Imported:
    """Import the traces at ``paths`` into the pattern file ``output``, written by ``write``
    (the CLI's atomic writer) once maestro's loader accepts it; TraceError when the traces
    cannot be imported or the file cannot be written (nothing is written then)."""
    options = options or ImportOptions()
    target = Path(output)
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
    return imported


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
        imported = import_trace(list(paths), output, options, write=write)
    except (OptionError, TraceError) as err:
        trace = isinstance(err, TraceError)
        say(f"maestro: invalid trace: {err}" if trace else user_error_message(err))
        return EXIT_USAGE
    print(_summary(output, imported))
    return EXIT_OK
