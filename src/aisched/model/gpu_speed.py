"""How fast each GPU model runs a typical training job, relative to a V100 (1.0).

A job's runtime in a trace is taken as its runtime on a reference GPU of speed 1.0; on a model
of speed s it runs 1/s as long. The default table holds rough ratios of training throughput
in the spirit of Gavel's measurements (Narayanan et al., OSDI '20), enough to make a
heterogeneous cluster behave like one; they are not measurements of any one workload. Models
not in the table run at `default` speed (openb's undisclosed G1, G2, G3 among them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_SPEEDS: tuple[tuple[str, float], ...] = (
    ("A10", 0.9),
    ("A100", 2.0),
    ("H100", 3.5),
    ("K80", 0.25),
    ("P100", 0.6),
    ("T4", 0.4),
    ("V100", 1.0),
    ("V100M16", 1.0),
    ("V100M32", 1.0),
)


@dataclass(frozen=True, slots=True)
class GpuSpeeds:
    """Speed per GPU model (positive, finite); `default` for models not listed."""

    table: tuple[tuple[str, float], ...] = DEFAULT_SPEEDS
    default: float = 1.0

    def __post_init__(self) -> None:
        for model, speed in (*self.table, ("default", self.default)):
            if not 0 < speed < float("inf"):
                raise ValueError(f"GPU speed of {model}: expected a positive number, got {speed}")

    @classmethod
    def of_mapping(cls, speeds: Mapping[str, float], default: float = 1.0) -> GpuSpeeds:
        return cls(tuple(sorted((str(k), float(v)) for k, v in speeds.items())), default)

    def speed(self, model: str | None) -> float:
        for name, s in self.table:
            if name == model:
                return s
        return self.default
