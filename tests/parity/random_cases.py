"""Random small traces for the parity test, drawn through one `Pick`, so that Hypothesis (the
property test, which shrinks what it finds) and a seeded `random.Random` (a large run by hand,
which counts how many traces agree) draw the very same kinds of case.

What a case may hold: 2 or 3 nodes of 2 or 4 GPUs; up to 8 jobs, each a gang of 1 to 3 tasks
(or an elastic job that may run with one), of a priority 0 to 3, with the drivers' checkpoint
interval or its own (20 s, or none), a grace period of 0, 4 or 30 s, up to 2 retries and up to
3 played failures; arrivals 0 to 120 s apart; stops (preemptions, shrinks, grows) that take 0
or 10 s (the grace caps them); the default, priority and fifo policies. What it never holds,
by construction:

- Two arrivals at one instant of different priorities: the service makes submit times
  strictly increasing (each a microsecond after the last), so FIFO follows submission order,
  where the simulator keeps a trace's equal times and breaks the tie by priority
  (docs/lifecycle.md, "Differences still there"). Jobs of one priority may arrive together:
  both drivers then take them in submission (id) order.
- A job that can never fit: the service refuses it at submission and it takes no id there,
  so the ids of the jobs after it would differ (the hand-written case
  `preemption-with-grace-and-never-fits` covers the refusal).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol, TypeVar

from drivers import Case, elastic, gang, gpus

from aisched.model.job import Job

T = TypeVar("T")

POLICIES = ("default", "priority", "fifo")


class Pick(Protocol):
    """Chooses one of `options` (Hypothesis' `draw(sampled_from(...))`, or `Random.choice`)."""

    def __call__(self, options: Sequence[T]) -> T: ...


def random_case(pick: Pick, name: str = "random") -> Case:
    node_gpus = pick((2, 4))
    nodes = tuple(gpus(f"n{i + 1}", node_gpus) for i in range(pick((2, 3))))
    jobs: list[tuple[Job, float, float, tuple[float, ...]]] = []
    t = 0.0
    for i in range(pick(range(1, 9))):
        label = f"j{i + 1}"
        gpu = pick(range(1, node_gpus + 1))
        fit = len(nodes) * (node_gpus // gpu)  # tasks of this size the cluster holds at once
        tasks = pick(range(1, min(3, fit) + 1))
        if tasks > 1 and pick((False, True)):
            j = elastic(label, tasks, 1, gpu=gpu)
        else:
            j = gang(label, tasks, gpu)
        gap = pick((0.0, 1.0, 5.0, 30.0, 120.0)) if jobs else math.inf
        t += gap if jobs else 0.0
        # An arrival at the instant of the one before takes its priority (see above).
        priority = jobs[-1][0].priority if gap == 0 else pick(range(4))
        j = replace(
            j,
            priority=priority,
            checkpoint_interval_s=pick((None, 20.0, float("inf"))),
            grace_period_s=pick((0.0, 4.0, 30.0)),
            max_retries=pick(range(3)),
        )
        fails = tuple(pick((5.0, 50.0)) for _ in range(pick(range(4))))
        jobs.append((j, t, pick((10.0, 60.0, 300.0)), fails))
    return Case(name, nodes, tuple(jobs), policy=pick(POLICIES), stop_s=pick((0.0, 10.0)))
