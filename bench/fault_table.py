"""The fault table of docs/reliability.md, from the cases the process tests measured.

Each fault test appends what it measured (the fault, the launcher, the time from the fault to
the last process gone, the exit statuses) to a JSON file:

    MAESTRO_FAULT_TABLE=faults.json python -m pytest tests/integration/test_faults.py
    python -m bench.fault_table faults.json [more.json ...]

The GPU fault tests (tests/gpu/test_multi_gpu_faults.py) write the same rows to
``$MAESTRO_GPU_OUT/faults.json``; give that file too. Each row records when and on what it
was measured (``append_row``). Prints markdown: for each machine, the date and the machine, then
one row per case; a time over its limit is marked.
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


def machine_text(info: dict[str, Any]) -> str:
    """The machine a row was measured on, as the table's heading names it."""
    device = f"{info['device']}, " if info.get("device") else ""
    return (
        f"{device}{info.get('cpu', '?')}, "
        f"{info.get('usable_cpus', info.get('logical_cpus', '?'))} usable CPUs, "
        f"torch {info.get('torch', '?')}, Python {info.get('python', '?')}"
    )


def append_row(path: Path, row: dict[str, Any], device: str | None = None) -> None:
    """Append one measured case to the JSON list at ``path``, stamped with this machine (and
    ``device``, the GPU it ran on) and the UTC date, so a table made elsewhere names them."""
    info = {**machine_info(), "device": device}
    rows = json.loads(path.read_text()) if path.exists() else []
    rows.append({**row, "machine": machine_text(info), "date_utc": info["date_utc"]})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1))


def render(rows: Sequence[dict[str, Any]]) -> str:
    """The markdown: for each machine in the order first measured, a line naming it and the
    first date its rows were measured, then their table (pure)."""
    by_machine: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_machine.setdefault(row.get("machine") or "a machine the rows do not name", []).append(
            row
        )
    parts = []
    for machine, group in by_machine.items():
        date = min((str(r["date_utc"]) for r in group if r.get("date_utc")), default="?")
        parts.append(
            f"Measured {date} on {machine}.\n\n{markdown_table(HEADERS, table_rows(group))}"
        )
    return "\n\n".join(parts)


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
    print(render(rows))
    return 1 if any(over_the_limit(r) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
