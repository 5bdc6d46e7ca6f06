"""What a `service` job asks for: long-running replicas, scaled between bounds on a load metric.

A service is a standing request, not work: the service layer turns it into replica jobs (each
one ordinary job of kind `infer`, one task) and keeps their number where the autoscaler says.
Standard library only, frozen once submitted, like every model type.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ScaleMetric(StrEnum):
    """The load figure the autoscaler follows. `rps`: requests per second per replica (the
    replicas share the load, so more replicas lower it); `latency_ms`: a latency the replicas
    report (averaged over them), brought down by adding replicas."""

    RPS = "rps"
    LATENCY_MS = "latency_ms"


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    min_replicas: int = 1  # 0 lets an idle service scale to zero
    max_replicas: int = 1
    metric: ScaleMetric = ScaleMetric.RPS
    target: float = 10.0  # per replica for rps; the value to stay under for latency
    # HTTP GET on the replica's port that answers 2xx once it serves; None: ready once running.
    readiness_path: str | None = "/healthz"
    # HTTP GET on the replica's port answering JSON such as {"rps": 12.5}; None: pushed only.
    metrics_path: str | None = None
    # Kubernetes HPA behaviour: a scale-up follows the lowest recommendation of the up window
    # (0: at once), a scale-down the highest of the down window (the scale-down delay).
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    # No change while the metric is within this fraction of the target (HPA's tolerance).
    tolerance: float = 0.1

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"min_replicas {self.min_replicas} must be in 0..max_replicas {self.max_replicas}"
            )
        if self.max_replicas < 1:
            raise ValueError("max_replicas must be at least 1")
        if self.target <= 0:
            raise ValueError("target must be above 0")
