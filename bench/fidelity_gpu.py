"""Fidelity on one CUDA GPU: maestro's latency against the kernel's own duration.

Per op (bf16 GEMMs 256^3..8192^3, spin sleeps, a 1-rank NCCL all_gather): (a) maestro's
latency with the cupti and the events profiler (``python -m userbenchmark.maestro run`` in a
subprocess, read from results.json); (b) the kernel span per launch from CUPTI in a hand loop
whose stream is held by a spin kernel while the host enqueues every iteration; (c) a naive
per-launch CUDA-event loop. Then lane start skew and gate delay of 2-4 gated GEMMs, and a size
sweep for where maestro stops being launch-bound. Exits 0 with a message without CUDA.

Run: ``python bench/fidelity_gpu.py --json out.json`` (or ``python -m bench.fidelity_gpu``).
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
    os.execve(sys.executable, [sys.executable, "-m", "bench.fidelity_gpu", *sys.argv[1:]], _env)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

from ._common import (  # noqa: E402
    REPO_ROOT,
    machine_info,
    machine_lines,
    maestro_env,
    markdown_table,
    write_json,
)

GEMM_SIZES = (256, 512, 1024, 2048, 4096, 8192)
SLEEP_US = (10, 100, 1000)
AG_SIZE_BYTES = 4 << 20
SKEW_LANES = (2, 3, 4)
SKEW_GEMM = 1024
SWEEP_SIZES = (64, 128, 256, 512, 1024, 2048, 4096)
LAUNCH_BOUND_US = 10.0  # maestro's threshold (core/runner.py): gate open -> first start
TARGET_RATIO_ERROR = 0.01
SUBPROCESS_TIMEOUT_S = 100
"""Per maestro run: three runs and the in-process part fit in ~6 minutes on one H200."""


def op_names() -> list[str]:
    return [f"gemm{n}" for n in GEMM_SIZES] + [f"sleep{u}us" for u in SLEEP_US] + ["ag4M_ws1"]


def fidelity_yaml(iters: int, warmup: int) -> str:
    """One single-block pattern per op, world size 1 (every block's latency is its own)."""
    lines = [
        "name: fidelity",
        "world_size: 1",
        f"defaults: {{dtype: bf16, warmup_iters: {warmup}, iters: {iters}, baseline: false}}",
        "stop_on_error: false",
        "patterns:",
    ]
    for n in GEMM_SIZES:
        lines.append(f"  - name: gemm{n}")
        lines.append(f"    blocks: [{{name: g, op: gemm, m: {n}, n: {n}, k: {n}}}]")
    for u in SLEEP_US:
        lines.append(f"  - name: sleep{u}us")
        lines.append(f"    blocks: [{{name: s, op: sleep, duration_us: {u}}}]")
    lines.append("  - name: ag4M_ws1")
    lines.append(f"    blocks: [{{name: ag, op: all_gather, size: {AG_SIZE_BYTES}}}]")
    return "\n".join(lines) + "\n"


def gate_yaml(iters: int, warmup: int) -> str:
    """2-4 GEMMs on separate lanes (skew), and 2-lane GEMM pairs from tiny to large (sweep)."""
    lines = [
        "name: gate",
        "world_size: 1",
        f"defaults: {{dtype: bf16, warmup_iters: {warmup}, iters: {iters}, baseline: false}}",
        "stop_on_error: false",
        "patterns:",
    ]
    n = SKEW_GEMM
    for lanes in SKEW_LANES:
        lines.append(f"  - name: skew{lanes}")
        lines.append("    blocks:")
        for i in range(lanes):
            lines.append(f"      - {{name: g{i}, op: gemm, lane: l{i}, m: {n}, n: {n}, k: {n}}}")
    for n in SWEEP_SIZES:
        lines.append(f"  - name: sweep{n}")
        lines.append("    blocks:")
        for i in range(2):
            lines.append(f"      - {{name: g{i}, op: gemm, lane: l{i}, m: {n}, n: {n}, k: {n}}}")
    return "\n".join(lines) + "\n"


def run_maestro(config: Path, profiler: str, out: Path) -> dict[str, Any]:
    """``python -m userbenchmark.maestro run`` in a subprocess; its results and patterns."""
    env = maestro_env()
    cmd = [
        sys.executable,
        "-m",
        "userbenchmark.maestro",
        "run",
        "-c",
        str(config),
        "--profiler",
        profiler,
        "--output-dir",
        str(out),
        "--no-metrics",
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        # Keep what it printed: the last pattern in stdout tells where it stopped.
        returncode = "timeout"
        stdout, stderr = _text(exc.stdout), _text(exc.stderr)
    wall = time.perf_counter() - t0
    res: dict[str, Any] = {"returncode": returncode, "wall_s": wall}
    res["warnings"] = [line for line in stderr.splitlines() if "WARNING" in line]
    if returncode != 0:
        res["stderr_tail"] = stderr[-3000:]
        res["stdout_tail"] = stdout[-1500:]
        done = [p["pattern"] for p in _read(out / "patterns.json")]
        res["stderr_tail"] += f"\n(patterns finished: {', '.join(done) or 'none'})"
    for name in ("results.json", "patterns.json"):
        res[name] = _read(out / name)
    return res


def _read(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text()) if path.exists() else []


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def by_pattern(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(r["pattern"], []).append(r)
    return out


# ---- in-process measurements -------------------------------------------------------------


class Ops:
    """The ops of the fidelity table as zero-argument callables on the current stream."""

    def __init__(self, torch: Any, cycles_per_us: float, errors: dict[str, str]) -> None:
        self.torch = torch
        self.ops: dict[str, Callable[[], Any]] = {}
        for n in GEMM_SIZES:
            a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
            self.ops[f"gemm{n}"] = lambda a=a, b=b, c=c: torch.matmul(a, b, out=c)
        for u in SLEEP_US:
            cycles = max(1, round(cycles_per_us * u))
            self.ops[f"sleep{u}us"] = lambda cycles=cycles: torch.cuda._sleep(cycles)
        try:
            self.ops["ag4M_ws1"] = self._all_gather()
        except Exception as exc:  # NCCL may be missing or refuse: the rest still runs
            errors["ag4M_ws1 setup"] = f"{type(exc).__name__}: {exc}"

    def _all_gather(self) -> Callable[[], Any]:
        import torch.distributed as dist

        torch = self.torch
        if not dist.is_initialized():
            store = Path(tempfile.mkdtemp()) / "store"
            dist.init_process_group(
                "nccl",
                init_method=f"file://{store}",
                rank=0,
                world_size=1,
                device_id=torch.device("cuda", torch.cuda.current_device()),
            )
        numel = AG_SIZE_BYTES // 2
        out = torch.empty(numel, device="cuda", dtype=torch.bfloat16)
        inp = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        # async_op=False: on one rank the copy runs on the caller's current stream, so the
        # spin kernel on that stream holds it like any other op.
        return lambda: gather(out, inp)


def naive_event_us(torch: Any, op: Callable[[], Any], iters: int, warmup: int) -> list[float]:
    """Per launch: record, op, record, synchronize, elapsed_time (the launch-bound way)."""
    for _ in range(warmup):
        op()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(iters):
        start.record()
        op()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
    return out


def held_kernel(
    prof: Any,
    torch: Any,
    op: Callable[[], Any],
    iters: int,
    warmup: int,
    cycles_per_us: float,
    window_id: int,
) -> dict[str, Any]:
    """CUPTI span per launch while a spin kernel holds the stream during the whole enqueue."""
    for _ in range(warmup):
        op()
    torch.cuda.synchronize()
    # Size the spin from an unheld enqueue of the same loop: 3x that, at least 5 ms.
    t0 = time.perf_counter_ns()
    for _ in range(iters):
        op()
    enqueue_probe_us = (time.perf_counter_ns() - t0) / 1e3
    torch.cuda.synchronize()
    spin_us = max(5000.0, 3.0 * enqueue_probe_us + 1000.0)
    prof.begin_window(window_id, 1, iters)  # flushes and drops the warmup's records
    prof.push_gate(0)
    torch.cuda._sleep(max(1, round(spin_us * cycles_per_us)))
    prof.pop()
    t0 = time.perf_counter_ns()
    for it in range(iters):
        prof.push(0, it)
        op()
        prof.pop()
    enqueue_ns = time.perf_counter_ns() - t0
    host_done_ns = time.time_ns()  # CUPTI timestamps are CLOCK_REALTIME, as time.time_ns()
    att = prof.end_window()
    spans_us = [float(d) / 1e3 for d in att.duration_ns[0]]
    gate_end = int(att.gate_end_ns[0])
    return {
        "spans_us": spans_us,
        "avg_us": statistics.fmean(spans_us),
        "p50_us": statistics.median(spans_us),
        "activities_per_launch": float(att.activity_count[0].mean()),
        "enqueue_us_per_launch": enqueue_ns / 1e3 / iters,
        "spin_us": spin_us,
        "held": bool(gate_end > 0 and host_done_ns < gate_end),
        "first_start_after_spin_us": (int(att.start_ns[0, 0]) - gate_end) / 1e3,
    }


def in_process(args: argparse.Namespace, errors: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Naive event loops first (no CUPTI attached), then the held CUPTI loops."""
    import torch

    from userbenchmark.maestro.core.executor import calibrate_sleep_cycles_per_us
    from userbenchmark.maestro.core.profilers.cupti import CuptiProfiler, cupti_available

    out: dict[str, dict[str, Any]] = {name: {} for name in op_names()}
    cycles_per_us = calibrate_sleep_cycles_per_us(torch.device("cuda", 0))
    out["_calibration"] = {"sleep_cycles_per_us": cycles_per_us}
    ops = Ops(torch, cycles_per_us, errors)
    for name, op in ops.ops.items():
        try:
            vals = naive_event_us(torch, op, args.iters, args.warmup)
            out[name]["naive_event_us"] = statistics.fmean(vals)
            out[name]["naive_event_p50_us"] = statistics.median(vals)
        except Exception as exc:
            errors[f"{name} naive"] = f"{type(exc).__name__}: {exc}"
    ok, why = cupti_available()
    if not ok:
        errors["held loop"] = f"cupti not usable: {why}"
        _destroy_group()
        return out
    prof = CuptiProfiler()
    prof.start()
    try:
        for window, (name, op) in enumerate(ops.ops.items(), start=1):
            try:
                held = held_kernel(prof, torch, op, args.iters, args.warmup, cycles_per_us, window)
                out[name]["held"] = held
            except Exception as exc:
                errors[f"{name} held"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
    finally:
        prof.stop()
        _destroy_group()
    return out


def _destroy_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


# ---- report -------------------------------------------------------------------------------


def _latency(run: dict[str, Any] | None, pattern: str) -> float | None:
    if not run:
        return None
    recs = by_pattern(run.get("results.json", [])).get(pattern)
    return recs[0]["latency_avg_us"] if recs else None


def fidelity_rows(
    maestro: dict[str, dict[str, Any]], local: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    rows = []
    for name in op_names():
        held = local.get(name, {}).get("held", {})
        held_us = held.get("avg_us")
        naive = local.get(name, {}).get("naive_event_us")
        m_cupti = _latency(maestro.get("cupti"), name)
        m_events = _latency(maestro.get("events"), name)
        ratio = m_cupti / held_us if m_cupti and held_us else math.nan
        launch_bound = None
        if naive is not None and held_us:
            launch_bound = naive - held_us > max(2.0, 0.10 * held_us)
        rows.append(
            {
                "op": name,
                "maestro_cupti_us": m_cupti,
                "maestro_events_us": m_events,
                "held_kernel_us": held_us,
                "held_p50_us": held.get("p50_us"),
                "held_stream_was_held": held.get("held"),
                "host_enqueue_us_per_launch": held.get("enqueue_us_per_launch"),
                "naive_event_us": naive,
                "ratio_maestro_cupti_over_held": ratio,
                "within_1pct": (
                    abs(ratio - 1.0) <= TARGET_RATIO_ERROR if not math.isnan(ratio) else None
                ),
                "naive_launch_bound": launch_bound,
            }
        )
    return rows


def gate_rows(run: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not run:
        return []
    pats = {p["pattern"]: p for p in run.get("patterns.json", [])}
    blocks = by_pattern(run.get("results.json", []))
    rows = []
    names = [f"skew{n}" for n in SKEW_LANES] + [f"sweep{n}" for n in SWEEP_SIZES]
    for name in names:
        p = pats.get(name)
        if p is None:
            rows.append({"pattern": name, "error": "no result (see warnings/stderr)"})
            continue
        lat = [b["latency_avg_us"] for b in blocks.get(name, [])]
        gate = p.get("gate_delay_max_us")
        rows.append(
            {
                "pattern": name,
                "blocks": p["num_blocks"],
                "latency_avg_us": statistics.fmean(lat) if lat else None,
                "makespan_avg_us": p.get("makespan_avg_us"),
                "lane_skew_p50_us": p.get("lane_skew_p50_us"),
                "lane_skew_max_us": p.get("lane_skew_max_us"),
                "gate_delay_max_us": gate,
                "launch_bound": None if gate is None else gate > LAUNCH_BOUND_US,
                "warned": any(name in w and "launch-bound" in w for w in run["warnings"]),
            }
        )
    return rows


def smallest_unbound(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The smallest sweep size from which no larger size is launch-bound."""
    sweep = [r for r in rows if r["pattern"].startswith("sweep") and "error" not in r]
    best = None
    for r in reversed(sweep):
        if r["launch_bound"] or r["warned"]:
            break
        best = r
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--gate-iters", type=int, default=200, help="iters of skew/sweep")
    parser.add_argument(
        "--write-configs", default=None, help="only write the generated pattern files here"
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.write_configs:
        folder = Path(args.write_configs)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "fidelity.yaml").write_text(fidelity_yaml(args.iters, args.warmup))
        (folder / "gate.yaml").write_text(gate_yaml(args.gate_iters, args.warmup))
        print(f"wrote {folder / 'fidelity.yaml'} and {folder / 'gate.yaml'}")
        return 0
    info = machine_info()
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        message = "fidelity_gpu: no CUDA device; nothing measured (run it on a GPU machine)"
        print(message)
        write_json(args.json, {"benchmark": "fidelity_gpu", "machine": info, "skipped": message})
        return 0
    info["gpu"] = torch.cuda.get_device_name(0)
    info["cuda"] = str(torch.version.cuda)
    try:
        import importlib.metadata

        info["cupti_python"] = importlib.metadata.version("cupti-python")
    except Exception:
        info["cupti_python"] = "not installed"
    try:
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        pass

    errors: dict[str, str] = {}
    maestro: dict[str, dict[str, Any]] = {}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        fid = tmp / "fidelity.yaml"
        fid.write_text(fidelity_yaml(args.iters, args.warmup))
        gate = tmp / "gate.yaml"
        gate.write_text(gate_yaml(args.gate_iters, args.warmup))
        for label, config, profiler in (
            ("cupti", fid, "cupti"),
            ("events", fid, "events"),
            ("gate", gate, "cupti"),
        ):
            try:
                maestro[label] = run_maestro(config, profiler, tmp / label)
                if maestro[label]["returncode"] != 0:
                    errors[f"maestro {label}"] = (
                        f"exit {maestro[label]['returncode']} after "
                        f"{maestro[label]['wall_s']:.0f} s: "
                        f"{maestro[label].get('stderr_tail', '')[-600:]}"
                    )
            except Exception as exc:
                errors[f"maestro {label}"] = f"{type(exc).__name__}: {exc}"
    local: dict[str, dict[str, Any]] = {}
    try:
        local = in_process(args, errors)
    except Exception as exc:
        errors["in-process"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    rows = fidelity_rows(maestro, local)
    grows = gate_rows(maestro.get("gate"))
    unbound = smallest_unbound(grows)
    elapsed = time.perf_counter() - t_start

    print("## Fidelity on one GPU\n")
    print(machine_lines(info))
    print(
        f"\nbf16, {args.iters} measured iterations after {args.warmup} warmup each. maestro: "
        "latency avg from results.json; held: CUPTI span per launch, stream held by a spin "
        "kernel while the host enqueued every launch; naive: per-launch CUDA events with a "
        f"synchronize. Target: maestro cupti / held within {TARGET_RATIO_ERROR:.0%}.\n"
    )
    headers = [
        "op",
        "maestro cupti us",
        "maestro events us",
        "held kernel us",
        "naive event us",
        "cupti / held",
        "within 1%",
        "naive launch-bound",
        "host enqueue us/launch",
        "stream held",
    ]
    print(
        markdown_table(
            headers,
            [
                [
                    r["op"],
                    r["maestro_cupti_us"],
                    r["maestro_events_us"],
                    r["held_kernel_us"],
                    r["naive_event_us"],
                    r["ratio_maestro_cupti_over_held"],
                    r["within_1pct"],
                    r["naive_launch_bound"],
                    r["host_enqueue_us_per_launch"],
                    r["held_stream_was_held"],
                ]
                for r in rows
            ],
        )
    )
    print(
        f"\n### Gate: lane skew and launch-bound sweep ({args.gate_iters} iterations, "
        f"maestro cupti; launch-bound = gate open -> first start > {LAUNCH_BOUND_US:.0f} us)\n"
    )
    gheaders = [
        "pattern",
        "blocks",
        "block avg us",
        "makespan us",
        "lane skew p50 us",
        "lane skew max us",
        "gate delay max us",
        "launch-bound",
        "warned",
    ]
    print(
        markdown_table(
            gheaders,
            [
                [
                    r["pattern"],
                    r.get("blocks"),
                    r.get("latency_avg_us"),
                    r.get("makespan_avg_us"),
                    r.get("lane_skew_p50_us"),
                    r.get("lane_skew_max_us"),
                    r.get("gate_delay_max_us"),
                    r.get("launch_bound"),
                    r.get("warned"),
                ]
                for r in grows
            ],
        )
    )
    if unbound:
        print(
            f"\nSmallest GEMM pair not launch-bound (and no larger one is): {unbound['pattern']}"
            f", block avg {unbound['latency_avg_us']:.2f} us."
        )
    print("\nmaestro does not report its host enqueue time per block; the held loop's is above.")
    if errors:
        print("\nErrors (each measurement that failed; the rest ran):")
        for key, text in errors.items():
            print(f"- {key}: {text}")
    print(f"\nTotal time {elapsed:.0f} s.")
    write_json(
        args.json,
        {
            "benchmark": "fidelity_gpu",
            "machine": info,
            "fidelity": rows,
            "gate": grows,
            "smallest_unbound": unbound,
            "in_process": local,
            "maestro_runs": {
                k: {kk: vv for kk, vv in v.items() if kk not in ("results.json", "patterns.json")}
                | {"results": v.get("results.json"), "patterns": v.get("patterns.json")}
                for k, v in maestro.items()
            },
            "errors": errors,
            "elapsed_s": elapsed,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
