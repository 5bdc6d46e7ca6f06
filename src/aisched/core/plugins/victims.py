"""Victim selectors for preempt and reclaim. Lower keys are evicted first.

`keys(running, now)`, where a selector has it, is `key` of each job in one pass: a preemption
walk keys every candidate at once (`framework.victim_keys`), and a call per job cost more than
the arithmetic. Each must equal its `key` exactly (tests/property/test_preempt_walk.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aisched.core.snapshot import RunningJob
from aisched.model.resources import GPU_MILLI_WHOLE


def time_left_s(running: RunningJob, now: float, waited: bool = False) -> float | None:
    """How long a running job is expected to go on: to its expected end, or, once past it, as
    long again as it has run in all (it outlived its estimate, so it is probably long);
    None when it has no expected end. `waited`: to the end the bound it waited with gives
    (`RunningJob.waited_end_s`, where its caller gives one)."""
    end = running.expected_end_s
    if waited and running.waited_end_s is not None:
        end = running.waited_end_s
    if end is None:
        return None
    if end > now:
        return end - now
    return running.attained_at(now) / max(running.usage[2] / GPU_MILLI_WHOLE, 1.0)


@dataclass(frozen=True, slots=True)
class LowestPriority:
    name: str = "lowest-priority"

    def key(self, running: RunningJob, now: float) -> float:
        return float(running.job.priority)

    def keys(self, running: Sequence[RunningJob], now: float) -> list[float]:
        return [float(r.job.priority) for r in running]


@dataclass(frozen=True, slots=True)
class LeastWorkLost:
    """GPU-seconds that would be lost: the time since the last checkpoint (or start), times
    the job's GPUs. Checkpoint-aware preemption evicts the job that loses least."""

    name: str = "least-work-lost"

    def key(self, running: RunningJob, now: float) -> float:
        since = running.checkpoint_at(now)
        return max(now - since, 0.0) * max(running.usage[2] / 1000.0, 1.0)

    def keys(self, running: Sequence[RunningJob], now: float) -> list[float]:
        # `key` inlined, `checkpoint_at` too (this is the walk's hottest loop): the same
        # operations in the same order, and max(x, c) spelled as its result (x unless x < c),
        # so the floats match.
        out = []
        for r in running:
            since = r.last_checkpoint_s
            if since is None:
                ck, started = r.checkpoint_interval_s, r.started_s
                if ck is None or ck <= 0 or now <= started:
                    since = started
                else:
                    since = started + ((now - started) // ck) * ck
            lost = now - since
            gpus = r.usage[2] / 1000.0
            out.append((0.0 if lost < 0.0 else lost) * (1.0 if gpus < 1.0 else gpus))
        return out


@dataclass(frozen=True, slots=True)
class Newest:
    name: str = "newest"

    def key(self, running: RunningJob, now: float) -> float:
        return -running.started_s

    def keys(self, running: Sequence[RunningJob], now: float) -> list[float]:
        return [-r.started_s for r in running]


@dataclass(frozen=True, slots=True)
class LongestRemaining:
    """Most GPU-time left first (shortest-remaining-time preemption evicts the job furthest
    from done), by `time_left_s`; a job with no expected end counts as endless."""

    name: str = "longest-remaining"

    def key(self, running: RunningJob, now: float) -> float:
        left = time_left_s(running, now)
        if left is None:
            return -float("inf")
        return -left * max(running.usage[2] / GPU_MILLI_WHOLE, 1.0)
