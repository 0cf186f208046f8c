"""One rank's process: load the pattern file, run the suite, turn failures into exit statuses."""

from __future__ import annotations

import sys
from typing import Any

from ...errors import EXIT_FAILED, EXIT_USAGE


def _load(config: str, world_size: int | None, options: dict[str, Any]) -> Any:
    from ..config.loader import load_suite
    from ..config.options import RunOptions, apply_overrides

    suite = load_suite(config, world_size=world_size)
    return apply_overrides(suite, RunOptions(**options))


def run_worker(config: str, world_size: int, options: dict[str, Any]) -> int:
    """One rank's run (in a worker started by the launcher, torchrun or srun)."""
    from ...errors import ConfigError, RunError
    from ..config.options import RunOptions
    from .distributed import detect_launch
    from .suite import run_suite

    launch = detect_launch()
    try:
        suite = _load(config, launch.world_size, options)
        return run_suite(suite, RunOptions(**options), launch)
    except ConfigError as err:
        if launch.rank == 0:
            print(f"maestro: invalid configuration:\n{err}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except RunError as err:
        print(f"maestro: rank {launch.rank}: {err}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except KeyboardInterrupt:
        if launch.rank == 0:
            print(
                "maestro: interrupted; patterns that finished are saved",
                file=sys.stderr,
                flush=True,
            )
        return 130
