"""The task mix: tasks counted by GPU shape, CPU-only tasks left out, weights summing to 1."""

from __future__ import annotations

from aisched.core.taskmix import TaskMixTally, TaskShape, mix_of
from aisched.testing import job


def test_mix_counts_tasks_by_gpu_shape_with_mean_cpu() -> None:
    jobs = [
        job("a").task(gpu_milli=500, cpu=2).build(),
        job("b").task(gpu_milli=500, cpu=4).build(),
        job("c").task(3, gpu=2, cpu=8).models("A100").build(),
        job("cpu-only").task(cpu=16).build(),
    ]
    shapes = mix_of(jobs).shapes
    assert shapes == (
        TaskShape(0, 500, 3000, 1024, (), 0.4, max_milli_cpu=4000, max_mem_mib=1024),
        TaskShape(2, 0, 8000, 1024, ("A100",), 0.6, max_milli_cpu=8000, max_mem_mib=1024),
    )
    # Where every task of a shape fits: the largest request seen, not the mean.
    assert (shapes[0].fit_milli_cpu, shapes[0].fit_mem_mib) == (4000, 1024)


def test_tally_gives_the_same_mix_whatever_the_order() -> None:
    a, b = job("a").task(gpu=1).build(), job("b").task(gpu_milli=250).build()
    first, second = TaskMixTally(), TaskMixTally()
    first.add_job(a)
    first.add_job(b)
    second.add_job(b)
    second.add_job(a)
    assert first.mix() == second.mix()
    assert sum(s.weight for s in first.mix().shapes) == 1.0


def test_empty_mix_is_falsy() -> None:
    assert not TaskMixTally().mix()
    assert not mix_of([job("cpu").task(cpu=1).build()])
