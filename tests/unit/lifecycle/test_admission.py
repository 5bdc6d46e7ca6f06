"""Refusing a job that can never run, on the cluster at its largest."""

from __future__ import annotations

from aisched.core.policy import preset
from aisched.core.snapshot import FreeState, Snapshot, build_arrays
from aisched.lifecycle.admission import Admission, never_fits_now, refusal
from aisched.lifecycle.attempts import Finish
from aisched.model.cluster import Cluster
from aisched.model.queue import QueueTree
from aisched.model.states import JobState
from aisched.testing import job, node


def empty(*gpus: int) -> Snapshot:
    nodes = [node(f"n{i}").gpus(n).cpus(32).mem_gib(128).build() for i, n in enumerate(gpus)]
    arrays = build_arrays(Cluster(tuple(nodes)))
    return Snapshot(arrays, FreeState.empty(arrays), (), QueueTree())


POLICY = preset("default")
HUGE = job("huge").task(1, gpu=8).build()
WHY = "can never fit this cluster: room for 0 of 1 'g0' tasks (8 GPU, 1 CPU, 1 GiB memory each)"


def test_a_job_larger_than_any_node_is_refused_with_the_reason() -> None:
    assert refusal(empty(4, 4), POLICY, HUGE) == WHY


def test_a_job_that_fits_is_admitted_whatever_its_id() -> None:
    assert refusal(empty(8), POLICY, HUGE) is None
    assert refusal(empty(8), POLICY, job("").task(1, gpu=8).build()) is None


def test_an_admitted_job_that_never_fits_now_fails_unless_the_largest_cluster_holds_it() -> None:
    assert never_fits_now(HUGE, "gone", POLICY) == Finish(JobState.FAILED, "gone")
    assert never_fits_now(HUGE, "gone", POLICY, empty(4, 8)) is None
    assert never_fits_now(HUGE, "gone", POLICY, empty(4, 4)) == Finish(JobState.FAILED, WHY)


def test_admission_kept_over_one_cluster_judges_as_refusal_does() -> None:
    largest = empty(4, 4)
    admission = Admission(largest, POLICY)
    jobs = [HUGE, job("ok").task(2, gpu=4).build(), HUGE, job("").task(1, gpu=2).build()]
    assert [admission.refusal(j) for j in jobs] == [refusal(largest, POLICY, j) for j in jobs]
    assert [admission.refusal(j) for j in jobs] == [WHY, None, WHY, None]


def gpu_nodes(model: str, mem_gib: int) -> Snapshot:
    arrays = build_arrays(Cluster((node("n0").gpus(4, model=model, mem_gib=mem_gib).build(),)))
    return Snapshot(arrays, FreeState.empty(arrays), (), QueueTree())


def test_a_refusal_names_a_gpu_model_that_no_node_has() -> None:
    why = refusal(gpu_nodes("A100", 80), POLICY, job("m").task(1, gpu=1).models("H100").build())
    assert why is not None and why.endswith(
        "; no GPU here is of model 'H100' (the models here: 'A100')"
    )


def test_a_refusal_names_gpu_memory_per_gpu_that_no_gpu_reaches() -> None:
    # 100 GiB over 2 GPUs is 50 per GPU: it fits 80 GiB GPUs; over 1 it does not.
    assert (
        refusal(gpu_nodes("A100", 80), POLICY, job("s").task(1, gpu=2, gpu_mem_gib=100).build())
        is None
    )
    one = refusal(gpu_nodes("A100", 80), POLICY, job("b").task(1, gpu=1, gpu_mem_gib=100).build())
    assert one is not None and one.endswith(
        "; it asks for 100 GiB of memory per GPU, and the largest GPU here has 80 GiB"
    )
    # The most a job file may ask for (`gpu_mem: 1P`), in a unit that needs no exponent.
    huge = job("p").task(1, gpu=1, gpu_mem_gib=1024**2).build()
    assert refusal(gpu_nodes("A100", 80), POLICY, huge) == (
        "can never fit this cluster: room for 0 of 1 'g0' tasks (1 GPU, 1 PiB GPU memory, 1 CPU, "
        "1 GiB memory each); it asks for 1 PiB of memory per GPU, and the largest GPU here has "
        "80 GiB"
    )
    share = job("h").task(1, gpu_milli=500, gpu_mem_gib=10).build()
    unknown = refusal(gpu_nodes("declared", 0), POLICY, share)
    assert unknown is not None and unknown.endswith(
        "; it asks for 10 GiB of memory per GPU, and no GPU here has a known size"
    )
