"""Why a pending job was or was not placed in a cycle.

Keeps "waiting: may fit later or by preemption" (WAIT_*) apart from "can never fit this cluster"
(NEVER_FITS), as the Kubernetes framework keeps Unschedulable apart from
UnschedulableAndUnresolvable.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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
