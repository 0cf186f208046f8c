"""Compute blocks: a GEMM (torch.matmul), a calibrated sleep and memory-bound busy work."""

from __future__ import annotations

import contextlib
import ctypes
import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from .base import Block, Param, TracedCall
from .data import fill_operand, fill_random
from .dtypes import DTYPE_SIZES_BYTES, FLOATING_DTYPES


def _gemm_operand_elems(m: int, n: int, k: int) -> int:
    return max(m * k, k * n, m * n)


def cap_gemm_dims(m: int, n: int, k: int, max_elems: int) -> tuple[int, int, int]:
    """(m, n, k) scaled by one common factor so that A[m,k], B[k,n] and C[m,n] each hold at
    most ``max_elems`` elements; every dim stays >= 1 and ratios hold up to rounding."""
    if max_elems < 1:
        raise ValueError(f"max_elems must be at least 1, got {max_elems}")
    if _gemm_operand_elems(m, n, k) <= max_elems:
        return m, n, k

    def scaled(factor: float) -> tuple[int, int, int]:
        return tuple(max(1, math.floor(d * factor)) for d in (m, n, k))  # type: ignore[return-value]

    # Operand sizes only grow with the factor, so bisect for the largest one that fits. A dim
    # clamped to 1 breaks the closed form sqrt(max / largest operand), hence no closed form.
    # 64 steps: far below one element at any 2**48-byte size.
    low, high = 0.0, 1.0
    for _ in range(64):
        mid = (low + high) / 2
        if _gemm_operand_elems(*scaled(mid)) <= max_elems:
            low = mid
        else:
            high = mid
    return scaled(low)


DATA_STD = Param(
    name="data_std",
    kind="float",
    default=None,
    minimum=0.0,
    maximum=1e3,
    doc="operand values normal with this standard deviation (0.02: initialised weights; 0: "
    "zeros); unset, gemm's are uniform in [-1, 1) and busy's zeros. Speed depends on the data "
    "(a GEMM runs faster on zeros: power)",
    described_at_default=False,
)


def _off_flag(name: str, doc: str) -> Param:
    return Param(name=name, kind="bool", default=False, doc=doc, described_at_default=False)


def _transposed(shape: tuple[int, ...], stride: tuple[int, ...] | None) -> bool:
    """Stored column-major (its first dimension is the contiguous one)."""
    two_d = bool(stride) and len(shape) == 2 and len(stride or ()) == 2
    return two_d and stride[0] == 1 < shape[0] and stride[1] != 1  # type: ignore[index]


SPIN_NS = 80_000
"""The end of a host wait spent spinning: ``time.sleep`` wakes tens of µs late, later with
Linux's default 50 µs timer slack than with 1 ns (fine_timer_slack)."""


def sleep_until_ns(deadline_ns: int) -> None:
    """Return at ``deadline_ns`` of ``time.perf_counter_ns()``: sleep (no core taken, the GIL
    released) until :data:`SPIN_NS` before it, spin the rest. A longer spin would take a core from
    a lane on a host with fewer cores than threads, and hold the GIL long enough for another lane
    to wait out Python's 5 ms switch interval past its own deadline."""
    if (coarse_ns := deadline_ns - time.perf_counter_ns() - SPIN_NS) > 0:
        time.sleep(coarse_ns / 1e9)
    while time.perf_counter_ns() < deadline_ns:
        pass


def fine_timer_slack() -> None:
    """Set the calling thread's timer slack to 1 ns for the rest of its life (Linux prctl
    PR_SET_TIMERSLACK; elsewhere nothing): its sleeps wake closer to their deadline."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)


class Gemm(Block):
    """C[m, n] = A[m, k] @ B[k, n]; dimensions are element counts, FLOPs = 2mnk."""

    op = "gemm"
    category = "compute"
    params = (
        Param(name="m", kind="int", minimum=1, default=None, doc="rows of A and C (elements)"),
        Param(name="n", kind="int", minimum=1, default=None, doc="columns of B and C (elements)"),
        Param(name="k", kind="int", minimum=1, default=None, doc="shared dimension (elements)"),
        Param(name="a_shape", kind="shape", default=None, doc="[m, k]: A's shape, instead of m/k"),
        Param(name="b_shape", kind="shape", default=None, doc="[k, n]: B's shape, instead of k/n"),
        _off_flag(
            "a_transposed",
            "A stored transposed (column-major, an [k, m] buffer read as A): cuBLAS picks its "
            "kernel by layout (import-trace keeps a traced GEMM's)",
        ),
        _off_flag(
            "b_transposed",
            "B stored transposed (an [n, k] buffer read as B, as x @ W.T reads a weight)",
        ),
        _off_flag(
            "bias",
            "C = bias + A @ B with a bias of n elements (torch.addmm, as a Linear layer with a "
            "bias runs): cuBLAS then picks a kernel with a bias epilogue, which import-trace "
            "keeps from a traced addmm or linear",
        ),
        Param(
            name="tf32",
            kind="bool",
            default=False,
            doc="fp32 on CUDA: let cuBLAS use TF32 tensor cores (faster, 10-bit mantissa); "
            "set on every launch, reported next to the numbers",
        ),
        DATA_STD,
    )
    trace_names = tuple(
        f"aten::{op}"
        for op in ("mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "linear", "matmul")
    )

    @classmethod
    def traced_params(cls, call: TracedCall) -> tuple[dict[str, Any], str | None] | None:
        """m, n, k and the operands' layouts from the input shapes and strides (bmm: batches as
        rows); None when they are not a GEMM's or the dtype is not floating."""
        strides = [*call.strides, *[None] * len(call.dims)]
        pairs = [(d, st) for d, st in zip(call.dims, strides, strict=False) if d]
        name = call.name.removeprefix("aten::")
        try:
            (a, sa), (b, sb) = pairs[-2], pairs[-1]
            layout = (_transposed(a, sa), _transposed(b, sb))
            note = None
            if name in ("mm", "addmm", "_addmm_activation"):
                m, k, n = a[0], a[1], b[1]
            elif name in ("bmm", "baddbmm"):
                m, k, n = a[0] * a[1], a[2], b[2]
                note = f"{name} of {a[0]} batches replayed as one GEMM of m = {a[0]} x {a[1]}"
            elif name == "linear":  # x @ W.T: B is the weight read transposed, unless stored so
                (a, sa), (b, sb) = pairs[0], pairs[1]
                m, k, n = math.prod(a[:-1]), a[-1], b[0]
                layout = (_transposed(a, sa), not _transposed(b, sb))
            else:  # matmul
                (a, sa), (b, sb) = pairs[0], pairs[1]
                m, k, n = math.prod(a[:-1]), a[-1], b[-1]
                layout = layout if len(b) == 2 else (False, False)
                note = (
                    f"matmul {list(a)} @ {list(b)} replayed as a 2-D GEMM" if len(a) > 2 else None
                )
        except (IndexError, TypeError, ValueError):
            return None
        if call.dtype not in FLOATING_DTYPES or min(m, n, k) < 1:
            return None
        params: dict[str, Any] = {"m": int(m), "n": int(n), "k": int(k)}
        params |= {f"{x}_transposed": True for x, on in zip("ab", layout, strict=True) if on}
        if (
            name in ("addmm", "linear")
            and len(pairs) == 3
            and len(pairs[2 if name == "linear" else 0][0]) == 1
        ):
            params["bias"] = True  # a 1-D bias of n elements: cuBLAS's bias epilogue
        if call.dtype == "fp32" and any("tf32" in kernel.lower() for kernel in call.kernels):
            params["tf32"] = True  # the traced kernel ran on TF32 tensor cores
        return params, note

    @classmethod
    def normalize_params(
        cls, params: Mapping[str, Any]
    ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        out = dict(params)
        problems: list[tuple[str, str]] = []
        dims = {d: [(d, int(out[d]))] if out.get(d) is not None else [] for d in "mnk"}
        for name, (first, second) in (("a_shape", "mk"), ("b_shape", "kn")):
            shape = out.pop(name, None)
            if shape is not None and len(shape) != 2:
                message = f"expected two dimensions [{first}, {second}], got {list(shape)}"
                problems.append((name, message))
            elif shape is not None:
                dims[first].append((name, int(shape[0])))
                dims[second].append((name, int(shape[1])))
        for d, sources in dims.items():
            if not sources:
                problems.append(
                    (d, f"gemm needs {d}: give m, n, k or a_shape [m, k] and b_shape [k, n]")
                )
                continue
            values = {v for _, v in sources}
            if len(values) > 1:
                text = ", ".join(f"{src} gives {v}" for src, v in sources)
                problems.append((d, f"inconsistent {d}: {text}"))
            out[d] = sources[0][1]
        return out, problems

    @classmethod
    def check_params(
        cls, params: Mapping[str, Any], *, dtype: str, team_size: int
    ) -> list[tuple[str, str]]:
        if dtype not in FLOATING_DTYPES:
            valid = ", ".join(FLOATING_DTYPES)
            return [("dtype", f"gemm needs a floating dtype ({valid}), got {dtype}")]
        return []

    @classmethod
    def buffer_bytes(cls, params: Mapping[str, Any], *, dtype: str, team_size: int) -> int:
        m, n, k = params["m"], params["n"], params["k"]
        return (m * k + k * n + m * n + (n if params.get("bias") else 0)) * DTYPE_SIZES_BYTES[dtype]

    @classmethod
    def flop_count(cls, params: Mapping[str, Any]) -> int:
        return 2 * int(params["m"]) * int(params["n"]) * int(params["k"])

    @classmethod
    def capped_params(
        cls, params: Mapping[str, Any], *, max_size_bytes: int, dtype: str, team_size: int
    ) -> dict[str, Any]:
        """m, n, k scaled by one factor so that no operand exceeds ``max_size_bytes``."""
        elem = DTYPE_SIZES_BYTES[dtype]
        if max_size_bytes < elem:
            raise ValueError(f"it is smaller than one {dtype} element ({elem} bytes)")
        dims = cap_gemm_dims(*(int(params[d]) for d in "mnk"), max_size_bytes // elem)
        return {**params, **dict(zip("mnk", dims, strict=True))}

    @classmethod
    def notes(cls, params: Mapping[str, Any], *, dtype: str, device: str) -> tuple[str, ...]:
        if dtype != "fp32" or device != "cuda":
            return ()
        return ("TF32 on" if params.get("tf32", False) else "TF32 off (IEEE fp32)",)

    def setup(self) -> None:
        import torch

        m, n, k = (self.spec.params[d] for d in ("m", "n", "k"))
        self.a = self._operand(m, k, self.spec.params.get("a_transposed", False))
        self.b = self._operand(k, n, self.spec.params.get("b_transposed", False))
        self.c = self.ctx.empty(m * n).view(m, n)
        self.bias = self.ctx.empty(n) if self.spec.params.get("bias", False) else None
        std = self.spec.params.get("data_std")
        for operand in (self.a, self.b) if self.bias is None else (self.a, self.b, self.bias):
            fill_operand(operand, self.ctx, std, lambda buf: fill_random(buf, self.ctx))
        # torch's TF32 switch is process-wide: set it on every launch so another block (or
        # user code) cannot change this block's math between iterations.
        self.set_tf32 = self.ctx.device.type == "cuda" and self.a.dtype == torch.float32
        self.tf32 = bool(self.spec.params.get("tf32", False))

    def _operand(self, rows: int, cols: int, transposed: bool) -> Any:
        flat = self.ctx.empty(rows * cols)
        return flat.view(cols, rows).t() if transposed else flat.view(rows, cols)

    def launch(self) -> None:
        import torch

        if self.set_tf32:
            torch.backends.cuda.matmul.allow_tf32 = self.tf32
        if self.bias is None:
            torch.matmul(self.a, self.b, out=self.c)
        else:
            torch.addmm(self.bias, self.a, self.b, out=self.c)


class Sleep(Block):
    """Occupy the lane for ``duration_us``: a spin kernel on CUDA, a timed wait on CPU."""

    op = "sleep"
    params = (
        Param(
            name="duration_us",
            kind="float",
            minimum=0.0,
            maximum=60e6,
            doc="how long to occupy the lane, at most 60 s (60000000): every iteration "
            "waits for it, so a longer one is a typo rather than a measurement",
        ),
    )

    @classmethod
    def traced_params(cls, call: TracedCall) -> tuple[dict[str, Any], str | None]:
        """A traced idle gap: its duration."""
        return {"duration_us": round(call.duration_us, 1)}, None

    def setup(self) -> None:
        duration_us = float(self.spec.params["duration_us"])
        self.duration_ns = round(duration_us * 1e3)
        self.cycles = 0
        if self.ctx.device.type == "cuda":  # the rig measures the spin rate on CUDA (> 0)
            self.cycles = max(1, round(self.ctx.calibration["sleep_cycles_per_us"] * duration_us))

    def launch(self) -> None:
        if self.cycles:
            import torch

            torch.cuda._sleep(self.cycles)
            return
        sleep_until_ns(time.perf_counter_ns() + self.duration_ns)


BUSY_KERNEL_US = 50.0
"""Longest kernel of a ``busy`` block (a longer block is back-to-back kernels), so that its
buffers hold at most BUSY_KERNEL_US x BUSY_PEAK_GBPS bytes; 5 TB/s is above any GPU's HBM."""
BUSY_PEAK_GBPS = 5000.0
BUSY_CPU_ELEMS = 16384
"""Elements per operand on CPU: each add stays on one core (below torch's parallel grain)."""


class Busy(Block):
    """Memory-bound compute occupying the GPU as an elementwise kernel does (every SM, HBM):
    ``c = a + b``, repeated and sized by calibration so the block takes ``duration_us`` alone;
    on CPU the same add in a loop until ``duration_us``."""

    op = "busy"
    category = "compute"
    params = (
        Param(
            name="duration_us",
            kind="float",
            minimum=0.0,
            maximum=100_000.0,
            doc="how long the block takes alone (µs), more than 0 and at most 100 ms (100000): "
            "longer work is more kernels, each enqueued by the host",
        ),
        DATA_STD,
    )

    @classmethod
    def traced_params(cls, call: TracedCall) -> tuple[dict[str, Any], str | None]:
        """Traced kernels no other block replays: their duration (work that rounds to 0.0 µs
        is still work)."""
        return {"duration_us": max(round(call.duration_us, 1), 0.1)}, None

    @classmethod
    def check_params(
        cls, params: Mapping[str, Any], *, dtype: str, team_size: int
    ) -> list[tuple[str, str]]:
        positive = params["duration_us"] > 0
        return [] if positive else [("duration_us", "busy needs a positive duration_us, got 0")]

    @staticmethod
    def operand_elems(duration_us: float, dtype: str) -> int:
        """Elements of each of a, b and c on CUDA: one kernel's traffic at BUSY_PEAK_GBPS."""
        traffic_bytes = min(duration_us, BUSY_KERNEL_US) * BUSY_PEAK_GBPS * 1e3
        return max(1, math.ceil(traffic_bytes / (3 * DTYPE_SIZES_BYTES[dtype])))

    @classmethod
    def buffer_bytes(cls, params: Mapping[str, Any], *, dtype: str, team_size: int) -> int:
        """a, b and c as sized for CUDA."""
        return 3 * cls.operand_elems(float(params["duration_us"]), dtype) * DTYPE_SIZES_BYTES[dtype]

    @classmethod
    def host_buffer_bytes(cls, params: Mapping[str, Any], *, dtype: str, team_size: int) -> int:
        """a, b and c on CPU: at most BUSY_CPU_ELEMS each."""
        elems = min(cls.operand_elems(float(params["duration_us"]), dtype), BUSY_CPU_ELEMS)
        return 3 * elems * DTYPE_SIZES_BYTES[dtype]

    def setup(self) -> None:
        duration_us = float(self.spec.params["duration_us"])
        self.duration_s = duration_us * 1e-6
        self.cuda = self.ctx.device.type == "cuda"
        n = self.operand_elems(duration_us, self.spec.dtype)
        self.a, self.b, self.c = (
            self.ctx.empty(n if self.cuda else min(n, BUSY_CPU_ELEMS)) for _ in range(3)
        )
        for buf in (self.a, self.b, self.c):
            fill_operand(buf, self.ctx, self.spec.params.get("data_std"), lambda b: b.zero_())
        self.reps, self.kernel_us = 1, math.nan
        if self.cuda:
            # ~50 µs of spin per launch to enqueue: far above one torch.add's host cost.
            self._hold_cycles_per_launch = 50.0 * self.ctx.calibration["sleep_cycles_per_us"]
            self._calibrate(duration_us)

    def _adds(self, launches: int) -> None:
        import torch

        for _ in range(launches):
            torch.add(self.a, self.b, out=self.c)

    def _event_span_us(self, enqueue: Callable[[], object], launches: int) -> float:
        """Median of three event spans around ``enqueue()``, each behind a spin holding the stream
        while the host enqueues, as behind the gate (without it busy ran short)."""
        import torch

        spans_us = []
        for _ in range(3):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            torch.cuda._sleep(round(self._hold_cycles_per_launch * (launches + 2)))
            start.record()
            enqueue()
            end.record()
            end.synchronize()
            spans_us.append(start.elapsed_time(end) * 1e3)
        return statistics.median(spans_us)

    def _as_run(self, work: Callable[[], object]) -> Callable[[], object]:
        if not self.ctx.graph:
            return work
        import torch

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            work()
        return graph.replay

    def _calibrate(self, duration_us: float) -> None:
        """Kernel count and elements per kernel whose span (as CUPTI times a block) takes
        ``duration_us`` alone. Events add a few µs (busy ran short of CUPTI's time without
        removing them): a spin of known length, timed the same way, measures that."""
        import torch

        spin_us = 20.0
        spin_cycles = round(spin_us * self.ctx.calibration["sleep_cycles_per_us"])
        spin = self._as_run(lambda: torch.cuda._sleep(spin_cycles))
        overhead_us = self._event_span_us(spin, 1) - spin_us
        whole = (self.a, self.b, self.c)
        full = n = self.a.numel()
        warm_us = 0.0
        while warm_us < 5_000:  # clocks up (5 ms of this very kernel) before measuring
            warm_us += 3 * self._event_span_us(lambda: self._adds(20), 20)

        def span_us() -> float:  # at least 0.1 µs: one add takes more than the events' noise
            work = self._as_run(lambda: self._adds(self.reps))
            return max(self._event_span_us(work, self.reps) - overhead_us, 0.1)

        self.reps = math.ceil(duration_us / BUSY_KERNEL_US)
        for _ in range(8):
            t_us = span_us()
            if n == full and t_us < duration_us:  # faster than the sizing assumed
                self.reps = math.ceil(self.reps * duration_us / t_us)
                continue
            if abs(t_us - duration_us) <= 0.005 * duration_us:
                break
            n = min(full, max(1, round(n * duration_us / t_us)))
            self.a, self.b, self.c = (x[:n] for x in whole)
        self.kernel_us = span_us() / self.reps

    def setup_notes(self) -> tuple[str, ...]:
        if not self.cuda:
            return ()
        moved = 3 * self.a.numel() * self.a.element_size()  # bytes one kernel reads and writes
        return (
            f"busy: {self.reps} x c=a+b over {moved / 2**20:.3g} MiB, "
            f"{self.reps * self.kernel_us:.1f} µs alone at {moved / self.kernel_us / 1e3:.0f} "
            "GB/s (calibrated at setup)",
        )

    def launch(self) -> None:
        import torch

        if self.cuda:
            self._adds(self.reps)
            return
        # CPU: real work until the deadline (torch releases the GIL inside each add).
        deadline = time.perf_counter() + self.duration_s
        while time.perf_counter() < deadline:
            torch.add(self.a, self.b, out=self.c)
