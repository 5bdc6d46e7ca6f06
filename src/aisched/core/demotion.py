"""When a running job's rank changes with time alone: Tiresias' 2D-LAS demotes a job the
instant its attained GPU-service crosses the next threshold, and a waiting job may then
preempt it. A driver that runs cycles only when something happens (the simulator) asks here
when to look again; the live service needs no such timer, since its loop runs a cycle every
`cycle_interval` (1 s by default) while jobs wait.

Only the policy's first job order ranks a running job (preemption `by: order` reads it), and
only an order whose key grows with attained service (`next_change_gpu_s`, as `las` has) makes
demotions. Pure: no clock; the caller says what time it is.
"""

from __future__ import annotations

import math

from aisched.core.policy import Policy
from aisched.core.snapshot import RunningJob
from aisched.model.resources import GPU_MILLI_WHOLE


def ranks_running_by_order(policy: Policy) -> bool:
    """Whether the policy preempts by its first job order (and so reads running jobs' keys)."""
    return any(a.name == "preempt" and getattr(a, "by", "") == "order" for a in policy.actions)


def demotion_at(policy: Policy, running: RunningJob, now: float) -> float | None:
    """The first instant after `now` at which `running` (running on, from `now` on) has a
    larger first order key than it has at `now`; None when none comes or none matters."""
    if not policy.order or not ranks_running_by_order(policy):
        return None
    next_change = getattr(policy.order[0], "next_change_gpu_s", None)
    gpus = running.usage[2] / GPU_MILLI_WHOLE
    if next_change is None or gpus <= 0:
        return None
    attained = running.attained_at(now)
    threshold: float | None = next_change(attained)
    if threshold is None:
        return None
    at = now + (threshold - attained) / gpus
    # Rounding may leave the service computed at `at` a hair short of the threshold, and the
    # cycle then would not see the demotion: step to the first instant that reaches it.
    while running.attained_at(at) < threshold:
        at = math.nextafter(at, math.inf)
    return at
