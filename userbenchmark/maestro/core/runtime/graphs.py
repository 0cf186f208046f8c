"""CUDA-graph mode: each block's launch captured once into a graph of its own, then replayed.

One graph per block (not one per iteration): replaying it on the block's lane stream, after
the gate event, with the block's external correlation id pushed around ``replay()``, gives
every kernel of the replay that id, so CUPTI attributes per block and iteration exactly as in
eager mode (seen on an H200 with torch 2.11 and cupti-python 13.0.1). A graph holding a whole
iteration would give every kernel of every lane the one id pushed around its replay; telling
the blocks apart there would need graph node ids. The gate, the lanes, the ``after:`` events
(recorded and waited between replays, outside the graphs) and the profilers are the same in
both modes; only what ``launch`` does changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...errors import RunError

GRAPH_MEMORY_MARGIN_BYTES = 64 << 20
"""Device memory set aside per captured block in the pre-flight check: a graph's private pool
holds what its capture allocates (library workspaces; maestro's buffers exist before it)."""


class CapturedBlock:
    """A block whose launch was captured once; ``launch`` replays the graph on the current
    stream (the block's lane)."""

    def __init__(self, block: Any, graph: Any) -> None:
        self.block = block
        self.graph = graph

    def launch(self) -> None:
        self.graph.replay()


def capture_blocks(
    lanes: Sequence[Any], names: Sequence[str], ops: Sequence[str], device: Any
) -> dict[int, CapturedBlock]:
    """Capture every block of ``lanes`` on its lane stream; {block index: captured block}.

    Called after the eager warmup (communicators and library handles exist, so the capture
    records only the blocks' own work). A block that cannot be captured raises a RunError
    naming its op and the reason.
    """
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
            captured[index] = CapturedBlock(block, graph)
    torch.cuda.synchronize(device)
    return captured
