"""A run of several processes (``run --repeat N``, each side of ``abtest``): each writes its own
output into ``processes/K``, and after each the run's files are rewritten from all of them (every
process's rows, a ``process`` column; the metrics file's means over them, results.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import pandas as pd

from .locations import atomic_write_files
from .results import PROCESS_COLUMN, TABLE_FILES, Results, load_results, read_json_file, run_texts

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
    texts = run_texts(gathered, environ, failures, output_dir, metrics_path)
    atomic_write_files({path: text.encode("utf-8") for path, text in texts.items()})
    return gathered
