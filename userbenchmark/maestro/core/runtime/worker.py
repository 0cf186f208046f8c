"""One rank's process: load the pattern file, run the suite, turn failures into exit statuses."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from ...errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, ConfigError, OptionError
from . import interrupts


@contextmanager
def _quiet_loader() -> Iterator[None]:
    """Hide the loader's warnings while a file is loaded again (they were shown once)."""
    logger = logging.getLogger("maestro.config")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _with_place(message: str, file: str, path: str) -> str:
    where = ": ".join(part for part in (file, path) if part)
    return f"{message} ({where})" if where else message


def _load(
    config: str,
    world_size: int | None,
    options: dict[str, Any],
    *,
    world_size_source: str = "--nproc",
    quiet: bool = False,
    text: str | None = None,
) -> Any:
    """The validated suite with the command-line options applied.

    ``text``: the pattern text, already read (``config`` then only names it in messages);
    None: read the file ``config`` (a path or a shipped config's name). Raises ConfigError
    for the pattern file and OptionError when an option does not fit it (``--pattern``
    matching nothing, ``--max-size`` a block cannot take).
    """
    from ..config.loader import load_suite, load_suite_text
    from ..config.options import RunOptions, apply_overrides

    with _quiet_loader() if quiet else nullcontext():
        if text is None:
            suite = load_suite(config, world_size=world_size, world_size_source=world_size_source)
        else:
            suite = load_suite_text(
                text, file=config, world_size=world_size, world_size_source=world_size_source
            )
    try:
        return apply_overrides(suite, RunOptions(**options))
    except ConfigError as err:  # the file is fine: the option does not fit it
        message = "; ".join(_with_place(i.message, i.file, i.path) for i in err.issues)
        raise OptionError(message) from None


def read_pattern(config: str) -> tuple[str, str]:
    """``(path, text)`` of the pattern file ``config`` (a path or a shipped config's name),
    read once: every rank of the run gets this text (ConfigError when it cannot be read)."""
    from ..config.loader import resolve_config_path
    from ..config.yaml_reader import read_file_text

    path = resolve_config_path(config)
    return str(path), read_file_text(path, str(path))


def run_worker(
    config: str,
    world_size: int,
    options: dict[str, Any],
    *,
    world_size_source: str = "--nproc",
    text: str | None = None,
    suite: Any = None,
) -> int:
    """One rank's run (in a worker started by the launcher, torchrun or srun).

    ``suite``: the suite this process validated already (torchrun, srun, one process);
    ``text``: the pattern text the local launcher read (its workers never read the file);
    neither: read the file ``config``. Loading again shows no warnings: they were shown once.
    """
    from ...errors import RunError
    from ..config.options import RunOptions
    from .distributed import detect_launch
    from .suite import run_suite

    launch = detect_launch()
    try:
        if suite is None:
            suite = _load(
                config,
                launch.world_size,
                options,
                world_size_source=world_size_source,
                quiet=True,
                text=text,
            )
        return run_suite(suite, RunOptions(**options), launch)
    except ConfigError as err:
        if launch.rank == 0:
            print(f"maestro: invalid configuration:\n{err}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except OptionError as err:
        if launch.rank == 0:
            print(f"maestro: invalid option: {err}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except RunError as err:
        print(f"maestro: rank {launch.rank}: {err}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except interrupts.PeerExited:
        return EXIT_FAILED  # another worker exited before the run began: the launcher says why
    except KeyboardInterrupt:
        # Only before the run's own handling starts (loading, the rendezvous): nothing ran.
        if launch.rank == 0:
            print(interrupts.message(saved=False), file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
