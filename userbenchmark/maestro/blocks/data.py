"""Buffer contents: random inputs that stay finite, deterministic check values, and checks."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .base import BlockContext


def _generator(ctx: BlockContext, rank: int, device: Any) -> torch.Generator:
    """A generator on ``device`` (values are drawn where the buffer lives: a host draw and copy
    of a GEMM's operands takes seconds)."""
    import torch

    return torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + rank)


def fill_random(buf: torch.Tensor, ctx: BlockContext) -> None:
    """Uniform values in [-1, 1) (integers in [-3, 3]), drawn on the buffer's device: finite in
    every dtype, never reduced in place."""
    import torch

    if not buf.numel():
        return
    gen = _generator(ctx, ctx.rank, buf.device)
    if buf.dtype.is_floating_point:  # every floating dtype of DTYPES (no float8) draws directly
        buf.uniform_(-1.0, 1.0, generator=gen)
    else:
        buf.copy_(torch.randint(-3, 4, buf.shape, generator=gen, device=buf.device))


def fill_operand(
    buf: torch.Tensor, ctx: BlockContext, std: float | None, usual: Callable[[Any], None]
) -> None:
    """``buf`` filled with normal values of a block's ``data_std`` (0: zeros; None: ``usual``)."""
    if std is None:
        usual(buf)
    elif std == 0:
        buf.zero_()
    else:
        buf.normal_(0.0, float(std), generator=_generator(ctx, ctx.rank, buf.device))


def fill_zero_sum(buf: torch.Tensor, ctx: BlockContext, op: str) -> None:
    """Inputs of an in-place reduction that stay finite however often it repeats (the team's
    values cancel, or are +-1 for prod); reduction speed does not depend on the values."""
    import torch

    if not buf.numel():
        return
    if op in ("max", "min"):
        fill_random(buf, ctx)
        return
    gen = _generator(ctx, ctx.team[0], buf.device)  # every rank of the team draws the same x
    if op == "prod":
        buf.copy_(torch.randint(0, 2, buf.shape, generator=gen, device=buf.device) * 2 - 1)
        return
    x = torch.empty(buf.shape, dtype=torch.float32, device=buf.device)
    x.uniform_(0.25, 1.0, generator=gen)
    n, me = ctx.team_size, ctx.team_rank
    if n % 2 and me == n - 1:
        x.zero_()
    elif me % 2:
        x.neg_()
    buf.copy_(x)


def check_values(team_rank: int, numel: int, like: torch.Tensor) -> torch.Tensor:
    """Deterministic small integers in [-8, 8] for team rank ``team_rank`` (exact in bf16)."""
    import torch

    idx = torch.arange(numel, device=like.device, dtype=torch.int64)
    return ((idx * 7 + team_rank * 13) % 17 - 8).to(like.dtype)


def exact_reduction(op: str, team_size: int, numel: int, like: torch.Tensor) -> torch.Tensor:
    """Expected result of reducing every team rank's :func:`check_values`, in float64."""
    import torch

    combine = {"max": torch.maximum, "min": torch.minimum, "prod": torch.mul}.get(op, torch.add)
    values = (check_values(t, numel, like).to(torch.float64) for t in range(team_size))
    acc = functools.reduce(combine, values)  # sum and avg add
    return acc / team_size if op == "avg" else acc


def count_wrong(out: torch.Tensor, expected: torch.Tensor, op: str, team_size: int) -> int:
    """Elements of ``out`` off ``expected``: exact for copies and for sum/max/min of the check
    values on teams up to 32 ranks (|sum| <= 256 is exact in bf16); avg, prod and larger sums get
    a relative tolerance of 2 ulp of the dtype times the team size."""
    import torch

    got = out.to(torch.float64)
    want = expected.to(device=out.device, dtype=torch.float64)
    exact = op in ("copy", "max", "min") or (op == "sum" and team_size <= 32)
    if exact or not out.dtype.is_floating_point:
        return int((got != want).sum().item())
    eps = torch.finfo(out.dtype).eps
    tol = 2 * eps * team_size * want.abs().clamp_min(1.0)
    return int(((got - want).abs() > tol).sum().item())
