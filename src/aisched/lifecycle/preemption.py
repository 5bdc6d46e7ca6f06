"""Preemption's grace and the wait of the job a preemption makes room for.

The rules, the same in both drivers:

1. A victim is sent SIGTERM and has its grace period (`Job.grace_period_s`) to stop, then its
   tasks are killed (the executors send the SIGKILL; `kill_at` says when). Until every task of
   it has exited it keeps its resources, and the core sees it as terminating (it is not chosen
   as a victim again). Once they all have, `attempts.after_attempt(Stop.PREEMPT)` says what it
   becomes: requeued, even when a task exited 0 in the meantime (a task that checkpoints on
   SIGTERM and exits 0 has not finished its work).
2. A bind the core made after victims (`Bind.after`) goes ahead at once only when none of them
   still holds its resources (`wait_for` gives None). So does any other bind of the cycle
   whose tasks do not fit what is free now because a job still stopping holds it: the core
   frees a victim at once in its cycle and may place other jobs, not only its preemptor, in
   what it frees (`blockers`; found by the property test with victims that take time to stop:
   started at once, those jobs ran beside the victim, on its GPUs, during its grace). While one
   does, the job waits out of the cycle (a `VictimWait`, which keeps where the core bound it),
   until they all have stopped (`after_victims` gives None), or until it has waited the grace
   period of the slowest victim still stopping plus the driver's `victim_wait_s`: a victim
   that never stops must not block it for ever.
3. When the wait is over the job starts where the core bound it, at once, if its tasks fit
   what is free then (`resumed_tasks`; waits that end together are taken longest-waiting
   first, `resume_order`); otherwise (a victim outlived the wait, the room was taken) a later
   cycle places it afresh. Placed afresh every time, the job competed for the room its victims
   had just freed with those victims, requeued at that instant, and a cycle could give the
   room back to a victim and evict another for the job, over and over (found when the
   simulator's victims that stop at once took a step to stop, as the service's do; under
   `las` with two queues, whose allocate interleaves queues where preemption ranks by order,
   two victims took turns for ever).
4. What a victim frees while the job waits for others is kept for that job (`keep_freed`),
   held in the ledger under an id of its own (`kept_id`), as a terminating view: no cycle
   gives it to another job, the victim itself included, and none takes it as a victim (the
   nominated-node rule of Kubernetes' preemption). It is given back when the wait ends
   (`release_kept`), just before the job starts or a cycle places it afresh. Without it a victim
   requeued before the others had stopped could be placed again where it was, and preempted a
   second time once the job was back in the cycle. Both the waits (rule 3) and what is kept
   are judged once every exit of an instant is in (the service: of a step), so the order in
   which the exits come decides nothing: judged exit by exit, what the first freed was kept
   for a job whose wait went on only until the second, though another job's wait, ended by
   then, had been bound there (found by the random cases).
   The ledger alone holds what is kept: after a restart of the service, a wait that goes on
   keeps what of its bound tasks is free then (`keep_free_of_bound`).
5. Played stops (the simulator; a virtual executor in tests): a victim's tasks exit
   `stop_s` after SIGTERM, or when its grace runs out if that comes first (`played_stop_s`).
   With `stop_s` 0 (the simulator's default) they exit at the instant they are preempted,
   but after the cycle that preempted them, as the service sees an exit only in a step after
   the one that signalled it: the binds after them wait that long, then start (rule 3), and
   the victims, requeued, have a cycle at that instant, as in the service.

Pure: every time is given; nothing here reads a clock or knows a driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from aisched.core.decisions import TaskBinding
from aisched.core.snapshot import RunningJob
from aisched.lifecycle.attempts import Stop
from aisched.lifecycle.holdings import Holdings
from aisched.model.job import Job


@dataclass(frozen=True, slots=True)
class VictimWait:
    """A job waiting out of the cycle for `victims` to stop, since `since`; `tasks`: where
    the core bound it (empty when not known: it is placed afresh)."""

    victims: frozenset[str]
    since: float
    tasks: tuple[TaskBinding, ...] = ()


def kill_at(grace_period_s: float, stopped_at: float) -> float:
    """When a task sent SIGTERM at `stopped_at` is killed if it has not exited."""
    return stopped_at + grace_period_s


def played_stop_s(grace_period_s: float, stop_s: float) -> float:
    """How long a played task takes to exit after SIGTERM: `stop_s`, or its whole grace
    when that is shorter (it is killed then)."""
    return max(min(stop_s, grace_period_s), 0.0)


def wait_for(
    victims: Iterable[str],
    still_stopping: Callable[[str], bool],
    now: float,
    tasks: tuple[TaskBinding, ...] = (),
) -> VictimWait | None:
    """A bind to `tasks` after `victims` decided at `now`: None when it may go ahead now (none
    of them holds its resources any more), else the wait it starts."""
    still = frozenset(v for v in victims if still_stopping(v))
    return VictimWait(still, now, tasks) if still else None


def blockers(
    tasks: Sequence[TaskBinding], held: Holdings, still_stopping: Callable[[str], bool]
) -> frozenset[str]:
    """The jobs still stopping that hold what `tasks` need: none when the tasks fit what is
    free now; else those with tasks on the nodes where they do not."""
    short = held.short_nodes(tasks)
    if not short:
        return frozenset()
    return frozenset(j for j in held.holders_on(short) if still_stopping(j))


# What a job that another waits for is doing, by why it stops: the wait is a preemption's, but
# what it waits for may be any stop of a job whose resources the core placed it in (a shrink
# gives up tasks; a cancelled or timed-out job still holds its own until its tasks exit).
_STOPPING_AS = {
    Stop.PREEMPT: "preempted",
    Stop.SHRINK: "shrinking",
    Stop.CANCEL: "cancelled",
    Stop.TIMEOUT: "timed-out",
    Stop.FAILED: "failed",
    Stop.UNRUNNABLE: "failed",
    Stop.LOGS: "failed",
    Stop.REQUEUE: "requeued",
}


def waiting_reason(victims: Mapping[str, Stop | None]) -> str:
    """A waiting job's reason, each job it waits for named by why it stops (None: it is no
    longer stopping): `waiting for preempted job(s) 3, 4 and shrinking job(s) 7 to stop`."""
    groups: dict[str, list[str]] = {}
    # Ids are numbers written out: as text, job 10 came before job 2.
    for job_id in sorted(victims, key=lambda j: (len(j), j)):
        stop = victims[job_id]
        what = "stopping" if stop is None else _STOPPING_AS.get(stop, "stopping")
        groups.setdefault(what, []).append(job_id)
    named = [f"{what} job(s) {', '.join(ids)}" for what, ids in groups.items()]
    return f"waiting for {' and '.join(named)} to stop"


def wait_limit_s(graces_s: Iterable[float], victim_wait_s: float) -> float:
    """How long a job waits for victims with these grace periods before it gives up."""
    return max(graces_s, default=0.0) + victim_wait_s


def after_victims(
    wait: VictimWait,
    still_stopping: Callable[[str], bool],
    grace_of: Callable[[str], float],
    now: float,
    victim_wait_s: float,
) -> VictimWait | None:
    """The wait as it stands at `now`: None when it is over (every victim stopped, or it has
    waited past its limit), else the wait on the victims still stopping."""
    still = frozenset(v for v in wait.victims if still_stopping(v))
    if not still:
        return None
    if now - wait.since > wait_limit_s((grace_of(v) for v in still), victim_wait_s):
        return None
    return wait if still == wait.victims else VictimWait(still, wait.since, wait.tasks)


def resume_order(waits: Mapping[str, VictimWait]) -> list[str]:
    """The jobs whose waits ended together, in the order they start (rule 3): the one that
    waited longest first (ties: the smaller id), as `keep_freed` chooses."""
    return sorted(waits, key=lambda j: (waits[j].since, len(j), j))


def resumed_tasks(wait: VictimWait, held: Holdings) -> tuple[TaskBinding, ...] | None:
    """A wait is over (and what was kept for the job given back, `release_kept`): the tasks
    it starts on now, where the core bound it, when they all fit what is free; None when it is
    placed afresh by a later cycle."""
    if not wait.tasks or held.short_nodes(wait.tasks):
        return None
    return wait.tasks


def kept_id(job_id: str) -> str:
    """The ledger's id for what is kept for waiting job `job_id` (no job id has a `~`)."""
    return f"{job_id}~kept"


def keep_freed(
    held: Holdings,
    victim: str,
    freed: Sequence[TaskBinding],
    waits: Mapping[str, VictimWait],
    jobs: Callable[[str], Job],
    now: float,
) -> str | None:
    """`victim` has stopped and given back `freed`: keep it for the job that waited for it
    longest (ties: the smaller id) among `waits`, the waits that go on after this stop, as
    they stood before it (so they name `victim`); returns that job's id (None: no wait goes
    on, and what it freed is free). `jobs` gives a waiting job by id."""
    waiting = [j for j, w in waits.items() if victim in w.victims]
    if not waiting or not freed:
        return None
    job_id = min(waiting, key=lambda j: (waits[j].since, len(j), j))
    key = kept_id(job_id)
    tasks = tuple(freed)
    if held.holds(key):
        tasks = held.give(key).tasks + tasks
    job = jobs(job_id)
    held.take(RunningJob(replace(job, id=key), tasks, now, terminating=True))
    return job_id


def keep_free_of_bound(held: Holdings, job: Job, wait: VictimWait, now: float) -> None:
    """After a restart, which forgot what was kept (it lives in the ledger only): keep for
    the waiting `job` what of its bound tasks (`wait.tasks`) is free now, which its victims
    that had stopped freed (rule 4). Without it the first cycle gave that room to another job,
    a requeued victim too, and the job evicted it again once its last victim had stopped."""
    index, free = held.arrays.index, held.free
    left: dict[str, list[int]] = {}  # node -> [cpu, mem, rdma] not yet kept
    taken: set[tuple[str, int]] = set()  # GPUs kept already
    parts: list[TaskBinding] = []
    for t in wait.tasks:
        i = index.get(t.node)
        if i is None:
            continue
        room = left.setdefault(t.node, [int(free.cpu[i]), int(free.mem[i]), int(free.rdma[i])])
        per_gpu_mem = t.gpu_mem_mib // len(t.gpus) if t.gpus else 0
        gpus = tuple(
            g
            for g in t.gpus
            if (t.node, g) not in taken
            and free.gpu_milli[i, g] >= t.gpu_milli
            and free.gpu_mem[i, g] >= per_gpu_mem
        )
        part = replace(
            t,
            gpus=gpus,
            gpu_mem_mib=per_gpu_mem * len(gpus),
            milli_cpu=min(t.milli_cpu, max(room[0], 0)),
            mem_mib=min(t.mem_mib, max(room[1], 0)),
            rdma=min(t.rdma, max(room[2], 0)),
        )
        room[0] -= part.milli_cpu
        room[1] -= part.mem_mib
        room[2] -= part.rdma
        taken.update((t.node, g) for g in gpus)
        if gpus or part.milli_cpu or part.mem_mib or part.rdma:
            parts.append(part)
    if parts:
        held.take(RunningJob(replace(job, id=kept_id(job.id)), tuple(parts), now, terminating=True))


def release_kept(held: Holdings, job_id: str) -> None:
    """The wait of `job_id` is over: give back what was kept for it (if anything)."""
    key = kept_id(job_id)
    if held.holds(key):
        held.give(key)
