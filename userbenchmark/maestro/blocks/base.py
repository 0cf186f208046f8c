"""The block interface (the op registry is registry.py): parameters, declared and checked by the
config loader before anything runs; bytes per rank; buffers allocated in ``setup``, work only
enqueued in ``launch``. Custom blocks subclass :class:`Block`, named as package.module:ClassName."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from ..core.config.spec import BlockSpec


class _Required:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()  # the default of a parameter that the YAML must give

PARAM_KINDS = ("size", "int", "float", "bool", "str", "shape")


@dataclass(frozen=True, kw_only=True)
class TracedCall:
    """A call (a collective, an aten op) of a profiler trace as ``import-trace`` found it;
    ``root`` is an index in the team, ``dtype`` maestro's name."""

    name: str = ""
    dtype: str = ""
    elem_bytes: int = 1
    in_elems: int = 0
    out_elems: int = 0
    team_size: int = 1
    root: int = 0
    splits: tuple[int, ...] = ()
    dims: tuple[tuple[int, ...], ...] = ()
    strides: tuple[tuple[int, ...], ...] = ()
    kernels: tuple[str, ...] = ()
    duration_us: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Param:
    """One op parameter: its YAML name, kind (one of PARAM_KINDS; a ``size`` in bytes accepts
    4M/1.5KiB), default and meaning."""

    name: str
    kind: str
    doc: str
    default: Any = REQUIRED
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    """Bounds of an int/float (inclusive); ``doc`` should say why there is a maximum."""
    described_at_default: bool = True
    """False: left out of the block's described settings (results, ``compare``) while it has
    its default, so that runs made before the parameter existed still compare."""

    def __post_init__(self) -> None:
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"Param {self.name}: kind must be one of {PARAM_KINDS}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


class Block:
    """Base class of every block; subclasses set ``op``, ``category`` (``comm``, ``compute`` or
    ``other``: what the comm/compute overlap counts) and ``params``."""

    op: ClassVar[str] = ""
    category: ClassVar[str] = "other"
    params: ClassVar[tuple[Param, ...]] = ()
    min_team_size: ClassVar[int] = 1
    trace_names: ClassVar[tuple[str, ...]] = ()
    """What a profiler trace calls this op (``import-trace`` maps those calls to it)."""

    # ---- validation (class level, before any process group or tensor exists) ----
    @classmethod
    def normalize_params(
        cls, params: Mapping[str, Any]
    ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """Resolve alternative spellings (GEMM operand shapes into m/n/k) after type checks and
        defaults: (resolved parameters, [(param name, message)])."""
        return dict(params), []

    @classmethod
    def check_params(
        cls, params: Mapping[str, Any], *, dtype: str, team_size: int
    ) -> list[tuple[str, str]]:
        """Cross-parameter rules (divisibility, ...): a list of (param name, message)."""
        return []

    @classmethod
    def buffer_bytes(cls, params: Mapping[str, Any], *, dtype: str, team_size: int) -> int:
        """Bytes of device/host memory one rank allocates for this block."""
        return 0

    @classmethod
    def host_buffer_bytes(cls, params: Mapping[str, Any], *, dtype: str, team_size: int) -> int:
        """Bytes one rank allocates for this block on CPU (as on CUDA unless it says less)."""
        return cls.buffer_bytes(params, dtype=dtype, team_size=team_size)

    # ---- the op's arithmetic: defined here, once, and read by every figure and by capping ----
    @classmethod
    def message_size_bytes(cls, params: Mapping[str, Any]) -> int | None:
        """S as nccl-tests defines it for this op (algbw = S / t), or None when not a collective."""
        return None

    @classmethod
    def bus_factor(cls, team_size: int) -> float | None:
        """nccl-tests' factor turning algbw into busbw on a team of ``team_size`` ranks; None: no
        bus bytes (no busbw, nothing added to the pattern's shared busbw)."""
        return None

    @classmethod
    def flop_count(cls, params: Mapping[str, Any]) -> int | None:
        """Floating-point operations of one launch (TFLOP/s = FLOPs / t), or None."""
        return None

    @classmethod
    def capped_params(
        cls, params: Mapping[str, Any], *, max_size_bytes: int, dtype: str, team_size: int
    ) -> dict[str, Any]:
        """``params`` with every byte count at most ``max_size_bytes`` (``--max-size``), still valid
        for :meth:`check_params`, or ValueError saying why none fits."""
        return dict(params)

    @classmethod
    def traced_params(cls, call: TracedCall) -> tuple[dict[str, Any], str | None] | None:
        """This op's parameters replaying ``call`` and what they approximate (None: exact),
        or None when this op cannot replay it."""
        return None

    @classmethod
    def idle_reason(cls, params: Mapping[str, Any], *, team_size: int, backend: str) -> str | None:
        """Why ``launch`` enqueues no device work here, or None: on CUDA every timed (block,
        iteration) must own device activity, so such a block is not timed."""
        return None

    @classmethod
    def notes(cls, params: Mapping[str, Any], *, dtype: str, device: str) -> tuple[str, ...]:
        """Settings that change this block's numbers and belong next to them (e.g. TF32)."""
        return ()

    # ---- run time ----
    def __init__(self, spec: BlockSpec, ctx: BlockContext) -> None:
        self.spec = spec
        self.ctx = ctx

    def setup(self) -> None:
        """Allocate buffers and fill inputs (untimed)."""

    def setup_notes(self) -> tuple[str, ...]:
        """Notes known only after ``setup`` (what a calibration found), added to :meth:`notes`."""
        return ()

    def launch(self) -> None:
        """Enqueue one execution on the current lane (timed: enqueue only, no setup)."""
        raise NotImplementedError

    def prepare_check(self) -> None:
        """Fill inputs with deterministic values for check mode."""

    def verify(self) -> int:
        """Number of wrong output elements after one check-mode launch (0 when not checkable)."""
        return 0

    def teardown(self) -> None:
        """Release buffers."""


@dataclass(kw_only=True)
class BlockContext:
    """What a block may use at run time: its device, dtype, team (global ranks on the block's
    axis) and the team's process group (None for blocks that communicate nothing)."""

    rank: int
    device: torch.device
    dtype: torch.dtype
    team: tuple[int, ...]
    group: Any = None
    seed: int = 0
    allocator: Callable[..., torch.Tensor] | None = None
    """``empty``-like; registered NCCL memory when asked for."""
    backend: str = "gloo"
    calibration: dict[str, float] = field(default_factory=dict)
    """Run-wide measured constants (e.g. ``sleep_cycles_per_us`` on CUDA)."""
    graph: bool = False
    """Inside a CUDA graph (the pattern's ``graph:``): a calibration times its work the same way
    (a graph runs kernels with shorter gaps between them)."""

    @property
    def team_size(self) -> int:
        return len(self.team)

    @property
    def team_rank(self) -> int:
        return self.team.index(self.rank)

    def empty(self, numel: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A fresh 1-D buffer on the block's device (never shared with another block)."""
        import torch

        if self.allocator is not None:
            return self.allocator(numel, dtype or self.dtype)
        return torch.empty(numel, dtype=dtype or self.dtype, device=self.device)
