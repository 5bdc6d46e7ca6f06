"""The HPA rule: raw recommendation, tolerance, stabilisation windows, bounds, scale to zero."""

from __future__ import annotations

import pytest

from aisched.core.autoscale import Recommendation, decide, raw_recommendation
from aisched.model.service import ScaleMetric, ServiceSpec

SPEC = ServiceSpec(min_replicas=1, max_replicas=5, target=10.0, scale_down_window_s=30.0)


@pytest.mark.parametrize(
    ("spec", "current", "load", "want"),
    [
        (SPEC, 2, 20.0, 4),  # ceil(2 × 20 / 10)
        (SPEC, 2, 10.5, 2),  # within the 10% tolerance: unchanged
        (SPEC, 3, 4.0, 2),  # ceil(3 × 0.4) = 2
        (SPEC, 0, 25.0, 3),  # from zero: the offered total over the target
        (SPEC, 0, 0.0, 0),
        (ServiceSpec(1, 5, ScaleMetric.LATENCY_MS, 100.0), 2, 250.0, 5),
        (ServiceSpec(1, 5, ScaleMetric.LATENCY_MS, 100.0), 0, 250.0, 0),
        # A load over a tiny target is an infinite ratio: the maximum, not an overflow.
        (ServiceSpec(1, 3, target=1e-320), 2, 1e308, 3),
        (ServiceSpec(0, 3, target=1e-320), 0, 1e308, 3),
    ],
)
def test_raw_recommendation(spec: ServiceSpec, current: int, load: float, want: int) -> None:
    assert raw_recommendation(spec, current, load) == want


def test_scale_up_is_immediate_and_clamped_to_max() -> None:
    d, _ = decide(SPEC, 1, 80.0, [], now=100.0)
    assert (d.desired, d.raw) == (5, 5)


def test_scale_down_waits_for_the_down_window_then_follows_its_highest() -> None:
    history: list[Recommendation] = []
    d, history = decide(SPEC, 4, 10.0, history, now=0.0)  # steady at 4
    assert d.desired == 4
    d, history = decide(SPEC, 4, 0.0, history, now=10.0)  # idle: raw 1, but 4 was recent
    assert (d.desired, d.raw) == (4, 1)
    d, history = decide(SPEC, 4, 0.0, history, now=31.0)  # the 4 left the window
    assert d.desired == 1


def test_scale_up_window_needs_the_spike_to_last() -> None:
    spec = ServiceSpec(1, 5, target=10.0, scale_up_window_s=20.0, scale_down_window_s=0.0)
    d, h = decide(spec, 1, 10.0, [], now=0.0)
    d, h = decide(spec, 1, 30.0, h, now=5.0)
    assert d.desired == 1  # the window still holds a recommendation of 1
    d, h = decide(spec, 1, 30.0, h, now=26.0)
    assert d.desired == 3


def test_min_zero_scales_to_zero_when_idle_and_back_from_it() -> None:
    spec = ServiceSpec(0, 3, target=10.0, scale_down_window_s=0.0)
    d, h = decide(spec, 2, 0.0, [], now=0.0)
    assert d.desired == 0
    d, h = decide(spec, 0, 15.0, h, now=1.0)
    assert d.desired == 2


def test_no_load_figure_holds_within_bounds() -> None:
    d, h = decide(SPEC, 0, None, [], now=0.0)
    assert d.desired == 1 and h == []
    d, h = decide(SPEC, 3, None, [], now=0.0)
    assert d.desired == 3
