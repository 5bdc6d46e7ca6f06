"""Loaders for the Alibaba GPU cluster trace v2023 ("openb"): its node list and its pod lists.

Nodes become a `Cluster`: racks are assigned in file order, `nodes_per_rack` at a time, all in
one zone (the trace has no topology), and every GPU sits in NVLink group 0. Pods become one-task
jobs: `BE` and `Burstable` pods are batch work, `LS` and `Guaranteed` pods are inference. A pod
with `num_gpu` = 1 and `gpu_milli` < 1000 asks for a share of one GPU (`gpu_milli`), every other
GPU pod for whole devices. Arrival is `creation_time` and the holding time is
`deletion_time - creation_time` (at least 1 s), so a pod still running at the end of the window
holds until then. The `multigpuNN` variants have no times: their pods arrive at their row index
and hold forever (`duration_s = inf`), which suits fill-the-cluster experiments, not JCT.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NoReturn

from aisched.model.cluster import GPU, Cluster, Node
from aisched.model.job import Job, JobKind, TaskGroup
from aisched.model.resources import GPU_MILLI_WHOLE, Resources
from aisched.sim.traces.base import (
    Trace,
    TraceError,
    TraceJob,
    open_csv,
    resolve_trace_file,
    sort_key,
)

FOLDER = "alibaba-openb-v2023"
ALL_NODES_FILE = "openb_node_list_all_node.csv"
GPU_NODES_FILE = "openb_node_list_gpu_node.csv"

# Device memory per model, MiB. G2 and G3 are undisclosed internal codes; 32 GiB is a guess that
# keeps them in the range of the other data-centre cards, not a published figure.
GPU_MEM_MIB: dict[str, int] = {
    "T4": 16 * 1024,
    "P100": 16 * 1024,
    "V100M16": 16 * 1024,
    "V100M32": 32 * 1024,
    "A10": 24 * 1024,
    "G1": 32 * 1024,
    "G2": 32 * 1024,
    "G3": 32 * 1024,
}

_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
_POD_RESOURCE_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
_POD_TIME_COLUMNS = ("gpu_spec", "qos", "creation_time", "deletion_time")
_INFER_QOS = frozenset({"LS", "Guaranteed"})
_KNOWN_QOS = frozenset({"LS", "Guaranteed", "BE", "Burstable"})
MAX_INTEGER = 10**12  # any count or time of a row (a year is 3e7 s, a node 1e6 millicores)
MAX_NODE_GPUS = 1024  # as a cluster file's `gpus_per_node`


def load_openb_nodes(
    path: Path | None = None, *, gpu_only: bool = False, nodes_per_rack: int = 16
) -> Cluster:
    """The openb cluster; `path` is a node-list CSV or its folder (default: the shared traces)."""
    if nodes_per_rack < 1:
        raise ValueError(f"nodes_per_rack must be >= 1, got {nodes_per_rack}")
    file = resolve_trace_file(path, FOLDER, GPU_NODES_FILE if gpu_only else ALL_NODES_FILE)
    nodes: list[Node] = []
    lines: dict[str, int] = {}  # node name -> its line
    with open_csv(file) as reader:
        idx = _header(file, next(reader, None), _NODE_COLUMNS)
        for row in reader:
            if _blank(row):
                continue
            line = reader.line_num
            cell = _Cells(file, line, row, idx)
            name = cell.text("sn")
            if name in lines:  # found here, where the line is known
                cell.fail("sn", f"node name {name!r} repeats line {lines[name]}")
            lines[name] = line
            num_gpus = cell.integer("gpu")
            if num_gpus > MAX_NODE_GPUS:  # a cluster file's bound: more hung the replay
                cell.fail("gpu", f"{num_gpus} GPUs on one node (at most {MAX_NODE_GPUS})")
            model = cell.text("model", required=False)
            gpus: tuple[GPU, ...] = ()
            if num_gpus:
                if model not in GPU_MEM_MIB:
                    raise TraceError(
                        file,
                        line,
                        "model",
                        f"unknown GPU model {model!r}; known: {', '.join(sorted(GPU_MEM_MIB))}",
                    )
                mem = GPU_MEM_MIB[model]
                gpus = tuple(GPU(index=i, model=model, mem_mib=mem) for i in range(num_gpus))
            rack = len(nodes) // nodes_per_rack
            nodes.append(
                Node(
                    name=name,
                    milli_cpu=cell.integer("cpu_milli"),
                    mem_mib=cell.integer("memory_mib"),
                    gpus=gpus,
                    zone="zone-00",
                    rack=f"rack-{rack:03d}",
                )
            )
    try:
        return Cluster(nodes=tuple(nodes))
    except ValueError as e:
        raise TraceError(file, 0, "sn", str(e)) from None


def load_openb_pods(
    path: Path | None = None,
    *,
    variant: str = "default",
    limit: int | None = None,
    skip_invalid: bool = False,
) -> Trace:
    """One openb pod list as a trace, with the node list of the same folder as its cluster.

    `path` is a pod-list CSV (then `variant` is ignored) or the folder holding
    `openb_pod_list_{variant}.csv`. `limit` keeps the first N pods by arrival. The trace is
    named after its file: `openb-VARIANT` for `openb_pod_list_VARIANT.csv`, else `openb-STEM`.
    With `skip_invalid`, a pod row it cannot use (a fractional or empty time, an unknown qos,
    ...) is left out and counted in `Trace.skipped` instead of refusing the whole list.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    file = resolve_trace_file(path, FOLDER, f"openb_pod_list_{variant}.csv")
    # (arrival, name, request, kind, gpu models, duration); jobs are built once the first
    # arrival is known, so their submit times can start at 0.
    pods: list[tuple[float, str, Resources, JobKind, tuple[str, ...], float]] = []
    seen: dict[str, int] = {}  # pod name -> line, because ids must be unique
    skipped: list[TraceError] = []
    with open_csv(file) as reader:
        header = next(reader, None)
        idx = _header(file, header, _POD_RESOURCE_COLUMNS)
        timed = all(c in idx for c in _POD_TIME_COLUMNS)
        if not timed and any(c in idx for c in _POD_TIME_COLUMNS):
            # Some but not all: it replayed untimed, its times and kinds dropped without a word.
            _header(file, header, _POD_RESOURCE_COLUMNS + _POD_TIME_COLUMNS)
        for row in reader:
            if _blank(row):
                continue
            cell = _Cells(file, reader.line_num, row, idx)
            try:
                pod = _pod(cell, timed, float(len(pods)), seen)
            except TraceError as e:
                if not skip_invalid:
                    raise
                skipped.append(e)
                continue
            seen[pod[1]] = reader.line_num
            pods.append(pod)

    t0 = min((p[0] for p in pods), default=0.0)
    jobs = sorted(
        (
            TraceJob(
                job=Job(
                    id=name,
                    groups=(TaskGroup(name="main", replicas=1, request=request),),
                    kind=kind,
                    gpu_models=models,
                    submit_time_s=arrival - t0,
                ),
                duration_s=duration,
                source="openb",
            )
            for arrival, name, request, kind, models, duration in pods
        ),
        key=sort_key,
    )
    if limit is not None:
        jobs = jobs[:limit]
    nodes_file = file.parent / ALL_NODES_FILE
    cluster = load_openb_nodes(nodes_file) if nodes_file.is_file() else None
    stem = file.stem.removeprefix("openb_pod_list_")
    return Trace(
        name=f"openb-{stem}",
        jobs=tuple(jobs),
        cluster=cluster,
        skipped=len(skipped),
        first_skipped=str(skipped[0]) if skipped else None,
    )


_Pod = tuple[float, str, Resources, JobKind, tuple[str, ...], float]


def _pod(cell: _Cells, timed: bool, row_index: float, seen: dict[str, int]) -> _Pod:
    """(arrival, name, request, kind, gpu models, duration) of one pod row, or `TraceError`."""
    arrival, duration = row_index, math.inf
    kind = JobKind.BATCH
    models: tuple[str, ...] = ()
    if timed:
        created = cell.integer("creation_time")
        deleted = cell.integer("deletion_time")
        if deleted < created:  # it ran 1 s, silently
            cell.fail("deletion_time", f"{deleted} is before its creation_time {created}")
        arrival, duration = float(created), float(max(deleted - created, 1))
        qos = cell.text("qos")
        if qos not in _KNOWN_QOS:
            cell.fail("qos", f"expected one of {', '.join(sorted(_KNOWN_QOS))}, got {qos!r}")
        kind = JobKind.INFER if qos in _INFER_QOS else JobKind.BATCH
        spec = cell.text("gpu_spec", required=False)
        models = tuple(m.strip() for m in spec.split("|") if m.strip())
    name = cell.text("name")
    if name in seen:
        cell.fail("name", f"pod name {name!r} repeats line {seen[name]}")
    return arrival, name, _pod_request(cell), kind, models, duration


def _pod_request(cell: _Cells) -> Resources:
    num_gpu = cell.integer("num_gpu")
    gpu_milli = cell.integer("gpu_milli")
    # Reject combinations the README rules out rather than silently dropping a GPU request.
    if num_gpu == 0 and gpu_milli != 0:
        cell.fail("gpu_milli", f"a pod with num_gpu 0 must have gpu_milli 0, got {gpu_milli}")
    if num_gpu > 1 and gpu_milli != GPU_MILLI_WHOLE:
        cell.fail("gpu_milli", f"a pod with num_gpu {num_gpu} must have 1000, got {gpu_milli}")
    if num_gpu == 1 and not 0 < gpu_milli <= GPU_MILLI_WHOLE:
        cell.fail("gpu_milli", f"a 1-GPU pod needs gpu_milli in 1..1000, got {gpu_milli}")
    whole = gpu_milli == GPU_MILLI_WHOLE
    return Resources(
        milli_cpu=cell.integer("cpu_milli"),
        mem_mib=cell.integer("memory_mib"),
        gpu=num_gpu if whole else 0,
        gpu_milli=0 if whole else gpu_milli,
    )


def _blank(row: list[str]) -> bool:
    return not row or (len(row) == 1 and not row[0].strip())


def _header(file: Path, header: list[str] | None, want: tuple[str, ...]) -> dict[str, int]:
    if header is None:
        raise TraceError(file, 1, want[0], "file is empty, expected a header row")
    names = [h.strip() for h in header]
    missing = [c for c in want if c not in names]
    if missing:
        raise TraceError(
            file, 1, missing[0], f"header lacks column(s) {', '.join(missing)}; found {names}"
        )
    return {c: i for i, c in enumerate(names)}


class _Cells:
    """Typed access to one row's cells, raising `TraceError` with the row's position."""

    __slots__ = ("file", "line", "row", "idx")

    def __init__(self, file: Path, line: int, row: list[str], idx: dict[str, int]) -> None:
        self.file, self.line, self.row, self.idx = file, line, row, idx

    def fail(self, column: str, problem: str) -> NoReturn:
        raise TraceError(self.file, self.line, column, problem)

    def raw(self, column: str) -> str:
        i = self.idx[column]
        if i >= len(self.row):
            self.fail(column, f"row has {len(self.row)} fields, column is number {i + 1}")
        return self.row[i].strip()

    def text(self, column: str, *, required: bool = True) -> str:
        value = self.raw(column)
        if required and not value:
            self.fail(column, "empty")
        return value

    def integer(self, column: str) -> int:
        value = self.raw(column)
        try:
            n = int(value)
        except ValueError:
            n = -1
        if n < 0:
            self.fail(column, f"expected a non-negative integer, got {value!r}")
        if n > MAX_INTEGER:  # no pod asks that much, and numpy's int64 would overflow
            self.fail(column, f"{value} is too large (at most {MAX_INTEGER:.0e})")
        return n
