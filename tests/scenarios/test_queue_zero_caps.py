"""A limit of 0 on a resource a queue's `limit` (or `user_limit`) names: none of it may be used
there, while the resources it does not name stay free. A 0 used to read as "not governed", so
`limit: {gpus: 0}` let a queue take the whole cluster's GPUs."""

from __future__ import annotations

import pytest
from helpers import QueueCase, check_queue_case, running

from aisched.core.cycle import never_runs, run_cycle
from aisched.core.policy import preset
from aisched.core.queues import tasks_to_regrow
from aisched.core.snapshot import snapshot_of
from aisched.core.status import StatusCode
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Dim, Resources
from aisched.testing import cluster, job, node

GPU_ONLY = frozenset({Dim.GPU})
QUEUES = QueueTree(
    (
        Queue("default"),
        # `limit: {gpus: 0}`: no GPU, CPUs and memory not capped.
        Queue("cpu-only", limit=Resources(), limit_named=GPU_ONLY),
        Queue("inside", parent="cpu-only"),
        # `limit: {cpus: 0}`: no CPU at all.
        Queue("no-cpu", limit=Resources(), limit_named=frozenset({Dim.CPU})),
        # `user_limit: {gpus: 0}`: no user may hold a GPU there.
        Queue("users-no-gpu", user_limit=Resources(), user_limit_named=GPU_ONLY),
        # `limit: {gpus: 2}`, as before: CPUs and memory not capped.
        Queue("two-gpus", limit=Resources(gpu=2), limit_named=GPU_ONLY),
    )
)


CASES = [
    QueueCase(
        "a GPU job in a queue limited to 0 GPUs never starts, on an idle cluster",
        [job("g").task(gpu=2).queue("cpu-only")],
        [],
        {"g": StatusCode.NEVER_FITS},
    ),
    QueueCase(
        "a CPU job in that queue starts: its CPUs and memory are not capped",
        [job("c").task(cpu=32, mem_gib=64).queue("cpu-only")],
        [("bind", "c", "n1:")],
        {"c": StatusCode.PLACED},
    ),
    QueueCase(
        "a queue under one limited to 0 GPUs gets none either",
        [job("g").task(gpu=1).queue("inside")],
        [],
        {"g": StatusCode.NEVER_FITS},
    ),
    QueueCase(
        "an elastic GPU job there is not cut to no task: it never starts",
        [job("e").task(4, gpu=1).min_available(1).elastic().queue("cpu-only")],
        [],
        {"e": StatusCode.NEVER_FITS},
    ),
    QueueCase(
        "a queue limited to 0 CPUs runs nothing that asks for a CPU",
        [job("c").task(cpu=1).queue("no-cpu")],
        [],
        {"c": StatusCode.NEVER_FITS},
    ),
    QueueCase(
        "a per-user limit of 0 GPUs keeps every user's GPU job out",
        [job("g").task(gpu=1).queue("users-no-gpu").user("alice")],
        [],
        {"g": StatusCode.NEVER_FITS},
    ),
    QueueCase(
        "a limit naming GPUs alone leaves CPUs free, as before",
        [job("c").task(gpu=2, cpu=60).queue("two-gpus")],
        [("bind", "c", "n1:0,1")],
        {"c": StatusCode.PLACED},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_zero_cap_scenarios(case: QueueCase) -> None:
    check_queue_case(case, QUEUES)


@pytest.mark.parametrize(
    ("queue", "reason"),
    [
        ("cpu-only", "needs more GPU than queue cpu-only's limit (0: it may use no GPU)"),
        ("inside", "needs more GPU than queue cpu-only's limit (0: it may use no GPU)"),
        (
            "users-no-gpu",
            "needs more GPU than queue users-no-gpu's per-user limit (0: it may use no GPU)",
        ),
    ],
)
def test_the_refusal_says_the_queue_may_use_none(queue: str, reason: str) -> None:
    snap = snapshot_of(cluster(node("n1").gpus(8)), (), QUEUES)
    assert never_runs(snap, preset("fifo"), job("g").task(gpu=1).queue(queue).build()) == reason


def test_a_job_running_there_from_before_is_not_regrown() -> None:
    # Started before the limit was set (a restart with a new config): held, never grown.
    el = job("e").task(4, gpu=1).min_available(1).elastic().queue("cpu-only").build()
    mine = running(el, ("n1", (0,)))
    snap = snapshot_of(cluster(node("n1").gpus(8)), [mine], QUEUES)
    assert tasks_to_regrow(snap, mine) == 0


def test_a_cap_built_in_code_governs_what_is_above_0_in_it() -> None:
    # Without `limit_named` (a queue built in code, not read from a config), as before.
    assert Queue("q", limit=Resources(gpu=2)).limit_caps() == GPU_ONLY
    assert Queue("q", limit=Resources()).limit_caps() == frozenset()
    assert Queue("q").limit_caps() == frozenset()
    snap = snapshot_of(
        cluster(node("n1").gpus(8)), (), QueueTree((Queue("default", limit=Resources()),))
    )
    result = run_cycle(snap, [job("g").task(gpu=8).pending()], preset("fifo"), 0.0)
    assert [d.job_id for d in result.decisions] == ["g"]
