"""Placements kept across cycles (`core.kept_placements`): read back only on the very free
state they were worked out on, equal to placing afresh there, bounded in the states they keep,
and never kept where placement is not a function of the free state and the shape."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from aisched.core import kept_placements as kept_mod
from aisched.core.cycle import run_cycle
from aisched.core.decisions import Bind, TaskBinding
from aisched.core.kept_placements import (
    KeptPlacements,
    current_key,
    free_state_key,
    kept_placements,
)
from aisched.core.placement import place_job
from aisched.core.policy import build_policy, preset
from aisched.core.session import Session
from aisched.core.snapshot import FreeState, snapshot_of
from aisched.core.statement import Statement
from aisched.model.cluster import Cluster
from aisched.model.job import Job
from aisched.testing import cluster, job, node, pending


def _cluster() -> Cluster:
    return cluster(*(node(f"n{i}").gpus(4).rack(f"r{i // 2}") for i in range(4)))


def _jobs() -> list[Job]:
    return [
        job("one").gang(1, gpu=1).build(),
        job("two").gang(1, gpu=2).build(),
        job("gang").gang(3, gpu=4).build(),
        job("big").gang(5, gpu=4).build(),  # never fits 4 nodes of 4
    ]


def test_a_placement_is_read_back_on_the_same_free_state_only() -> None:
    c, policy = _cluster(), preset("las")
    snap = snapshot_of(c)
    first = Session(snap, policy, 0.0, ())
    st = Statement(first)
    got = place_job(first, st, _jobs()[2])
    assert not isinstance(got, str)
    st.discard()
    table = kept_placements(first, False)
    assert table is not None and table.states() == 1
    # A later cycle on an equal free state reads it back: same bindings, same free state.
    second = Session(snap, policy, 1.0, ())
    assert kept_placements(second, False) is table
    st2 = Statement(second)
    again = place_job(second, st2, job("other").gang(3, gpu=4).build())
    assert again == got
    assert second.placement_attempts == 1
    fresh = FreeState.empty(snap.arrays)
    for t in got:
        fresh.take(snap.arrays.index[t.node], t)
    assert second.free.equals(fresh)
    # Undone like a placement worked out afresh.
    st2.discard()
    assert second.free.equals(snap.free)


def test_kept_outcomes_equal_fresh_ones_over_random_states() -> None:
    """Random binds and releases over a run of sessions, each placing a random job: the
    outcome (bindings or reason, and the free state after) read from the kept table equals the
    one worked out afresh by a session that keeps nothing."""
    c, policy = _cluster(), preset("las")
    snap = snapshot_of(c)
    rng = random.Random(7)
    free = snap.free.copy()
    held: list[tuple[int, TaskBinding]] = []
    for _ in range(300):
        j = rng.choice(_jobs())
        s = Session(snap, policy, 0.0, ())
        s.free = free.copy()
        st = Statement(s)
        kept = place_job(s, st, j)
        after_kept = s.free.copy()
        st.discard()
        table = kept_placements(s, False)
        assert table is not None
        s2 = Session(snap, policy, 0.0, ())
        s2.free = free.copy()
        s2.memo["kept-placements"] = None  # no table: placed afresh
        st2 = Statement(s2)
        fresh = place_job(s2, st2, j)
        assert kept == fresh
        assert s2.free.equals(after_kept)
        if not isinstance(fresh, str) and rng.random() < 0.5:
            idx = snap.arrays.index
            for t in fresh:
                free.take(idx[t.node], t)
                held.append((idx[t.node], t))
        elif held and rng.random() < 0.5:
            n, t = held.pop(rng.randrange(len(held)))
            free.give(n, t)


def test_states_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept_mod, "MAX_STATES", 3)
    table = KeptPlacements(preset("las"))
    for k in (b"a", b"b", b"c", b"a", b"d"):
        table.outcomes(k)[k] = "reason"
    assert table.states() == 3
    assert table.outcomes(b"a") == {b"a": "reason"}  # used again, so kept
    assert table.outcomes(b"b") == {}  # the least recently used, dropped


def test_nothing_is_kept_on_a_cluster_too_large_for_its_free_state_as_a_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snap = snapshot_of(_cluster())
    monkeypatch.setattr(kept_mod, "MAX_NODES", 3)
    assert kept_placements(Session(snap, preset("fifo"), 0.0, ()), False) is None
    monkeypatch.setattr(kept_mod, "MAX_NODES", 4)
    assert kept_placements(Session(snap, preset("fifo"), 0.0, ()), False) is not None


def test_nothing_is_kept_where_placement_reads_more_than_the_free_state() -> None:
    c = _cluster()
    snap = snapshot_of(c)
    random_score = build_policy({"actions": ["enqueue", "allocate"], "score": ["random"]})
    fgd = build_policy({"actions": ["enqueue", "allocate"], "score": ["fgd"]})
    assert kept_placements(Session(snap, random_score, 0.0, ()), False) is None
    assert kept_placements(Session(snap, fgd, 0.0, ()), False) is None
    assert kept_placements(Session(snap, preset("las"), 0.0, ()), True) is None  # sampled
    assert kept_placements(Session(snap, preset("fifo"), 0.0, ()), False) is not None


def test_the_key_is_the_whole_free_state() -> None:
    snap = snapshot_of(_cluster())
    free = snap.free.copy()
    before = free_state_key(free)
    session = Session(snap, preset("fifo"), 0.0, ())
    t = place_job(session, Statement(session), _jobs()[0])
    assert not isinstance(t, str)
    free.take(snap.arrays.index[t[0].node], t[0])
    assert free_state_key(free) != before
    free.give(snap.arrays.index[t[0].node], t[0])
    assert free_state_key(free) == before


def test_the_current_key_follows_every_change_of_the_session_free_state() -> None:
    snap = snapshot_of(_cluster())
    session = Session(snap, preset("fifo"), 0.0, ())
    before = current_key(session)
    assert current_key(session) is before  # unchanged: not worked out again
    st = Statement(session)
    placed = place_job(session, st, _jobs()[0])
    assert not isinstance(placed, str)
    assert current_key(session) == free_state_key(session.free) != before
    st.discard()
    assert current_key(session) == before
    with session.scratch(FreeState.empty(snap.arrays)):
        assert current_key(session) == free_state_key(session.free)


@pytest.mark.parametrize("policy", ["fifo", "las"])
def test_a_placement_read_back_for_another_job_names_that_jobs_task_groups(policy: str) -> None:
    """Two jobs of one shape whose task groups are named differently: the second, placed on
    the free state the first was placed on, gets bindings naming its own groups (the live
    service starts each task from the group its binding names)."""
    c, pol = _cluster(), preset(policy)
    arrays = snapshot_of(c).arrays
    first = job("first").task(2, gpu=2, name="trainer").task(1, cpu=2, name="ps").build()
    second = job("second").task(2, gpu=2, name="worker").task(1, cpu=2, name="chief").build()
    assert first.shape_id == second.shape_id
    got = {}
    for now, j in enumerate((first, second)):
        result = run_cycle(snapshot_of(arrays), pending(j), pol, float(now), validate=True)
        (bind,) = [d for d in result.decisions if isinstance(d, Bind)]
        got[j.id] = bind.tasks
    assert sorted((t.group, t.index) for t in got["second"]) == [
        ("chief", 0),
        ("worker", 0),
        ("worker", 1),
    ]
    # Placed where the first one was: the same nodes and GPUs, only the names are its own.
    assert [replace(t, group="") for t in got["second"]] == [
        replace(t, group="") for t in got["first"]
    ]
