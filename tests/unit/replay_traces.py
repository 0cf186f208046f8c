"""Synthetic torch.profiler (Kineto) traces for the importer's tests, built event by event with
the fields Kineto writes (as in real H200 traces): CPU ops with External ids, runtime launches
with correlation ids, kernels on streams, record_param_comms, cuda_sync events."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAIN_TID = 100


@dataclass
class TraceBuilder:
    """One rank's trace; times in µs from the step's start."""

    rank: int
    world_size: int
    groups: list[dict[str, Any]] = field(default_factory=list)
    sync_events: bool = True
    record_shapes: bool = True
    base_ts: float = 1_000_000.0
    events: list[dict[str, Any]] = field(default_factory=list)
    next_ext: int = 1
    next_corr: int = 1000
    distributed: bool = True

    def __post_init__(self) -> None:
        if not self.groups:
            self.groups = [group("0", "default_pg", list(range(self.world_size)))]

    # ---- low level ----
    def _ext(self) -> int:
        self.next_ext += 1
        return self.next_ext

    def _corr(self) -> int:
        self.next_corr += 1
        return self.next_corr

    def _x(self, cat: str, name: str, ts: float, dur: float, tid: Any, args: dict, pid=1):
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": self.base_ts + ts,
                "dur": dur,
                "args": args,
            }
        )

    def step(self, number: int, start: float, end: float) -> None:
        self._x("user_annotation", f"ProfilerStep#{number}", start, end - start, MAIN_TID, {})

    def annotate(self, name: str, start: float, end: float, tid: int = MAIN_TID) -> None:
        self._x("user_annotation", name, start, end - start, tid, {"External id": self._ext()})

    def launch(
        self,
        *,
        stream: int,
        launch: float,
        start: float,
        dur: float,
        kernel: str = "void elementwise_kernel<float>()",
        op: str | None = "aten::add",
        op_args: dict | None = None,
        ext: int | None = None,
        tid: int = MAIN_TID,
        cat: str = "kernel",
        with_activity: bool = True,
        call: str | None = None,
    ) -> int:
        """A CPU op launching one device activity by ``call`` (default: cudaLaunchKernel, or
        cudaMemcpyAsync for a copy); returns the op's External id."""
        if ext is None:
            ext = self._ext()
            if op is not None:
                args = {"External id": ext, **(op_args or {})}
                self._x("cpu_op", op, launch - 1, 8, tid, args)
        corr = self._corr()
        self._x(
            "cuda_runtime",
            call or ("cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync"),
            launch,
            4,
            tid,
            {"External id": ext, "cbid": 211, "correlation": corr},
        )
        if with_activity:
            self._x(cat, kernel, start, dur, stream, {"stream": stream, "correlation": corr}, 0)
        return ext

    def gemm(
        self,
        *,
        stream: int,
        launch: float,
        start: float,
        dur: float,
        m: int,
        n: int,
        k: int,
        op: str = "aten::mm",
        dtype: str = "c10::BFloat16",
        kernel: str = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
        call: str | None = None,
    ) -> int:
        dims = [[m, k], [k, n]] if op == "aten::mm" else [[n], [m, k], [k, n], [], []]
        types = [dtype, dtype] if op == "aten::mm" else [dtype, dtype, dtype, "Scalar", "Scalar"]
        args = {"Input Dims": dims, "Input type": types} if self.record_shapes else {}
        return self.launch(
            stream=stream,
            launch=launch,
            start=start,
            dur=dur,
            op=op,
            op_args=args,
            kernel=kernel,
            call=call,
        )

    def collective(
        self,
        *,
        stream: int,
        launch: float,
        start: float,
        dur: float,
        name: str = "allreduce",
        in_nelems: int,
        out_nelems: int | None = None,
        dtype: str = "BFloat16",
        group_name: str = "0",
        peer: int | None = None,
        in_splits: list[int] | None = None,
        kernel: str | None = None,
        launches_kernel: bool = True,
        tid: int = MAIN_TID,
        seq: int | None = None,
    ) -> int:
        """A record_param_comms call (and its NCCL kernel when ``launches_kernel``); ``seq``:
        the group's sequence number, as newer torch writes it (``Seq``)."""
        g = next(g for g in self.groups if g["pg_name"] == group_name)
        ext = self._ext()
        self._x(
            "cpu_op",
            "record_param_comms",
            launch - 2,
            20,
            tid,
            {
                "External id": ext,
                "Collective name": name,
                "Process Group Description": g["pg_desc"],
                "Process Group Name": group_name,
                "Process Group Ranks": str(g["ranks"]),
                "Group size": len(g["ranks"]),
                "dtype": dtype,
                "In msg nelems": in_nelems,
                "Out msg nelems": in_nelems if out_nelems is None else out_nelems,
                "Rank": g["ranks"].index(self.rank) if peer is None else peer,
                "In split size": str(in_splits or []),
                "Out split size": "[]",
                **({"Seq": seq} if seq is not None else {}),
            },
        )
        if launches_kernel:
            self.launch(
                stream=stream,
                launch=launch,
                start=start,
                dur=dur,
                ext=ext,
                op=None,
                tid=tid,
                kernel=kernel or f"ncclDevKernel_{name}_RING(ncclDevKernelArgsStorage<4096ul>)",
            )
        return ext

    def old_collective(
        self,
        *,
        stream: int,
        launch: float,
        start: float,
        dur: float,
        op: str = "allreduce_",
        dims: list | None = None,
        types: list | None = None,
        kernel: str = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
    ) -> None:
        """A collective as torch 1.13-2.0 wrote it: a ``c10d::<op>`` CPU op (its inputs' shapes
        where ``dims``/``types`` are given, as record_shapes writes them) around a
        record_param_comms without the collective's name, group or sizes and torch's
        ``nccl:<op>`` span, the NCCL kernel launched under an External id of its own, then a
        second record_param_comms (the work's wait) after the op."""
        shapes = {"Input Dims": dims, "Input type": types} if dims is not None else {}
        self._x(
            "cpu_op",
            f"c10d::{op}",
            launch - 6,
            40,
            MAIN_TID,
            {"External id": self._ext(), **shapes},
        )
        self._x(
            "cpu_op", "record_param_comms", launch - 4, 34, MAIN_TID, {"External id": self._ext()}
        )
        span = {"_allgather_base_": "_all_gather_base", "allreduce_": "all_reduce"}.get(op, op)
        self._x(
            "user_annotation",
            f"nccl:{span}",
            launch - 2,
            25,
            MAIN_TID,
            {"External id": self._ext()},
        )
        self.launch(stream=stream, launch=launch, start=start, dur=dur, op=None, kernel=kernel)
        self._x(
            "cpu_op", "record_param_comms", launch + 40, 5, MAIN_TID, {"External id": self._ext()}
        )

    def nccl_kernel(self, *, stream: int, launch: float, start: float, dur: float) -> None:
        """An NCCL kernel launched for earlier records without kernels (batched p2p)."""
        self.launch(
            stream=stream,
            launch=launch,
            start=start,
            dur=dur,
            ext=self._ext(),
            op=None,
            kernel="ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
        )

    def record(self, ts: float, tid: int = MAIN_TID) -> None:
        self._x(
            "cuda_runtime",
            "cudaEventRecord",
            ts,
            1,
            tid,
            {"cbid": 135, "correlation": self._corr()},
        )

    def wait(self, stream: int, ts: float, event_id: int = 7, tid: int = MAIN_TID) -> None:
        """cudaStreamWaitEvent(stream, event): the sync event only with ``sync_events``."""
        corr = self._corr()
        self._x(
            "cuda_runtime", "cudaStreamWaitEvent", ts, 1, tid, {"cbid": 147, "correlation": corr}
        )
        if self.sync_events:
            self._x(
                "cuda_sync",
                "Stream Wait Event",
                ts + 0.1,
                0.5,
                stream,
                {
                    "External id": corr,
                    "cuda_sync_kind": "Stream Wait Event",
                    "wait_on_stream": -1,
                    "wait_on_cuda_event_record_corr_id": -1,
                    "wait_on_cuda_event_id": event_id,
                    "stream": stream,
                    "correlation": corr,
                    "device": 0,
                    "context": 1,
                },
                0,
            )

    def host_sync(self, ts: float, dur: float, tid: int = MAIN_TID) -> None:
        self._x(
            "cuda_runtime",
            "cudaStreamSynchronize",
            ts,
            dur,
            tid,
            {"cbid": 131, "correlation": self._corr()},
        )

    # ---- output ----
    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
            "record_shapes": 1 if self.record_shapes else 0,
        }
        if self.distributed:
            doc["distributedInfo"] = {
                "backend": "nccl",
                "rank": self.rank,
                "world_size": self.world_size,
                "pg_count": len(self.groups),
                "pg_config": [g for g in self.groups if self.rank in g["ranks"]],
                "nccl_version": "2.28.9",
            }
        doc["baseTimeNanoseconds"] = 1790857026000000000
        doc["traceEvents"] = self.events + [
            {
                "name": "process_name",
                "ph": "M",
                "ts": self.base_ts,
                "pid": 1,
                "tid": 0,
                "args": {"name": "python3"},
            },
            {
                "ph": "f",
                "id": 1,
                "pid": 1,
                "tid": MAIN_TID,
                "ts": self.base_ts,
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            },
        ]
        doc["traceName"] = f"rank{self.rank}.json"
        return doc

    def write(self, folder: Path, *, gz: bool = True) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}.json{'.gz' if gz else ''}"
        text = json.dumps(self.document(), indent=1)
        if gz:
            with gzip.open(path, "wt", encoding="utf-8") as handle:
                handle.write(text)
        else:
            path.write_text(text, encoding="utf-8")
        return path


def group(name: str, desc: str, ranks: list[int]) -> dict[str, Any]:
    return {
        "pg_name": name,
        "pg_desc": desc,
        "backend_config": "cuda:nccl",
        "pg_size": len(ranks),
        "ranks": ranks,
    }


def write_all(builders: list[TraceBuilder], folder: Path, *, gz: bool = True) -> Path:
    for b in builders:
        b.write(folder, gz=gz)
    return folder
