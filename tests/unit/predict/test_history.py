"""Runtime history: the groups of job names are bounded, the least recently added dropped
first, and every group kept answers as if none had been dropped. Before: a group per distinct
name was kept for ever (a sweep of unique names grew the service by ~1 KB a job)."""

from __future__ import annotations

from aisched.predict import PredictorConfig, RuntimePredictor
from aisched.predict.features import JobFeatures
from aisched.predict.history import RuntimeHistory


def _keys(name: str) -> tuple[tuple[str, ...], ...]:
    return (("user", "u"), ("name", name))


def test_the_name_least_recently_added_to_is_dropped_first() -> None:
    h = RuntimeHistory(per_key=4, max_names=2)
    h.add(_keys("a"), 1.0, 10.0)
    h.add(_keys("b"), 2.0, 20.0)
    h.add(_keys("a"), 3.0, 11.0)  # a is now more recent than b
    h.add(_keys("c"), 4.0, 30.0)
    assert [h.values(("name", n)) for n in "abc"] == [[10.0, 11.0], [], [30.0]]
    assert (h.count(("name", "a")), h.count(("name", "b"))) == (2, 0)
    # Other groups are not bounded: the user's keeps every runtime (up to per_key).
    assert (h.values(("user", "u")), h.count(("user", "u"))) == ([10.0, 20.0, 11.0, 30.0], 4)
    h.add(_keys("d"), 5.0, 40.0)
    assert [h.values(("name", n)) for n in "abcd"] == [[], [], [30.0], [40.0]]


def _f(job_id: str, name: str, now: float) -> JobFeatures:
    return JobFeatures(job_id, "u", "q", name, "batch", 1.0, 1, now, now)


def test_predictions_for_names_kept_are_those_of_an_unbounded_history() -> None:
    bounded = RuntimePredictor(PredictorConfig(max_names=2))
    unbounded = RuntimePredictor(PredictorConfig(max_names=1_000_000))
    # A name answers from its own history from 3 runs on; gamma's first drops beta's group.
    names = ["beta", "alpha", "beta", "alpha", "beta", "alpha", "gamma", "gamma", "gamma"]
    for i, name in enumerate(names):
        for p in (bounded, unbounded):
            p.observe(_f(f"j{i}", name, float(i)), 100.0 * (i + 1), finished_s=float(i))
    now = float(len(names))

    def answer(p: RuntimePredictor, name: str) -> tuple[float, float, str]:
        got = p.predict(_f(f"new-{name}", name, now))
        return got.median_s, got.upper_s, got.source

    for name in ("alpha", "gamma"):  # the two most recently finished
        assert answer(bounded, name) == answer(unbounded, name)
        assert answer(bounded, name)[2] == "history:name"
    # A name dropped answers as a name never seen: from its user's history.
    assert answer(bounded, "beta")[2] == answer(bounded, "delta")[2] != "history:name"
    assert answer(unbounded, "beta")[2] == "history:name"
