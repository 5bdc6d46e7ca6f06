"""A waiting reason worked out once for a shape is read by every job of that shape, and jobs of
one shape may be of different users and name their task groups differently: each job's reason
names its own task group, never the group of the job it was first worked out for (it named
another user's group, on the service as in the simulator, under every preset)."""

from __future__ import annotations

import pytest

from aisched.core.cycle import run_cycle
from aisched.core.decisions import TaskBinding
from aisched.core.policy import PRESETS, preset
from aisched.core.snapshot import RunningJob, snapshot_of
from aisched.model.job import Job
from aisched.testing import cluster, job, node, pending

CLUSTER = cluster(node("n0").gpus(2).cpus(16).mem_gib(64))
# Holds both GPUs for an hour: the jobs below wait behind it, and may reserve its nodes.
BLOCKER = RunningJob(
    job("blocker").task(gpu=2, name="main").build(),
    (TaskBinding("main", 0, "n0", (0, 1), 1000),),
    0.0,
    expected_end_s=3600.0,
)
USERS = ("alice", "bob")


def _queue(gpus: int) -> list[Job]:
    """Jobs of one shape, of two users who name their task group each their own way."""
    return [
        job(f"{user}-{i}")
        .user(user)
        .submitted(float(i))
        .task(gpu=gpus, name=f"{user}-group")
        .estimate(600.0)
        .build()
        for i in range(4)
        for user in USERS
    ]


def _named_groups(reason: str) -> set[str]:
    return {f"{user}-group" for user in USERS if f"'{user}-group'" in reason}


@pytest.mark.parametrize("policy", sorted(PRESETS))
@pytest.mark.parametrize("gpus", [1, 4], ids=["waits", "never-fits"])
def test_each_job_reads_its_own_task_group_in_a_shared_reason(policy: str, gpus: int) -> None:
    jobs = _queue(gpus)
    result = run_cycle(snapshot_of(CLUSTER, (BLOCKER,)), pending(*jobs), preset(policy), 0.0)
    named: set[str] = set()
    for j in jobs:
        reason = result.diagnostics[j.id].reason
        groups = _named_groups(reason)
        assert groups <= {j.groups[0].name}, f"{j.id} ({j.user}): {reason}"
        named |= groups
    # Under a strict order all but the first job wait behind it, for a reason naming none.
    if not (gpus == 1 and policy == "fifo-strict"):
        assert len(named) == len(USERS), "not every user's jobs were told of their group"
