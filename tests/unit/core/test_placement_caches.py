"""What placement keeps between placements: fit counts and per-domain sums updated on the
nodes a take or give changed must equal the same figures computed afresh; the bounded sample of
scored nodes places as much as scoring every node would, and is the same on every run."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

import aisched.core.snapshot as snapshot_mod
from aisched.core import placement
from aisched.core.cycle import run_cycle
from aisched.core.decisions import TaskBinding
from aisched.core.policy import PolicyError, build_policy, preset
from aisched.core.session import Session
from aisched.core.snapshot import FreeState, snapshot_of
from aisched.core.statement import Statement
from aisched.model.cluster import TopologyLevel
from aisched.model.resources import Resources
from aisched.testing import cluster, job, node

REQUESTS = (
    Resources(milli_cpu=4000, mem_mib=8192, gpu=1),
    Resources(milli_cpu=16000, mem_mib=65536, gpu=4),
    Resources(milli_cpu=1000, mem_mib=1024, gpu_milli=250),
    Resources(milli_cpu=2000, mem_mib=2048),
)


def _session(nodes: int = 24) -> Session:
    c = cluster(
        *(node(f"n{i:02d}").gpus(4 if i % 3 else 8).rack(f"r{i // 4}") for i in range(nodes))
    )
    return Session(snapshot_of(c), preset("fifo"), 0.0, ())


def _fresh(session: Session, req: Resources) -> list[int]:
    return placement._fit(session.arrays, session.free, req, (), None).tolist()  # type: ignore[no-any-return]


@pytest.mark.parametrize("log_limit", [4096, 5])
def test_kept_fit_counts_and_domain_sums_equal_fresh_ones(
    monkeypatch: pytest.MonkeyPatch, log_limit: int
) -> None:
    """Random takes and gives (and a rolled-back statement, and a scratch free state), with
    the change log starting new generations often or never."""
    monkeypatch.setattr(snapshot_mod, "CHANGE_LOG_LIMIT", log_limit)
    s = _session()
    rng = random.Random(1)
    held: list[tuple[int, TaskBinding]] = []
    for step in range(300):
        req = rng.choice(REQUESTS)
        counts = placement.fit_counts(s, req)
        nodes = np.flatnonzero(counts)
        if len(nodes) and (not held or rng.random() < 0.6):
            n = int(rng.choice(nodes))
            gpus, milli = placement.pick_gpus(s.free, s, n, req)
            t = TaskBinding("g", 0, s.arrays.names[n], gpus, milli, req.milli_cpu, req.mem_mib)
            st = Statement(s)
            st.take(n, t)
            if rng.random() < 0.2:
                st.discard()
            else:
                st.commit()
                held.append((n, t))
        elif held:
            n, t = held.pop(rng.randrange(len(held)))
            s.free.give(n, t)
        if step % 50 == 25:
            with s.scratch(FreeState.empty(s.arrays)):
                assert placement.fit_counts(s, req).tolist() == _fresh(s, req)
        for r in REQUESTS:
            assert placement.fit_counts(s, r).tolist() == _fresh(s, r)
        rack = s.arrays.domain(TopologyLevel.RACK)
        want_gpu = np.bincount(rack, weights=s.free.gpu_total).astype(np.int64).tolist()
        got_gpu = placement._domain_sums(
            s, TopologyLevel.RACK, ("free-gpu",), lambda idx: placement._at(s.free.gpu_total, idx)
        )
        assert got_gpu.tolist() == want_gpu


def test_kept_fit_counts_cannot_be_written() -> None:
    s = _session()
    counts = placement.fit_counts(s, REQUESTS[0])
    with pytest.raises(ValueError, match="read-only"):
        counts[0] = 0


def _cycle(nodes: int, sample: int, seed: int) -> tuple[int, tuple[object, ...]]:
    c = cluster(*(node(f"n{i:03d}").gpus(8).rack(f"r{i // 8}") for i in range(nodes)))
    rng = random.Random(seed)
    pending = [
        job(f"j{i:03d}").gang(rng.choice((1, 1, 1, 2)), gpu=rng.choice((1, 2, 4, 8)))
        .submitted(float(i)).pending()
        for i in range(nodes)
    ]  # fmt: skip
    policy = replace(preset("fifo"), node_sample=sample)
    res = run_cycle(snapshot_of(c), pending, policy, now=0.0, validate=True)
    return res.stats.placed, res.decisions


def test_a_sample_places_what_scoring_every_node_places_when_room_is_plenty() -> None:
    placed_all, _ = _cycle(200, 0, seed=3)
    placed_sample, decisions = _cycle(200, 16, seed=3)
    assert placed_sample == placed_all > 150
    assert _cycle(200, 16, seed=3)[1] == decisions  # same input, same sample, same decisions


def test_the_sample_is_used_from_the_automatic_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """node_sample unset: every node is scored below AUTO_SAMPLE_FROM_NODES nodes, a sample
    from there on; the decisions tell which happened."""
    exhaustive, sampled = _cycle(120, 0, seed=5)[1], _cycle(120, 8, seed=5)[1]
    assert exhaustive != sampled
    auto = replace(preset("fifo"), node_sample=None)
    c = cluster(*(node(f"n{i:03d}").gpus(8).rack(f"r{i // 8}") for i in range(120)))
    rng = random.Random(5)
    pending = [
        job(f"j{i:03d}").gang(rng.choice((1, 1, 1, 2)), gpu=rng.choice((1, 2, 4, 8)))
        .submitted(float(i)).pending()
        for i in range(120)
    ]  # fmt: skip
    assert run_cycle(snapshot_of(c), pending, auto, now=0.0).decisions == exhaustive
    monkeypatch.setattr(placement, "AUTO_SAMPLE_FROM_NODES", 100)
    monkeypatch.setattr(placement, "AUTO_SAMPLE", 8)
    assert run_cycle(snapshot_of(c), pending, auto, now=0.0).decisions == sampled


@pytest.mark.parametrize("bad", [-1, 3, 2.5, True, "many"])
def test_a_bad_node_sample_is_refused(bad: object) -> None:
    with pytest.raises(PolicyError, match=r"policy\.node_sample: expected 0"):
        build_policy({"actions": ["enqueue", "allocate"], "node_sample": bad})


def test_a_gang_with_no_room_anywhere_fails_at_once_for_the_reason_the_tries_end_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random gangs on a random partly used cluster: with the check of the whole cluster's room
    first, every placement (and every reason of a failure) is what trying one node, then one
    rack, then one zone, then the cluster gives."""
    rng = random.Random(7)
    checked = 0
    for _ in range(60):
        s = _session()
        for n in range(24):  # some nodes partly used
            for _ in range(rng.randrange(3)):
                req = Resources(milli_cpu=1000, mem_mib=1024, gpu=1)
                if placement.fit_counts(s, req)[n] > 0:
                    gpus, milli = placement.pick_gpus(s.free, s, n, req)
                    s.free.take(n, TaskBinding("g", 0, s.arrays.names[n], gpus, milli, 1000, 1024))
        gang = job("j").gang(rng.randrange(2, 9), gpu=rng.choice([1, 2, 4, 8])).build()
        results = []
        for shortcut in (True, False):
            with monkeypatch.context() as m:
                if not shortcut:
                    m.setattr(placement, "_short_everywhere", lambda session, job, allowed: None)
                s.fail_cache.clear()  # a failure is cached per shape: try afresh each time
                st = Statement(s)
                results.append(placement.place_job(s, st, gang))
                st.discard()
        assert results[0] == results[1]
        checked += isinstance(results[0], str)
    assert checked > 5
