"""A pattern's "ideal" once blocks wait for each other (``after:``, one lane's blocks in order):
perfect overlap ends with the longest chain of such blocks at their isolated durations (the critical
path; the longest block when nothing waits)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from graphlib import CycleError, TopologicalSorter

import numpy as np
from numpy.typing import ArrayLike


def critical_path(
    durations_us: ArrayLike, predecessors: Sequence[Sequence[int]]
) -> tuple[float, tuple[int, ...]]:
    """Length (µs) of the longest chain of blocks that run one after another, and the chain's
    blocks, first to last (``predecessors[i]``: the blocks block ``i`` waits for); NaN and ()
    when a duration is not finite (a block not measured); ValueError on a cycle."""
    durations = np.asarray(durations_us, dtype=np.float64)
    num = durations.size
    if len(predecessors) != num:
        raise ValueError(f"{len(predecessors)} predecessor lists for {num} durations")
    if not num or not np.isfinite(durations).all():
        return math.nan, ()
    finish = np.zeros(num)
    via = [-1] * num  # the predecessor that finishes last
    graph = TopologicalSorter({i: predecessors[i] for i in range(num)})
    try:
        for i in graph.static_order():
            if predecessors[i]:
                via[i] = max(predecessors[i], key=lambda j: finish[j])
            finish[i] = durations[i] + (finish[via[i]] if via[i] >= 0 else 0.0)
    except CycleError:
        raise ValueError("the blocks wait for each other in a cycle") from None
    path = [int(np.argmax(finish))]
    while via[path[-1]] >= 0:
        path.append(via[path[-1]])
    return float(finish[path[0]]), tuple(reversed(path))
