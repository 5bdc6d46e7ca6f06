"""Quantities as people write them, turned into the integer units of the model.

Memory sizes (`8G`, `512Mi`), durations (`90s`, `1h30m`), CPU counts (`4`, `0.5`, `500m`), GPU
counts (`2`, `0.5`) and Kubernetes resource quantities (`8Gi`, `500m`, bare bytes).

Two forms of each parser:

- `to_mem_mib(value)`, `to_duration_s(value)`, `to_milli_cpu(value)`, `to_gpus(value)`,
  `k8s_mem_mib(value)`, `k8s_cpu_milli(value)` raise `UnitError` (a ValueError) with a message
  that names no field; pydantic validators call these, and pydantic puts the field path in front.
- `parse_mem_mib(value, path)`, `parse_duration_s(value, path)`, `parse_cpus_milli(value, path)`
  and `parse_gpus(value, path)` raise `SpecError("path: message")`, for callers outside pydantic
  (the CLI's `--mem 8G`, with path `--mem`).

Invariants: arithmetic is exact (`Decimal`, never binary floats, so `0.1` CPU is 100 milli-CPU);
sizes and CPUs round *up* to the next whole unit, so a task never gets less than it asked for;
NaN, infinities, booleans and absurd exponents are refused rather than passed on. Limits that
depend on the meaning of a field (at most 1 PiB of memory per task, ...) are the job spec's,
not this module's. Nothing here reads files or knows about jobs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import ROUND_CEILING, Decimal
from typing import Any, TypeVar

from aisched.spec.errors import SpecError, WrittenInt

_T = TypeVar("_T")

_KIB = 1024
_MIB = 1024 * 1024

# Anything larger is a typo, and converting it to an int could take unbounded time and memory.
_MAX_QUANTITY = Decimal(10) ** 24


class UnitError(ValueError):
    """A quantity that cannot be read; the message says why and shows an accepted form."""


def _describe(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, WrittenInt):
        return value.written
    if isinstance(value, str | int | float):
        return repr(value)
    return f"a {type(value).__name__}"


def _decimal(value: int | float) -> Decimal:
    """An exact Decimal of a YAML/JSON number; NaN and infinities are refused."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UnitError(f"{value} is not a finite number")
    # str() of a float is its shortest round-tripping form: 0.1 -> Decimal('0.1'), not 0.1000...
    d = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    if abs(d) > _MAX_QUANTITY:
        raise UnitError(f"{value} is far too large")
    return d


def _ceil_int(d: Decimal) -> int:
    return int(d.to_integral_value(rounding=ROUND_CEILING))


# --- memory ---------------------------------------------------------------------------------

_MEM_RE = re.compile(
    r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?b|i)?\s*$", re.IGNORECASE | re.ASCII
)
_MEM_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def to_mem_mib(value: Any) -> int:
    """A memory size in MiB, rounded up: `512M`, `512MB`, `512Mi`, `512MiB`, `8G`, `1.5T`
    (the rules of `to_bytes`)."""
    return -(-to_bytes(value) // _MIB)


def to_bytes(value: Any) -> int:
    """A size in bytes, rounded up: `64K`, `512M`, `512MiB`, `8G`, `1.5T`, `4096B`.

    Every unit is binary, whatever its spelling: `G`, `GB`, `Gi` and `GiB` all mean 2**30 bytes
    (people writing `8G` for a task mean what `free -g` and `docker --memory 8g` mean). Letters
    may be upper or lower case; `K`, `M`, `G`, `T`, `P` are known, and `B` alone means bytes.
    A bare number is an error: `8` could be bytes, MiB or GiB, and a wrong guess is costly;
    but not `0`, the same in every unit (`disk_min_free: 0`, nothing kept free).
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UnitError(f"expected a size such as 8G or 512M, got {_describe(value)}")
    if value == 0 or (isinstance(value, str) and value.strip() == "0"):
        return 0
    if isinstance(value, int | float):
        raise UnitError(f"{value} has no unit: give a unit, e.g. 8G or 512M")
    m = _MEM_RE.match(value)
    if m is None:
        raise UnitError(
            f"{value!r} is not a size: give a number and a unit, e.g. 8G, 512M, 1.5T or 512Mi"
        )
    number, letter, suffix = m.groups()
    if not letter and not suffix:
        raise UnitError(f"{value!r} has no unit: give a unit, e.g. 8G or 512M")
    if not letter and suffix.lower() != "b":  # "8i" or "8iB"
        raise UnitError(f"{value!r} is not a size: give a unit, e.g. 8G or 512M")
    return _ceil_int(Decimal(number) * (_KIB ** _MEM_POWER[letter.lower()]))


def parse_mem_mib(value: Any, path: str) -> int:
    """`to_mem_mib`, with problems raised as `SpecError("path: message")`."""
    return _at(path, to_mem_mib, value)


def parse_bytes(value: Any, path: str) -> int:
    """`to_bytes`, with problems raised as `SpecError("path: message")`."""
    return _at(path, to_bytes, value)


# --- durations ------------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)\s*", re.ASCII)
_DURATION_SCALE = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}
_BARE_NUMBER = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*$", re.ASCII)


def _is_duration(text: str) -> bool:
    try:
        to_duration_s(text)
    except UnitError:
        return False
    return True


def to_duration_s(value: Any) -> float:
    """A duration in seconds: `90`, `90s`, `30m`, `2h`, `1d`, `1h30m`, `1.5h`, `250ms`.

    A bare number (in YAML or in a string) is seconds. Parts add up and may be separated by
    spaces (`1h 30m`). Units are lower case (`m` is minutes); negative durations are refused.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UnitError(f"expected a duration such as 90s, 30m or 2h, got {_describe(value)}")
    if isinstance(value, int | float):
        d = _decimal(value)
        if d < 0:
            raise UnitError(f"{value} is negative")
        return float(d)
    if _BARE_NUMBER.match(value):
        return float(Decimal(value.strip()))
    text = value.strip()
    pos = 0
    total = Decimal(0)
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            break
        total += Decimal(m.group(1)) * _DURATION_SCALE[m.group(2)]
        pos = m.end()
    if not text or pos != len(text):
        if text.startswith("-") and _is_duration(text[1:]):
            raise UnitError(f"{value!r} is negative")  # `-5s`: a duration, but below zero
        raise UnitError(
            f"{value!r} is not a duration: give seconds or a number with a unit "
            "(ms, s, m, h, d), e.g. 90s, 30m, 2h or 1h30m"
        )
    return float(total)


def parse_duration_s(value: Any, path: str) -> float:
    """`to_duration_s`, with problems raised as `SpecError("path: message")`."""
    return _at(path, to_duration_s, value)


# --- CPUs -----------------------------------------------------------------------------------

_CPU_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(m?)\s*$", re.ASCII)


def to_milli_cpu(value: Any) -> int:
    """CPUs in thousandths of a core, rounded up: `4` -> 4000, `0.5` -> 500, `"500m"` -> 500."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UnitError(f"expected a CPU count such as 4, 0.5 or 500m, got {_describe(value)}")
    if isinstance(value, int | float):
        d = _decimal(value)
        if d < 0:
            raise UnitError(f"{value} is negative")
        return _ceil_int(d * 1000)
    m = _CPU_RE.match(value)
    if m is None:
        raise UnitError(f"{value!r} is not a CPU count: give e.g. 4, 0.5 or 500m")
    number, milli = m.groups()
    return _ceil_int(Decimal(number) * (1 if milli else 1000))


def parse_cpus_milli(value: Any, path: str) -> int:
    """`to_milli_cpu`, with problems raised as `SpecError("path: message")`."""
    return _at(path, to_milli_cpu, value)


# --- GPUs -----------------------------------------------------------------------------------


def to_gpus(value: Any) -> tuple[int, int]:
    """A GPU count as `(gpu, gpu_milli)`: a whole number of devices (`2` -> (2, 0)), or a share
    of one device strictly between 0 and 1 in thousandths (`0.5` -> (0, 500)). `2.0` is 2."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UnitError(f"expected a GPU count such as 1, 4 or 0.5, got {_describe(value)}")
    if isinstance(value, str):
        if not _BARE_NUMBER.match(value):
            raise UnitError(f"{value!r} is not a GPU count: give e.g. 1, 4 or 0.5")
        d = Decimal(value.strip())
    else:
        d = _decimal(value)
    if d < 0:
        raise UnitError(f"{value} is negative")
    if d == d.to_integral_value():
        return int(d), 0
    if d > 1:
        raise UnitError(
            f"{value}: more than one GPU must be a whole number; a share (0 to 1) is of one GPU"
        )
    milli = d * 1000
    if milli != milli.to_integral_value():
        raise UnitError(f"{value}: a share of a GPU is counted in thousandths, e.g. 0.25")
    return 0, int(milli)


def parse_gpus(value: Any, path: str) -> tuple[int, int]:
    """`to_gpus`, with problems raised as `SpecError("path: message")`."""
    return _at(path, to_gpus, value)


# --- Kubernetes quantities ------------------------------------------------------------------

# Kubernetes' resource.Quantity: a signed decimal, then a binary suffix, a decimal suffix or an
# exponent. Bare numbers are plain units (bytes, cores).
_K8S_RE = re.compile(
    r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$",
    re.ASCII,
)
_K8S_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def k8s_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (`8Gi`, `500m`, `1e9`, `2`) as an exact, non-negative Decimal."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UnitError(
            f"expected a Kubernetes quantity such as 8Gi or 500m, got {_describe(value)}"
        )
    if isinstance(value, int | float):
        d = _decimal(value)
    else:
        m = _K8S_RE.match(value.strip())
        if m is None:
            raise UnitError(f"{value!r} is not a Kubernetes quantity (e.g. 8Gi, 512Mi, 500m, 2)")
        sign, number, exponent, suffix = m.groups()
        if exponent and abs(int(exponent[1:])) > 24:
            raise UnitError(f"{value!r} is out of range")
        d = Decimal(number) * (Decimal(f"1{exponent}") if exponent else _K8S_SUFFIX[suffix or ""])
        if sign == "-":
            d = -d
        if abs(d) > _MAX_QUANTITY:
            raise UnitError(f"{value!r} is far too large")
    if d < 0:
        raise UnitError(f"{value} is negative")
    return d


def k8s_mem_mib(value: Any) -> int:
    """A Kubernetes memory quantity in MiB, rounded up: `8Gi` -> 8192, `1G` -> 954, bare bytes.
    Unlike `to_mem_mib`, `G` here is Kubernetes' decimal 10**9 bytes."""
    return _ceil_int(k8s_quantity(value) / _MIB)


def k8s_cpu_milli(value: Any) -> int:
    """A Kubernetes CPU quantity in milli-CPU, rounded up as Kubernetes does: `500m`, `2`, `0.5`."""
    return _ceil_int(k8s_quantity(value) * 1000)


def k8s_count(value: Any) -> int:
    """A Kubernetes extended-resource quantity (`nvidia.com/gpu`), which must be whole."""
    d = k8s_quantity(value)
    if d != d.to_integral_value():
        raise UnitError(f"{value} is not a whole number (extended resources are counted whole)")
    return int(d)


def _at(path: str, parse: Callable[[Any], _T], value: Any) -> _T:
    try:
        return parse(value)
    except UnitError as e:
        raise SpecError(f"{path}: {e}") from None
