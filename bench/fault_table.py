"""The fault table of docs/reliability.md, from the cases the process tests measured.

Each fault test appends what it measured (the fault, the launcher, the time from the fault to
the last process gone, the exit statuses) to a JSON file:

    MAESTRO_FAULT_TABLE=faults.json python -m pytest tests/integration/test_faults.py
    python -m bench.fault_table faults.json [more.json ...]

The GPU fault tests (tests/gpu/test_multi_gpu_faults.py) write the same rows to
``$MAESTRO_GPU_OUT/faults.json``; give that file too. Prints markdown: the date and machine,
then one row per case; a time over its limit is marked.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench._common import machine_info, markdown_table

HEADERS = (
    "fault",
    "launcher",
    "backend",
    "timeout_s",
    "all gone after (s)",
    "limit (s)",
    "exit status",
)


def _cell(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f}"


def _limit(value: Any) -> str:
    return "-" if value is None else f"{float(value):g}"


def over_the_limit(row: dict[str, Any]) -> bool:
    """Whether the case took longer than its limit (False where either is unknown)."""
    gone, limit = row.get("all_gone_s"), row.get("limit_s")
    return gone is not None and limit is not None and float(gone) > float(limit)


def table_rows(rows: Iterable[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One table row per measured case, in the order measured (pure)."""
    out = []
    for row in rows:
        gone, limit = row.get("all_gone_s"), row.get("limit_s")
        late = over_the_limit(row)
        statuses = row.get("exit") or []
        out.append(
            (
                str(row["fault"]),
                str(row["launcher"]),
                str(row.get("backend", "nccl")),
                _cell(row.get("timeout_s")),
                _cell(gone) + (" (over the limit)" if late else ""),
                _limit(limit),
                ", ".join(str(s) for s in statuses) or "-",
            )
        )
    return out


def render(rows: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """The markdown: a line naming the date and machine, then the table."""
    machine = (
        f"{info.get('cpu', '?')}, {info.get('usable_cpus', info.get('logical_cpus', '?'))} "
        f"usable CPUs, torch {info.get('torch', '?')}, Python {info.get('python', '?')}"
    )
    head = f"Measured {info.get('date_utc', '?')} on {machine}."
    return head + "\n\n" + markdown_table(HEADERS, table_rows(rows))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="JSON files the fault tests wrote")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for name in args.files:
        try:
            found = json.loads(Path(name).read_text())
        except (OSError, ValueError) as exc:
            print(f"fault_table: cannot read {name}: {exc}", file=sys.stderr)
            return 2
        if not isinstance(found, list) or not all(isinstance(r, dict) for r in found):
            print(f"fault_table: {name}: expected a JSON list of fault rows", file=sys.stderr)
            return 2
        rows.extend(found)
    print(render(rows, machine_info()))
    return 1 if any(over_the_limit(r) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
