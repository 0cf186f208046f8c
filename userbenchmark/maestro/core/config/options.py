"""Command-line choices of a run, and the validated suite they turn a pattern file into;
``--max-size`` caps sizes to what each op's own validation accepts, as if the file said so."""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
from dataclasses import dataclass
from typing import Any

from ...blocks.registry import resolve_op
from ...errors import ConfigError, OptionError
from .patterns import MAX_ITERS, PATTERN_SETTINGS, window_launches_problem
from .spec import TRACED_KEYS, BlockSpec, PatternSpec, SuiteSpec, frozen_mapping
from .summary import describe_params

logger = logging.getLogger("maestro.config")

MAX_SEED = 2**32 - 1
"""Largest ``--seed``: each rank seeds its generator with ``seed * 1_000_003 + rank``, which
must fit torch's 64-bit seeds."""

DEFAULT_ROUNDS = 10
"""Rounds of a pattern with what-if variants when ``--rounds`` is not given: a change's Student t
interval narrows much from five rounds to ten, less from ten to twenty (BENCHMARKS.md)."""


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Command-line choices of a run (the pattern file holds everything else)."""

    backend: str = "auto"
    profiler: str = "auto"
    output_dir: str | None = None
    metrics_dir: str | None = None
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
    graph: bool | None = None
    """``--graph``: every pattern in CUDA-graph mode; None: as each pattern says."""
    metrics_path: str | None = None
    """The metrics file's path, reserved in ``metrics_dir`` before the run (the command line
    calls ``prepare_output_locations``); None: no metrics file."""
    log_level: str = "INFO"
    rounds: int = DEFAULT_ROUNDS

    def __post_init__(self) -> None:
        """Values that no machine or pattern file can make valid: OptionError naming the flag."""
        for flag, value, low, high in (
            ("--iters", self.iters, 1, MAX_ITERS),
            ("--warmup-iters", self.warmup_iters, 0, MAX_ITERS),
            ("--precision", self.precision, 0, 9),
            ("--seed", self.seed, 0, MAX_SEED),
            ("--rounds", self.rounds, 2, None),  # a paired interval needs two rounds
        ):
            if value is not None and (value < low or (high is not None and value > high)):
                valid = f"between {low} and {high}" if high is not None else f"at least {low}"
                raise OptionError(f"{flag} must be {valid}, got {value}")
        for flag, folder in (
            ("--output-dir", self.output_dir),
            ("--metrics-dir", self.metrics_dir),
        ):
            if folder is not None and not str(folder).strip():
                raise OptionError(f"{flag} is empty: give a folder")
        for flag, wanted in (("--trace", self.trace), ("--plot", self.plot)):
            if wanted and not self.output_dir:
                raise OptionError(f"{flag} writes into --output-dir: give --output-dir DIR")


def apply_overrides(suite: SuiteSpec, options: RunOptions) -> SuiteSpec:
    """The suite with command-line overrides applied and patterns filtered (pure), within
    the launches of one window."""
    overridable = ("iters", "warmup_iters", "check", "baseline", "graph")  # RunOptions' names
    given = {PATTERN_SETTINGS[key]: getattr(options, key) for key in overridable}
    changes = {key: value for key, value in given.items() if value is not None}
    patterns = []
    for p in suite.patterns:
        if options.patterns and not any(
            fnmatch.fnmatchcase(p.name, f) or fnmatch.fnmatchcase(p.base_name, f)
            for f in options.patterns
        ):
            continue
        variants = tuple(dataclasses.replace(v, **changes) for v in p.variants)
        pattern = dataclasses.replace(p, **changes, variants=variants)
        if changes:
            num_iters = max(pattern.num_iters, pattern.warmup_iters)
            problem = window_launches_problem(len(pattern.blocks), num_iters)
            if problem is not None:
                raise ConfigError(
                    f"pattern {pattern.name!r} with the command line's iterations: {problem}",
                    file=suite.source,
                )
        patterns.append(pattern)
    if not patterns:
        names = ", ".join(p.name for p in suite.patterns)
        raise ConfigError(
            f"--pattern {' '.join(options.patterns)} matches no pattern; patterns: {names}",
            file=suite.source,
        )
    result = dataclasses.replace(suite, patterns=tuple(patterns))
    if options.max_size_bytes is not None:
        result = apply_max_size(result, options.max_size_bytes)
    return result


def check_graphs(suite: SuiteSpec, options: RunOptions, backend: str) -> None:
    """CUDA-graph mode needs CUDA: ``--graph`` on the CPU ``backend`` is an OptionError,
    ``graph: true`` in the file a ConfigError naming the pattern."""
    graphs = [p for p in suite.patterns if p.graph]
    if backend == "nccl" or not graphs:
        return
    why = f"CUDA graphs need CUDA, and this run uses the {backend} backend on the CPU"
    if options.graph:
        raise OptionError(f"--graph: {why}; drop --graph or run on GPUs")
    names = ", ".join(p.name for p in graphs[:5]) + (", ..." if len(graphs) > 5 else "")
    raise ConfigError(
        f"patterns {names}: graph: true, and {why}; set graph: false or run on GPUs",
        file=suite.source,
        path=graphs[0].yaml_path,
    )


def _capped_block(block: BlockSpec, suite: SuiteSpec, max_size_bytes: int) -> BlockSpec:
    cls = resolve_op(block.op)  # validated already: resolves
    team_size, source = suite.axes[block.axis].team_size, suite.source
    where = f"--max-size {max_size_bytes} bytes: {block.op} block {block.name!r}"
    try:
        params = cls.capped_params(
            block.params, max_size_bytes=max_size_bytes, dtype=block.dtype, team_size=team_size
        )
    except ValueError as exc:
        raise ConfigError(
            f"{where} cannot be capped: {exc}", file=source, path=block.yaml_path
        ) from None
    if params == dict(block.params):
        return block
    # The op's own rules decide whether the capped block is valid (custom ops may have more
    # rules than divisibility).
    problems = cls.check_params(params, dtype=block.dtype, team_size=team_size)
    if problems:
        text = "; ".join(message for _, message in problems)
        raise ConfigError(
            f"{where}: the capped parameters are not valid: {text}",
            file=source,
            path=block.yaml_path,
        )
    untraced = dict.fromkeys(TRACED_KEYS)  # other sizes
    work = describe_params(cls, params)
    return dataclasses.replace(block, params=frozen_mapping(params), work=work, **untraced)


_NOT_CONTENT = frozenset({"name", "sweep_point", "yaml_path"})
"""Fields that name or locate a pattern or block; every other field is what it measures."""


def _content(spec: Any) -> tuple[Any, ...]:
    """What a pattern (or block) measures: every field but its names and places, comparable; a
    field added to the specs counts without being listed here."""
    values = []
    for f in dataclasses.fields(spec):
        if f.name in _NOT_CONTENT:
            continue
        value = getattr(spec, f.name)
        if f.name in ("blocks", "variants"):
            value = tuple(_content(b) for b in value)
        elif f.name == "params":
            value = tuple(sorted((key, repr(v)) for key, v in value.items()))
        values.append((f.name, value))
    return tuple(values)


def apply_max_size(suite: SuiteSpec, max_size_bytes: int) -> SuiteSpec:
    """``suite`` with every collective's size capped at ``max_size_bytes`` and every GEMM's
    operands scaled below it; sweep points of one pattern that become identical are kept once
    (the first, under its own name), so result names stay unique."""
    patterns: list[PatternSpec] = []
    seen: set[tuple[Any, ...]] = set()

    def cap(spec: PatternSpec) -> tuple[BlockSpec, ...]:
        return tuple(_capped_block(block, suite, max_size_bytes) for block in spec.blocks)

    for pattern in suite.patterns:
        new = cap(pattern)
        variants = tuple(dataclasses.replace(v, blocks=cap(v)) for v in pattern.variants)
        capped = dataclasses.replace(pattern, blocks=new, variants=variants)
        untraced = sum(a.traced_us != b.traced_us for a, b in zip(pattern.blocks, new, strict=True))
        if untraced:  # the trace describes neither these blocks nor the step any more
            capped = dataclasses.replace(capped, traced_us=None, traced_by_rank_us=())
            total = sum(b.traced_us is not None for b in pattern.blocks)
            logger.warning(
                f"pattern {pattern.name!r}: --max-size changed {untraced} of its {total} imported "
                "blocks, so the trace does not describe them: their replay against it, and the "
                "step's, is left out"
            )
        key = _content(capped)
        if pattern.sweep_point and key in seen:
            continue
        seen.add(key)
        patterns.append(capped)
    return dataclasses.replace(suite, patterns=tuple(patterns))
