"""How many replicas a service should have: the Kubernetes HPA's rule, pure.

1. Raw recommendation: `ceil(current × metric / target)`, where `metric` is the per-replica
   load (rps) or the replicas' latency; unchanged while `metric / target` is within the
   tolerance of 1. With no replica running, an rps load still asks for `ceil(total / target)`
   (scale from zero); latency needs a running replica to be measured.
2. Stabilisation: recommendations are kept for the longer window; a scale-up follows the
   *lowest* recommendation of the up window, a scale-down the *highest* of the down window, so
   a short dip never removes replicas and a spike must last the up window to add them.
3. Clamped to `min_replicas..max_replicas`.

The caller owns the recommendation history and passes `now`; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from aisched.model.service import ScaleMetric, ServiceSpec


@dataclass(frozen=True, slots=True)
class Recommendation:
    time_s: float
    replicas: int


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    desired: int
    raw: int  # the recommendation of this step before stabilisation
    reason: str


def raw_recommendation(spec: ServiceSpec, current: int, load: float) -> int:
    """Step 1. `load` is the per-replica rps, or the latency, that the replicas report; for rps
    with `current == 0` it is the total rps offered to the service."""
    if spec.metric == ScaleMetric.RPS and current == 0:
        return _ceil_within(load / spec.target, spec.max_replicas) if load > 0 else 0
    if current == 0:
        return 0
    ratio = load / spec.target
    if abs(ratio - 1.0) <= spec.tolerance:
        return current
    return _ceil_within(current * ratio, spec.max_replicas)


def _ceil_within(replicas: float, most: int) -> int:
    """`ceil(replicas)`, but no more than `most`: a huge load over a tiny target is an
    infinite ratio, which has no ceiling as an int (and would fail the autoscaler's round)."""
    return most if not replicas < most else math.ceil(replicas)


def decide(
    spec: ServiceSpec,
    current: int,
    load: float | None,
    history: Sequence[Recommendation],
    now: float,
) -> tuple[ScaleDecision, list[Recommendation]]:
    """Steps 1-3; returns the decision and the history to keep (this step's recommendation
    added, those older than both windows dropped). `load` None (no fresh figure) holds the
    current count, within bounds."""
    if load is None:
        desired = min(max(current, spec.min_replicas), spec.max_replicas)
        return ScaleDecision(desired, current, "no fresh load figure: holding"), list(history)
    raw = min(max(raw_recommendation(spec, current, load), spec.min_replicas), spec.max_replicas)
    horizon = max(spec.scale_up_window_s, spec.scale_down_window_s)
    kept = [r for r in history if now - r.time_s <= horizon]
    kept.append(Recommendation(now, raw))
    up = [r.replicas for r in kept if now - r.time_s <= spec.scale_up_window_s]
    down = [r.replicas for r in kept if now - r.time_s <= spec.scale_down_window_s]
    desired = current
    if raw > current:
        desired = max(current, min(up))
    elif raw < current:
        desired = min(current, max(down))
    desired = min(max(desired, spec.min_replicas), spec.max_replicas)
    unit = "rps per replica" if spec.metric == ScaleMetric.RPS else "ms latency"
    if current == 0 and spec.metric == ScaleMetric.RPS:
        unit = "rps offered"
    reason = f"{load:.4g} {unit} for a target of {spec.target:g}"
    return ScaleDecision(desired, raw, reason), kept
