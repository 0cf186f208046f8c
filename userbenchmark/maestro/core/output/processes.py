"""A run of several processes (``run --repeat N``, each side of ``abtest``): each writes its own
output into ``processes/K``, and after each the run's files are rewritten from all of them (every
process's rows, a ``process`` column; the metrics file's means over them, results.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import pandas as pd

from .locations import atomic_write_files
from .results import (
    PROCESS_COLUMN,
    TABLE_FILES,
    Results,
    csv_text,
    json_text,
    load_results,
    metrics_from_results,
    read_json_file,
)

PROCESSES_DIR: Final = "processes"


def process_dir(base: Path, index: int) -> Path:
    """Where process ``index`` (0, 1, ...) of a run whose files go to ``base`` writes its own."""
    return base / PROCESSES_DIR / str(index)


def gather_processes(
    folders: Sequence[Path], output_dir: Path | None, metrics_path: Path | None
) -> Results:
    """Rewrite ``output_dir``'s tables, run.json and failures.json, and the metrics file, from
    the processes' folders (process K wrote ``folders[K]``; one that saved nothing is skipped),
    all together; the gathered tables. The environ is the first process's, with ``processes``."""
    parts: dict[str, list[pd.DataFrame]] = {table: [] for table in TABLE_FILES}
    failures: list[Any] = []
    environ: dict[str, Any] = {}
    for index, folder in enumerate(folders):
        if (folder / "results.json").exists():
            found = load_results(folder)
            for table, frames in parts.items():
                frame = getattr(found, table)
                frames.append(
                    frame.assign(**{PROCESS_COLUMN: pd.array([index] * len(frame), dtype="Int64")})
                )
        if (folder / "failures.json").exists():
            failures += [
                {**f, PROCESS_COLUMN: index} for f in read_json_file(folder / "failures.json")
            ]
        if not environ and (folder / "run.json").exists():
            environ = dict(read_json_file(folder / "run.json"))
    gathered = Results(
        **{t: pd.concat(f, ignore_index=True) if f else pd.DataFrame() for t, f in parts.items()}
    )
    environ["processes"] = str(len(parts["blocks"]))
    texts: dict[Path, str] = {}
    if output_dir is not None:
        for table, stem in TABLE_FILES.items():
            texts[output_dir / f"{stem}.json"] = json_text(getattr(gathered, table))
            texts[output_dir / f"{stem}.csv"] = csv_text(getattr(gathered, table))
        texts[output_dir / "run.json"] = json.dumps(environ, indent=1, sort_keys=True) + "\n"
        if failures:
            texts[output_dir / "failures.json"] = json.dumps(failures, indent=1) + "\n"
    if metrics_path is not None:
        doc = {"name": "maestro", "environ": environ, "metrics": metrics_from_results(gathered)}
        texts[metrics_path] = json.dumps(doc, indent=2) + "\n"
    atomic_write_files({path: text.encode("utf-8") for path, text in texts.items()})
    return gathered
