"""Fidelity on one CUDA GPU: maestro's latency against the kernel's own duration.

Per op (bf16 GEMMs 64^3..8192^3, spin sleeps, a 1-rank NCCL all_gather): (a) maestro's
latency with the cupti and the events profiler, and with cupti under CUDA graphs (``--graph``)
(``python -m userbenchmark.maestro run`` in a subprocess, read from results.json); (b) the kernel span per launch from CUPTI in a hand loop
whose stream is held by a spin kernel while the host enqueues every iteration; (c) a naive
per-launch CUDA-event loop. Then the gate: lane start skew of 2-4 gated GEMMs, a size sweep of
GEMM pairs and a chain of small GEMMs on one lane, each with maestro's own host enqueue time
and launch-bound count, eager and under CUDA graphs; and a probe of the host stall at a kernel's first launch. Exits 0 with
a message without CUDA.

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
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

from ._common import (  # noqa: E402
    REPO_ROOT,
    fmt,
    machine_info,
    machine_lines,
    maestro_env,
    markdown_table,
    write_json,
)

GEMM_SIZES = (64, 256, 512, 1024, 2048, 4096, 8192)
SLEEP_US = (10, 100, 1000)
AG_SIZE_BYTES = 4 << 20
SKEW_LANES = (2, 3, 4)
SKEW_GEMM = 1024
SWEEP_SIZES = (64, 128, 256, 512, 1024, 2048, 4096)
CHAIN_BLOCKS = 32
CHAIN_GEMM = 64
"""The chain: 32 back-to-back 64^3 GEMMs on one lane (~2 µs each, ~25 µs of host enqueue)."""
TARGET_RATIO_ERROR = 0.01
SUBPROCESS_TIMEOUT_S = 240
"""Per maestro run (each takes well under a minute on one H200 when nothing is wrong)."""


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
    """A chain of small GEMMs on one lane, 2-4 GEMMs on separate lanes (skew), and 2-lane
    GEMM pairs from tiny to large (sweep)."""
    lines = [
        "name: gate",
        "world_size: 1",
        f"defaults: {{dtype: bf16, warmup_iters: {warmup}, iters: {iters}, baseline: false}}",
        "stop_on_error: false",
        "patterns:",
    ]
    n = SKEW_GEMM
    lines.append("  - name: chain")
    lines.append("    blocks:")
    for i in range(CHAIN_BLOCKS):
        m = CHAIN_GEMM
        lines.append(f"      - {{name: c{i}, op: gemm, lane: l0, m: {m}, n: {m}, k: {m}}}")
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


def run_maestro(
    config: Path, profiler: str, out: Path, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
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
        "--metrics-dir",
        str(out / "metrics"),
        *extra,
    ]
    # A run that overstays gets SIGABRT: with faulthandler on, Python prints every thread's
    # stack first, so a hang says where it hung.
    env["PYTHONFAULTHANDLER"] = "1"
    t0 = time.perf_counter()
    with subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
            returncode: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            try:
                stdout, stderr = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            returncode = "timeout"
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
    metrics = sorted((out / "metrics").glob("metrics-*.json"))
    res["environ"] = json.loads(metrics[-1].read_text())["environ"] if metrics else {}
    return res


def _read(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text()) if path.exists() else []


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


def enqueue_probe_us_per_launch(
    torch: Any, op: Callable[[], Any], *, warmup: int, launches: int
) -> float:
    """Host µs per launch of ``op`` in an unheld loop of ``launches``, after ``warmup`` runs;
    the device is idle again on return."""
    for _ in range(warmup):
        op()
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(launches):
        op()
    per_launch_us = (time.perf_counter_ns() - t0) / 1e3 / launches
    torch.cuda.synchronize()
    return per_launch_us


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
    # Size the spin from an unheld enqueue of the same loop: 3x that, at least 5 ms.
    enqueue_probe_us = iters * enqueue_probe_us_per_launch(torch, op, warmup=warmup, launches=iters)
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
    att = prof.attribute_window()
    spans_us = [float(d) / 1e3 for d in (att.end_ns - att.start_ns)[0]]
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


def gated_kernel(
    prof: Any,
    torch: Any,
    op: Callable[[], Any],
    iters: int,
    warmup: int,
    cycles_per_us: float,
    window_id: int,
    gap_us: float | None = None,
) -> dict[str, Any]:
    """CUPTI span per launch, one launch per iteration behind its own spin: maestro's schedule
    written by hand (synchronize, spin on the stream, enqueue the op while the spin runs)."""
    enqueue_probe_us = enqueue_probe_us_per_launch(torch, op, warmup=warmup, launches=10)
    # The gap maestro left between iterations (its gate spin) when known: the GPU's clocks
    # and power state under a long kernel depend on how busy it is kept.
    spin_us = max(200.0, 3.0 * enqueue_probe_us + 50.0, gap_us or 0.0)
    cycles = max(1, round(spin_us * cycles_per_us))
    done_ns = []
    enqueue_ns = 0
    prof.begin_window(window_id, 1, iters)
    for it in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        prof.push_gate(it)
        torch.cuda._sleep(cycles)
        prof.pop()
        prof.push(0, it)
        op()
        prof.pop()
        enqueue_ns += time.perf_counter_ns() - t0
        done_ns.append(time.time_ns())  # CUPTI timestamps are CLOCK_REALTIME
    att = prof.attribute_window()
    spans_us = [float(d) / 1e3 for d in (att.end_ns - att.start_ns)[0]]
    gate_end = [int(g) for g in att.gate_end_ns]
    return {
        "spans_us": spans_us,
        "avg_us": statistics.fmean(spans_us),
        "p50_us": statistics.median(spans_us),
        "enqueue_us_per_iter": enqueue_ns / 1e3 / iters,
        "spin_us": spin_us,
        "held_fraction": statistics.fmean(d < g for d, g in zip(done_ns, gate_end, strict=True)),
    }


def in_process(
    args: argparse.Namespace,
    errors: dict[str, str],
    maestro_rate: float | None,
    maestro_gate_us: dict[str, float],
) -> dict[str, dict[str, Any]]:
    """Naive event loops first (no CUPTI attached), then the held and gated CUPTI loops.

    Sleeps spin as many cycles as maestro's did (``maestro_rate``, its calibrated cycles per
    µs) so that both time the same kernel; the gate spins use this process's own rate.
    """
    import torch

    from userbenchmark.maestro.core.measure.lanes import calibrate_sleep_cycles_per_us
    from userbenchmark.maestro.core.profilers.cupti import CuptiProfiler, cupti_available

    out: dict[str, dict[str, Any]] = {name: {} for name in op_names()}
    cycles_per_us = calibrate_sleep_cycles_per_us(torch.device("cuda", 0))
    out["_calibration"] = {"sleep_cycles_per_us": cycles_per_us, "maestro_rate": maestro_rate}
    ops = Ops(torch, maestro_rate or cycles_per_us, errors)
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
        window = 0
        for name, op in ops.ops.items():
            # Gated first: the back-to-back loop heats the GPU (a long kernel then runs slower).
            for label in ("gated", "held"):
                window += 1
                try:
                    common = (prof, torch, op, args.iters, args.warmup, cycles_per_us, window)
                    out[name][label] = (
                        held_kernel(*common)
                        if label == "held"
                        else gated_kernel(*common, gap_us=maestro_gate_us.get(name))
                    )
                except Exception as exc:
                    errors[f"{name} {label}"] = f"{type(exc).__name__}: {exc}"
                    traceback.print_exc()
    finally:
        _destroy_group()  # before CUPTI is detached (see core/session.py)
        prof.close()
    return out


KINETO_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def kineto_spans_us(trace: dict[str, Any], iters: int) -> dict[str, Any]:
    """Per iteration of a gated loop read by torch.profiler: the op's span (first start to
    last end of its device events), leaving out each iteration's leading gate spin.

    The loop synchronizes between iterations and runs everything on one stream, so the device
    events sorted by start come in ``iters`` equal chunks: [gate spin, op's events...].
    """
    events = sorted(
        (e for e in trace.get("traceEvents", []) if e.get("cat") in KINETO_DEVICE_CATS),
        key=lambda e: float(e["ts"]),
    )
    if not events or len(events) % iters:
        raise ValueError(f"{len(events)} device events do not split into {iters} iterations")
    per_iter = len(events) // iters
    if per_iter < 2:
        raise ValueError(f"{per_iter} device event per iteration: no op behind the gate")
    spans = []
    for it in range(iters):
        chunk = events[it * per_iter + 1 : (it + 1) * per_iter]
        start = min(float(e["ts"]) for e in chunk)
        end = max(float(e["ts"]) + float(e["dur"]) for e in chunk)
        spans.append(end - start)
    return {
        "avg_us": statistics.fmean(spans),
        "p50_us": statistics.median(spans),
        "events_per_launch": per_iter - 1,
    }


def kineto_reference(
    args: argparse.Namespace, maestro_rate: float | None, gates: dict[str, float]
) -> dict[str, Any]:
    """The gated loop of every op under torch.profiler (CUPTI through Kineto, not maestro's
    reader); runs in a process of its own (one CUPTI client per process). Each op's spin is
    the hand gated loop's (maestro's gate spin for that op): a long kernel's speed depends on
    how busy the GPU is kept between launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from userbenchmark.maestro.core.measure.lanes import calibrate_sleep_cycles_per_us

    errors: dict[str, str] = {}
    cycles_per_us = calibrate_sleep_cycles_per_us(torch.device("cuda", 0))
    ops = Ops(torch, maestro_rate or cycles_per_us, errors)
    out: dict[str, Any] = {"_errors": errors}
    for name, op in ops.ops.items():
        spin_us = max(200.0, gates.get(name) or 0.0)
        spin = max(1, round(spin_us * cycles_per_us))
        try:
            for _ in range(args.warmup):
                op()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.iters):
                    torch.cuda.synchronize()
                    torch.cuda._sleep(spin)  # the gate: the op is enqueued while it spins
                    op()
                torch.cuda.synchronize()
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "trace.json"
                prof.export_chrome_trace(str(path))
                out[name] = kineto_spans_us(json.loads(path.read_text()), args.iters)
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    _destroy_group()
    return out


def run_kineto_reference(
    args: argparse.Namespace, maestro_rate: float | None, gates: dict[str, float]
) -> dict[str, Any]:
    """:func:`kineto_reference` in a child process; its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "kineto.json"
        cmd = [sys.executable, "-m", "bench.fidelity_gpu", "--kineto-reference", str(result)]
        cmd += ["--iters", str(args.iters), "--warmup", str(args.warmup)]
        if maestro_rate:
            cmd += ["--maestro-rate", repr(maestro_rate)]
        cmd += ["--maestro-gates", json.dumps(gates)]
        proc = subprocess.run(
            cmd, cwd=REPO_ROOT, env=maestro_env(), capture_output=True, text=True,
            timeout=SUBPROCESS_TIMEOUT_S,
        )  # fmt: skip
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(f"exit {proc.returncode}: {proc.stderr[-2000:]}")
        return json.loads(result.read_text())


def _destroy_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


# ---- report -------------------------------------------------------------------------------


def _record(run: dict[str, Any] | None, pattern: str) -> dict[str, Any]:
    """The first block record of ``pattern`` in a maestro run (empty when it has none)."""
    if not run:
        return {}
    recs = by_pattern(run.get("results.json", [])).get(pattern)
    return recs[0] if recs else {}


def fidelity_rows(
    maestro: dict[str, dict[str, Any]], local: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per op: maestro against the gated hand loop (same schedule; the target's reference),
    the back-to-back held loop and the naive event loop."""
    rows = []
    for name in op_names():
        held = local.get(name, {}).get("held", {})
        gated = local.get(name, {}).get("gated", {})
        kineto = local.get(name, {}).get("kineto", {})
        ref_us = gated.get("avg_us")
        naive = local.get(name, {}).get("naive_event_us")
        cupti = _record(maestro.get("cupti"), name)
        m_cupti = cupti.get("latency_avg_us")
        m_events = _record(maestro.get("events"), name).get("latency_avg_us")
        graph = _record(maestro.get("graph"), name)
        m_graph = graph.get("latency_avg_us")
        ratio = m_cupti / ref_us if m_cupti and ref_us else math.nan
        k_us = kineto.get("avg_us")
        k_ratio = m_cupti / k_us if m_cupti and k_us else math.nan
        launch_bound = None
        if naive is not None and ref_us:
            launch_bound = naive - ref_us > max(2.0, 0.10 * ref_us)
        held_fraction = gated.get("held_fraction")
        rows.append(
            {
                "op": name,
                "maestro_cupti_us": m_cupti,
                "maestro_events_us": m_events,
                "maestro_enqueue_us": cupti.get("enqueue_avg_us"),
                "maestro_graph_us": m_graph,
                "ratio_graph_over_eager": m_graph / m_cupti if m_graph and m_cupti else math.nan,
                "maestro_graph_enqueue_us": graph.get("enqueue_avg_us"),
                "gated_kernel_us": ref_us,
                "kineto_gated_us": k_us,
                "ratio_maestro_cupti_over_kineto": k_ratio,
                "within_1pct_of_kineto": (
                    abs(k_ratio - 1.0) <= TARGET_RATIO_ERROR if not math.isnan(k_ratio) else None
                ),
                "gated_p50_us": gated.get("p50_us"),
                "gated_all_held": None if held_fraction is None else held_fraction == 1.0,
                "held_kernel_us": held.get("avg_us"),
                "held_stream_was_held": held.get("held"),
                "host_enqueue_us_per_launch": held.get("enqueue_us_per_launch"),
                "naive_event_us": naive,
                "ratio_maestro_cupti_over_gated": ratio,
                "within_1pct": (
                    abs(ratio - 1.0) <= TARGET_RATIO_ERROR if not math.isnan(ratio) else None
                ),
                "naive_launch_bound": launch_bound,
            }
        )
    return rows


def gate_names() -> list[str]:
    return ["chain"] + [f"skew{n}" for n in SKEW_LANES] + [f"sweep{n}" for n in SWEEP_SIZES]


def gate_rows(run: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per gate pattern: block times, skews, and maestro's own host figures."""
    if not run:
        return []
    pats = {p["pattern"]: p for p in run.get("patterns.json", [])}
    blocks = by_pattern(run.get("results.json", []))
    rows = []
    for name in gate_names():
        p = pats.get(name)
        if p is None:
            rows.append({"pattern": name, "error": "no result (see warnings/stderr)"})
            continue
        recs = blocks.get(name, [])
        lat = [b["latency_avg_us"] for b in recs]
        enq = [b["enqueue_avg_us"] for b in recs if b.get("enqueue_avg_us") is not None]
        rows.append(
            {
                "pattern": name,
                "blocks": p["num_blocks"],
                "latency_avg_us": statistics.fmean(lat) if lat else None,
                "latency_min_block_us": min(lat) if lat else None,
                "latency_max_block_us": max(lat) if lat else None,
                "makespan_avg_us": p.get("makespan_avg_us"),
                "lane_skew_p50_us": p.get("lane_skew_p50_us"),
                "lane_skew_p99_us": p.get("lane_skew_p99_us"),
                "lane_skew_max_us": p.get("lane_skew_max_us"),
                "gate_delay_max_us": p.get("gate_delay_max_us"),
                "gate_spin_us": p.get("gate_spin_us"),
                "enqueue_max_us": p.get("enqueue_max_us"),
                "enqueue_per_block_us": statistics.fmean(enq) if enq else None,
                "host_late_iters": p.get("host_late_iters"),
            }
        )
    return rows


LAUNCH_BOUND_FRACTION = 0.05
"""A pattern is launch-bound when more than 5% of its iterations were (the host's enqueue
outlasted the gate); one or two late iterations in 200 are host hiccups, reported as such."""


def launch_bound(row: dict[str, Any], iters: int) -> bool | None:
    late = row.get("host_late_iters")
    return None if late is None else late > LAUNCH_BOUND_FRACTION * iters


def smallest_unbound(rows: list[dict[str, Any]], iters: int) -> dict[str, Any] | None:
    """The smallest sweep size from which no larger size is launch-bound."""
    sweep = [r for r in rows if r["pattern"].startswith("sweep") and "error" not in r]
    best = None
    for r in reversed(sweep):
        if launch_bound(r, iters) is not False:
            break
        best = r
    return best


# ---- the host stall at a kernel's first launch -------------------------------------------

PROBE_SPIN_US = 500_000.0
"""Longer than a first launch takes on an idle device (~0.1-0.2 s seen), so a launch that
returns after the spin ended waited for it."""


def first_launch_probe() -> dict[str, Any]:
    """Does a kernel's first launch in a process wait for the device? Host time of a launch
    while another stream spins 0.5 s, and whether the spin had ended when it returned.

    cuBLAS, its handle and the stream's workspace are warmed with a bf16 GEMM first. Cases:
    the first fp16 GEMM with the device idle; the first fp32 GEMM during the spin; a later
    fp16 GEMM during the spin.
    """
    import torch

    from userbenchmark.maestro.core.measure.lanes import calibrate_sleep_cycles_per_us

    dev = torch.device("cuda", 0)
    rate = calibrate_sleep_cycles_per_us(dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    spin, work = torch.cuda.Stream(), torch.cuda.Stream()
    spin_done = torch.cuda.Event()
    n = 1536

    def mats(dtype: Any) -> list[Any]:
        return [torch.randn(n, n, device=dev, dtype=dtype) for _ in range(3)]

    warm, half, single = mats(torch.bfloat16), mats(torch.float16), mats(torch.float32)
    with torch.cuda.stream(work):
        torch.matmul(warm[0], warm[1], out=warm[2])
    torch.cuda.synchronize()

    def launch(m: list[Any], *, during_spin: bool) -> tuple[float, bool]:
        torch.cuda.synchronize()
        if during_spin:
            with torch.cuda.stream(spin):
                torch.cuda._sleep(round(PROBE_SPIN_US * rate))
                spin_done.record(spin)
        t0 = time.perf_counter_ns()
        with torch.cuda.stream(work):
            torch.matmul(m[0], m[1], out=m[2])
        host_us = (time.perf_counter_ns() - t0) / 1e3
        waited = during_spin and spin_done.query()  # the spin had ended before it returned
        torch.cuda.synchronize()
        return host_us, bool(waited)

    first_idle_us, _ = launch(half, during_spin=False)
    first_spin_us, first_waited = launch(single, during_spin=True)
    later = [launch(half, during_spin=True) for _ in range(3)]
    return {
        "first_idle_us": first_idle_us,
        "first_during_spin_us": first_spin_us,
        "first_waited_for_spin": first_waited,
        "later_during_spin_us": statistics.median(h for h, _ in later),
        "later_waited_for_spin": any(w for _, w in later),
    }


def run_probe(mode: str) -> dict[str, Any]:
    """:func:`first_launch_probe` in a fresh process with ``CUDA_MODULE_LOADING=mode``."""
    env = maestro_env() | {"CUDA_MODULE_LOADING": mode}
    cmd = [sys.executable, "-m", "bench.fidelity_gpu", "--first-launch-probe"]
    proc = subprocess.run(
        cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        return {"mode": mode, "error": proc.stderr[-1500:]}
    return {"mode": mode, **json.loads(proc.stdout.strip().splitlines()[-1])}


FIDELITY_COLUMNS = (
    ("op", "op"),
    ("maestro cupti us", "maestro_cupti_us"),
    ("maestro events us", "maestro_events_us"),
    ("hand gated us", "gated_kernel_us"),
    ("cupti / gated", "ratio_maestro_cupti_over_gated"),
    ("within 1%", "within_1pct"),
    ("torch.profiler gated us", "kineto_gated_us"),
    ("maestro / torch.profiler", "ratio_maestro_cupti_over_kineto"),
    ("within 1% of torch.profiler", "within_1pct_of_kineto"),
    ("hand back-to-back us", "held_kernel_us"),
    ("naive event us", "naive_event_us"),
    ("naive launch-bound", "naive_launch_bound"),
    ("maestro enqueue us/block", "maestro_enqueue_us"),
    ("maestro graph us", "maestro_graph_us"),
    ("graph / eager", "ratio_graph_over_eager"),
    ("maestro graph enqueue us/block", "maestro_graph_enqueue_us"),
    ("hand enqueue us/launch", "host_enqueue_us_per_launch"),
    ("held (gated, back-to-back)", "held_pair"),
)
GATE_COLUMNS = (
    ("pattern", "pattern"),
    ("blocks", "blocks"),
    ("block avg us", "latency_avg_us"),
    ("makespan us", "makespan_avg_us"),
    ("lane skew p50 us", "lane_skew_p50_us"),
    ("lane skew p99 us", "lane_skew_p99_us"),
    ("lane skew max us", "lane_skew_max_us"),
    ("gate -> first start max us", "gate_delay_max_us"),
    ("gate spin us", "gate_spin_us"),
    ("enqueue max us/iter", "enqueue_max_us"),
    ("enqueue us/block", "enqueue_per_block_us"),
    ("launch-bound iters", "host_late_iters"),
    ("launch-bound (> 5%)", "launch_bound"),
)


def _table(columns: tuple[tuple[str, str], ...], rows: list[dict[str, Any]]) -> str:
    def cell(row: dict[str, Any], key: str) -> Any:
        if key == "held_pair":
            return "/".join(fmt(row.get(k)) for k in ("gated_all_held", "held_stream_was_held"))
        return row.get(key)

    return markdown_table([h for h, _ in columns], [[cell(r, k) for _, k in columns] for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--gate-iters", type=int, default=200, help="iters of the gate patterns")
    parser.add_argument(
        "--write-configs", default=None, help="only write the generated pattern files here"
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument(
        "--kineto-reference",
        default=None,
        metavar="FILE",
        help="only the torch.profiler reference loops, in this process; JSON to FILE",
    )
    parser.add_argument("--maestro-rate", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--maestro-gates", default="{}", help=argparse.SUPPRESS)
    parser.add_argument(
        "--first-launch-probe",
        action="store_true",
        help="only the first-launch probe, in this process (set CUDA_MODULE_LOADING yourself); "
        "prints one JSON line",
    )
    args = parser.parse_args(argv)
    if args.kineto_reference:  # the child of run_kineto_reference
        result = kineto_reference(args, args.maestro_rate, json.loads(args.maestro_gates))
        Path(args.kineto_reference).write_text(json.dumps(result))
        return 0
    if args.first_launch_probe:  # the child of run_probe: one JSON line
        print(json.dumps(first_launch_probe()))
        return 0
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
        graph: tuple[str, ...] = ("--graph",)
        for label, config, profiler, extra in (
            ("cupti", fid, "cupti", ()),
            ("events", fid, "events", ()),
            ("gate", gate, "cupti", ()),
            ("graph", fid, "cupti", graph),
            ("gate_graph", gate, "cupti", graph),
        ):
            try:
                maestro[label] = run_maestro(config, profiler, tmp / label, extra)
                if maestro[label]["returncode"] != 0:
                    errors[f"maestro {label}"] = (
                        f"exit {maestro[label]['returncode']} after "
                        f"{maestro[label]['wall_s']:.0f} s: "
                        f"{maestro[label].get('stderr_tail', '')[-2500:]}"
                    )
            except Exception as exc:
                errors[f"maestro {label}"] = f"{type(exc).__name__}: {exc}"
    local: dict[str, dict[str, Any]] = {}
    rate = None
    gates: dict[str, float] = {}
    try:
        cupti_run = maestro.get("cupti", {})
        rate = cupti_run.get("environ", {}).get("sleep_cycles_per_us")
        gates = {
            p["pattern"]: p["gate_spin_us"]
            for p in cupti_run.get("patterns.json", [])
            if p.get("gate_spin_us")
        }
        local = in_process(args, errors, float(rate) if rate else None, gates)
    except Exception as exc:
        errors["in-process"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    try:
        kineto = run_kineto_reference(args, float(rate) if rate else None, gates)
        for key, message in kineto.pop("_errors", {}).items():
            errors[f"torch.profiler {key}"] = message
        for name, value in kineto.items():
            local.setdefault(name, {})["kineto"] = value
    except Exception as exc:
        errors["torch.profiler reference"] = f"{type(exc).__name__}: {exc}"
    probes = []
    for mode in ("LAZY", "EAGER"):
        try:
            probes.append(run_probe(mode))
        except Exception as exc:
            errors[f"first-launch probe {mode}"] = f"{type(exc).__name__}: {exc}"
    rows = fidelity_rows(maestro, local)
    grows = gate_rows(maestro.get("gate"))
    graph_grows = gate_rows(maestro.get("gate_graph"))
    for row in grows + graph_grows:
        row["launch_bound"] = launch_bound(row, args.gate_iters)
    unbound = smallest_unbound(grows, args.gate_iters)
    elapsed = time.perf_counter() - t_start

    print("## Fidelity on one GPU\n")
    print(machine_lines(info))
    print(
        f"\nbf16, {args.iters} measured iterations after {args.warmup} warmup each. maestro: "
        "latency avg from results.json, and its host time per block launch (enqueue_avg_us); "
        "hand gated: CUPTI span per launch, one launch per iteration enqueued while a spin "
        "kernel holds its stream, as long as maestro's gate spin for that op (maestro's "
        "schedule, written by hand); hand back-to-back: "
        "one spin holds the stream while every launch is enqueued, then they run back to "
        "back; naive: per-launch CUDA events with a synchronize. Target: maestro cupti / "
        f"hand gated within {TARGET_RATIO_ERROR:.0%}; the independent reference is the same "
        "gated loop read by torch.profiler (Kineto's CUPTI client, in a process of its own), "
        "not by maestro's CUPTI reader. Sleeps spin the cycle count maestro's "
        f"own calibration gave ({local.get('_calibration', {}).get('maestro_rate')} cycles/us)."
        "\n"
    )
    print(_table(FIDELITY_COLUMNS, rows))
    print(
        f"\n### Gate ({args.gate_iters} iterations, maestro cupti; launch-bound iterations: "
        "the host's enqueue outlasted the gate spin)\n"
    )
    print(_table(GATE_COLUMNS, grows))
    print(
        f"\n### Gate under CUDA graphs ({args.gate_iters} iterations, maestro cupti --graph: "
        "each block's launch captured once and replayed per iteration)\n"
    )
    print(_table(GATE_COLUMNS, graph_grows))
    if unbound:
        print(
            f"\nSmallest GEMM pair not launch-bound (nor any larger one): "
            f"{unbound['pattern']}, block avg {unbound['latency_avg_us']:.2f} us."
        )
    chain = next((r for r in grows if r["pattern"] == "chain" and "error" not in r), None)
    held64 = local.get(f"gemm{CHAIN_GEMM}", {}).get("held", {}).get("avg_us")
    if chain and held64:
        print(
            f"\nChain of {CHAIN_BLOCKS} {CHAIN_GEMM}^3 GEMMs on one lane: per-block latency "
            f"{chain['latency_min_block_us']:.3f}-{chain['latency_max_block_us']:.3f} us "
            f"(avg {chain['latency_avg_us']:.3f}) against {held64:.3f} us back-to-back "
            "hand-loop kernel time, "
            f"with {chain['enqueue_per_block_us']:.1f} us of host enqueue per block."
        )
    if probes:
        print(
            f"\n### Host time of a GEMM launch while another stream spins "
            f"{PROBE_SPIN_US / 1e3:.0f} ms\n"
        )
        print(
            markdown_table(
                [
                    "CUDA_MODULE_LOADING",
                    "first launch, device idle us",
                    "first launch, during spin us",
                    "it returned after the spin ended",
                    "later launch, during spin us",
                    "it returned after the spin ended",
                ],
                [
                    [
                        p["mode"],
                        p.get("first_idle_us"),
                        p.get("first_during_spin_us"),
                        p.get("first_waited_for_spin"),
                        p.get("later_during_spin_us"),
                        p.get("later_waited_for_spin"),
                    ]
                    for p in probes
                ],
            )
        )
        for p in probes:
            if "error" in p:
                errors[f"first-launch probe {p['mode']}"] = p["error"]
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
            "gate_graph": graph_grows,
            "smallest_unbound": unbound,
            "first_launch_probe": probes,
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
