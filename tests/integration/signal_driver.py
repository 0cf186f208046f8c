"""Test driver: maestro's command line, with rank 0 signalled while it saves its Nth pattern.

``python -m tests.integration.signal_driver N ARGS...`` runs ``maestro ARGS``; on rank 0, while
the Nth update of the output files is half-written, SIGINT then SIGTERM arrive (Ctrl-C, then
the SIGTERM a launcher forwards), the moment a bare KeyboardInterrupt would split the files.
"""

from __future__ import annotations

import os
import signal
import sys

from userbenchmark.maestro.cli import main
from userbenchmark.maestro.core.output import locations as outputs


def _signal_inside_update(n: int) -> None:
    real = outputs._write_temporary
    seen = 0

    def write(path, data):
        nonlocal seen
        if path.name == "results.csv":  # the second file of every update
            seen += 1
            if seen == n:
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)
        return real(path, data)

    outputs._write_temporary = write


if __name__ == "__main__":
    if os.environ.get("RANK", "0") == "0":
        _signal_inside_update(int(sys.argv[1]))
    raise SystemExit(main(sys.argv[2:]))
