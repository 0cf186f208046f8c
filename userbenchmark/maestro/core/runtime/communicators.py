"""Communicators: one process group per team per axis, created once per run, in the same
order on every rank (torch requires it); NCCL options go through a fresh
``ProcessGroupNCCL.Options`` per group (``new_group`` writes into it)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ...errors import RunError
from ..config.spec import AxisSpec
from .agreement import grace_s, group_timeout

log = logging.getLogger("maestro.comms")

GATE_GROUP = "(gate)"  # the gate's alignment group among the axes' (no axis has parentheses)


def nccl_options(axis: AxisSpec, timeout: timedelta) -> Any:
    """A fresh ProcessGroupNCCL.Options for ``axis``; unsupported fields are a clear error."""
    options_cls = getattr(dist, "ProcessGroupNCCL", None)
    if options_cls is None:
        raise RunError("this torch build has no NCCL backend")
    opts = options_cls.Options()
    opts.is_high_priority_stream = axis.priority == "high"
    if hasattr(opts, "_timeout"):
        # new_group warns when the options' timeout differs from its own timeout argument.
        opts._timeout = timeout
    config = getattr(opts, "config", None)
    for key, value in axis.nccl.items():
        if config is None or not hasattr(config, key):
            valid = sorted(k for k in dir(config) if not k.startswith("_")) if config else []
            raise RunError(
                f"axis {axis.name!r}: nccl option {key!r} is not supported by the "
                f"installed torch/NCCL (ProcessGroupNCCL.Options.config fields: "
                f"{', '.join(valid) or 'none'})",
                phase="setup",
            )
        setattr(config, key, value)
    return opts


class Communicators:
    """The process group of this rank's team on each axis (None where it is in no team)."""

    def __init__(
        self,
        axes: Mapping[str, AxisSpec],
        *,
        rank: int,
        backend: str,
        timeout_s: float,
        used: Iterable[str] | None = None,
    ) -> None:
        self.rank = rank
        self.backend = backend
        self.timeout_s = timeout_s
        self._timeout = group_timeout(backend, timeout_s)
        self._axes = dict(axes)
        self._groups: dict[str, Any] = {}
        for name in list(self._axes) if used is None else [a for a in self._axes if a in set(used)]:
            self._create(self._axes[name])

    def _create(self, axis: AxisSpec) -> None:
        if axis.nccl and self.backend != "nccl":
            log.warning(
                "axis %r: nccl options %s have no effect on the %s backend",
                axis.name,
                dict(axis.nccl),
                self.backend,
            )
        if axis.priority == "high" and self.backend != "nccl":
            log.warning(
                "axis %r: priority: high has no effect on the %s backend (CPU lanes are "
                "threads without priorities; it sets CUDA stream and NCCL priorities)",
                axis.name,
                self.backend,
            )
        mine = None
        for team in axis.teams:
            kwargs = {"ranks": list(team), "backend": self.backend, "timeout": self._timeout}
            if self.backend == "nccl":  # a fresh object per group: new_group writes into it
                kwargs["pg_options"] = nccl_options(axis, self._timeout)
            group = dist.new_group(**kwargs)
            if self.rank in team:
                mine = group
        self._groups[axis.name] = mine
        log.debug("axis %s: %d team(s) of %d", axis.name, len(axis.teams), axis.team_size)

    def gate_group(self) -> Any:
        """A new NCCL group of every rank for the gate's alignment all_reduce, held (and
        aborted after a failure) with the axes' groups, under the same watchdog timeout."""
        group = dist.new_group(backend="nccl", timeout=self._timeout)
        self._groups[GATE_GROUP] = group
        return group

    def group(self, axis: str) -> Any:
        """This rank's group on ``axis`` (None when the rank is in no team of it)."""
        return self._groups[axis]

    def axis(self, name: str) -> AxisSpec:
        return self._axes[name]

    def team(self, axis: str) -> tuple[int, ...] | None:
        return self._axes[axis].team_of(self.rank)

    def abort(self) -> bool:
        """Abort every communicator after a failure left collectives half-issued; False when it
        did not end within grace_s (kernels hold the GPU). NCCL groups all at once (one by one
        they can block each other: pytorch/pytorch#119797); gloo's operations timed out."""
        groups = dict(self._groups)
        self._groups = {name: None for name in self._groups}
        if self.backend != "nccl":
            return True
        thread = threading.Thread(
            target=_abort_groups, args=(groups,), name="maestro-nccl-abort", daemon=True
        )
        thread.start()
        thread.join(wait_s := grace_s(self.timeout_s))
        if not thread.is_alive():
            return True
        log.error(
            "rank %d: the NCCL communicators did not abort within %g s (collective kernels "
            "still hold the GPU); leaving without tearing NCCL down",
            self.rank,
            wait_s,
        )
        return False


def _abort_groups(groups: Mapping[str, Any]) -> None:
    abort_all = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort_all is not None and dist.is_initialized():
        try:
            abort_all()
            return
        except Exception as exc:  # aborting after a failure must not hide the failure
            log.warning("aborting every process group at once failed (%s); aborting each", exc)
    for name, group in groups.items():
        if group is None:
            continue
        abort = getattr(group, "abort", None)
        if abort is None:
            log.warning("axis %s: this torch cannot abort a process group", name)
            continue
        try:
            abort()
        except Exception as exc:  # aborting after a failure must not hide the failure
            log.debug("axis %s: abort failed: %s", name, exc)
