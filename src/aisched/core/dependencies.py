"""Job dependencies (pipelines): is a job's `depends_on` met, still awaited, or broken for good?

Pure: the caller passes the states it knows (live jobs and ended ones it looked up); nothing
here reads a store or a clock. A job whose dependencies are not met is not handed to the cycle
at all (it is not "pending" for the core), so it never holds a reservation or triggers a
preemption; the caller shows the reason from here as its status.

`check_dependencies` looks at every dependency; `Awaited` keeps, between checks, what each
waiting job still awaits, so that a dependency's end costs its waiters O(1) each instead of
a look at all their dependencies (a pipeline may list 100, and be one of thousands).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import islice

from aisched.model.job import Dependency, DependencyCondition, Job
from aisched.model.states import JobState


class DependencyVerdict(StrEnum):
    MET = "met"  # every dependency has ended as asked: the job may be scheduled
    WAITING = "waiting"  # some dependency is still pending or running
    BROKEN = "broken"  # some dependency can never be met (it failed, or does not exist)


@dataclass(frozen=True, slots=True)
class DependencyCheck:
    verdict: DependencyVerdict
    reason: str = ""


MET = DependencyCheck(DependencyVerdict.MET)


def check_dependencies(
    job: Job, state_of: Callable[[str], JobState | None], name_of: Mapping[str, str]
) -> DependencyCheck:
    """The verdict on `job.depends_on`; `state_of(id)` is None for a job that does not exist.

    A broken dependency wins over waiting ones (the job can be ended at once); the reason names
    the first dependency that breaks, or the first `NAMED_WAITING` awaited and how many more,
    in the order the job lists them.
    """
    waiting: list[Dependency] = []
    for dep in job.depends_on:
        label = _label(dep.job_id, name_of)
        state = state_of(dep.job_id)
        if state is None:
            return DependencyCheck(DependencyVerdict.BROKEN, f"dependency {label} does not exist")
        if dep.condition == DependencyCondition.SUCCESS:
            if state == JobState.SUCCEEDED:
                continue
            if state.is_terminal:
                return DependencyCheck(
                    DependencyVerdict.BROKEN,
                    f"dependency {label} {state.value}; it had to succeed",
                )
        if not state.is_terminal:
            waiting.append(dep)
    if waiting:
        reason = waiting_reason(waiting[:NAMED_WAITING], len(waiting), name_of)
        return DependencyCheck(DependencyVerdict.WAITING, reason)
    return MET


# A waiting job's reason is its status, shown in every listing: it names a few, not all.
NAMED_WAITING = 3


def waiting_reason(first: Sequence[Dependency], count: int, name_of: Mapping[str, str]) -> str:
    """Why a job waits on `count` dependencies, the first of which (in the order the job
    lists them, `NAMED_WAITING` at most) are `first`."""
    named = ", ".join(
        f"{_label(d.job_id, name_of)} "
        + ("to succeed" if d.condition == DependencyCondition.SUCCESS else "to end")
        for d in first
    )
    more = count - NAMED_WAITING
    return f"waiting for job {named}" + (f" and {more} more" if more > 0 else "")


class Awaited:
    """Who waits on whom, kept between checks: per waiting job, the dependencies it still
    awaits, in the order it lists them; per awaited job, the jobs that wait on it.

    The caller `hold`s a job that `check_dependencies` found WAITING, tells `ended` of every
    job that ends (it returns the jobs to re-check), and `forget`s a job once it no longer
    waits. In between, `still_awaited` answers a re-check without looking at any state: a job
    that still awaits some dependency, none of which has ended in a way that breaks it, is
    WAITING, for exactly the reason a full check would give. It answers None where a full
    check must decide: the job's last awaited dependency ended (met, unless one it ended
    meanwhile can no longer be found), one broke it, or it lists a job twice (never held: a
    full check counts each listing).

    Invariant: every job in `awaiting` is in `waiters[d]` for each `d` it awaits. `waiters`
    may also name jobs no longer awaiting (forgotten); the caller skips those as it re-checks.
    """

    def __init__(self) -> None:
        self.awaiting: dict[str, dict[str, Dependency]] = {}  # job → its awaited, by id
        self.waiters: dict[str, set[str]] = {}  # job → the jobs that wait on it

    def hold(self, job: Job, state_of: Callable[[str], JobState | None]) -> None:
        """`job` waits (a full check said so): index the dependencies that have not ended."""
        awaited: dict[str, Dependency] = {}
        for dep in job.depends_on:
            state = state_of(dep.job_id)
            if state is not None and not state.is_terminal:
                awaited[dep.job_id] = dep
                self.waiters.setdefault(dep.job_id, set()).add(job.id)
        if len(awaited) == sum(d.job_id in awaited for d in job.depends_on):
            self.awaiting[job.id] = awaited
        else:  # it lists an awaited job twice: left to full checks
            self.awaiting.pop(job.id, None)

    def forget(self, job_id: str) -> None:
        self.awaiting.pop(job_id, None)

    def ended(self, job_id: str, state: JobState) -> list[str]:
        """`job_id` ended in `state`: the jobs that waited on it, in id order, to re-check."""
        waiting = self.waiters.pop(job_id, None)
        if not waiting:
            return []
        for w in waiting:
            awaited = self.awaiting.get(w)
            if awaited is None:
                continue
            dep = awaited.pop(job_id, None)
            breaks = (
                dep is not None
                and dep.condition == DependencyCondition.SUCCESS
                and state != JobState.SUCCEEDED
            )
            if breaks or not awaited:
                del self.awaiting[w]  # a full check decides
        return sorted(waiting, key=lambda i: (len(i), i))

    def still_awaited(self, job_id: str) -> tuple[list[Dependency], int] | None:
        """The first `NAMED_WAITING` dependencies `job_id` still awaits and how many it does
        (for `waiting_reason`), or None where a full check must decide (see the class)."""
        awaited = self.awaiting.get(job_id)
        if not awaited:
            return None
        return list(islice(awaited.values(), NAMED_WAITING)), len(awaited)


def find_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A dependency cycle among `edges` (node → nodes it depends on) as [a, b, ..., a], or None.

    Nodes missing from `edges` have no dependencies. Iterative, so a long chain cannot exhaust
    the stack; nodes are visited in sorted order, so the cycle reported is always the same.
    """
    done: set[str] = set()
    for root in sorted(edges):
        if root in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            if i == 0:
                path.append(node)
                on_path.add(node)
            deps = sorted(edges.get(node, ()))
            if i < len(deps):
                stack.append((node, i + 1))
                nxt = deps[i]
                if nxt in on_path:
                    return [*path[path.index(nxt) :], nxt]
                if nxt not in done:
                    stack.append((nxt, 0))
                continue
            path.pop()
            on_path.discard(node)
            done.add(node)
    return None


def _label(job_id: str, name_of: Mapping[str, str]) -> str:
    name = name_of.get(job_id)
    return f"{job_id} ({name})" if name and name != job_id else job_id
