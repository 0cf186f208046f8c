"""Test driver: maestro's command line, with the pattern file replaced while the local launcher
starts its workers.

``python -m tests.integration.swap_driver OTHER ARGS...`` runs ``maestro ARGS``; the moment
the launcher starts its workers, the file given with ``-c`` is overwritten with the text of
the file OTHER (a copy swapped in during start-up). Workers that read the file themselves would
run OTHER's patterns.
"""

from __future__ import annotations

import sys
from pathlib import Path

from userbenchmark.maestro.cli import main
from userbenchmark.maestro.core.runtime import launcher


def _swap_when_workers_start(other: Path) -> None:
    real = launcher.launch_local

    def launch_local(source, text, *args, **kwargs):
        Path(source).write_text(other.read_text())
        return real(source, text, *args, **kwargs)

    launcher.launch_local = launch_local


if __name__ == "__main__":
    _swap_when_workers_start(Path(sys.argv[1]))
    raise SystemExit(main(sys.argv[2:]))
