"""Refusing a job that can never run: one rule, applied by both drivers when a job arrives.

A job is refused when it could never run on the largest cluster it may get: the present
nodes, or, where node pools grow on demand, every pool at its maximum. "Never run" is the
core's judgement (`core.cycle.never_runs`: an unknown queue, more than its queue's limit on
its own, larger than any place it may go), the one its cycles report as `NEVER_FITS`.

When: at its submission, before its dependencies are looked at (a pipeline's step that could
never run is refused with its pipeline; it would otherwise hold its dependents up until its
turn came). The live service answers the submission with the reason (the API's 422) and stores
nothing; the simulator, which has no caller to answer, records the job as rejected at its
arrival time (`reject` in its log). The choice (issue 15): the simulator used to judge a job at
its first cycle, later than its arrival for a pipeline's step and on a cycle period's boundary;
the service's rule is kept, as DESIGN asks ("refused with the reason").

A job admitted before whose cycle says it never fits now (the nodes changed under it, or a
scheduler restarted on a smaller cluster) fails then with the reason (`never_fits_now`), unless
the largest cluster would still hold it: then it waits for nodes (the service's largest
cluster: the nodes that left or shrank at a restart, within `lost_node_grace`, as they were).
"""

from __future__ import annotations

from dataclasses import replace

from aisched.core.actions.enqueue import admission_refusal
from aisched.core.cycle import never_runs
from aisched.core.policy import Policy
from aisched.core.session import Session
from aisched.core.snapshot import Snapshot
from aisched.lifecycle.attempts import Finish
from aisched.model.job import Job
from aisched.model.states import JobState


def refusal(largest: Snapshot, policy: Policy, job: Job) -> str | None:
    """Why `job` is refused (None: it is admitted). `largest`: the largest cluster it may get,
    empty of work, with the queue tree."""
    return never_runs(largest, policy, job if job.id else replace(job, id="?"))


class Admission:
    """`refusal` for many jobs against one cluster at its largest (the simulator's arrivals):
    one session over it is kept, so that a job of a shape judged before costs a lookup in the
    cluster's memo rather than a new session (a copy of every node's free capacity). The
    judgement is the same: the check the core's enqueue makes, on the empty cluster."""

    def __init__(self, largest: Snapshot, policy: Policy) -> None:
        self._session = Session(largest, policy, 0.0, ())

    def refusal(self, job: Job) -> str | None:
        return admission_refusal(self._session, job if job.id else replace(job, id="?"))


def never_fits_now(
    job: Job, reason: str, policy: Policy, largest: Snapshot | None = None
) -> Finish | None:
    """What an admitted job whose cycle said `reason` (NEVER_FITS) becomes: FAILED, or None
    when `largest` (the cluster at its largest, where it may grow) would still hold it."""
    if largest is not None:
        why = refusal(largest, policy, job)
        return None if why is None else Finish(JobState.FAILED, why)
    return Finish(JobState.FAILED, reason)
