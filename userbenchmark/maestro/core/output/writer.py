"""Files rank 0 writes: results/patterns/pairs JSON+CSV and TorchBench's metrics JSON, rewritten
after each finished pattern, together and atomically (locations.py) with SIGINT/SIGTERM
held meanwhile: a run killed at any moment leaves complete files that agree with each other."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from ..analysis.records import PatternOutcome
from .locations import atomic_write_files
from .trace import TRACES_DIR, rank_trace_texts, stale_rank_files, trace_text


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
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        """``guard()`` wraps every update: the runtime passes one that holds SIGINT/SIGTERM
        until the files of the update agree again."""
        self.output_dir = output_dir
        self.metrics_path = metrics_path
        for folder in (output_dir, metrics_path and metrics_path.parent):
            if folder is not None:  # now, never again: a folder removed mid-run stops the run
                folder.mkdir(parents=True, exist_ok=True)
        self.environ = dict(environ)
        self.trace = trace and output_dir is not None
        self.plot = plot and output_dir is not None
        self.outcomes: list[PatternOutcome] = []
        self.failures: list[dict[str, str]] = []
        self._plot_names: set[str] = set()
        self._guard = guard

    def add(self, outcome: PatternOutcome) -> None:
        with self._guard():  # the plot too: a signal waits until this pattern is saved
            self.outcomes.append(outcome)
            self.flush()
            if self.plot and outcome.timeline is not None:
                from .plot import plot_pattern, unique_plot_name

                name = unique_plot_name(outcome.pattern.pattern, self._plot_names)
                plot_pattern(outcome, self.output_dir / name)

    def add_failure(self, pattern: str, message: str) -> None:
        self.failures.append({"pattern": pattern, "error": message})
        self.flush()

    def flush(self) -> None:
        """Rewrite every output file from what was collected, all together."""
        with self._guard():
            texts = self._texts()
            if self.trace:
                # Never the output folder itself: one removed during the run stays gone.
                (self.output_dir / TRACES_DIR).mkdir(exist_ok=True)
            atomic_write_files({path: text.encode("utf-8") for path, text in texts.items()})
            if self.trace:
                for path in stale_rank_files(self.output_dir / TRACES_DIR, (p.name for p in texts)):
                    path.unlink()  # an earlier, larger run's rank: HTA would read it as ours

    def _texts(self) -> dict[Path, str]:
        from .results import TABLE_FILES, csv_text, json_text, metrics_from_results, results_of

        results = results_of(self.outcomes)
        texts: dict[Path, str] = {}
        if self.output_dir is not None:
            out = self.output_dir
            for table, stem in TABLE_FILES.items():
                frame = getattr(results, table)
                texts[out / f"{stem}.json"] = json_text(frame)
                texts[out / f"{stem}.csv"] = csv_text(frame)
            if self.failures:
                texts[out / "failures.json"] = json.dumps(self.failures, indent=1) + "\n"
            # What produced these numbers (the metrics file's environ): compare reads it.
            texts[out / "run.json"] = json.dumps(self.environ, indent=1, sort_keys=True) + "\n"
            if self.trace:
                texts[out / "trace.json"] = trace_text(self.outcomes)
                for name, text in rank_trace_texts(self.outcomes).items():
                    texts[out / TRACES_DIR / name] = text  # one per rank, for HTA
        if self.metrics_path is not None:
            metrics = metrics_from_results(results)
            doc = {"name": "maestro", "environ": self.environ, "metrics": metrics}
            texts[self.metrics_path] = json.dumps(doc, indent=2) + "\n"
        return texts
