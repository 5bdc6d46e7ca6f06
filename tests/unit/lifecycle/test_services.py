"""A service's replica count: held within its bounds; the surplus chosen by one rule."""

from __future__ import annotations

from aisched.lifecycle.services import replicas_within, surplus
from aisched.model.service import ServiceSpec


def test_a_count_asked_for_is_held_within_the_services_bounds() -> None:
    spec = ServiceSpec(min_replicas=2, max_replicas=5)
    assert [replicas_within(spec, n) for n in (0, 2, 4, 9)] == [2, 2, 4, 5]


def test_the_surplus_is_pending_replicas_first_then_the_newest_running() -> None:
    live = [("3", True), ("4", False), ("10", True), ("7", True), ("8", False)]
    assert surplus(live, 2) == ["8", "4", "10"]
    assert surplus(live, 5) == []
    assert surplus(live, 9) == []
