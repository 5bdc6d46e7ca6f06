"""Job dependencies (pipelines): is a job's `depends_on` met, still awaited, or broken for good?

Pure: the caller passes the states it knows (live jobs and ended ones it looked up); nothing
here reads a store or a clock. A job whose dependencies are not met is not handed to the cycle
at all (it is not "pending" for the core), so it never holds a reservation or triggers a
preemption; the caller shows the reason from here as its status.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from aisched.model.job import DependencyCondition, Job
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
    waiting: list[str] = []
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
            waiting.append(f"{label} to succeed")
        elif not state.is_terminal:
            waiting.append(f"{label} to end")
    if waiting:
        return DependencyCheck(DependencyVerdict.WAITING, _waiting_reason(waiting))
    return MET


# A waiting job's reason is its status, shown in every listing: it names a few, not all.
NAMED_WAITING = 3


def _waiting_reason(waiting: list[str]) -> str:
    named = ", ".join(waiting[:NAMED_WAITING])
    more = len(waiting) - NAMED_WAITING
    return f"waiting for job {named}" + (f" and {more} more" if more > 0 else "")


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
