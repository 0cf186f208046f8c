"""``python -m userbenchmark.maestro``: the command-line interface."""

import gc
import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line loads: no traceback
    print("maestro: interrupted", file=sys.stderr, flush=True)
    raise SystemExit(130) from None

status = main()
gc.freeze()  # everything is written: no last collection walking every object torch made
raise SystemExit(status)
