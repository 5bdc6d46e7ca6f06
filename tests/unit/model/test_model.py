"""Model value types: the job state machine, resource arithmetic, job and queue validation."""

from __future__ import annotations

import pytest

from aisched.model.job import Job, TaskGroup
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources, describe_mib
from aisched.model.states import (
    ALLOWED_TRANSITIONS,
    InvalidTransition,
    JobState,
    can_transition,
    check_transition,
)

LEGAL = [
    (JobState.PENDING, JobState.RUNNING),
    (JobState.PENDING, JobState.CANCELLED),
    (JobState.RUNNING, JobState.SUCCEEDED),
    (JobState.RUNNING, JobState.FAILED),
    (JobState.RUNNING, JobState.PREEMPTED),
    (JobState.RUNNING, JobState.PENDING),
    (JobState.PREEMPTED, JobState.PENDING),
]
ILLEGAL = [
    (JobState.SUCCEEDED, JobState.RUNNING),
    (JobState.FAILED, JobState.PENDING),
    (JobState.CANCELLED, JobState.RUNNING),
    (JobState.PENDING, JobState.SUCCEEDED),
    (JobState.PREEMPTED, JobState.RUNNING),
]


@pytest.mark.parametrize(("src", "dst"), LEGAL)
def test_legal_transitions(src: JobState, dst: JobState) -> None:
    assert can_transition(src, dst)
    assert check_transition("j", src, dst) == dst


@pytest.mark.parametrize(("src", "dst"), ILLEGAL)
def test_illegal_transitions_raise_with_the_job_named(src: JobState, dst: JobState) -> None:
    assert not can_transition(src, dst)
    with pytest.raises(InvalidTransition, match=f"job j: cannot go from {src} to {dst}"):
        check_transition("j", src, dst)


def test_terminal_states_lead_nowhere() -> None:
    for state in JobState:
        assert (ALLOWED_TRANSITIONS[state] == frozenset()) == state.is_terminal


def test_resource_arithmetic() -> None:
    a = Resources(milli_cpu=1000, mem_mib=512, gpu=1, extended=(("nic", 1),))
    b = Resources(milli_cpu=500, gpu_milli=250)
    assert a.plus(b) == Resources(1500, 512, 1, 250, 0, (("nic", 1),))
    assert a.plus(b).minus(b) == a
    assert a.times(3).gpu == 3
    assert b.fits_in(Resources(milli_cpu=500, gpu_milli=1000))
    assert not a.fits_in(Resources(milli_cpu=1000, mem_mib=512, gpu=1))  # lacks the nic
    assert Resources(gpu=2, gpu_milli=500).gpu_equivalent_milli == 2500
    wide = Resources(gpu=8, milli_cpu=24000, mem_mib=98304)
    assert wide.describe() == "8 GPU, 24 CPU, 96 GiB memory"


def test_sizes_are_described_without_an_exponent_and_exactly() -> None:
    # 1 PiB of GPU memory read `1.04858e+06 GiB`; 500 MiB read `0.488281 GiB`.
    gib, tib, pib = 1024, 1024**2, 1024**3
    sizes = [500, 512, 1280, 1500, 80 * gib, 1023 * gib, tib, 1536 * gib, pib, 2 * pib, 1024 * pib]
    assert [describe_mib(n) for n in sizes] == [
        "500 MiB",
        "512 MiB",
        "1.25 GiB",
        "1500 MiB",
        "80 GiB",
        "1023 GiB",
        "1 TiB",
        "1.5 TiB",
        "1 PiB",
        "2 PiB",
        "1024 PiB",
    ]
    big = Resources(gpu=1, gpu_mem_mib=pib, milli_cpu=1000, mem_mib=2 * tib)
    assert big.describe() == "1 GPU, 1 PiB GPU memory, 1 CPU, 2 TiB memory"
    small = Resources(gpu=1, gpu_mem_mib=500, milli_cpu=1000, mem_mib=500)
    assert small.describe() == "1 GPU, 500 MiB GPU memory, 1 CPU, 500 MiB memory"


def test_job_validation_names_the_job() -> None:
    with pytest.raises(ValueError, match="job j: needs at least one task group"):
        Job(id="j", groups=())
    with pytest.raises(ValueError, match=r"job j: min_available 5 must be in 1\.\.4"):
        Job(id="j", groups=(TaskGroup("w", 4, Resources(gpu=1)),), min_available=5)


def test_job_totals_and_shape() -> None:
    g = TaskGroup("w", 4, Resources(milli_cpu=1000, gpu=2))
    a, b = Job(id="a", groups=(g,)), Job(id="b", groups=(g,), priority=5)
    assert a.total_request == Resources(milli_cpu=4000, gpu=8)
    assert a.num_gpus == 8.0 and a.gang_min == 4
    assert a.shape_id == b.shape_id  # priority does not change where a job fits
    assert a.shape_id != Job(id="c", groups=(g,), gpu_models=("A100",)).shape_id


def test_queue_tree_paths_and_errors() -> None:
    tree = QueueTree((Queue("org"), Queue("team", parent="org"), Queue("default")))
    assert tree.path("team") == ("org", "team")
    assert [q.name for q in tree.children("org")] == ["team"]
    with pytest.raises(ValueError, match="parent 'nope' is not a queue"):
        QueueTree((Queue("a", parent="nope"),))
    with pytest.raises(ValueError, match="cycle"):
        QueueTree((Queue("a", parent="b"), Queue("b", parent="a")))
    with pytest.raises(ValueError, match="reserved"):
        QueueTree((Queue("root"),))


def test_a_node_role_must_match_its_gpus() -> None:
    from aisched.model.cluster import GPU, Node

    assert Node("c", 1000, 1024, role="cpu").role == "cpu"
    assert Node("g", 1000, 1024, gpus=(GPU(0),), role="gpu").role == "gpu"
    with pytest.raises(ValueError, match="role cpu but it has 1 GPUs"):
        Node("x", 1000, 1024, gpus=(GPU(0),), role="cpu")
    with pytest.raises(ValueError, match="role gpu but it has no GPUs"):
        Node("y", 1000, 1024, role="gpu")
    with pytest.raises(ValueError, match="role 'disk'"):
        Node("z", 1000, 1024, role="disk")
