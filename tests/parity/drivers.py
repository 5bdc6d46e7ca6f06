"""The parity test's two drivers of one trace: the simulator and the live service.

`sim_log` replays a `Case` through `sim.engine.simulate`; `live_log` through the service's real
`Scheduler` over a real SQLite store, with a virtual executor (`virtual.py`, which plays task
ends by the simulator's rules) on a virtual clock that it moves from one event to the next.
Both give the decision log in one shape (`Entry`: binds with the nodes they bound, preemptions,
shrinks, grows, retries, ends, each with its time), sorted, so two logs compare with `==`.

The live log is read back from what the service stored (its event log and task rows), not from
anything the loop keeps for the test; a job that can never fit is refused at its submission and
stored nowhere, so its entry is the refusal the submission got (a case puts such jobs last: a
refused job takes no id). Used by the hand-written cases (`test_parity.py`) and the random ones
(`test_random_parity.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

from virtual import Plan, VirtualExecutor

from aisched.core.policy import preset
from aisched.lifecycle.work import checkpoint_interval_s
from aisched.model.cluster import Cluster, Node
from aisched.model.job import Job
from aisched.model.queue import QueueTree
from aisched.service.loop import LoopConfig, Rejected, Scheduler
from aisched.sim.engine import SimConfig, SimResult, simulate
from aisched.sim.traces import Trace, TraceJob
from aisched.store.db import Row, Store
from aisched.testing import job, node

# (time_s, job id, kind, nodes): one decision or end.
Entry = tuple[float, str, str, tuple[str, ...]]

GROW_AFTER_S = 60.0
CHECKPOINT_S = 50.0
RESTART_COST_S = 5.0
HORIZON_S = 100_000.0


@dataclass(frozen=True)
class Case:
    name: str
    nodes: tuple[Node, ...]
    # (job, submit time, runtime with every task, played failures); ids are "1", "2", ... in
    # submission order, the ids the service gives them.
    jobs: tuple[tuple[Job, float, float, tuple[float, ...]], ...]
    policy: str = "default"
    # The simulator's whole log, sorted, where a case spells it out.
    want: tuple[Entry, ...] = ()
    # How long a stopped task takes to exit (its grace period caps it), in both drivers.
    stop_s: float = 0.0
    queues: QueueTree = QueueTree()


def gpus(name: str, n: int) -> Node:
    return node(name).gpus(n).cpus(32).mem_gib(128).build()


def trace_of(case: Case) -> Trace:
    jobs = []
    for i, (j, at, duration, fail_after) in enumerate(case.jobs):
        built = replace(j, id=str(i + 1), submit_time_s=at)
        jobs.append(TraceJob(built, duration, fail_after_s=fail_after))
    return Trace(case.name, tuple(jobs))


def sim_log(case: Case) -> list[Entry]:
    config = SimConfig(
        checkpoint_interval_s=CHECKPOINT_S,
        restart_cost_s=RESTART_COST_S,
        validate=True,
        elastic_grow_after_s=GROW_AFTER_S,
        max_backoff_s=60.0,
        victim_stop_s=case.stop_s,
    )
    result: SimResult = simulate(
        trace_of(case), Cluster(case.nodes), preset(case.policy), config, queues=case.queues
    )
    out: list[Entry] = []
    for t, kind, job_id, detail in result.log:
        if kind == "bind":
            out.append((t, job_id, "bind", tuple(sorted(detail))))
        elif kind == "shrink":
            out.append((t, job_id, "shrink", tuple(sorted(detail[2:]))))
        elif kind in ("preempt", "grow", "retry", "fail", "finish", "cancel", "service", "reject"):
            out.append((t, job_id, kind, ()))
    return sorted(out)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def live_log(case: Case, home: Path) -> list[Entry]:
    trace = trace_of(case)
    clock = Clock()
    plans = {
        tj.job.name: Plan(
            tj.duration_s,
            tj.job.num_tasks,
            tj.job.elastic,
            checkpoint_interval_s(tj.job, CHECKPOINT_S),
            tj.fail_after_s,
        )
        for tj in trace.jobs
    }
    replica = Plan(math.inf, 1, False, CHECKPOINT_S)
    fx = VirtualExecutor(
        case.nodes, clock, plans, RESTART_COST_S, stop_s=case.stop_s, replica_plan=replica
    )
    store = Store.sqlite(home / "state.db")
    config = LoopConfig(
        data_dir=home,
        # Cycles only when something changed, as in the simulator.
        cycle_interval_s=math.inf,
        max_backoff_s=60.0,
        tick_s=math.inf,
        cycle_gap_factor=0,
        elastic_grow_after_s=GROW_AFTER_S,
        # The drivers' default for jobs that name no interval: the same here, by one rule.
        checkpoint_interval_s=CHECKPOINT_S,
        validate=True,
    )
    sched = Scheduler(store, fx, preset(case.policy), case.queues, config, clock=clock)
    sched.recover()
    arrivals = sorted(trace.jobs, key=lambda tj: tj.job.submit_time_s)
    refused: list[Entry] = []
    i = 0
    while clock.t <= HORIZON_S:
        # Every arrival of this instant is queued, then one step takes them all in before its
        # cycle, as the simulator's arrivals all come before the cycle of their instant.
        queued: list[tuple[TraceJob, Future[Row] | Future[list[Row]]]] = []
        while i < len(arrivals) and arrivals[i].job.submit_time_s <= clock.t:
            tj = arrivals[i]
            i += 1
            fx.names[tj.job.id] = tj.job.name
            bare = replace(tj.job, id="", submit_time_s=0.0)
            if bare.depends_on:  # a pipeline's step, naming earlier jobs by id
                queued.append((tj, sched.submit_all(((bare, "native", ()),))))
            else:
                queued.append((tj, sched.submit(bare)))
        if queued:
            sched.step()
        for tj, fut in queued:
            try:
                got = fut.result(0)
            except Rejected:
                refused.append((clock.t, tj.job.id, "reject", ()))
                assert tj is arrivals[-1], "a refused job takes no id: put it last"
                continue
            row = got[0] if isinstance(got, list) else got
            assert row["id"] == tj.job.id
        delay = settle(sched, store)
        if i == len(arrivals) and not sched.jobs:
            break
        nxt = min(
            arrivals[i].job.submit_time_s if i < len(arrivals) else math.inf,
            fx.next_end_s(),
            clock.t + delay,
        )
        assert nxt > clock.t, f"t={clock.t}: the live run stalled"
        clock.t = nxt
    return sorted(read_log(store) + refused)


def settle(sched: Scheduler, store: Store) -> float:
    """Step at one instant until a step changes nothing stored; the last step's delay."""
    last = -1
    for _ in range(50):
        delay = sched.step()
        with store.read() as tx:
            seen = sum(len(tx.events_of(str(k))) for k in range(1, tx.max_seq() + 1))
        if seen == last:
            return delay
        last = seen
    raise AssertionError("the loop never settled")


_ATTEMPT = re.compile(r"attempt (\d+):")


def read_log(store: Store) -> list[Entry]:
    out: list[Entry] = []
    with store.read() as tx:
        for k in range(1, tx.max_seq() + 1):
            job_id = str(k)
            # A shrink is logged when it is decided (as the simulator logs it), with the nodes
            # of the attempt that restarts on the kept tasks once the others have stopped.
            shrinking: float | None = None
            shrunk = False
            for e in tx.events_of(job_id):
                kind, t = e["kind"], e["time"]
                if kind == "started" and e["message"] == "service started":
                    out.append((t, job_id, "service", ()))
                elif kind == "placed":
                    m = _ATTEMPT.match(e["message"])
                    assert m is not None, e["message"]
                    tasks = tx.tasks_of(job_id, int(m.group(1)))
                    nodes = tuple(sorted(r["node"] for r in tasks))
                    if shrunk and shrinking is not None:
                        out.append((shrinking, job_id, "shrink", nodes))
                    else:
                        out.append((t, job_id, "bind", nodes))
                    shrunk, shrinking = False, None
                elif kind == "shrinking":
                    shrinking = t
                elif kind == "shrunk":
                    shrunk = True
                elif kind in ("preempting", "growing", "retrying"):
                    word = {"preempting": "preempt", "growing": "grow", "retrying": "retry"}
                    out.append((t, job_id, word[kind], ()))
                elif kind == "succeeded":
                    out.append((t, job_id, "finish", ()))
                elif kind == "failed":
                    out.append((t, job_id, "fail", ()))
                elif kind == "cancelled":
                    out.append((t, job_id, "cancel", ()))
    return sorted(out)


def gang(name: str, tasks: int, gpu: int, priority: int = 0) -> Job:
    return job(name).name(name).task(tasks, gpu=gpu).priority(priority).build()


def elastic(name: str, tasks: int, least: int, gpu: int = 1) -> Job:
    return job(name).name(name).task(tasks, gpu=gpu).min_available(least).elastic().build()


def graceful(j: Job, grace_s: float) -> Job:
    return replace(j, grace_period_s=grace_s)


def show(entries: Sequence[Entry]) -> str:
    return "\n".join(map(str, entries))
