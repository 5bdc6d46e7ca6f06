"""Bulk cancel in the loop: every live job a selection names, cancelled in one step.

`Scheduler.cancel_matching` queues one command; the loop applies it in one step, cancelling
each selected job exactly as a single cancel does (`Commands._cancel_live`: a pending job ends
at once, a running one is stopped first), and answers once the batch is stored. Each job's end
costs a constant amount of work (the reverse index of waiters, `SchedulerState.waiters`), so
cancelling thousands is one pass over the live jobs, not one per job.

Who may cancel what is the caller's business (`routes.bulk`): the selection says whose jobs,
the account's (its name and uid), not any account's that bore the name.
A service's replicas are never selected on their own; cancelling the service stops them.
"""

from __future__ import annotations

from concurrent.futures import Future

from aisched.model.states import JobState
from aisched.service.commands import Commands
from aisched.service.identity import same_account
from aisched.service.live import Batch, LiveJob
from aisched.service.loop_types import BulkCancelCommand, CancelSelection

STATES = {"pending": JobState.PENDING, "running": JobState.RUNNING}


class BulkCancels(Commands):
    def cancel_matching(self, selection: CancelSelection) -> Future[list[tuple[str, str]]]:
        """Cancel every live job `selection` names. The Future gives each job taken, in
        submission order, with its state after the command."""
        if selection.state is not None and selection.state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, not {selection.state!r}")
        fut: Future[list[tuple[str, str]]] = Future()
        self.commands.put(BulkCancelCommand(selection, fut))
        self.wake.set()
        return fut

    def _on_bulk_cancel(self, cmd: BulkCancelCommand, batch: Batch, now: float) -> None:
        taken = [lj for lj in self.jobs.values() if selected(cmd.selection, lj)]
        done = [(lj.id, self._cancel_live(lj, batch, now)) for lj in taken]
        batch.after.append(lambda: cmd.future.set_result(done))


def selected(sel: CancelSelection, lj: LiveJob) -> bool:
    """Whether the live job `lj` is one that `sel` names."""
    job = lj.job
    if job.replica_of is not None:
        return False
    if sel.user is not None and not same_account(sel.user, sel.uid, job.user, job.uid):
        return False
    if sel.queue is not None and job.queue != sel.queue:
        return False
    want = STATES.get(sel.state) if sel.state is not None else None
    if want is not None:
        return lj.state == want
    return lj.state in (JobState.PENDING, JobState.RUNNING)
