"""Per-caller request rate limits: a token bucket for each caller, so that one user (or one
token, or one address without a valid token) flooding the service cannot starve the others'
requests and the scheduling loop's CPU.

A bucket holds at most `burst` tokens and refills at `rate_per_s`; each request takes one, and
a request that finds less than one is refused with the seconds until one is there. Callers are
keyed by account, its name and uid (`model.job.account_key`; the socket's uid and a token's
user share one bucket), or by peer address for requests without a valid identity. Admins are
not limited (`service/auth.py` says why).

Memory is bounded: a bucket idle long enough to be full again is the same as none, so such
buckets are forgotten from the least recently used end on every request, and past
`max_callers` the least recently used is dropped whatever its state.

Nothing here reads the clock itself: `clock` is given (the service passes `time.monotonic`,
the tests one they advance), and the buckets are shared by the request threads under a lock.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_CALLERS = 10_000
# Submissions (each parsed, validated, stored and scheduled) and bulk cancels (up to thousands
# of jobs at once) cost far more than a read: they take from a second, smaller budget too.
EXPENSIVE = frozenset({("POST", "/v1/jobs"), ("POST", "/v1/jobs/cancel")})


@dataclass(frozen=True, slots=True)
class Budget:
    name: str  # how the configuration names it: limits.NAME_rate and limits.NAME_burst
    rate_per_s: float
    burst: int


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass(frozen=True, slots=True)
class Refusal:
    budget: Budget
    retry_after_s: int  # whole seconds, as the Retry-After header takes them; at least 1

    def message(self, who: str) -> str:
        b = self.budget
        return (
            f"rate limit: {who} sent more than {b.burst} {_what(b.name)} at once or "
            f"{b.rate_per_s:g} a second (limits.{b.name}_rate, limits.{b.name}_burst); "
            f"try again in {self.retry_after_s} s"
        )


def _what(name: str) -> str:
    return "requests" if name == "request" else "submissions and bulk cancels"


class TokenBuckets:
    """One budget's buckets, one per caller key."""

    def __init__(
        self,
        budget: Budget,
        clock: Callable[[], float] = time.monotonic,
        max_callers: int = MAX_CALLERS,
    ) -> None:
        self.budget = budget
        self.clock = clock
        self.max_callers = max_callers
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Take one token from `key`'s bucket: 0.0 if there was one, else the seconds until
        there will be (nothing is taken then)."""
        now = self.clock()
        rate, burst = self.budget.rate_per_s, self.budget.burst
        with self._lock:
            self._forget_full(now)
            bucket = self._buckets.pop(key, None)
            tokens = burst if bucket is None else self._level(bucket, now)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / rate
            self._buckets[key] = _Bucket(tokens - 1 if wait == 0.0 else tokens, now)
            while len(self._buckets) > self.max_callers:
                self._buckets.popitem(last=False)
        return wait

    def __len__(self) -> int:
        return len(self._buckets)

    def _level(self, bucket: _Bucket, now: float) -> float:
        elapsed = max(now - bucket.at, 0.0)  # a clock that steps back refills nothing
        return min(float(self.budget.burst), bucket.tokens + elapsed * self.budget.rate_per_s)

    def _forget_full(self, now: float) -> None:
        while self._buckets:
            oldest = next(iter(self._buckets.values()))
            if self._level(oldest, now) < self.budget.burst:
                return
            self._buckets.popitem(last=False)


class RequestLimits:
    """Every request takes from the caller's `request` budget; an expensive one (EXPENSIVE)
    from its `submit` budget as well. A budget with rate 0 is off."""

    def __init__(self, budgets: list[Budget], clock: Callable[[], float] = time.monotonic) -> None:
        self._by_name = {b.name: TokenBuckets(b, clock) for b in budgets if b.rate_per_s > 0}

    def check(self, key: str, method: str, path: str) -> Refusal | None:
        """Charge one request of `key`; the refusal if one of its budgets is spent."""
        names = ["request", "submit"] if (method, path.rstrip("/")) in EXPENSIVE else ["request"]
        for name in names:
            buckets = self._by_name.get(name)
            if buckets is None:
                continue
            wait = buckets.take(key)
            if wait > 0:
                return Refusal(buckets.budget, max(1, math.ceil(wait)))
        return None
