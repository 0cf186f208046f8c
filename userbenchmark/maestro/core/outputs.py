"""Files rank 0 writes: results/patterns JSON+CSV and TorchBench's metrics JSON.

Every file is rewritten after each finished pattern, atomically (a temporary file in the same
folder, then ``os.replace``), so a run killed at any moment leaves complete files holding every
pattern that finished and never a partial file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .metric_keys import BLOCK_METRICS, PATTERN_METRICS, metric_key
from .results import BLOCK_COLUMNS, PATTERN_COLUMNS, PatternOutcome


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def metrics_of(outcomes: Iterable[PatternOutcome]) -> dict[str, float]:
    """Flat ``{key: float}`` TorchBench metrics; not-applicable (NaN/None) values are left out."""
    metrics: dict[str, float] = {}
    for outcome in outcomes:
        p = outcome.pattern
        for b in outcome.blocks:
            for name in BLOCK_METRICS:
                value = getattr(b, name)
                if value is not None and not (isinstance(value, float) and math.isnan(value)):
                    metrics[metric_key(p.suite, p.pattern, b.block, name)] = float(value)
        for name in PATTERN_METRICS:
            value = getattr(p, name)
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                metrics[metric_key(p.suite, p.pattern, None, name)] = float(value)
    return metrics


def _csv(records: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    import pandas as pd

    frame = pd.DataFrame.from_records(records, columns=list(columns))
    if "pairwise_overlap" in frame:
        frame["pairwise_overlap"] = frame["pairwise_overlap"].map(
            lambda d: json.dumps(d, sort_keys=True) if isinstance(d, dict) else ""
        )
    return frame.to_csv(index=False)


class OutputWriter:
    """Collects finished patterns on rank 0 and rewrites every output file after each one."""

    def __init__(
        self,
        *,
        output_dir: Path | None,
        metrics_path: Path | None,
        environ: Mapping[str, str],
        trace: bool = False,
        plot: bool = False,
    ) -> None:
        self.output_dir = output_dir
        self.metrics_path = metrics_path
        self.environ = dict(environ)
        self.trace = trace and output_dir is not None
        self.plot = plot and output_dir is not None
        self.outcomes: list[PatternOutcome] = []
        self.failures: list[dict[str, str]] = []
        self._plot_names: set[str] = set()

    def add(self, outcome: PatternOutcome) -> None:
        self.outcomes.append(outcome)
        self.flush()
        if self.plot and outcome.timeline is not None:
            self._write_plot(outcome)

    def _write_plot(self, outcome: PatternOutcome) -> None:
        from .plot import plot_pattern, unique_plot_name

        name = unique_plot_name(outcome.pattern.pattern, self._plot_names)
        plot_pattern(outcome, self.output_dir / name)

    def add_failure(self, pattern: str, message: str) -> None:
        self.failures.append({"pattern": pattern, "error": message})
        self.flush()

    def flush(self) -> None:
        block_records = [b.to_record() for o in self.outcomes for b in o.blocks]
        pattern_records = [o.pattern.to_record() for o in self.outcomes]
        if self.output_dir is not None:
            out = self.output_dir
            atomic_write_text(out / "results.json", json.dumps(block_records, indent=1) + "\n")
            atomic_write_text(out / "results.csv", _csv(block_records, BLOCK_COLUMNS))
            atomic_write_text(out / "patterns.json", json.dumps(pattern_records, indent=1) + "\n")
            atomic_write_text(out / "patterns.csv", _csv(pattern_records, PATTERN_COLUMNS))
            if self.failures:
                atomic_write_text(out / "failures.json", json.dumps(self.failures, indent=1) + "\n")
            if self.trace:
                from .trace import write_trace

                # Rewritten after every pattern, like the other files: a killed run keeps a
                # valid trace of what finished.
                write_trace(out / "trace.json", self.outcomes)
        if self.metrics_path is not None:
            doc = {"name": "maestro", "environ": self.environ, "metrics": metrics_of(self.outcomes)}
            atomic_write_text(self.metrics_path, json.dumps(doc, indent=2) + "\n")
