"""Recent runtimes of finished jobs, grouped by who ran them and what they looked like, and
recent submissions per user.

Each group keeps its last `per_key` runtimes (as log seconds) with their finish times. Reads can
be cut at a time: only runtimes finished by then count, which is how a training row is rebuilt
as it would have looked when its job was submitted.

Groups of one job name (keys `("name", ...)`) are at most `max_names`: a sweep of unique names
would otherwise add one for ever per job (about 1 KB each). The group least recently added to is
dropped first, whole, as if that name had never run; every other group answers as before.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable

Entry = tuple[float, float]  # (finished_s, log runtime)


class RuntimeHistory:
    def __init__(self, per_key: int, max_names: int) -> None:
        self._per_key = per_key
        self._max_names = max_names
        self._groups: dict[Hashable, deque[Entry]] = {}
        self._counts: dict[Hashable, int] = {}
        self._names: OrderedDict[Hashable, None] = OrderedDict()  # least recently added first

    def add(self, keys: tuple[Hashable, ...], finished_s: float, log_runtime: float) -> None:
        for key in keys:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = deque(maxlen=self._per_key)
            group.append((finished_s, log_runtime))
            self._counts[key] = self._counts.get(key, 0) + 1
            if isinstance(key, tuple) and key[:1] == ("name",):
                self._names[key] = None
                self._names.move_to_end(key)
                if len(self._names) > self._max_names:
                    oldest, _ = self._names.popitem(last=False)
                    del self._groups[oldest], self._counts[oldest]

    def values(self, key: Hashable, cut_s: float = math.inf) -> list[float]:
        """Log runtimes of the group, oldest first, of jobs finished by `cut_s`."""
        group = self._groups.get(key)
        if not group:
            return []
        if group[-1][0] <= cut_s:
            return [v for _, v in group]
        return [v for t, v in group if t <= cut_s]

    def count(self, key: Hashable) -> int:
        """How many runtimes the group has ever had (not only the kept ones)."""
        return self._counts.get(key, 0)


class Submissions:
    """Submission times per user, to tell a burst (a sweep) from a lone job."""

    def __init__(self, per_user: int = 256) -> None:
        self._per_user = per_user
        self._times: dict[str, deque[float]] = {}

    def add(self, user: str, submit_s: float) -> None:
        times = self._times.get(user)
        if times is None:
            times = self._times[user] = deque(maxlen=self._per_user)
        times.append(submit_s)

    def recent(self, user: str, submit_s: float, window_s: float) -> tuple[int, float]:
        """(submissions in the `window_s` before `submit_s`, seconds since the one before it;
        NaN when there is none)."""
        times = self._times.get(user)
        if not times:
            return 0, math.nan
        n = 0
        gap = math.nan
        for t in reversed(times):
            if t > submit_s:
                continue
            if math.isnan(gap):
                gap = submit_s - t
            if submit_s - t > window_s:
                break
            n += 1
        return n, gap


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])
