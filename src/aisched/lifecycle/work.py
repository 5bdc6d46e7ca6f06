"""How much work an attempt keeps through its checkpoints, and how long the next one takes.

An attempt checkpoints every checkpoint interval after it starts. An attempt after an
interruption (a preemption, a shrink, a grow or a failure) first spends a restore time (GPU
time that makes no progress), then continues from the saved work. A stopped attempt keeps only
the work up to its last checkpoint; checkpoints taken while restoring hold no new work. Work is
counted in seconds of the job's runtime at full speed; an attempt on slower GPUs, or an elastic
job with fewer tasks than it asked for, does `speed` seconds of it per second.

The simulator plays task ends with these rules; a test executor on a virtual clock uses the
same ones, so both see one job take one time.
"""

from __future__ import annotations

import math

from aisched.model.job import Job


def checkpoint_interval_s(job: Job, default_s: float) -> float:
    """How often `job` checkpoints: its own interval, else the driver's default (`inf`: it is
    taken not to checkpoint, and keeps nothing when stopped).

    The defaults differ on purpose, the rule does not (issue 15): the live service's is `inf`
    (`LoopConfig.checkpoint_interval_s`), since a scheduler must not count work as saved that a
    job may never have saved (it would choose victims by it); the simulator's is a modelling
    assumption about traces that carry no intervals (`SimConfig.checkpoint_interval_s`, 1 h;
    `aisched simulate --checkpoint-interval`)."""
    own = job.checkpoint_interval_s
    return own if own is not None else default_s


def core_interval(interval_s: float) -> float | None:
    """The interval as the core's running view takes it (None: the attempt's start counts as
    its last checkpoint)."""
    return None if interval_s == math.inf else interval_s


def kept_work_s(
    saved_s: float,
    elapsed_s: float,
    checkpoint_interval_s: float,
    restore_s: float,
    speed: float,
    total_s: float,
) -> float:
    """The work saved once an attempt that ran `elapsed_s` stops (never more than `total_s`)."""
    if checkpoint_interval_s == math.inf:
        kept = 0.0
    else:
        kept = math.floor(elapsed_s / checkpoint_interval_s) * checkpoint_interval_s
    return min(saved_s + max(kept - restore_s, 0.0) * speed, total_s)


def attempt_runtime_s(total_s: float, saved_s: float, restore_s: float, speed: float) -> float:
    """How long an attempt runs to the job's end: its restore, then the work left at `speed`."""
    return restore_s + max(total_s - saved_s, 0.0) / speed


def time_left_s(total_s: float | None, saved_s: float, restore_s: float) -> float | None:
    """What a scheduler should expect the next attempt to take, from an estimate of the whole
    runtime: the restore plus the estimate less the saved work. Past its estimate a job is
    expected to run about as long again as it has (the rule preemption applies to a running
    job that outlives its expected end)."""
    if total_s is None:
        return None
    return restore_s + (total_s - saved_s if total_s > saved_s else saved_s)


def elastic_speed(tasks: int, asked: int) -> float:
    """Linear scaling: an elastic job with `tasks` of its `asked` tasks runs that much slower."""
    return tasks / asked


def planned_end_s(runtime_s: float, fail_after_s: tuple[float, ...], failures: int) -> float:
    """How long a played attempt runs (the simulator's task ends, a virtual executor's): to its
    end, unless the job's next planned failure (`fail_after_s[failures]`) comes first."""
    if failures < len(fail_after_s) and fail_after_s[failures] < runtime_s:
        return fail_after_s[failures]
    return runtime_s


def fails(runtime_s: float, fail_after_s: tuple[float, ...], failures: int) -> bool:
    """Whether the attempt `planned_end_s` plays ends in a failure."""
    return failures < len(fail_after_s) and fail_after_s[failures] < runtime_s
