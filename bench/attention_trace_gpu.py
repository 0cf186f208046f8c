"""Make a one-rank torch.profiler trace of a transformer training step with attention, one GPU.

The second one-rank trace for replay fidelity (the first, ``tests/data/traces/onerank``, has no
attention): 4 pre-LayerNorm transformer layers (d 2048, 16 heads of 128, causal
``torch.nn.functional.scaled_dot_product_attention``, MLP 4d with GELU), batch 4 x 2048
tokens, bf16, AdamW (foreach), a mean-square loss. Recorded as tests/data/traces/README.md
says: ``profile(activities=[CPU, CUDA], record_shapes=True, schedule=schedule(wait=1,
warmup=2, active=1))`` around four steps, the active one written as
``$OUT/<name>/rank0.json.gz`` (``--out`` without ``$OUT``); ``--sync`` adds CUDA sync events.
Then the trace is imported as ``import-trace`` would, and what it became is printed: the
coverage line, and the attention kernels (each a ``busy`` stand-in of its traced duration).
Exits 0 with a message without CUDA.

Run: ``OUT=/tmp/traces python bench/attention_trace_gpu.py`` (or ``python -m
bench.attention_trace_gpu --out traces``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Started as a file: restart as a module of the repository (package imports, no sys.path).
    _root = str(Path(__file__).resolve().parents[1])
    _env = dict(os.environ)
    _env["PYTHONPATH"] = os.pathsep.join(p for p in (_root, _env.get("PYTHONPATH")) if p)
    os.execve(
        sys.executable, [sys.executable, "-m", "bench.attention_trace_gpu", *sys.argv[1:]], _env
    )

import argparse  # noqa: E402
import gzip  # noqa: E402
import shutil  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any  # noqa: E402

from ._common import markdown_table  # noqa: E402

ATTENTION = ("flash", "fmha", "attention", "sdpa", "attn")
"""Words of the kernel names attention runs as (flash, memory-efficient, cuDNN)."""


def model(d: int, heads: int, layers: int) -> Any:
    """Pre-LayerNorm transformer layers: causal self-attention (SDPA) and a 4d GELU MLP."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, d // heads).unbind(2)
            att = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
            return x + self.mlp(self.ln2(x))

    return nn.Sequential(*[Layer() for _ in range(layers)])


def record(
    out: Path, *, batch: int, seq: int, d: int, heads: int, layers: int, sync: bool, active: int = 1
) -> Path:
    """Profile 3 + ``active`` training steps; the active ones' trace is ``out/rank0.json.gz``."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    net = model(d, heads, layers).to(dev, torch.bfloat16)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)
    x = torch.randn(batch, seq, d, device=dev, dtype=torch.bfloat16)

    def step() -> None:
        loss = net(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    out.mkdir(parents=True, exist_ok=True)
    path = out / "rank0.json"

    def save(prof: Any) -> None:
        prof.export_chrome_trace(str(path))
        with open(path, "rb") as raw, gzip.open(f"{path}.gz", "wb") as packed:
            shutil.copyfileobj(raw, packed)
        path.unlink()

    extra = {}
    if sync:
        extra["experimental_config"] = torch.profiler._ExperimentalConfig(
            enable_cuda_sync_events=True
        )
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        record_shapes=True,
        schedule=schedule(wait=1, warmup=2, active=active),
        on_trace_ready=save,
        **extra,
    ) as prof:
        for _ in range(3 + active):
            step()
            prof.step()
    torch.cuda.synchronize()
    return Path(f"{path}.gz")


def imported(folder: Path) -> str:
    """What ``import-trace`` makes of the trace: its summary, and the attention kernels."""
    from userbenchmark.maestro.core.replay.emit import coverage
    from userbenchmark.maestro.core.replay.importer import import_traces

    imp = import_traces([str(folder)])
    ops = Counter(b.op for b in imp.layout.blocks)
    kernels: Counter = Counter()
    time_us: Counter = Counter()
    for st in imp.steps:
        for item in st.items:
            if any(w in item.kernel.lower() for w in ATTENTION):
                kernels[(item.kernel[:90], item.kind, item.opname)] += 1
                time_us[(item.kernel[:90], item.kind, item.opname)] += item.busy_us
    rows = [[*key, n, time_us[key]] for key, n in kernels.most_common()]
    return "\n\n".join(
        [
            f"{imp.step_name}: {len(imp.layout.blocks)} blocks ({dict(ops)})",
            coverage(imp).line(),
            "## Attention kernels of the step (kind other: a busy stand-in)",
            markdown_table(["kernel", "kind", "op", "launches", "µs"], rows),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "traces")))
    parser.add_argument("--name", default="onerank_attention", help="folder under --out")
    parser.add_argument("--sync", action="store_true", help="record CUDA sync events")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--d", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument(
        "--active", type=int, default=1, help="active profiler steps (several: traced ranges)"
    )
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("attention_trace_gpu: no CUDA device; no trace made (run it on a GPU machine)")
        return 0
    folder = args.out / args.name
    path = record(
        folder,
        batch=args.batch,
        seq=args.seq,
        d=args.d,
        heads=args.heads,
        layers=args.layers,
        sync=args.sync,
        active=args.active,
    )
    print(f"# {path} ({path.stat().st_size} bytes, {torch.cuda.get_device_name(0)})\n")
    print(imported(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
