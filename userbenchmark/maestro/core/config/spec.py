"""The typed, frozen objects a validated pattern file becomes; everything downstream reads these,
never the YAML. Mappings are read-only, and every spec pickles: the local launcher hands the
validated suite to its workers."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...blocks.dtypes import DTYPE_SIZES_BYTES

PRIORITIES = ("normal", "high")
SYNC_MODES = ("barrier", "barrier-only", "none")
"""``barrier``: a host barrier, then every rank's gate opens at one agreed instant;
``barrier-only``: each gate opens as its rank leaves the barrier; ``none``: lanes run on."""
WORLD_AXIS = "world"
TRACED_KEYS = ("traced_us", "traced_min_us", "traced_max_us", "traced_kernel", "traced_overlap")
"""A block's figures from the trace it was imported from (BlockSpec fields of these names)."""


class FrozenMapping(Mapping[str, Any]):
    """A read-only mapping that pickles (``types.MappingProxyType`` does not)."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values = dict(values or {})

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"FrozenMapping({self._values!r})"


frozen_mapping = FrozenMapping


@dataclass(frozen=True, kw_only=True)
class AxisSpec:
    """A set of equal-size teams of ranks; each team gets its own communicator."""

    name: str
    teams: tuple[tuple[int, ...], ...]
    """Global ranks of each team; every rank is in at most one team."""
    like: str | None = None
    """Axis whose teams this one copies (a second communicator on the same ranks)."""
    priority: str = "normal"
    """``high`` gives the axis a high-priority lane stream and NCCL stream."""
    nccl: Mapping[str, Any] = field(default_factory=frozen_mapping)
    """``ProcessGroupNCCL.Options.config`` fields (max_ctas, min_ctas, ...)."""

    @property
    def team_size(self) -> int:
        """Ranks per team (all teams of an axis have this size)."""
        return len(self.teams[0])

    def team_of(self, rank: int) -> tuple[int, ...] | None:
        """The team holding ``rank``, or None when the rank is in no team of this axis."""
        return next((team for team in self.teams if rank in team), None)


@dataclass(frozen=True, kw_only=True)
class BlockSpec:
    """One validated block of a pattern, its parameters resolved to plain values."""

    name: str
    op: str
    """Registry name (``all_reduce``) or custom ``package.module:ClassName``."""
    axis: str
    lane: str
    """In-order queue the block is issued on; defaults to the axis name."""
    dtype: str
    params: Mapping[str, Any] = field(default_factory=frozen_mapping)
    """Op parameters after defaults; sizes are int bytes, GEMM dims int element counts."""
    work: str = field(default="", compare=False)
    """The parameters as the file spells them, after any ``--max-size`` cap (what the block
    measures; summary.describe_params, set where they are validated or capped)."""
    register_buffers: bool = False
    after: tuple[str, ...] = ()
    """Blocks of the same pattern this block waits for in each iteration (``after:``)."""
    traced_us: float | None = None
    """Duration in the trace the block was imported from (``import-trace``), if any: the
    median over the trace's steps where it has several."""
    traced_min_us: float | None = None
    traced_max_us: float | None = None
    """The range of the block's traced durations over the steps (None: one step)."""
    traced_kernel: str | None = None
    """Name of the (first) kernel the traced call ran, if known: what the replay's kernel is
    compared with."""
    traced_overlap: float | None = None
    """Share (0 to 1) of ``traced_us`` during which a collective or transfer ran beside the
    block on its rank, in the trace."""
    yaml_path: str = ""

    @property
    def dtype_size_bytes(self) -> int:
        return DTYPE_SIZES_BYTES[self.dtype]


def predecessors(blocks: Sequence[BlockSpec]) -> tuple[tuple[int, ...], ...]:
    """The wait-for graph: for each block (by index), the blocks it waits for in an iteration:
    its ``after:`` names (names not in ``blocks`` are left out) and the block before it on its
    lane."""
    index = {block.name: i for i, block in enumerate(blocks)}
    previous: dict[str, int] = {}
    out = []
    for i, block in enumerate(blocks):
        waits = [index[name] for name in block.after if name in index]
        if block.lane in previous:
            waits.append(previous[block.lane])
        previous[block.lane] = i
        out.append(tuple(dict.fromkeys(waits)))
    return tuple(out)


def issue_order(blocks: Sequence[BlockSpec]) -> tuple[int, ...]:
    """Blocks after those they wait for, lane by lane, round after round (a cycle left out): the
    CUDA enqueue order, so awaited events are recorded first and every rank enqueues collectives
    of different communicators in one order."""
    waits = predecessors(blocks)
    queues: dict[str, deque[int]] = {}
    for i, block in enumerate(blocks):
        queues.setdefault(block.lane, deque()).append(i)
    order: list[int] = []
    done: set[int] = set()
    while len(order) < len(blocks):
        before = len(order)
        for queue in queues.values():
            while queue and done.issuperset(waits[queue[0]]):
                done.add(queue[0])
                order.append(queue.popleft())
        if len(order) == before:
            break  # the rest wait for each other
    return tuple(order)


def whatif_label(name: str, variant: str) -> str:
    """``name`` with ``whatif=variant`` in its bracket suffix (one added where it has none): a
    form no name in a pattern file has (names are letters, digits and _ . -)."""
    return f"{name[:-1]},whatif={variant}]" if name.endswith("]") else f"{name}[whatif={variant}]"


@dataclass(frozen=True, kw_only=True)
class PatternSpec:
    """One pattern after sweep expansion: the unit that is measured."""

    name: str
    """Stable expanded name, e.g. ``ar_sweep[size=4M]``."""
    base_name: str
    sweep_point: tuple[tuple[str, str], ...] = ()
    """(variable, value as written) pairs of this sweep point, in declaration order."""
    blocks: tuple[BlockSpec, ...]
    warmup_iters: int
    num_iters: int
    baseline: bool
    check: bool
    sync: str = "barrier"
    graph: bool = False
    """Each block's launch is captured once into a CUDA graph and replayed per iteration."""
    traced_us: float | None = None
    """The traced step's duration, for a pattern imported from a trace (``import-trace``)."""
    traced_by_rank_us: tuple[float, ...] = ()
    """Each rank's own traced step duration (empty: not given)."""
    yaml_path: str = ""
    variant: str | None = None
    """A what-if variant's name (the pattern's `whatif:` key); None for the pattern itself."""
    variants: tuple[PatternSpec, ...] = ()
    """The pattern's `whatif:` variants, each a complete validated PatternSpec with the same
    name, its `variant` set and no variants of its own."""
    predecessors: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    issue_order: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "predecessors", predecessors(self.blocks))
        object.__setattr__(self, "issue_order", issue_order(self.blocks))

    @property
    def traced(self) -> bool:
        """The pattern carries traced durations (it was imported from a trace)."""
        return self.traced_us is not None or any(b.traced_us is not None for b in self.blocks)

    @property
    def label(self) -> str:
        """The name outputs and metric keys give it: its name, or for a variant
        ``step[whatif=bigger]`` (``ar[size=4M,whatif=bigger]`` at a sweep point)."""
        return self.name if self.variant is None else whatif_label(self.name, self.variant)

    @property
    def lanes(self) -> tuple[str, ...]:
        """Lanes in order of first use."""
        return tuple(dict.fromkeys(b.lane for b in self.blocks))


@dataclass(frozen=True, kw_only=True)
class SuiteSpec:
    """A whole validated pattern file."""

    name: str
    source: str  # the file's path
    world_size: int
    env: Mapping[str, str] = field(default_factory=frozen_mapping)
    axes: Mapping[str, AxisSpec] = field(default_factory=frozen_mapping)
    mesh: Mapping[str, int] = field(default_factory=frozen_mapping)
    """Mesh dimension -> degree, outer to inner, as ``mesh:`` gives them (their axes, with
    their teams, are in ``axes``)."""
    patterns: tuple[PatternSpec, ...] = ()
    timeout_s: float = 45.0
    """Timeout of communicator operations and of the ranks' agreement step."""
    stop_on_error: bool = True
    """Stop at the first failed pattern; otherwise go on when every rank contained it."""
    text_sha256: str = ""
    """SHA-256 (hex) of the pattern text this suite was loaded from: every rank of a run
    compares it with rank 0's before anything runs."""
