"""Helpers shared by the bench scripts: machine description, markdown tables, JSON output."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def maestro_env() -> dict[str, str]:
    """Environment for a ``python -m userbenchmark.maestro`` subprocess: this repo importable,
    no inherited launcher variables (the subprocess starts its own ranks)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's best guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """What produced the numbers: CPU, cores, library versions, UTC date."""
    info: dict[str, Any] = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        pass
    for name in ("torch", "numpy"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = "not installed"
    return info


def machine_lines(info: dict[str, Any]) -> str:
    """The machine description as one markdown line per item."""
    return "\n".join(f"- {k}: {v}" for k, v in info.items())


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: floats with `digits` significant decimals, None/NaN as '-'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != 0 and abs(value) < 10 ** -(digits - 1):
            return f"{value:.{digits}g}"
        return f"{value:.{digits}f}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; cells formatted by :func:`fmt`."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    return "\n".join(lines)


def median_spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    vals = [float(v) for v in values]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` as indented JSON when a path was given."""
    if path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")


def with_op_params(suite: Any, op: str, params: dict[str, Any]) -> str:
    """The one-pattern ``suite`` as a pattern file, each block of ``op`` with ``params`` added."""
    import dataclasses

    from userbenchmark.maestro.core.config.loader import dump_suite

    pattern = suite.patterns[0]
    blocks = tuple(
        dataclasses.replace(b, params={**b.params, **params}) if b.op == op else b
        for b in pattern.blocks
    )
    one = dataclasses.replace(pattern, blocks=blocks)
    return dump_suite(dataclasses.replace(suite, patterns=(one,)))
