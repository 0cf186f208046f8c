"""busy against a real elementwise kernel on one CUDA GPU: an overlapped NCCL collective is
slowed by ``op: busy`` as by a real elementwise kernel of the same duration, and not by
``op: sleep``.

The collective is an out-of-place all_gather. At world 1 (the default) NCCL does it as a
device-to-device copy, which needs HBM bandwidth as an elementwise kernel does (and no SMs).
With ``--nproc 2`` and two ranks sharing the GPU (NCCL >= 2.30.7 with
``NCCL_MULTI_RANK_GPU_ENABLE=1``) it runs NCCL's own kernels, which need SMs as well; absolute
timings of that mode describe nothing real, the comparison of the partners within one run
still does.

1. The real kernel alone: one ``torch.add(a, b, out=c)`` over ``--real-mib`` MiB per operand
   (the custom op :class:`RealAdd` below), timed by maestro: its latency is D.
2. One pattern per partner and collective size: the collective beside the partner on a lane of
   its own, both started by the gate, with the baseline on (each block alone, same run). The
   partners: the real kernel, ``busy`` with ``duration_us: D``, ``sleep`` with D. The whole run
   is repeated ``--repeats`` times, each a process of its own.
3. e = the collective's slowdown - 1 under each partner (mean over repeats; spread = max - min).
   Per size: busy matches the real kernel when |e_busy - e_real| <= max(MARGIN x e_real, spread
   of e_busy + spread of e_real); sleep competes with nothing when e_sleep <= MARGIN x e_real +
   its spread; "inconclusive" when the real kernel slows the collective by less than
   MIN_EFFECT (nothing to compare).

Run: ``python bench/busy_gpu.py --json busy.json`` (about 3 minutes on one H200). Exits 0 with a
message without CUDA; exits 1 when a verdict fails.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Started as a file: restart as a module of the repository, so that package imports
    # resolve without touching sys.path.
    _root = str(Path(__file__).resolve().parents[1])
    _env = dict(os.environ)
    _env["PYTHONPATH"] = os.pathsep.join(p for p in (_root, _env.get("PYTHONPATH")) if p)
    os.execve(sys.executable, [sys.executable, "-m", "bench.busy_gpu", *sys.argv[1:]], _env)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from typing import Any  # noqa: E402

from userbenchmark.maestro.blocks.base import Block, Param  # noqa: E402

from ._common import REPO_ROOT, machine_info, maestro_env, markdown_table, write_json  # noqa: E402

MARGIN = 0.25
"""busy's excess slowdown of the collective must be within this part of the real kernel's."""
MIN_EFFECT = 0.10
"""The real kernel must slow the collective by at least this much for a verdict."""
SIZES = ("64M", "256M")
PARTNERS = ("real", "busy", "sleep")
RUN_TIMEOUT_S = 900


class RealAdd(Block):
    """A real elementwise kernel: one ``c = a + b`` over ``mib`` MiB per operand."""

    op = "bench.busy_gpu:RealAdd"
    category = "compute"
    params = (Param(name="mib", kind="int", minimum=1, doc="MiB of each of a, b and c"),)

    @classmethod
    def buffer_bytes(cls, params: Mapping[str, Any], *, dtype: str, team_size: int) -> int:
        return 3 * int(params["mib"]) << 20

    def setup(self) -> None:
        n = (int(self.spec.params["mib"]) << 20) // self.spec.dtype_size_bytes
        self.a, self.b, self.c = (self.ctx.empty(n).zero_() for _ in range(3))

    def launch(self) -> None:
        import torch

        torch.add(self.a, self.b, out=self.c)


def _head(name: str, nproc: int, iters: int, baseline: bool) -> str:
    return (
        f"name: {name}\nworld_size: {nproc}\n"
        f"defaults: {{dtype: fp32, warmup_iters: 10, iters: {iters}, "
        f"baseline: {'true' if baseline else 'false'}}}\npatterns:\n"
    )


def real_alone_yaml(nproc: int, iters: int, real_mib: int) -> str:
    """The real kernel alone (its latency is the duration the other partners are given)."""
    return _head("busy_bench_real", nproc, iters, False) + (
        "  - name: real_alone\n    blocks:\n"
        f"      - {{name: real, op: '{RealAdd.op}', mib: {real_mib}}}\n"
    )


def overlap_yaml(nproc: int, iters: int, real_mib: int, duration_us: float) -> str:
    """The collective beside each partner, at each size, with the baseline on."""
    partners = {
        "real": f"op: '{RealAdd.op}', mib: {real_mib}",
        "busy": f"op: busy, duration_us: {duration_us:.1f}",
        "sleep": f"op: sleep, duration_us: {duration_us:.1f}",
    }
    text = _head("busy_bench", nproc, iters, True)
    for partner, params in partners.items():
        text += (
            f"  - name: with_{partner}\n    sweep: {{size: [{', '.join(SIZES)}]}}\n    blocks:\n"
            "      - {name: ag, op: all_gather, size: '${size}'}\n"
            f"      - {{name: partner, lane: partner, {params}}}\n"
        )
    return text


def run_maestro(text: str, nproc: int) -> list[dict[str, Any]]:
    """Run the pattern file ``text`` through maestro's command line; its results.json."""
    with tempfile.TemporaryDirectory() as tmp:
        config, out = Path(tmp) / "pattern.yaml", Path(tmp) / "out"
        config.write_text(text)
        cmd = [sys.executable, "-m", "userbenchmark.maestro", "run", "-c", str(config),
               "--output-dir", str(out), "--no-metrics", "--nproc", str(nproc)]  # fmt: skip
        proc = subprocess.run(
            cmd, cwd=REPO_ROOT, env=maestro_env(), capture_output=True, text=True,
            timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"maestro exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        print(proc.stdout, flush=True)
        return json.loads((out / "results.json").read_text())


def excess(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """{(partner, size): the collective's slowdown - 1} of one run."""
    out = {}
    for r in records:
        if r["block"] == "ag" and r["slowdown"] is not None:
            partner = r["pattern"].split("[")[0].removeprefix("with_")
            size = r["pattern"].split("size=")[1].rstrip("]")
            out[(partner, size)] = r["slowdown"] - 1.0
    return out


def verdict(e: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """The verdict of one size from each partner's excess slowdowns over the repeats."""
    mean = {p: statistics.fmean(v) for p, v in e.items()}
    spread = {p: max(v) - min(v) for p, v in e.items()}
    out: dict[str, Any] = {"mean": mean, "spread": spread}
    if mean["real"] < MIN_EFFECT:
        out["result"] = (
            f"inconclusive: the real kernel slows the collective by {mean['real']:+.3f}, "
            f"less than {MIN_EFFECT}"
        )
        return out
    busy_ok = abs(mean["busy"] - mean["real"]) <= max(
        MARGIN * mean["real"], spread["busy"] + spread["real"]
    )
    sleep_ok = mean["sleep"] <= MARGIN * mean["real"] + spread["sleep"]
    out["busy_matches_real"], out["sleep_competes_with_nothing"] = busy_ok, sleep_ok
    out["result"] = "pass" if busy_ok and sleep_ok else "FAIL"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=1, help="ranks on the one GPU (1 or 2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--real-mib", type=int, default=1024, help="MiB per operand of the add")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    info = machine_info()
    import torch

    if not torch.cuda.is_available():
        print("busy_gpu: no CUDA device; nothing measured (run it on a GPU machine)")
        return 0
    info["gpu"] = torch.cuda.get_device_name(0)
    real = run_maestro(real_alone_yaml(args.nproc, args.iters, args.real_mib), args.nproc)
    duration_us = float(real[0]["latency_avg_us"])
    print(f"real kernel alone: {duration_us:.1f} µs (the duration given to busy and sleep)")
    runs = [
        run_maestro(overlap_yaml(args.nproc, args.iters, args.real_mib, duration_us), args.nproc)
        for _ in range(args.repeats)
    ]
    found = [excess(run) for run in runs]
    verdicts = {
        size: verdict({p: [f[(p, size)] for f in found] for p in PARTNERS}) for size in SIZES
    }
    busy_alone = [
        r["isolated_latency_avg_us"]
        for run in runs
        for r in run
        if r["block"] == "partner" and r["pattern"].startswith("with_busy")
    ]
    rows = [
        [size, *(v["mean"][p] for p in PARTNERS), *(v["spread"][p] for p in PARTNERS), v["result"]]
        for size, v in verdicts.items()
    ]
    print(
        markdown_table(
            [
                "all_gather size",
                *(f"e {p}" for p in PARTNERS),
                *(f"spread {p}" for p in PARTNERS),
                "verdict",
            ],
            rows,
        )  # fmt: skip
    )
    print(f"busy alone: {statistics.fmean(busy_alone):.1f} µs for {duration_us:.1f} µs asked")
    write_json(
        args.json,
        {
            "benchmark": "busy_gpu",
            "machine": info,
            "nproc": args.nproc,
            "real_alone_us": duration_us,
            "busy_alone_us": busy_alone,
            "margin": MARGIN,
            "min_effect": MIN_EFFECT,
            "verdicts": verdicts,
            "runs": runs,
        },
    )
    return 1 if any(v["result"] == "FAIL" for v in verdicts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
