"""The per-caller token buckets, driven by a clock the test advances."""

from __future__ import annotations

import pytest

from aisched.service.ratelimit import Budget, Refusal, RequestLimits, TokenBuckets


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_passes_then_each_request_waits_for_its_refill() -> None:
    clock = Clock()
    buckets = TokenBuckets(Budget("request", rate_per_s=2.0, burst=3), clock)
    assert [buckets.take("alice") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("alice") == pytest.approx(0.5)  # one token at 2 a second
    clock.now += 0.25
    assert buckets.take("alice") == pytest.approx(0.25)  # a refusal takes nothing
    clock.now += 0.25
    assert buckets.take("alice") == 0.0
    assert buckets.take("alice") == pytest.approx(0.5)


def test_callers_have_buckets_of_their_own() -> None:
    clock = Clock()
    buckets = TokenBuckets(Budget("request", rate_per_s=1.0, burst=2), clock)
    assert [buckets.take("alice") > 0 for _ in range(4)] == [False, False, True, True]
    assert [buckets.take("bob") > 0 for _ in range(3)] == [False, False, True]


def test_an_idle_callers_bucket_refills_to_its_burst_and_no_further() -> None:
    clock = Clock()
    buckets = TokenBuckets(Budget("request", rate_per_s=1.0, burst=2), clock)
    buckets.take("alice")
    buckets.take("alice")
    clock.now += 3600
    assert [buckets.take("alice") > 0 for _ in range(3)] == [False, False, True]


def test_idle_callers_are_forgotten_and_memory_is_capped() -> None:
    clock = Clock()
    buckets = TokenBuckets(Budget("request", rate_per_s=1.0, burst=2), clock, max_callers=3)
    for n in range(5):
        buckets.take(f"user{n}")
    assert len(buckets) == 3  # the least recently seen dropped past the cap
    clock.now += 2  # every bucket full again: the same as none
    buckets.take("carol")
    assert len(buckets) == 1


def test_a_clock_that_steps_back_refills_nothing() -> None:
    clock = Clock()
    buckets = TokenBuckets(Budget("request", rate_per_s=1.0, burst=1), clock)
    buckets.take("alice")
    clock.now -= 100
    assert buckets.take("alice") == pytest.approx(1.0)


def test_submissions_and_bulk_cancels_also_take_from_the_submit_budget() -> None:
    clock = Clock()
    limits = RequestLimits(
        [Budget("request", 100.0, 100), Budget("submit", 0.5, 2)],
        clock,
    )
    assert limits.check("alice", "POST", "/v1/jobs") is None
    assert limits.check("alice", "POST", "/v1/jobs/cancel") is None
    refused = limits.check("alice", "POST", "/v1/jobs")
    assert refused == Refusal(Budget("submit", 0.5, 2), retry_after_s=2)
    # Reads and other changes go on: only the request budget counts for them.
    assert limits.check("alice", "GET", "/v1/jobs") is None
    assert limits.check("alice", "POST", "/v1/jobs/j-1/cancel") is None
    assert refused.message("aisalice") == (
        "rate limit: aisalice sent more than 2 submissions and bulk cancels at once or 0.5 a "
        "second (limits.submit_rate, limits.submit_burst); try again in 2 s"
    )


def test_retry_after_is_whole_seconds_and_at_least_one() -> None:
    clock = Clock()
    limits = RequestLimits([Budget("request", 20.0, 1)], clock)
    assert limits.check("alice", "GET", "/v1/jobs") is None
    assert limits.check("alice", "GET", "/v1/jobs") == Refusal(Budget("request", 20.0, 1), 1)


def test_a_rate_of_zero_is_no_limit() -> None:
    limits = RequestLimits([Budget("request", 0.0, 1)], Clock())
    assert all(limits.check("alice", "GET", "/v1/jobs") is None for _ in range(100))
