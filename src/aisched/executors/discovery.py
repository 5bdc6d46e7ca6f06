"""What this machine offers, as the scheduler's `Node`: usable cores, memory, GPUs.

`discover_node` measures (CPU affinity, psutil, the own cgroup's memory limit, NVML) and lets
the operator declare what cannot be measured or should be held back: `gpus=N` declares N GPUs
on a machine without NVML (so the whole flow runs on a CPU-only machine) or keeps the first N
of the real ones. Each figure comes with a note saying where it came from.

Invariants: NVML trouble never raises (discovery falls back and says so in the notes); a bad
declaration raises `DiscoveryError` naming the argument, as the caller's `names` say it (the
service: as the user gave it, `--gpu-model` or `node.gpu_model`). Nothing here starts processes
or changes the machine.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

import psutil

from aisched.executors.cgroups import own_memory_limit_mib
from aisched.model.cluster import GPU, Node

MIB = 1 << 20
_VENDOR_WORDS = ("NVIDIA", "Tesla", "GeForce", "Quadro")
_JOINED_FAMILIES = ("RTX", "GTX", "TITAN")


class DiscoveryError(ValueError):
    """A declared figure is invalid or impossible on this machine; the message names it, and
    `key` is the argument of `discover_node` it blames (the first, where it blames two)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def short_model(name: str) -> str:
    """A GPU model as policies and job files name it, from NVML's product name:
    `NVIDIA A100-SXM4-80GB` -> `A100`, `NVIDIA H100 80GB HBM3` -> `H100`,
    `NVIDIA GeForce RTX 4090` -> `RTX-4090`."""
    words = [w for w in name.split() if w not in _VENDOR_WORDS]
    if not words:
        return name.strip() or "unknown"
    if words[0].upper() in _JOINED_FAMILIES and len(words) > 1:
        return f"{words[0]}-{words[1]}"
    return words[0].split("-")[0]


def _check(key: str, name: str, value: float | None, *, minimum: float, whole: bool) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DiscoveryError(key, f"{name}: expected a number, got {value!r}")
    if whole and int(value) != value:
        raise DiscoveryError(key, f"{name}: expected a whole number, got {value!r}")
    if value < minimum:
        raise DiscoveryError(key, f"{name}: must be at least {minimum:g}, got {value!r}")


def _pynvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    module: ModuleType = pynvml
    return module


def _nvlink_groups(nv: Any, handles: list[Any]) -> tuple[list[int], str]:
    """Group ids per GPU: GPUs joined (directly or not) by NVLink peer access share a group."""
    parent = list(range(len(handles)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    try:
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                status = nv.nvmlDeviceGetP2PStatus(
                    handles[i], handles[j], nv.NVML_P2P_CAPS_INDEX_NVLINK
                )
                if status == nv.NVML_P2P_STATUS_OK:
                    parent[find(j)] = find(i)
    except Exception as exc:  # NVML raises its own error classes, and old drivers lack calls
        return [0] * len(handles), f"NVLink topology unknown ({exc}): one group"
    roots: dict[int, int] = {}
    groups = [roots.setdefault(find(i), len(roots)) for i in range(len(handles))]
    return groups, f"NVLink groups from NVML peer status: {len(roots)}"


def nvml_gpus() -> tuple[list[GPU] | None, list[str]]:
    """The GPUs NVML sees (None when NVML is unavailable or fails), with notes."""
    nv = _pynvml()
    if nv is None:
        return None, ["gpus: NVML unavailable (the nvidia-ml-py package is not installed)"]
    try:
        nv.nvmlInit()
    except Exception as exc:
        return None, [f"gpus: NVML unavailable ({exc})"]
    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        names = [_text(nv.nvmlDeviceGetName(h)) for h in handles]
        mems = [int(nv.nvmlDeviceGetMemoryInfo(h).total) // MIB for h in handles]
        groups, group_note = _nvlink_groups(nv, handles) if handles else ([], "")
    except Exception as exc:
        return None, [f"gpus: NVML failed while listing devices ({exc})"]
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
    gpus = [
        GPU(index=i, model=short_model(n), mem_mib=m, nvlink_group=g)
        for i, (n, m, g) in enumerate(zip(names, mems, groups, strict=True))
    ]
    notes = [
        f"gpus: {len(gpus)} found by NVML"
        + (f" ({', '.join(sorted(set(names)))})" if names else "")
    ]
    if group_note:
        notes.append(f"gpus: {group_note}")
    return gpus, notes


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def discover_node(
    name: str | None = None,
    *,
    gpus: int | None = None,
    gpu_model: str | None = None,
    gpu_mem_mib: int | None = None,
    cpus: float | None = None,
    mem_mib: int | None = None,
    names: Mapping[str, str] | None = None,
) -> tuple[Node, list[str]]:
    """This machine as a `Node`, and notes saying where each figure came from.

    Measured: CPUs = usable cores (this process's affinity), memory = psutil's total (or the
    own cgroup's limit when lower), GPUs = NVML's. Declared values override: fewer CPUs or
    less memory than present is fine, more is allowed with a note; `gpus` declares that many
    GPUs where NVML finds none, or keeps the first N of those it finds (more is an error).
    `gpu_model` / `gpu_mem_mib` name and size declared GPUs, or relabel real ones; with no GPU
    to describe (`gpus=0`, or none found and none declared) they are an error, not ignored.
    `names`: what errors call an argument (`{"gpu_model": "--gpu-model"}`), where that is not
    its own name.
    """

    def said(key: str) -> str:
        return (names or {}).get(key, key)

    _check("gpus", said("gpus"), gpus, minimum=0, whole=True)
    _check("gpu_mem_mib", said("gpu_mem_mib"), gpu_mem_mib, minimum=0, whole=True)
    _check("cpus", said("cpus"), cpus, minimum=0.001, whole=False)
    _check("mem_mib", said("mem_mib"), mem_mib, minimum=1, whole=True)
    if gpu_model is not None and (not isinstance(gpu_model, str) or not gpu_model.strip()):
        raise DiscoveryError(
            "gpu_model", f"{said('gpu_model')}: expected a non-empty name, got {gpu_model!r}"
        )
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise DiscoveryError(
            "name", f"{said('name')}: expected a non-empty node name, got {name!r}"
        )
    notes: list[str] = []

    cores = len(os.sched_getaffinity(0))
    milli_cpu = cores * 1000
    notes.append(f"cpus: {cores} usable cores (CPU affinity of the scheduler)")
    if cpus is not None:
        milli_cpu = round(cpus * 1000)
        if milli_cpu > cores * 1000:
            notes.append(
                f"cpus: {cpus:g} declared, more than {cores} usable cores: tasks share them"
            )
        else:
            notes.append(f"cpus: {cpus:g} declared")

    total = int(psutil.virtual_memory().total) // MIB
    node_mem = total
    notes.append(f"memory: {total} MiB (psutil total)")
    limit = own_memory_limit_mib()
    if limit is not None and limit < total:
        node_mem = limit
        notes.append(f"memory: {limit} MiB, the limit of the scheduler's own cgroup")
    if mem_mib is not None:
        if mem_mib > node_mem:
            notes.append(f"memory: {mem_mib} MiB declared, more than the {node_mem} MiB present")
        else:
            notes.append(f"memory: {mem_mib} MiB declared")
        node_mem = mem_mib

    found, gpu_notes = nvml_gpus()
    notes.extend(gpu_notes)
    node_gpus: list[GPU]
    if found:
        node_gpus = found
        if gpus is not None:
            if gpus > len(found):
                raise DiscoveryError(
                    "gpus",
                    f"{said('gpus')}: {gpus} declared, but this machine has only {len(found)} "
                    f"GPU{'s' if len(found) != 1 else ''} (NVML)",
                )
            node_gpus = found[:gpus]
            notes.append(f"gpus: the first {gpus} of {len(found)} used, as declared")
        if gpu_model is not None or gpu_mem_mib is not None:
            node_gpus = [
                GPU(
                    g.index,
                    gpu_model or g.model,
                    g.mem_mib if gpu_mem_mib is None else gpu_mem_mib,
                    g.nvlink_group,
                )
                for g in node_gpus
            ]
            notes.append("gpus: model/memory relabelled as declared")
    elif gpus:
        model = gpu_model or "declared"
        node_gpus = [GPU(i, model, gpu_mem_mib or 0) for i in range(gpus)]
        notes.append(f"gpus: {gpus} declared ({model}), none detected: not checked")
    else:
        node_gpus = []
    if not node_gpus and (gpu_model is not None or gpu_mem_mib is not None):
        _refuse_without_gpus(gpus, gpu_model, gpu_mem_mib, said)
    node = Node(
        name=name or socket.gethostname(),
        milli_cpu=milli_cpu,
        mem_mib=node_mem,
        gpus=tuple(node_gpus),
    )
    return node, notes


def _refuse_without_gpus(
    gpus: int | None,
    gpu_model: str | None,
    gpu_mem_mib: int | None,
    said: Callable[[str], str],
) -> None:
    """A GPU model or size declared for a node left without GPUs: a mistake (a forgotten
    `gpus`, GPUs NVML no longer finds), which ignored would start a service whose GPU jobs
    never fit."""
    blamed = [
        k for k, v in (("gpu_model", gpu_model), ("gpu_mem_mib", gpu_mem_mib)) if v is not None
    ]
    keys = " and ".join(said(k) for k in blamed)
    count = said("gpus")
    why = (
        f"{count} is 0"
        if gpus == 0
        else f"NVML finds no GPU on this machine and {count} declares none"
    )
    # A flag is given as `--gpus N`, a key as `gpus: N`.
    declare = f"{count} N" if count.startswith("-") else f"{count}: N"
    raise DiscoveryError(
        blamed[0],
        f"{keys}: describe{'s' if len(blamed) == 1 else ''} the node's GPUs, but it has none "
        f"({why}): declare them ({declare}), or leave {keys} out",
    )


_nvml_lock = threading.Lock()
_nvml_ready: bool | None = None


def _nvml_for_queries() -> ModuleType | None:
    """NVML initialised once for repeated queries (init is slow); None when unavailable."""
    global _nvml_ready
    nv = _pynvml()
    if nv is None:
        return None
    with _nvml_lock:
        if _nvml_ready is None:
            try:
                nv.nvmlInit()
                _nvml_ready = True
            except Exception:
                _nvml_ready = False
    return nv if _nvml_ready else None


def gpu_memory(indices: Iterable[int]) -> dict[int, list[tuple[int, int]]]:
    """GPU index -> [(pid, used MiB)] of the compute processes on it, for a GPU-memory watch.
    Empty without NVML; a GPU NVML cannot query is left out. Pids are as NVML reports them
    (the host's pid namespace, which differs from ours inside a container)."""
    nv = _nvml_for_queries()
    if nv is None:
        return {}
    out: dict[int, list[tuple[int, int]]] = {}
    for i in indices:
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(i))
        except Exception:
            continue
        out[i] = [(int(p.pid), int(p.usedGpuMemory or 0) // MIB) for p in procs]
    return out


def nvml_device_files() -> list[str] | None:
    """Each GPU's device file (`/dev/nvidia<minor>`, NVML's minor number), in NVML index order;
    None when NVML is unavailable or cannot say."""
    nv = _nvml_for_queries()
    if nv is None:
        return None
    try:
        count = nv.nvmlDeviceGetCount()
        return [
            f"/dev/nvidia{int(nv.nvmlDeviceGetMinorNumber(nv.nvmlDeviceGetHandleByIndex(i)))}"
            for i in range(count)
        ]
    except Exception:
        return None


def nvml_unavailable() -> str | None:
    """Why NVML cannot be queried on this machine, or None when it can."""
    if _pynvml() is None:
        return "nvidia-ml-py (pynvml) is not installed"
    if _nvml_for_queries() is None:
        return "NVML did not initialise (no NVIDIA driver?)"
    return None
