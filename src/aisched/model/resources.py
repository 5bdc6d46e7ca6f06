"""Resource quantities in integer units, the unit in each field's name.

Invariants: every field is a non-negative integer except in a difference produced by
`minus` (which callers check with `fits_in`). `gpu` counts whole devices; `gpu_milli` is a share
of one device (1000 = whole) and is only meaningful on a task that asks for at most one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

GPU_MILLI_WHOLE = 1000
_LARGER_UNITS = ((1024**3, "PiB"), (1024**2, "TiB"), (1024, "GiB"))  # in MiB, largest first


def describe_mib(mib: int) -> str:
    """A size in MiB for people, exactly: in the largest unit from GiB up that writes it with
    at most two decimals (`80 GiB`, `1.5 TiB`, `1 PiB`), else in MiB (`500 MiB`, `1500 MiB`,
    not `0.488281 GiB` or `1.46484 GiB`). Never with an exponent (`1.04858e+06 GiB`): an ask
    and what a node has, side by side, must not look alike when they differ."""
    for size, unit in _LARGER_UNITS:
        if mib >= size and (mib * 100) % size == 0:
            return f"{mib / size:.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{mib} MiB"


def describe_mib_of(part: int, whole: int) -> str:
    """A part of a size and the whole (free of total, used of total) as `describe_mib` says
    each, the unit once where both take the same one: `22057 / 24105 MiB`, `1.5 / 2 GiB`,
    `1500 MiB / 64 GiB` (a column of these fits an 80-column table)."""
    first, second = describe_mib(part), describe_mib(whole)
    number, _, unit = first.partition(" ")
    if unit == second.partition(" ")[2]:
        return f"{number} / {second}"
    return f"{first} / {second}"


def describe_bytes(n: int) -> str:
    """A size in bytes for people, as `describe_mib` writes sizes (`80 GiB`, `4886 MiB`): in
    whole MiB, rounded down, so that a measured free space is never overstated."""
    return describe_mib(max(n, 0) >> 20)


class Dim(IntEnum):
    """The resources a queue's caps and usage are counted in, each by its index in
    `Resources.per_dim` (and in the core's usage vectors): CPU in milli-CPU, memory in MiB,
    GPU in milli-GPU (whole devices and shares together)."""

    CPU = 0
    MEMORY = 1
    GPU = 2


# Each `Dim` in words, by its index, as reasons and warnings name it.
DIM_NAMES = ("CPU", "memory", "GPU")


@dataclass(frozen=True, slots=True)
class Resources:
    milli_cpu: int = 0
    mem_mib: int = 0
    gpu: int = 0
    gpu_milli: int = 0
    gpu_mem_mib: int = 0
    extended: tuple[tuple[str, int], ...] = field(default=())
    # RDMA devices (network adapters for GPUDirect / InfiniBand traffic), counted whole.
    rdma: int = 0

    def plus(self, other: Resources) -> Resources:
        return Resources(
            self.milli_cpu + other.milli_cpu,
            self.mem_mib + other.mem_mib,
            self.gpu + other.gpu,
            self.gpu_milli + other.gpu_milli,
            self.gpu_mem_mib + other.gpu_mem_mib,
            _merge(self.extended, other.extended, 1),
            self.rdma + other.rdma,
        )

    def minus(self, other: Resources) -> Resources:
        return Resources(
            self.milli_cpu - other.milli_cpu,
            self.mem_mib - other.mem_mib,
            self.gpu - other.gpu,
            self.gpu_milli - other.gpu_milli,
            self.gpu_mem_mib - other.gpu_mem_mib,
            _merge(self.extended, other.extended, -1),
            self.rdma - other.rdma,
        )

    def times(self, n: int) -> Resources:
        return Resources(
            self.milli_cpu * n,
            self.mem_mib * n,
            self.gpu * n,
            self.gpu_milli * n,
            self.gpu_mem_mib * n,
            tuple((k, v * n) for k, v in self.extended),
            self.rdma * n,
        )

    def fits_in(self, other: Resources) -> bool:
        """True when every quantity here is at most the same quantity in `other`."""
        ext = dict(other.extended)
        return (
            self.milli_cpu <= other.milli_cpu
            and self.mem_mib <= other.mem_mib
            and self.gpu <= other.gpu
            and self.gpu_milli <= other.gpu_milli
            and self.gpu_mem_mib <= other.gpu_mem_mib
            and self.rdma <= other.rdma
            and all(v <= ext.get(k, 0) for k, v in self.extended)
        )

    @property
    def gpu_equivalent_milli(self) -> int:
        """GPU demand in milli-GPUs, whole devices and shares together (for accounting)."""
        return self.gpu * GPU_MILLI_WHOLE + self.gpu_milli

    def per_dim(self) -> tuple[int, int, int]:
        """The quantities counted per `Dim`, in its order."""
        return (self.milli_cpu, self.mem_mib, self.gpu_equivalent_milli)

    def describe(self) -> str:
        """Short human form, e.g. `8 GPU, 24 CPU, 96 GiB memory`."""
        parts: list[str] = []
        if self.gpu:
            parts.append(f"{self.gpu} GPU")
        if self.gpu_milli:
            parts.append(f"{self.gpu_milli / 1000:g} of a GPU")
        if self.gpu_mem_mib:
            parts.append(f"{describe_mib(self.gpu_mem_mib)} GPU memory")
        if self.milli_cpu:
            parts.append(f"{self.milli_cpu / 1000:g} CPU")
        if self.mem_mib:
            parts.append(f"{describe_mib(self.mem_mib)} memory")
        if self.rdma:
            parts.append(f"{self.rdma} RDMA")
        parts.extend(f"{v} {k}" for k, v in self.extended)
        return ", ".join(parts) or "nothing"

    def is_zero(self) -> bool:
        return self == Resources()


def _merge(
    a: tuple[tuple[str, int], ...], b: tuple[tuple[str, int], ...], sign: int
) -> tuple[tuple[str, int], ...]:
    if not a and not b:
        return ()
    out = dict(a)
    for k, v in b:
        out[k] = out.get(k, 0) + sign * v
    return tuple(sorted((k, v) for k, v in out.items() if v != 0))
