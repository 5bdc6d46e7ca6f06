"""Every change of a job's state goes through `move`, which enforces `model.states`' table.

The choice (issue 15): the table is kept and enforced, not replaced by derived states. A job's
state is what the store records, what the API shows and what a restarted scheduler reads back;
deriving it from other fields (stopping, tasks, not_before) would make every reader re-derive it
the same way. So both drivers keep the state and change it only here, and a move the table
does not allow raises `InvalidTransition` (a bug in a driver, never bad input).

`PREEMPTED` is in the table and stays a state no driver enters: a preempted attempt keeps its
job RUNNING while its tasks stop (it still holds the resources; the core sees it as
terminating), then the job goes RUNNING → PENDING, with the preemption in its counters and
event log. A separate state for those few seconds would show "preempted" where every other
reader (metrics, the dashboard, `aisched jobs`) counts a job holding resources as running.
"""

from __future__ import annotations

from aisched.model.states import JobState, check_transition


def move(job_id: str, src: JobState, dst: JobState) -> JobState:
    """`dst`, once the table allows `src` → `dst`; raises `InvalidTransition` otherwise."""
    return check_transition(job_id, src, dst)
