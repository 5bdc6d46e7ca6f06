"""What the two job-file formats (native, Volcano) share: limits, field types, defaults, results.

The pydantic field types here carry their own checks and limits, so a mistake is reported at its
field path by pydantic together with every other field's mistake. The limits refuse values that
can only be typos (a million replicas, a petabyte per task, a retry budget of ten thousand)
before they reach the scheduler. Environment names the scheduler sets for every task (the
contract of `executors.base.contract_env`) are refused here, so a job file can never override
them.

Nothing here reads files or builds a `Job`; `job_native` and `job_volcano` do.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, StrictInt, StrictStr

from aisched.model.job import (
    ContainerSpec,
    Job,
    NetworkMode,
    Volume,
    image_transport,
    mount_option_char,
)
from aisched.spec.errors import WrittenInt, describe
from aisched.spec.units import (
    UnitError,
    k8s_count,
    k8s_cpu_milli,
    k8s_mem_mib,
    to_duration_s,
    to_gpus,
    to_mem_mib,
    to_milli_cpu,
)

# --- limits (anything beyond is a typo, not a job) ------------------------------------------

MAX_REPLICAS = 10_000  # per task group
MAX_TASKS = 10_000  # per job, all groups together
MAX_MILLI_CPU = 100_000 * 1000  # 100,000 CPUs per task
MAX_MEM_MIB = 1024**3  # 1 PiB per task (and per GPU for gpu_mem)
MAX_GPUS = 4096  # per task
MAX_DURATION_S = 366 * 86400.0
MAX_RETRIES = 1000
MAX_GRACE_S = 3600.0
MAX_PRIORITY = 1_000_000_000  # Kubernetes' own bound for user priorities
MAX_NAME_LEN = 63
MAX_PATH_LEN = 4096
MAX_IMAGE_LEN = 512
# Linux's MAX_ARG_STRLEN (32 pages) bounds each argument and each NAME=value string of an
# exec; the variable's name and a margin for it are kept out of this bar.
MAX_EXEC_STRING = 32 * 4096 - 1024
# Linux's ARG_MAX bounds a program's arguments and environment together (a quarter of the
# stack limit: 2 MiB by default); half of it leaves room for what the executor adds, and a
# command written out in a job file (at most 1 MiB) never reaches it.
MAX_EXEC_TOTAL = 1 << 20
MAX_ENV_NAME_LEN = 256
MIN_BANDWIDTH_BIT_S = 8_000  # tc cannot shape below a few kbit/s in any useful way
MAX_BANDWIDTH_BIT_S = 10**13  # 10 Tbit/s

# --- environment the scheduler owns ---------------------------------------------------------

SCHEDULER_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "OMP_NUM_THREADS",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_WORLD_SIZE",
        "VC_TASK_INDEX",
        "VK_TASK_INDEX",
        # NVIDIA's container runtime hook exposes the GPUs this names (`all`) to a container,
        # whichever the task was given.
        "NVIDIA_VISIBLE_DEVICES",
    }
)
SCHEDULER_ENV_PREFIX = "AISCHED_"

# --- defaults and results -------------------------------------------------------------------

DEFAULT_PRIORITY_CLASSES: Mapping[str, int] = MappingProxyType(
    {"low": -100, "normal": 0, "high": 100, "critical": 1000}
)


@dataclass(frozen=True, slots=True)
class JobDefaults:
    """What a job file leaves out, as the service is configured. `priority_classes` names the
    priorities a file may ask for by name (`priority_class`, Volcano's `priorityClassName`)."""

    user: str = "default"
    queue: str = "default"
    priority_classes: Mapping[str, int] = field(default_factory=lambda: DEFAULT_PRIORITY_CLASSES)
    grace_period_s: float = 30.0
    max_retries: int = 3
    backoff_s: float = 10.0


DEFAULTS = JobDefaults()


@dataclass(frozen=True, slots=True)
class ParsedJob:
    """A job read from a file or request body.

    `job` has `id=""` and `submit_time_s=0.0`: the service sets both. `format` is "native" or
    "volcano". `warnings` are `source: field.path: message` lines about what was accepted but
    will not act as the author may expect (a container image, a volume, a node selector...).
    `queue_path` is the field that named the job's queue (or would have), for problems found
    with it later (a queue the service does not have).
    """

    job: Job
    format: str
    warnings: tuple[str, ...] = ()
    queue_path: str = field(default="queue", compare=False)


class Problems:
    """Collects `source: path: message` lines, so every mistake of a stage is reported at once."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.lines.append(
            f"{self.source}: {path}: {message}" if path else f"{self.source}: {message}"
        )


def priority_of_class(name: str, classes: Mapping[str, int]) -> int:
    """The priority of a named class; ValueError naming the known classes otherwise."""
    if name in classes:
        return classes[name]
    known = ", ".join(f"{k} ({v})" for k, v in sorted(classes.items(), key=lambda kv: -kv[1]))
    raise ValueError(f"unknown priority class {name!r}; known: {known or '(none configured)'}")


def duplicates(names: Iterable[str]) -> list[tuple[int, int]]:
    """`(index, index of the first with the same name)` for every repeated name."""
    first: dict[str, int] = {}
    out: list[tuple[int, int]] = []
    for i, n in enumerate(names):
        if n in first:
            out.append((i, first[n]))
        else:
            first[n] = i
    return out


# --- field types ----------------------------------------------------------------------------

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def checked_name(v: str, max_len: int) -> str:
    """`v` if it is a name of at most `max_len` characters (letters, digits, '.', '_', '-',
    starting with a letter or digit), else ValueError saying so."""
    if len(v) > max_len or not _NAME_RE.fullmatch(v):
        shown = repr(v) if len(v) <= 2 * max_len else f"{v[:max_len]!r}..."
        raise ValueError(
            f"{shown} is not a valid name: 1 to {max_len} letters, digits, '.', '_' or "
            "'-', starting with a letter or digit"
        )
    return v


def _name(v: str) -> str:
    return checked_name(v, MAX_NAME_LEN)


def gpu_model(v: Any) -> str:
    """A GPU model's name, as a job asks for it and a node declares it."""
    if not isinstance(v, str):  # `[1]`: "Input should be a valid string" did not say what
        raise ValueError(f"expected a GPU model name such as A100 or H100-80GB, got {describe(v)}")
    if len(v) > 128 or not _NAME_RE.fullmatch(v):
        raise ValueError(f"{v!r} is not a GPU model name such as A100 or H100-80GB")
    return v


def _gpu_milli(v: int) -> int:
    if not 1 <= v <= 999:  # not pydantic's "Input should be greater than or equal to 1"
        raise ValueError(
            f"{v} is not a share of one GPU: give thousandths from 1 to 999 (250 is a quarter); "
            "ask for whole GPUs with gpus"
        )
    return v


def _env_name(v: str) -> str:
    if len(v) > MAX_ENV_NAME_LEN:
        raise ValueError(f"is longer than {MAX_ENV_NAME_LEN} characters")
    if not _ENV_NAME_RE.fullmatch(v):
        raise ValueError(
            f"{v!r} is not a valid environment variable name: letters, digits and '_', "
            "not starting with a digit"
        )
    if v in SCHEDULER_ENV or v.startswith(SCHEDULER_ENV_PREFIX):
        raise ValueError("set by the scheduler; cannot be overridden")
    return v


def _text(v: Any) -> str:
    """A word of a command or an environment value: a string, or an integer written bare (as
    the file wrote it)."""
    if isinstance(v, str):
        if "\x00" in v:
            raise ValueError("contains a NUL character")
        if len(v) > MAX_EXEC_STRING // 4 and len(v.encode()) > MAX_EXEC_STRING:
            # Accepted, it would fail at every start (E2BIG) and be retried to no end.
            raise ValueError(
                f"is {len(v.encode()):,} bytes: a program gets at most {MAX_EXEC_STRING:,} "
                "bytes in each argument or variable (the kernel's limit); put it in a file"
            )
        return v
    if isinstance(v, WrittenInt):
        return v.written  # as written: `0755` is not `493`
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if isinstance(v, float | bool):
        # YAML turns 1e-3 into 0.001 and `on` into true: the process would not see what was written.
        raise ValueError(f"expected a string, got {describe(v)}: quote it")
    raise ValueError(f"expected a string, got {describe(v)}")


def exec_size_problems(
    words: Sequence[str], env: Iterable[tuple[str, str]]
) -> list[tuple[int | None, str]]:
    """What makes a command, once its `$(NAME)`s are expanded, one the kernel will not start
    (E2BIG at every start): each word over MAX_EXEC_STRING, with its index, and the command
    and environment together over MAX_EXEC_TOTAL, with index None."""
    out: list[tuple[int | None, str]] = []
    total = 0
    for i, word in enumerate(words):
        size = len(word.encode())
        total += size + 1
        if size > MAX_EXEC_STRING:
            out.append(
                (
                    i,
                    f"is {size:,} bytes once $(NAME) is expanded: a program gets at most "
                    f"{MAX_EXEC_STRING:,} bytes in each argument or variable (the kernel's limit)",
                )
            )
    total += sum(len(name.encode()) + len(value.encode()) + 2 for name, value in env)
    if total > MAX_EXEC_TOTAL:
        out.append(
            (
                None,
                f"the command and its environment are {total:,} bytes once $(NAME) is "
                f"expanded: a program gets at most {MAX_EXEC_TOTAL:,} bytes of them",
            )
        )
    return out


def _shell_or_words(v: Any) -> Any:
    if isinstance(v, str):
        if not v.strip():
            raise ValueError("is empty: give the program to run")
        return ["/bin/sh", "-c", v]
    if not isinstance(v, list | tuple):
        raise ValueError(
            f"expected a list of words (e.g. [python, train.py]) or a shell command string, "
            f"got {describe(v)}"
        )
    return v


def nonempty_command(v: tuple[str, ...]) -> tuple[str, ...]:
    if not v:
        raise ValueError("is empty: give the program and its arguments, e.g. [python, train.py]")
    if not v[0].strip():
        raise ValueError("the program name (word 0, the first) is empty")
    return v


def at_least_one_task(v: list[Any]) -> list[Any]:
    if not v:
        raise ValueError("a job needs at least one task")
    return v


def _path(v: str) -> str:
    if not v:
        raise ValueError("is empty")
    if "\x00" in v:
        raise ValueError("contains a NUL character")
    if len(v) > MAX_PATH_LEN:
        raise ValueError(f"is longer than {MAX_PATH_LEN} characters")
    return v


def _unit(parse: Callable[[Any], Any], check: Callable[[Any, Any], None]) -> Callable[[Any], Any]:
    def validate(v: Any) -> Any:
        try:
            out = parse(v)
        except UnitError as e:
            raise ValueError(str(e)) from None
        check(v, out)
        return out

    return validate


def _positive_limited(limit: int, what: str) -> Callable[[Any, int], None]:
    def check(v: Any, out: int) -> None:
        if out <= 0:
            raise ValueError("must be more than 0")
        if out > limit:
            raise ValueError(f"{v} is more than the limit of {what}")

    return check


def _duration_check(limit: float, what: str, allow_zero: bool) -> Callable[[Any, float], None]:
    # Negative durations are refused by the parser itself.
    def check(v: Any, out: float) -> None:
        if out == 0 and not allow_zero:
            raise ValueError("must be more than 0")
        if out > limit:
            raise ValueError(f"{v} is more than the limit of {what}")

    return check


def _gpus_check(v: Any, out: tuple[int, int]) -> None:
    if out[0] > MAX_GPUS:
        raise ValueError(f"{v} is more than the limit of {MAX_GPUS} GPUs per task")


def _gpu_count_check(v: Any, out: int) -> None:
    if out > MAX_GPUS:
        raise ValueError(f"{v} is more than the limit of {MAX_GPUS} GPUs per task")


Name = Annotated[StrictStr, AfterValidator(_name)]
GpuModel = Annotated[str, BeforeValidator(gpu_model)]
EnvName = Annotated[StrictStr, AfterValidator(_env_name)]
Text = Annotated[str, BeforeValidator(_text)]
Command = Annotated[
    tuple[Text, ...], BeforeValidator(_shell_or_words), AfterValidator(nonempty_command)
]
Path = Annotated[StrictStr, AfterValidator(_path)]
Replicas = Annotated[StrictInt, Field(ge=1, le=MAX_REPLICAS)]
Retries = Annotated[StrictInt, Field(ge=0, le=MAX_RETRIES)]
Priority = Annotated[StrictInt, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)]

MilliCpu = Annotated[
    int, BeforeValidator(_unit(to_milli_cpu, _positive_limited(MAX_MILLI_CPU, "100,000 CPUs")))
]
MemMib = Annotated[int, BeforeValidator(_unit(to_mem_mib, _positive_limited(MAX_MEM_MIB, "1P")))]
Gpus = Annotated[tuple[int, int], BeforeValidator(_unit(to_gpus, _gpus_check))]
# A share of one GPU in thousandths; whole GPUs are asked for with `gpus`.
GpuMilli = Annotated[StrictInt, AfterValidator(_gpu_milli)]
# A span of time the job runs or waits (time limit, estimate, checkpoint interval): above 0.
Span = Annotated[
    float, BeforeValidator(_unit(to_duration_s, _duration_check(MAX_DURATION_S, "366d", False)))
]
# A delay that may be 0 (backoff between retries).
Delay = Annotated[
    float, BeforeValidator(_unit(to_duration_s, _duration_check(MAX_DURATION_S, "366d", True)))
]
Grace = Annotated[
    float, BeforeValidator(_unit(to_duration_s, _duration_check(MAX_GRACE_S, "1h", True)))
]

K8sMilliCpu = Annotated[
    int, BeforeValidator(_unit(k8s_cpu_milli, _positive_limited(MAX_MILLI_CPU, "100,000 CPUs")))
]
K8sMemMib = Annotated[
    int, BeforeValidator(_unit(k8s_mem_mib, _positive_limited(MAX_MEM_MIB, "1Pi")))
]
K8sGpus = Annotated[int, BeforeValidator(_unit(k8s_count, _gpu_count_check))]


# --- containers -----------------------------------------------------------------------------

# A registry reference, as the OCI distribution (docker) grammar writes it:
# [domain[:port]/]path-component[/path-component...][:tag][@algorithm:hex], path components
# in lowercase. Nothing else: the engine would read any other form as a transport (below).
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?"
_IMAGE_RE = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::\w[\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?",
    re.ASCII,
)
_BANDWIDTH_RE = re.compile(r"(?i)\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(bit|bps|bit/s)?\s*")
_BANDWIDTH_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def _image(v: str) -> str:
    transport = image_transport(v)
    if transport is not None and transport.lower() == "docker":
        alone = v.split(":", 1)[1].lstrip("/")
        raise ValueError(
            f"{v!r}: leave out the transport (give {alone!r}): a reference alone is pulled "
            "from a registry"
        )
    if transport is not None:
        raise ValueError(
            f"{v!r} names the image transport {transport!r}, which loads an image from a "
            "file, a directory or another store with the engine's rights: give a registry "
            "reference such as python:3.11 or nvcr.io/nvidia/pytorch:24.01-py3"
        )
    if len(v) > MAX_IMAGE_LEN or not _IMAGE_RE.fullmatch(v):
        raise ValueError(
            f"{v!r} is not an image reference such as python:3.11, "
            "nvcr.io/nvidia/pytorch:24.01-py3 or localhost/mine@sha256:..."
        )
    return v


def to_bandwidth_bit_s(v: Any) -> int:
    """`1Gbit`, `10Mbit`, `500kbit` (`bit/s` too) or a bare number of bits per second.

    `bps` is refused: tc reads `mbps` as megabytes per second, where most people mean
    megabits; either reading would surprise someone eightfold. The number is read exactly,
    in integers (a float made a long one infinite)."""
    if isinstance(v, bool) or not isinstance(v, str | int):
        raise ValueError(f"expected a rate such as 10Mbit or 1Gbit, got {describe(v)}")
    m = _BANDWIDTH_RE.fullmatch(str(v))
    if m is None:
        raise ValueError(f"{v!r} is not a rate such as 10Mbit or 1Gbit")
    number, prefix = m.group(1), m.group(2).lower()
    shown = repr(v) if len(repr(v)) <= 40 else f"{repr(v)[:36]}...'"
    if (m.group(3) or "").lower() == "bps":
        bits = f"{number}{prefix if prefix == 'k' else prefix.upper()}bit"
        raise ValueError(
            f"{shown}: bps is ambiguous (tc reads it as bytes per second, most people as "
            f"bits): write bits per second, such as {bits}"
        )
    whole, _, part = number.partition(".")
    whole = whole.lstrip("0") or "0"
    # More digits than 10Tbit has as a bare number is over the limit whatever the prefix
    # (and would be a slow int to make).
    if len(whole) > len(str(MAX_BANDWIDTH_BIT_S)):
        raise ValueError(f"{shown} is more than the limit of 10Tbit")
    # Digits finer than a bit per second at the largest prefix (10^12) change nothing.
    scale = _BANDWIDTH_SCALE[prefix]
    rate = int(whole) * scale + int(part[:12].ljust(12, "0")) * scale // 10**12
    if rate < MIN_BANDWIDTH_BIT_S:
        raise ValueError(f"{shown} is below the least shapeable rate of 8kbit")
    if rate > MAX_BANDWIDTH_BIT_S:
        raise ValueError(f"{shown} is more than the limit of 10Tbit")
    return rate


def _mount_path(v: str) -> str:
    if not v.startswith("/"):
        raise ValueError(f"{v!r} must be an absolute path")
    if (c := mount_option_char(v)) is not None:
        raise ValueError(
            f"{v!r} holds a {c!r}, which the container engine would read as mount "
            "options: a mounted path may hold neither ':' nor ','"
        )
    return v


Image = Annotated[StrictStr, AfterValidator(_image)]
Bandwidth = Annotated[int, BeforeValidator(to_bandwidth_bit_s)]
# A path of a volume, on the host or in the container.
MountPath = Annotated[StrictStr, AfterValidator(_path), AfterValidator(_mount_path)]


def container_spec(
    image: str | None,
    network: NetworkMode | None,
    bandwidth_bit_s: int | None,
    shm_mib: int | None,
    volumes: tuple[Volume, ...],
    path: str,
    p: Problems,
    env: Sequence[tuple[str, str]] = (),
) -> ContainerSpec | None:
    """The container of a task group (None: it runs on the host), checking what only makes
    sense in one: every container field without an image is a mistake at `path`. `env`: the
    group's variables, each with its field's path."""
    if image is None:
        for given, key in (
            (network is not None, "network"),
            (bandwidth_bit_s is not None, "bandwidth"),
            (shm_mib is not None, "shm_size"),
            (bool(volumes), "volumes"),
        ):
            if given:
                p.add(f"{path}{key}", "needs an image: only a container task has one")
        return None
    # Shaping needs the container's own interface: a bandwidth alone asks for a bridge.
    if network is None:
        net = NetworkMode.HOST if bandwidth_bit_s is None else NetworkMode.BRIDGE
    else:
        net = network
    if bandwidth_bit_s is not None and net != NetworkMode.BRIDGE:
        p.add(
            f"{path}bandwidth",
            f"needs network: bridge (traffic is shaped on the container's own interface; "
            f"network {net.value} has none)",
        )
    for i, first in duplicates(v.container_path for v in volumes):
        p.add(f"{path}volumes.{i}", f"mounts on {volumes[i].container_path}, as volumes.{first}")
    for field_path, value in env:
        if "\n" in value or "\r" in value:
            # The engine reads a container's variables from a file of one line each; on its
            # command line every local user would read the value, and its own environment
            # is root's (what it reads there, LD_PRELOAD and the like, it obeys).
            p.add(
                field_path,
                "a container task's variable cannot hold a line break; encode the value "
                "(base64, for instance) or put it in a file the task reads",
            )
    return ContainerSpec(
        image=image,
        network=net,
        bandwidth_bit_s=bandwidth_bit_s,
        shm_mib=shm_mib,
        volumes=volumes,
    )
