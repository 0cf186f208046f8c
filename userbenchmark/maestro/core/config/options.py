"""Command-line choices of a run, and the validated suite they turn a pattern file into."""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from .spec import SuiteSpec


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Command-line choices of a run (the pattern file holds everything else)."""

    backend: str = "auto"
    profiler: str = "auto"
    output_dir: str | None = None
    metrics_dir: str | None = None
    """Where the TorchBench metrics file goes; default ``<repo>/.userbenchmark/maestro``."""
    write_metrics: bool = True
    precision: int = 2
    iters: int | None = None
    warmup_iters: int | None = None
    check: bool | None = None
    baseline: bool | None = None
    patterns: tuple[str, ...] = ()
    """fnmatch filters on pattern names (expanded or base); empty: every pattern."""
    seed: int = 0
    trace: bool = False
    plot: bool = False
    max_size_bytes: int | None = None
    """Cap of every message size and GEMM operand (``--max-size``); None: sizes as written."""


def apply_overrides(suite: SuiteSpec, options: RunOptions) -> SuiteSpec:
    """The suite with command-line overrides applied and patterns filtered (pure)."""
    patterns = []
    for p in suite.patterns:
        if options.patterns and not any(
            fnmatch.fnmatchcase(p.name, f) or fnmatch.fnmatchcase(p.base_name, f)
            for f in options.patterns
        ):
            continue
        changes: dict[str, Any] = {}
        if options.iters is not None:
            changes["num_iters"] = options.iters
        if options.warmup_iters is not None:
            changes["warmup_iters"] = options.warmup_iters
        if options.check is not None:
            changes["check"] = options.check
        if options.baseline is not None:
            changes["baseline"] = options.baseline
        patterns.append(dataclasses.replace(p, **changes))
    if not patterns:
        names = ", ".join(p.name for p in suite.patterns)
        raise ConfigError(
            f"--pattern {' '.join(options.patterns)} matches no pattern; patterns: {names}",
            file=suite.source,
        )
    result = dataclasses.replace(suite, patterns=tuple(patterns))
    if options.max_size_bytes is not None:
        from .capping import apply_max_size

        result = apply_max_size(result, options.max_size_bytes)
    return result
