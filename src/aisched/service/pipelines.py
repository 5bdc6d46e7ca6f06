"""The loop's bookkeeping of job dependencies (pipelines): who waits on whom, and why.

Owned by the loop thread, like every other piece of live state. It decides nothing about
placement: a job it reports as blocked is simply left out of the cycle's pending list, with the
reason as its status. The verdicts themselves come from the pure `core.dependencies`.

Invariants: `blocked` holds only live pending jobs; `awaited.waiters[d]` lists the jobs that
wait on job `d`, a job not yet ended (and maybe some that no longer wait). When `d` ends they
move, in id order, to the end of `recheck`, the loop's work list: the loop re-checks exactly
those, and takes each off the list only once it has been re-checked, so a step that fails
halfway leaves the rest to the next one, and a re-check that ends a job (a broken dependency)
only adds to the list, however long the chain it cascades down.

A re-check is incremental (`core.dependencies.Awaited`): a job that still awaits other jobs
only has its reason rebuilt from what it still awaits, without a look at the dependencies
that have already ended; the full check runs when a job is first held (submission, and every
waiting job at recovery, which is how a restart or a takeover rebuilds the index from the
store), and when an end may release or cancel it.

Ended jobs' states are read from the store once and cached, since an ended job never changes;
the cache keeps the `ENDED_CACHED` most recently used (a service that runs for months must not
hold every job it ever ended), and a job no longer in it is read from the store again.
An end not stored yet (written to the loop's batch, not flushed) is remembered from `on_end`
until `stored`: the store still calls that job pending or running, and a job checked against
it meanwhile (one submitted, or re-checked by a restart, in the same step) must see it ended,
whatever order the step took.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import replace

from aisched.core.dependencies import (
    Awaited,
    DependencyCheck,
    DependencyVerdict,
    check_dependencies,
    waiting_reason,
)
from aisched.model.job import Dependency, DependencyCondition, Job
from aisched.model.states import JobState
from aisched.service.live import LiveJob
from aisched.store.db import Store

# Ended jobs whose (state, name) the loop keeps at hand: far more than the dependencies a step
# looks up, few enough to be nothing in memory (some 200 bytes each).
ENDED_CACHED = 10_000


class DependencyError(ValueError):
    """A submission whose `depends_on` can never be met; nothing of it is created."""


class Pipelines:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.blocked: dict[str, str] = {}  # job id → why it waits
        self.awaited = Awaited()  # who waits on whom
        self.recheck: deque[str] = deque()  # jobs to re-check: something they wait on ended
        # job id → (final state, name), the most recently used last (see ENDED_CACHED)
        self.ended: OrderedDict[str, tuple[JobState, str]] = OrderedDict()
        self.unstored: dict[str, tuple[JobState, str]] = {}  # ended, its batch not yet flushed

    def lookup(self, job_id: str, live: Mapping[str, LiveJob]) -> tuple[JobState, str] | None:
        """(state, name) of any job, live or ended; None if there is no such job."""
        lj = live.get(job_id)
        if lj is not None:
            return lj.state, lj.job.name
        found = self.unstored.get(job_id)
        if found is not None:
            return found
        found = self.ended.get(job_id)
        if found is not None:
            self.ended.move_to_end(job_id)
            return found
        with self.store.read() as tx:
            row = tx.get_job(job_id)
        if row is None:
            return None
        found = JobState(row["state"]), str(row["name"])
        if found[0].is_terminal:
            self.remember(job_id, found)
        return found

    def remember(self, job_id: str, ended: tuple[JobState, str]) -> None:
        self.ended[job_id] = ended
        self.ended.move_to_end(job_id)
        while len(self.ended) > ENDED_CACHED:
            self.ended.popitem(last=False)

    def resolve(
        self, jobs: Sequence[Job], ids: Sequence[str], live: Mapping[str, LiveJob]
    ) -> list[Job]:
        """The jobs of one submission with every reference replaced by a job id: a name of a
        job of the same submission first, else an existing job's id. Raises DependencyError
        naming the job and the field if a reference names nothing or can never be met."""
        by_name = {j.name: i for i, j in zip(ids, jobs, strict=True)} if len(jobs) > 1 else {}
        out: list[Job] = []
        for job, _id in zip(jobs, ids, strict=True):
            deps: list[Dependency] = []
            for k, dep in enumerate(job.depends_on):
                where = f"job {job.name!r}: depends_on.{k}"
                if dep.job_id in by_name:
                    deps.append(Dependency(by_name[dep.job_id], dep.condition))
                    continue
                found = self.lookup(dep.job_id, live)
                if found is None:
                    raise DependencyError(
                        f"{where}: no job {dep.job_id!r} (neither a job of this submission "
                        "by name nor an existing job by id)"
                    )
                state, name = found
                if (
                    dep.condition == DependencyCondition.SUCCESS
                    and state.is_terminal
                    and state != JobState.SUCCEEDED
                ):
                    raise DependencyError(
                        f"{where}: job {dep.job_id} ({name}) has already ended ({state.value}); "
                        "it can never succeed (use condition: any to run after it regardless)"
                    )
                deps.append(dep)
            out.append(replace(job, depends_on=tuple(deps)))
        return out

    def check(self, lj: LiveJob, live: Mapping[str, LiveJob]) -> DependencyCheck:
        """Re-evaluate a pending job's dependencies; record it as blocked (and as a waiter on
        what it awaits) or not. The caller ends it if the verdict is BROKEN."""
        still = self.awaited.still_awaited(lj.id)
        if still is not None:  # it waits on: only its reason changes
            reason = self._waiting_reason(*still, live)
            self.blocked[lj.id] = reason
            return DependencyCheck(DependencyVerdict.WAITING, reason)
        found = {d.job_id: self.lookup(d.job_id, live) for d in lj.job.depends_on}
        states = {k: v[0] for k, v in found.items() if v is not None}
        names = {k: v[1] for k, v in found.items() if v is not None}
        verdict = check_dependencies(lj.job, states.get, names)
        if verdict.verdict == DependencyVerdict.WAITING:
            self.blocked[lj.id] = verdict.reason
            self.awaited.hold(lj.job, states.get)
        else:
            self.blocked.pop(lj.id, None)
            self.awaited.forget(lj.id)
        return verdict

    def _waiting_reason(
        self, first: Sequence[Dependency], count: int, live: Mapping[str, LiveJob]
    ) -> str:
        """The reason of a job that still awaits `count` jobs, `first` of all: only those
        named are looked up (live jobs, at no cost)."""
        names: dict[str, str] = {}
        for dep in first:
            found = self.lookup(dep.job_id, live)
            if found is not None:
                names[dep.job_id] = found[1]
        return waiting_reason(first, count, names)

    def on_end(self, job_id: str, state: JobState, name: str) -> None:
        """Job `job_id` ended (written to the batch, not yet stored): remember how, and add
        the live jobs that waited on it to `recheck`. The caller calls `stored` once the batch
        is flushed."""
        self.blocked.pop(job_id, None)
        self.awaited.forget(job_id)
        self.unstored[job_id] = (state, name)
        waiting = self.awaited.ended(job_id, state)
        if waiting:
            self.remember(job_id, (state, name))
            self.recheck.extend(waiting)

    def stored(self, job_id: str) -> None:
        """The end of `job_id` is in the store: from now on the store says so."""
        self.unstored.pop(job_id, None)
