"""``python -m userbenchmark.maestro``: the command-line interface."""

from .cli import main

raise SystemExit(main())
