"""What every trace loader returns, where the trace files live, how bad rows are reported, and
the gang shape shared by traces that record only a GPU count.

Invariants of a `Trace`: its jobs are sorted by `(job.submit_time_s, job.id)`, the first one
arrives at 0, and every `TraceJob.duration_s` is positive (`inf` means "holds its resources until
the end of the run", for traces that record no lifetime). Loaders never guess at a row they
cannot read: they raise `TraceError` naming the file, line and column, unless asked to skip such
rows (`skip_invalid`), which they then count in `Trace.skipped`. Header and file problems are
never skipped.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from aisched.model.cluster import Cluster
from aisched.model.job import Job, JobKind, TaskGroup
from aisched.model.resources import Resources

TRACES_ENV = "AISCHED_TRACES"

GPUS_PER_SERVER = 8
# Host resources asked per GPU by traces that record only GPUs; modest, so that a whole 8-GPU
# server's worth (24 cores, 96 GiB) fits any common 8-GPU machine.
MILLI_CPU_PER_GPU = 3000
MEM_MIB_PER_GPU = 12288


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace and its true service time.

    `job.submit_time_s` is the arrival time in seconds from the start of the trace. `duration_s`
    is the time it runs once started on the GPUs the trace recorded; the scheduler never sees it
    (a user's guess, when the trace has one, is `job.estimate_s`).
    """

    job: Job
    duration_s: float
    source: str = ""
    # Played failures (no public trace records them; tests and what-if runs set them): while
    # the job has failed fewer times than there are entries, its attempt fails this long
    # after it starts (the first failure after the first entry, ...), then is retried per
    # its restart policy.
    fail_after_s: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    jobs: tuple[TraceJob, ...]
    # A cluster that comes with the trace (openb's node list); None when the trace has none.
    cluster: Cluster | None = None
    # Rows a loader left out because it was asked to skip what it cannot use (`skip_invalid`),
    # and the first of their problems ("file:line: column: ..."), for the user to see.
    skipped: int = 0
    first_skipped: str | None = None

    def __len__(self) -> int:
        return len(self.jobs)


class TraceError(ValueError):
    """A row of a trace file that cannot be read; the message says where and what is wrong."""

    def __init__(self, file: Path | str, line: int, column: str | None, problem: str) -> None:
        where = f"{file}:{line}:" if column is None else f"{file}:{line}: column {column!r}:"
        super().__init__(f"{where} {problem}")
        self.file = str(file)
        self.line = line
        self.column = column
        self.problem = problem


def _candidates() -> list[Path]:
    cwd = Path.cwd()
    out = [cwd / "shared" / "traces", cwd.parent / "shared" / "traces"]
    # Walk up from this file so an installed or editable checkout finds `<repo>/shared/traces`
    # and `<repo>/../shared/traces` whatever the current directory is.
    out.extend(parent / "shared" / "traces" for parent in Path(__file__).resolve().parents)
    seen: set[Path] = set()
    unique: list[Path] = []
    for p in out:
        if p not in seen:
            seen.add(p)
            unique.append(p)
    return unique


def find_traces_dir() -> Path:
    """The folder holding the public traces (`philly-pollux/`, `alibaba-openb-v2023/`).

    `$AISCHED_TRACES` wins when set; a value that is not a folder is an error rather than a
    silent fallback, so a typo is not hidden by some other copy of the traces.
    """
    env = os.environ.get(TRACES_ENV)
    if env:
        p = Path(env)
        if p.is_dir():
            return p
        raise FileNotFoundError(f"{TRACES_ENV}={env} is not a folder")
    tried = _candidates()
    for p in tried:
        if p.is_dir():
            return p
    listed = "\n  ".join(str(p) for p in tried)
    raise FileNotFoundError(
        f"no traces folder found; tried:\n  {listed}\n"
        f"set {TRACES_ENV} to the folder that holds philly-pollux/ and alibaba-openb-v2023/"
    )


def resolve_trace_file(path: Path | str | None, folder: str, filename: str) -> Path:
    """`path` as given, `path/filename` when it is a folder, else the file in the traces dir."""
    if path is None:
        p = find_traces_dir() / folder / filename
    else:
        p = Path(path)
        if p.is_dir():
            p = p / filename
    if not p.is_file():
        raise FileNotFoundError(f"trace file not found: {p}")
    return p


@contextmanager
def open_csv(file: Path) -> Iterator[CsvRows]:
    """The rows of `file` as a csv reader gives them, with its `line_num`; what cannot be read
    (a byte that is not UTF-8, a field over the csv module's size limit) is a `TraceError`
    naming its line, as a bad value is."""
    with file.open(newline="", encoding="utf-8-sig") as fh:  # -sig: a spreadsheet's BOM
        yield CsvRows(file, fh)


class CsvRows:
    """A csv reader over `lines` whose errors are `TraceError`s naming `file` and the line."""

    def __init__(self, file: Path, lines: Iterable[str]) -> None:
        self.file = file
        self._reader = csv.reader(lines)

    def __iter__(self) -> CsvRows:
        return self

    def __next__(self) -> list[str]:
        try:
            return next(self._reader)
        except csv.Error as e:
            raise TraceError(self.file, self._reader.line_num, None, f"not CSV: {e}") from None
        except UnicodeDecodeError:
            raise _not_utf8(self.file) from None

    @property
    def line_num(self) -> int:
        return self._reader.line_num


def _not_utf8(file: Path) -> TraceError:
    """The error for `file`'s first byte that is not UTF-8, found again in the raw bytes: the
    text-mode reader decodes ahead in blocks, so its own error names no line."""
    data = file.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        line = data.count(b"\n", 0, e.start) + 1
        return TraceError(file, line, None, f"not UTF-8 text (byte {e.start - line_start + 1})")
    return TraceError(file, 1, None, "not UTF-8 text")  # changed since it was read


def one_queue(trace: Trace, queue: str = "default") -> Trace:
    """The trace with every job in `queue` (users kept): a cluster-wide order, as in the
    Helios and Tiresias replays, instead of one fair-shared queue per team or VC."""
    jobs = tuple(
        TraceJob(replace(tj.job, queue=queue), tj.duration_s, tj.source) for tj in trace.jobs
    )
    return replace(trace, jobs=jobs)


def sort_key(tj: TraceJob) -> tuple[float, str]:
    return (tj.job.submit_time_s, tj.job.id)


def split_gpus(num_gpus: int, per_server: int = GPUS_PER_SERVER) -> tuple[int, int]:
    """(replicas, GPUs per replica) for a job holding `num_gpus` GPUs on `per_server`-GPU
    servers (8 unless the cluster's nodes are smaller; see `fit_gangs_to`).

    Up to `per_server` GPUs is one task. More is a gang of equal replicas, each the largest of
    8, 4, 2 (no larger than a server) that divides the count (on 8-GPU servers 16 → 2×8,
    24 → 3×8, 12 → 3×4; on 4-GPU servers 8 → 2×4), because power-of-two slices match how
    servers group their GPUs; an odd count falls back to its largest divisor up to a server.
    """
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
    if per_server < 1:
        raise ValueError(f"per_server must be >= 1, got {per_server}")
    if num_gpus <= per_server:
        return 1, num_gpus
    for per in (8, 4, 2):
        if per <= per_server and num_gpus % per == 0:
            return num_gpus // per, per
    per = max(d for d in range(1, per_server + 1) if num_gpus % d == 0)
    return num_gpus // per, per


def gpu_train_job(
    job_id: str,
    num_gpus: int,
    *,
    user: str,
    queue: str,
    submit_time_s: float,
    priority: int = 0,
    estimate_s: float | None = None,
) -> Job:
    """A training gang for a trace row that records only a GPU count (see `split_gpus`)."""
    return Job(
        id=job_id,
        groups=_train_groups(num_gpus),
        kind=JobKind.TRAIN,
        user=user,
        queue=queue,
        priority=priority,
        estimate_s=estimate_s,
        submit_time_s=submit_time_s,
    )


@lru_cache(maxsize=256)
def _train_groups(num_gpus: int, per_server: int = GPUS_PER_SERVER) -> tuple[TaskGroup, ...]:
    # Task groups are immutable, so jobs of the same size share one; a trace of 80 k jobs then
    # allocates a few dozen groups instead of 80 k, which halves its load time.
    replicas, per = split_gpus(num_gpus, per_server)
    request = Resources(milli_cpu=MILLI_CPU_PER_GPU * per, mem_mib=MEM_MIB_PER_GPU * per, gpu=per)
    return (TaskGroup(name="worker", replicas=replicas, request=request),)


def largest_gpu_node(cluster: Cluster) -> int:
    """The most GPUs on one node of `cluster`, its autoscaling pools' nodes included."""
    counts = [len(n.gpus) for n in cluster.nodes]
    counts += [len(p.template.gpus) for p in cluster.node_pools]
    return max(counts, default=0)


def fit_gangs_to(trace: Trace, cluster: Cluster) -> tuple[Trace, int]:
    """The trace with every job made by `gpu_train_job` whose tasks ask for more GPUs than the
    cluster's largest node has split again for that node size (an 8-GPU Philly job on 4-GPU
    nodes: a gang of 2×4, as Tiresias and Helios replay it), and how many were split. Jobs of
    other shapes (pod lists, job files) are left as they are."""
    per_server = largest_gpu_node(cluster)
    if per_server < 1 or per_server >= GPUS_PER_SERVER:
        return trace, 0
    jobs: list[TraceJob] = []
    changed = 0
    for tj in trace.jobs:
        groups = tj.job.groups
        g = groups[0]
        total = g.replicas * g.request.gpu
        if len(groups) == 1 and g.request.gpu > per_server and groups == _train_groups(total):
            tj = replace(tj, job=replace(tj.job, groups=_train_groups(total, per_server)))
            changed += 1
        jobs.append(tj)
    if not changed:
        return trace, 0
    return replace(trace, jobs=tuple(jobs)), changed
