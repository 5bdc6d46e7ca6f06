"""The pure dependency verdicts and cycle finding behind pipelines."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from aisched.core.dependencies import (
    NAMED_WAITING,
    Awaited,
    DependencyCheck,
    DependencyVerdict,
    check_dependencies,
    find_cycle,
    waiting_reason,
)
from aisched.model.job import Dependency, DependencyCondition
from aisched.model.states import JobState
from aisched.testing import job

S, A = DependencyCondition.SUCCESS, DependencyCondition.ANY
MET, WAITING, BROKEN = DependencyVerdict.MET, DependencyVerdict.WAITING, DependencyVerdict.BROKEN
MUST = "it had to succeed"


@pytest.mark.parametrize(
    ("deps", "states", "want"),
    [
        ([], {}, DependencyCheck(MET)),
        ([("1", S)], {"1": JobState.SUCCEEDED}, DependencyCheck(MET)),
        ([("1", S)], {"1": JobState.RUNNING},
         DependencyCheck(WAITING, "waiting for job 1 (prep) to succeed")),
        ([("1", A)], {"1": JobState.PENDING},
         DependencyCheck(WAITING, "waiting for job 1 (prep) to end")),
        ([("1", A)], {"1": JobState.FAILED}, DependencyCheck(MET)),
        ([("1", S)], {"1": JobState.FAILED},
         DependencyCheck(BROKEN, f"dependency 1 (prep) failed; {MUST}")),
        ([("1", S)], {"1": JobState.CANCELLED},
         DependencyCheck(BROKEN, f"dependency 1 (prep) cancelled; {MUST}")),
        ([("9", S)], {}, DependencyCheck(BROKEN, "dependency 9 does not exist")),
        # A broken dependency wins over one still awaited, wherever it is listed.
        ([("2", S), ("1", S)], {"1": JobState.FAILED, "2": JobState.RUNNING},
         DependencyCheck(BROKEN, "dependency 1 (prep) failed; it had to succeed")),
        ([("1", S), ("2", A)], {"1": JobState.RUNNING, "2": JobState.RUNNING},
         DependencyCheck(WAITING, "waiting for job 1 (prep) to succeed, 2 (train) to end")),
        # The reason is the job's status in every listing: a few are named, the rest counted.
        ([(str(i), A) for i in range(1, 101)], {str(i): JobState.RUNNING for i in range(1, 101)},
         DependencyCheck(WAITING, "waiting for job 1 (prep) to end, 2 (train) to end, 3 to end "
                                  "and 97 more")),
    ],
)  # fmt: skip
def test_verdicts(
    deps: list[tuple[str, DependencyCondition]],
    states: dict[str, JobState],
    want: DependencyCheck,
) -> None:
    j = replace(job("x").build(), depends_on=tuple(Dependency(i, c) for i, c in deps))
    assert check_dependencies(j, states.get, {"1": "prep", "2": "train"}) == want


@pytest.mark.parametrize(
    ("edges", "want"),
    [
        ({}, None),
        ({"a": [], "b": ["a"], "c": ["b", "a"]}, None),
        ({"a": ["b"], "b": ["a"]}, ["a", "b", "a"]),
        ({"a": ["a"]}, ["a", "a"]),
        ({"x": ["a"], "a": ["b"], "b": ["c"], "c": ["a"]}, ["a", "b", "c", "a"]),
        ({"a": ["zz"]}, None),  # a node with no entry has no dependencies
    ],
)
def test_find_cycle(edges: dict[str, list[str]], want: list[str] | None) -> None:
    assert find_cycle(edges) == want


def test_a_long_chain_has_no_cycle_and_no_recursion_limit() -> None:
    edges = {str(i): [str(i + 1)] for i in range(5000)}
    assert find_cycle(edges) is None
    edges["5000"] = ["0"]
    cycle = find_cycle(edges)
    assert cycle is not None and cycle[0] == cycle[-1] and len(cycle) == 5002


@pytest.mark.parametrize("seed", range(20))
def test_what_a_job_still_awaits_gives_the_verdict_of_a_full_check(seed: int) -> None:
    # Jobs waiting on random subsets of 12 (some listed twice), which end one at a time in a
    # random order and state: after each end, every job still held must get from `Awaited`
    # exactly what a look at all its dependencies says, or be left to that look.
    rng = random.Random(seed)
    heads = [str(i) for i in range(1, 13)]
    names = {h: f"h{h}" for h in heads}
    states = dict.fromkeys(heads, JobState.RUNNING)
    waiters = []
    for k in range(30):
        listed = rng.sample(heads, rng.randint(1, 8))
        if k % 10 == 0:
            listed.append(listed[0])  # the same job twice
        deps = tuple(Dependency(h, rng.choice((S, A))) for h in listed)
        waiters.append(replace(job(f"w{k}").build(), depends_on=deps))
    index = Awaited()
    held = {}
    for w in waiters:
        assert check_dependencies(w, states.get, names).verdict == WAITING
        index.hold(w, states.get)
        held[w.id] = w
    for h in rng.sample(heads, len(heads)):
        states[h] = rng.choice((JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.FAILED))
        rechecked = index.ended(h, states[h])
        assert rechecked == sorted(rechecked, key=lambda i: (len(i), i))
        # Jobs that no longer wait may be named too: the caller skips them.
        assert {w.id for w in held.values() if any(d.job_id == h for d in w.depends_on)} <= set(
            rechecked
        )
        for job_id in (i for i in rechecked if i in held):
            full = check_dependencies(held[job_id], states.get, names)
            still = index.still_awaited(job_id)
            if still is not None:
                first, count = still
                assert len(first) == min(count, NAMED_WAITING)
                assert DependencyCheck(WAITING, waiting_reason(first, count, names)) == full
            elif full.verdict == WAITING:  # only a job listed twice is left to full checks
                deps = held[job_id].depends_on
                assert len({d.job_id for d in deps}) < len(deps)
                index.hold(held[job_id], states.get)
            else:
                index.forget(job_id)
                del held[job_id]
    assert held == {}
