"""Bulk cancel in the loop: every live job a selection names, cancelled in one step.

`Scheduler.cancel_matching` queues one command; the loop applies it in one step, cancelling
each selected job exactly as a single cancel does (`Commands._cancel_live`: a pending job ends
at once, a running one is stopped first), and answers once the batch is stored. Each job's end
costs a constant amount of work (the reverse index of waiters, `SchedulerState.waiters`), so
cancelling thousands is one pass over the live jobs, not one per job. The jobs that wait on
the selected ones are re-checked once the whole selection is cancelled (`_ending_together`),
so a selection that holds a pipeline cancels every step of it and starts none.

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
        # 1. Take the selection as it stands, then cancel each job of it with the re-checks
        #    of their dependents held until all are: a pipeline's later steps are taken as
        #    they were asked for, cancelled, neither cancelled on the way as broken dependents
        #    (a second end of one job) nor released to run (`condition: any`).
        # 2. A job that fails to cancel (a bug) does not keep the rest live: they are
        #    cancelled, and then the command fails with the first error, as a single cancel's.
        taken = [lj for lj in self.jobs.values() if selected(cmd.selection, lj)]
        done: list[tuple[str, str]] = []
        failed: Exception | None = None
        with self._ending_together(batch, now):
            for lj in taken:
                if self.jobs.get(lj.id) is not lj:  # ended by the cancel of one before it
                    done.append((lj.id, lj.state.value))
                    continue
                try:
                    done.append((lj.id, self._cancel_live(lj, batch, now)))
                except Exception as exc:
                    failed = failed or exc
        if failed is not None:
            raise failed
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
