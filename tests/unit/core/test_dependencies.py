"""The pure dependency verdicts and cycle finding behind pipelines."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aisched.core.dependencies import (
    DependencyCheck,
    DependencyVerdict,
    check_dependencies,
    find_cycle,
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
