"""CUDA-graph mode: each block's launch captured once into a graph of its own, then replayed.

One graph per block: replayed on the block's lane stream after the gate event, with the block's
external correlation id pushed around ``replay()``, every kernel of the replay carries that id,
so CUPTI attributes per block and iteration as in eager mode (H200, torch 2.11, cupti-python
13.0.1). A graph of a whole iteration would give every kernel of every lane the one id pushed
around its replay (telling blocks apart would need graph node ids). Gate, lanes, ``after:``
events (between replays, outside the graphs) and profilers are eager mode's: only ``launch``
changes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...errors import RunError

GRAPH_MEMORY_MARGIN_BYTES = 64 << 20
"""Device memory set aside per captured block in the pre-flight check: a graph's private pool
holds what its capture allocates (library workspaces; maestro's buffers exist before it)."""


class CapturedBlock:
    """A block's launch captured once: ``launch`` replays the graph on the current stream (the
    block's lane)."""

    def __init__(self, graph: Any) -> None:
        self.launch = graph.replay


def capture_blocks(
    lanes: Sequence[Any], names: Sequence[str], ops: Sequence[str], device: Any
) -> dict[int, CapturedBlock]:
    """Capture every block of ``lanes`` on its lane stream, after the eager warmup (communicators
    and library handles exist: the capture records only the blocks' own work); {block index:
    captured block}. A block that cannot be captured is a RunError naming its op and why."""
    pool = torch.cuda.graph_pool_handle()  # one private pool for the pattern's graphs
    captured: dict[int, CapturedBlock] = {}
    torch.cuda.synchronize(device)
    for lane in lanes:
        for index, block in lane.blocks:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=pool, stream=lane.stream):
                    block.launch()
            except Exception as exc:
                raise RunError(
                    f"op {ops[index]} cannot be captured into a CUDA graph with torch "
                    f"{torch.__version__} ({type(exc).__name__}: {exc}); run this pattern with "
                    "graph: false",
                    block=names[index],
                ) from exc
            captured[index] = CapturedBlock(graph)
    torch.cuda.synchronize(device)
    return captured
