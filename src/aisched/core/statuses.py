"""The statuses of one cycle's pending jobs: set job by job, or stated once for many by a rule.

In a long queue most jobs end a cycle as they began it, waiting for a shape that did not fit
(or behind a blocked job under strict order). Writing a status per job makes every cycle cost
O(queue) however little changed, so allocate may instead state one rule for every admitted job
it gives no status of its own: each waits for its shape's reason (`by_shape`), or all wait for
one reason. A lookup answers from the job's own status first, then the rule; once the cycle
ends (`finish`), a pending job with neither was not reached. A status shared by the jobs of a
shape names task groups by place (`status.group_ref`): each job reads its own groups' names,
never those of the job the reason was first worked out for (maybe another user's).

Invariants:
- A job's own status always wins over the rule, and the rule covers only admitted jobs (those
  enqueue kept, `core.admitted`), never a refused one.
- Until `finish`, the keys are the jobs that have a status (a job not yet reached is absent, as
  the actions expect); after it, exactly the pending jobs' ids, in pending order.
- The members it reads job shapes from never change while it is alive (the kept order hands it
  a copy before it changes its table again), so a cycle's result stays what it was.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, MutableMapping
from typing import Protocol

from aisched.core.snapshot import PendingJob
from aisched.core.status import GROUP_MARK, JobStatus, group_refs, named_for
from aisched.model.job import Job


class Admitted(Protocol):
    """What the rule needs of an enqueued job (`core.admitted.Member`)."""

    @property
    def pj(self) -> PendingJob: ...

    @property
    def refusal(self) -> str | None: ...

    @property
    def shape(self) -> Hashable: ...


class Statuses(MutableMapping[str, JobStatus]):
    """Every pending job's status this cycle: its own, else the rule's (see the module)."""

    # With `__weakref__`: the kept order lends it its members and watches it weakly.
    __slots__ = ("own", "_pending", "_members", "_by_shape", "_all", "_default", "_ids",
                 "_jobs", "_reasons", "_named", "__weakref__")  # fmt: skip

    def __init__(self, pending: tuple[PendingJob, ...]) -> None:
        self.own: dict[str, JobStatus] = {}
        self._pending = pending
        # Job id -> its member, for every pending job, once enqueue kept the order.
        self._members: Mapping[str, Admitted] | None = None
        self._by_shape: Mapping[Hashable, JobStatus] | None = None
        self._all: JobStatus | None = None
        self._default: JobStatus | None = None
        self._ids: set[str] | None = None
        self._jobs: dict[str, Job] | None = None  # by id, before enqueue's members are known
        # A shared reason -> the places of the groups it names, and by the names there the
        # reason as the jobs of those names read it. Keyed by the reason, not the status: the
        # eta action gives each waiting job a status of its own (its start), of one reason.
        self._reasons: dict[str, tuple[tuple[int, ...], dict[object, str]]] = {}
        # (a status as stated, the names at its places) -> the status as those jobs read it:
        # alike statuses (equal code, reason and start) are read as one object.
        self._named: dict[tuple[JobStatus, object], JobStatus] = {}

    def know_members(self, members: Mapping[str, Admitted]) -> None:
        """Enqueue's word: `members` holds every pending job, by id, and is not changed while
        this is alive (the kept order hands over a copy first, `AdmittedOrder.lend_members`)."""
        self._members = members

    def wait_by_shape(self, by_shape: Mapping[Hashable, JobStatus]) -> None:
        """Every admitted job without a status of its own has its shape's status, from now on
        (`by_shape` must hold every such job's shape)."""
        assert self._members is not None, "a rule needs the members enqueue kept"
        self._by_shape, self._all = by_shape, None

    def wait_all(self, status: JobStatus) -> None:
        """Every admitted job without a status of its own has `status`, from now on."""
        assert self._members is not None, "a rule needs the members enqueue kept"
        self._by_shape, self._all = None, status

    def finish(self, default: JobStatus) -> None:
        """The cycle is over: a pending job with no status has `default` (not reached)."""
        self._default = default

    def _ruled(self, job_id: str, named: bool) -> JobStatus | None:
        members = self._members
        if members is None:
            return None
        m = members.get(job_id)
        if m is None or m.refusal is not None:
            return None
        s = self._all
        if s is None:
            by_shape = self._by_shape
            if by_shape is None:
                return None
            s = by_shape[m.shape]
        return self._named_for(s, m.pj.job) if named and GROUP_MARK in s.reason else s

    def _named_for(self, s: JobStatus, job: Job) -> JobStatus:
        """`s` as `job` reads it (see the module). Called for every waiting job a shared
        reason covers: the reason is named once per names, the status built once per alike
        status and names."""
        reason = s.reason
        entry = self._reasons.get(reason)
        if entry is None:
            entry = self._reasons[reason] = (group_refs(reason), {})
        places, by_names = entry
        groups = job.groups
        names = (
            groups[places[0]].name if len(places) == 1 else tuple(groups[i].name for i in places)
        )
        key = (s, names)
        named = self._named.get(key)
        if named is None:
            named_reason = by_names.get(names)
            if named_reason is None:
                named_reason = by_names[names] = named_for(reason, job)
            named = self._named[key] = JobStatus(s.code, named_reason, s.eta_s)
        return named

    def _job(self, job_id: str) -> Job:
        members = self._members
        if members is not None:
            return members[job_id].pj.job
        if self._jobs is None:
            self._jobs = {pj.id: pj.job for pj in self._pending}
        return self._jobs[job_id]

    def _is_pending(self, job_id: str) -> bool:
        if self._members is not None:
            return job_id in self._members
        return job_id in self._pending_ids()

    def get(self, job_id: str, default: JobStatus | None = None) -> JobStatus | None:  # type: ignore[override]
        s = self._find(job_id, True)
        return default if s is None else s

    def stated(self, job_id: str) -> JobStatus | None:
        """The job's status as the cycle stated it: a shared reason with its groups named by
        place. For actions that read its code, or pass it on to a job of the same shape."""
        return self._find(job_id, False)

    def _find(self, job_id: str, named: bool) -> JobStatus | None:
        """The job's status; as the job reads it if `named`, else as stated (enough to say
        whether it has one)."""
        s = self.own.get(job_id)
        if s is not None:
            if named and GROUP_MARK in s.reason:
                return self._named_for(s, self._job(job_id))
            return s
        s = self._ruled(job_id, named)
        if s is not None:
            return s
        if self._default is not None and self._is_pending(job_id):
            return self._default
        return None

    def __getitem__(self, job_id: str) -> JobStatus:
        s = self.get(job_id)
        if s is None:
            raise KeyError(job_id)
        return s

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and self._find(job_id, False) is not None

    def __setitem__(self, job_id: str, status: JobStatus) -> None:
        self.own[job_id] = status

    def __delitem__(self, job_id: str) -> None:
        del self.own[job_id]  # a status stated by the rule cannot be taken back

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for pj in self._pending:
            job_id = pj.id
            if job_id not in seen and self._find(job_id, False) is not None:
                seen.add(job_id)
                yield job_id

    def __len__(self) -> int:
        if self._default is None:
            return sum(1 for _ in self)
        return len(self._members) if self._members is not None else len(self._pending_ids())

    def _pending_ids(self) -> set[str]:
        if self._ids is None:
            self._ids = {pj.id for pj in self._pending}
        return self._ids


__all__ = ["Admitted", "Statuses"]
