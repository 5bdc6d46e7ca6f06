"""How often a job checkpoints: its own interval, else the driver's default."""

from __future__ import annotations

import math
from dataclasses import replace

from aisched.lifecycle.work import checkpoint_interval_s, core_interval, kept_work_s
from aisched.testing import job


def test_a_jobs_own_interval_wins_over_the_drivers_default() -> None:
    own = replace(job("a").build(), checkpoint_interval_s=120.0)
    plain = job("b").build()
    assert [checkpoint_interval_s(j, d) for j in (own, plain) for d in (3600.0, math.inf)] == [
        120.0,
        120.0,
        3600.0,
        math.inf,
    ]


def test_without_an_interval_a_stopped_attempt_keeps_nothing_and_the_core_sees_its_start() -> None:
    assert core_interval(math.inf) is None
    assert core_interval(600.0) == 600.0
    assert kept_work_s(0.0, 5000.0, math.inf, 0.0, 1.0, 10_000.0) == 0.0
    assert kept_work_s(0.0, 5000.0, 3600.0, 0.0, 1.0, 10_000.0) == 3600.0
