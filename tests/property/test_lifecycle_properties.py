"""Property tests of the lifecycle (`aisched.lifecycle`) in validate mode.

1. Random traces (gangs, priorities, elastic jobs, played failures, victims that take their
   time to stop within a grace period, jobs that can never fit) through the simulator with
   `validate=True`, which checks the lifecycle's ledger after every cycle (free capacity equals
   capacity less the held bindings, usage per (queue, user) equals the held views' sum, no job
   both pending and running). From the decision log: no job is bound while it is running (no
   task runs twice), every job ends at most once, and nothing is left held at the end.
2. Random take/give sequences straight on `Holdings`, against a plain model of who holds what.
3. `after_attempt` only ever leads to moves the transition table allows.
4. A grow's prediction (`queue_takes_back`) is what the next cycle binds of the job once it has
   given its tasks back, with capacity to spare: queue limits, per-user limits, guarantees and
   unevictable work all drawn.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aisched.core.cycle import run_cycle
from aisched.core.decisions import Bind, TaskBinding
from aisched.core.policy import preset
from aisched.core.snapshot import PendingJob, RunningJob, build_arrays
from aisched.lifecycle.attempts import Finish, Requeue, RestartOn, Stop, after_attempt
from aisched.lifecycle.elastic import Running, queue_takes_back
from aisched.lifecycle.holdings import HoldingError, Holdings
from aisched.lifecycle.states import move
from aisched.model.cluster import Cluster
from aisched.model.job import Job, RestartPolicy
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources
from aisched.model.states import InvalidTransition, JobState
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.traces import Trace, TraceJob
from aisched.testing import job, node

CLUSTER = Cluster((node("n1").gpus(4).build(), node("n2").gpus(4).build()))


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    n = draw(st.integers(1, 8))
    jobs = []
    t = 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 5.0, 30.0, 120.0]))
        tasks = draw(st.integers(1, 3))
        gpu = draw(st.sampled_from([1, 2, 3, 4, 5]))  # 5: never fits a 4-GPU node
        b = job(str(i + 1)).task(tasks, gpu=gpu).priority(draw(st.integers(0, 3)))
        if tasks > 1 and draw(st.booleans()):
            b = b.min_available(1).elastic()
        built = replace(
            b.build(),
            submit_time_s=t,
            checkpoint_interval_s=draw(st.sampled_from([20.0, 100.0, float("inf")])),
            max_retries=draw(st.integers(0, 2)),
            grace_period_s=draw(st.sampled_from([0.0, 4.0, 30.0])),
        )
        fails = tuple(draw(st.lists(st.sampled_from([5.0, 50.0]), max_size=3)))
        jobs.append(TraceJob(built, draw(st.sampled_from([10.0, 60.0, 300.0])), fail_after_s=fails))
    return Trace("random", tuple(jobs))


_ENDS = ("preempt", "grow", "retry", "fail", "finish", "reject")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=traces(),
    policy=st.sampled_from(["default", "priority", "fifo"]),
    stop_s=st.sampled_from([0.0, 10.0]),
)
def test_random_traces_keep_the_lifecycle_invariants(
    trace: Trace, policy: str, stop_s: float
) -> None:
    config = SimConfig(
        checkpoint_interval_s=100.0,
        restart_cost_s=5.0,
        validate=True,
        elastic_grow_after_s=30.0,
        victim_stop_s=stop_s,
    )
    result = simulate(trace, CLUSTER, preset(policy), config, queues=QueueTree())
    running: set[str] = set()
    ended: set[str] = set()
    for t, kind, job_id, _ in result.log:
        assert job_id not in ended, f"t={t}: {kind} of {job_id} after it ended"
        if kind == "bind":
            assert job_id not in running, f"t={t}: {job_id} bound while running"
            running.add(job_id)
        elif kind == "shrink":
            assert job_id in running, f"t={t}: shrink of {job_id}, which is not running"
        elif kind in _ENDS:
            running.discard(job_id)
            if kind in ("finish", "fail", "reject"):
                ended.add(job_id)
    # Every job ended (the trace is finite and nothing holds forever).
    assert ended == {tj.job.id for tj in trace.jobs}
    assert running == set()
    for rec in result.jobs:
        assert (rec.finish_s is not None) + (rec.failed is not None) + (
            rec.rejected is not None
        ) == 1


def _view(job_id: str, tasks: tuple[TaskBinding, ...], user: str) -> RunningJob:
    j = job(job_id).task(len(tasks), gpu=1).user(user).build()
    return RunningJob(j, tasks, 0.0)


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["take", "give"]),
            st.integers(0, 5),
            st.integers(1, 2),
            st.sampled_from(["n1", "n2"]),
            st.sampled_from(["ann", "bob"]),
        ),
        max_size=30,
    )
)
def test_holdings_match_a_plain_model(ops: list[tuple[str, int, int, str, str]]) -> None:
    held = Holdings(build_arrays(CLUSTER))
    model: dict[str, int] = {}  # job -> GPUs held
    free_gpus = {"n1": 4, "n2": 4}
    where: dict[str, str] = {}
    for op, k, n, node_name, user in ops:
        job_id = f"j{k}"
        if op == "take":
            if job_id in model:
                with pytest.raises(HoldingError):
                    held.take(_view(job_id, (TaskBinding("g0", 0, node_name, (0,), 1000),), user))
                continue
            if free_gpus[node_name] < n:
                continue
            start = 4 - free_gpus[node_name]
            tasks = tuple(
                TaskBinding("g0", i, node_name, (start + i,), 1000, milli_cpu=1000, mem_mib=1024)
                for i in range(n)
            )
            held.take(_view(job_id, tasks, user))
            model[job_id] = n
            where[job_id] = node_name
            free_gpus[node_name] -= n
        else:
            if job_id not in model:
                with pytest.raises(HoldingError):
                    held.give(job_id)
                continue
            # Only the last taker on a node gives back, so GPU indices stay contiguous.
            last = [j for j in model if where[j] == where[job_id]][-1]
            if last != job_id:
                continue
            held.give(job_id)
            free_gpus[where[job_id]] += model.pop(job_id)
            del where[job_id]
        assert held.problems() == []
        assert sorted(held.views) == sorted(model)
        running = held.running()
        assert [v.job.id for v in running] == list(model)  # in the order they were taken
        assert held.running() is running  # one tuple until the views change
        for node_name in ("n1", "n2"):
            on = {j for j, n in where.items() if n == node_name}
            assert held.holders_on(frozenset([node_name])) == on
    a = held.arrays
    assert [int(a.num_gpus[i]) - int(held.free.whole[i]) for i in range(2)] == [
        4 - free_gpus["n1"],
        4 - free_gpus["n2"],
    ]


@settings(max_examples=200, deadline=None)
@given(
    stop=st.sampled_from([None, *Stop]),
    failures=st.integers(0, 5),
    retries=st.integers(0, 3),
    policy=st.sampled_from(list(RestartPolicy)),
    keep=st.booleans(),
)
def test_attempt_ends_only_lead_to_allowed_moves(
    stop: Stop | None, failures: int, retries: int, policy: RestartPolicy, keep: bool
) -> None:
    j: Job = replace(job("j").task(2, gpu=1).build(), max_retries=retries, restart_policy=policy)
    kept = (TaskBinding("g0", 0, "n1", (0,), 1000),) if keep else None
    end = after_attempt(
        j, stop, "why", failures=failures, preemptions=0, now=100.0, max_backoff_s=60.0, keep=kept
    )
    nxt = end.next
    if isinstance(nxt, Finish):
        assert move("j", JobState.RUNNING, nxt.state) == nxt.state
        assert nxt.state.is_terminal
    elif isinstance(nxt, Requeue):
        assert move("j", JobState.RUNNING, JobState.PENDING) == JobState.PENDING
        if nxt.not_before is not None:
            assert 100.0 <= nxt.not_before <= 160.0
    else:
        assert isinstance(nxt, RestartOn) and stop == Stop.SHRINK and nxt.keep == kept
    # A failed task counts a failure, and so does one that could never run (a missing image).
    assert end.failures == failures + (stop in (Stop.FAILED, Stop.UNRUNNABLE))
    # Whatever came next, a terminal state never moves again.
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        with pytest.raises(InvalidTransition):
            move("j", state, JobState.PENDING)


def test_validate_mode_sees_a_ledger_that_drifted() -> None:
    held = Holdings(build_arrays(CLUSTER))
    task = TaskBinding("g0", 0, "n1", (0,), 1000, milli_cpu=1000, mem_mib=1024)
    held.take(_view("a", (task,), "ann"))
    assert held.problems() == []
    held.free.cpu[0] += 500  # capacity given back that no one held
    held.usage[("default", "ann")] = (0.0, 0.0, 0.0)
    assert held.problems() == [
        "free cpu drifted on node n1",
        "usage of queue default user ann drifted: (0.0, 0.0, 0.0) vs (1000.0, 1024.0, 1000.0)",
    ]


@st.composite
def regrowths(draw: st.DrawFn) -> tuple[QueueTree, Holdings, Job]:
    """Queues a (maybe guaranteed) and b (maybe guaranteed, maybe limited) with b1 under it
    (maybe a per-user limit); a few running one-task jobs, evictable or not; and an elastic
    job, evictable or not, running short of tasks, on a 10-GPU node with room for all of it."""
    gpus = 10
    limit = draw(st.sampled_from([None, 3, 6, 10]))
    user_limit = draw(st.sampled_from([None, 2, 4]))
    b_guarantee = draw(st.sampled_from([0, 2, 4]))
    tree = QueueTree(
        (
            Queue("a", guarantee=Resources(gpu=draw(st.sampled_from([0, 2, 4, 6])))),
            Queue(
                "b",
                guarantee=Resources(gpu=b_guarantee),
                # Not below the guarantee, which a tree refuses.
                limit=None if limit is None else Resources(gpu=max(limit, b_guarantee)),
            ),
            Queue(
                "b1",
                parent="b",
                user_limit=None if user_limit is None else Resources(gpu=user_limit),
            ),
        )
    )
    ledger = Holdings(build_arrays(Cluster((node("n1").gpus(gpus).build(),))))
    used = 0
    for i in range(draw(st.integers(0, 4))):
        n = draw(st.integers(1, 3))
        if used + n > gpus - 6:
            break
        b = job(f"r{i}").task(gpu=n).queue(draw(st.sampled_from(["a", "b1"])))
        built = replace(
            b.user(draw(st.sampled_from(["u", "v"]))).build(), preemptible=draw(st.booleans())
        )
        ledger.take(
            RunningJob(
                built, (TaskBinding("g0", 0, "n1", tuple(range(used, used + n)), 1000),), 0.0
            )
        )
        used += n
    tasks = draw(st.integers(2, 6))
    least = draw(st.integers(1, tasks - 1))
    held = draw(st.integers(least, tasks - 1))
    queue = draw(st.sampled_from(["a", "b1"]))
    el = job("e").task(tasks, gpu=1).min_available(least).elastic().queue(queue).user("u").build()
    el = replace(el, preemptible=draw(st.booleans()))
    bindings = tuple(TaskBinding("g0", i, "n1", (used + i,), 1000) for i in range(held))
    ledger.take(RunningJob(el, bindings, 0.0))
    return tree, ledger, el


@settings(max_examples=200, deadline=None)
@given(regrowths())
def test_a_grow_predicts_what_the_next_cycle_takes_back(
    case: tuple[QueueTree, Holdings, Job],
) -> None:
    tree, ledger, el = case
    back = queue_takes_back(tree, ledger, Running(el, len(ledger.views[el.id].tasks), 0.0))
    ledger.give(el.id)
    result = run_cycle(ledger.snapshot(tree), [PendingJob(el)], preset("fifo"), 0.0, validate=True)
    bound = [len(d.tasks) for d in result.decisions if isinstance(d, Bind) and d.job_id == el.id]
    assert bound == ([back] if back else [])
