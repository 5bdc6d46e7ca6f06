"""Why a pending job was or was not placed in a cycle.

Keeps "waiting: may fit later or by preemption" (WAIT_*) apart from "can never fit this cluster"
(NEVER_FITS), as the Kubernetes framework keeps Unschedulable apart from
UnschedulableAndUnresolvable.

A reason worked out once for a shape is shared by every job of that shape, and jobs of one
shape (of different users, too) may name their task groups differently: such a reason refers to
a group by its place in the job (`group_ref`), and each job reads it with its own group's name
(`named_for`; `core.statuses` does it for every status it gives out).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from aisched.model.job import Job


class StatusCode(StrEnum):
    PLACED = "placed"
    PREEMPTING = "preempting"
    RESERVED = "reserved"
    WAIT_RESOURCES = "wait-resources"
    WAIT_QUEUE = "wait-queue"
    WAIT_RESERVATION = "wait-reservation"
    NOT_CONSIDERED = "not-considered"
    WAIT_DEPENDENCIES = "wait-dependencies"  # held back until the jobs it depends on end
    NEVER_FITS = "never-fits"

    @property
    def is_placed(self) -> bool:
        return self in (StatusCode.PLACED, StatusCode.PREEMPTING)


@dataclass(frozen=True, slots=True)
class JobStatus:
    code: StatusCode
    reason: str
    eta_s: float | None = None


PLACED = JobStatus(StatusCode.PLACED, "placed")


# Around a group's index in a shared reason; never in a name (names are validated at the edge).
GROUP_MARK = "\x00"


def group_ref(index: int) -> str:
    """The task group at `index` of whichever job reads the reason (see the module)."""
    return f"{GROUP_MARK}{index}{GROUP_MARK}"


def group_refs(reason: str) -> tuple[int, ...]:
    """The places of the task groups `reason` refers to, in order."""
    return tuple(int(i) for i in reason.split(GROUP_MARK)[1::2])


def named_for(reason: str, job: Job) -> str:
    """`reason` as `job` reads it: with its own task groups' names."""
    if GROUP_MARK not in reason:
        return reason
    parts = reason.split(GROUP_MARK)
    groups = job.groups
    parts[1::2] = [groups[int(i)].name for i in parts[1::2]]
    return "".join(parts)
