"""Run a userbenchmark by name, as TorchBench does: ``python run_benchmark.py NAME [ARGS...]``.

Imports ``userbenchmark.NAME.run`` and calls ``run(ARGS)``. Failures are never turned into
exit status 0: an import error or exception shows its traceback, SystemExit codes pass through,
and an interrupt (KeyboardInterrupt) exits 130 with one line.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

USERBENCHMARK_DIR = Path(__file__).resolve().parent / "userbenchmark"
USAGE = "usage: python run_benchmark.py NAME [ARGS...]"


def list_userbenchmarks() -> list[str]:
    """Names of the userbenchmarks beside this file (packages that have a run.py)."""
    if not USERBENCHMARK_DIR.is_dir():
        return []
    return sorted(
        d.name
        for d in USERBENCHMARK_DIR.iterdir()
        if d.is_dir() and (d / "__init__.py").is_file() and (d / "run.py").is_file()
    )


def main(argv: list[str] | None = None) -> int:
    """Dispatch to ``userbenchmark.<name>.run.run(args)``; 2 for a missing or unknown name."""
    argv = sys.argv[1:] if argv is None else list(argv)
    available = list_userbenchmarks()
    listing = f"available userbenchmarks: {', '.join(available) or '(none)'}"
    if not argv or argv[0] in ("-h", "--help"):
        stream = sys.stdout if argv else sys.stderr
        print(f"{USAGE}\n{listing}", file=stream)
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    if name not in available:
        print(f"{USAGE}\nunknown userbenchmark {name!r}; {listing}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(f"userbenchmark.{name}.run")
        module.run(args)
    except KeyboardInterrupt:  # Ctrl-C is not a failure to trace back: the usual status 130
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
