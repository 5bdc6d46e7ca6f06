"""Placement scores are each normalised to 0-100 over the nodes and then weighed: a plugin's
argument at the edge of the float range must not overflow that into inf (which hides every
other score) or NaN (which `argmax` takes for the best node)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aisched.core.framework import WeightedScore, combined_score
from aisched.core.policy import build_policy
from aisched.core.session import Session
from aisched.core.snapshot import FloatArray, IntArray, snapshot_of
from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE, Resources
from aisched.testing import cluster, job, node


def test_a_huge_gpu_speed_leaves_the_other_scores_to_choose_among_the_fast_nodes() -> None:
    policy = build_policy(
        {
            "actions": ["enqueue", "allocate"],
            "order": ["fifo"],
            "score": [
                {"name": "hetero", "speeds": {"A100": 1e308, "T4": 0.5}, "weight": 2},
                {"name": "binpack", "weight": 1},
            ],
        }
    )
    nodes = [node("a-t4").gpus(8, "T4"), node("b-a100").gpus(8, "A100")]
    session = Session(snapshot_of(cluster(*nodes, node("c-a100").gpus(8, "A100"))), policy, 0, ())
    session.free.gpu_total[2] -= 6 * GPU_MILLI_WHOLE  # c-a100 is the fuller of the fast nodes
    long_job = job("long").task(1, gpu=4).estimate(36000).build()
    at = np.arange(3, dtype=np.int64)
    scores = combined_score(policy.scores, session, long_job, long_job.groups[0].request, at)
    assert np.isfinite(scores).all()
    assert int(np.argmax(scores)) == 2


@dataclass(frozen=True)
class Extremes:
    """A score plugin whose raw scores span the whole float range."""

    name: str = "extremes"

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        return np.array([-1.7e308, 0.0, 1.7e308])[nodes]


def test_scores_spanning_the_float_range_are_normalised_not_nan() -> None:
    policy = build_policy({"actions": ["enqueue", "allocate"], "order": ["fifo"]})
    session = Session(
        snapshot_of(cluster(*(node(f"n{i}").gpus(1) for i in range(3)))), policy, 0, ()
    )
    j = job("j").task(1, gpu=1).build()
    at = np.arange(3, dtype=np.int64)
    scores = combined_score([WeightedScore(Extremes(), 1e6)], session, j, j.groups[0].request, at)
    assert scores.tolist() == [0.0, 5e7, 1e8]
