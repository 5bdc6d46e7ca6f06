"""Extension points and the rules that combine their answers, written once.

- Job order: each `JobOrder` gives a key; jobs compare on the first key that differs, then on
  (priority desc, submit time, job id) so every ordering is total.
- Filters: every filter must pass; a filter answers with a mask over nodes.
- Scores: each `Score` gives raw values over the feasible nodes; the framework normalises each
  to 0–100 over those nodes and sums them with the configured weights.
- Victims: each `SelectVictims` gives a key; lower keys are evicted first; ties fall back to
  (priority asc, started latest first, job id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import inf
from typing import TYPE_CHECKING, Protocol

import numpy as np

from aisched.core.snapshot import BoolArray, FloatArray, IntArray, RunningJob
from aisched.model.job import Job
from aisched.model.resources import Resources

if TYPE_CHECKING:
    from aisched.core.session import Session


class JobOrder(Protocol):
    """Orders jobs. Called once per job per cycle (pending) and for running jobs when
    preemption compares by order. Must not change anything; lower keys go first."""

    name: str

    def key(self, job: Job, attained_gpu_s: float, estimate_s: float | None) -> float: ...


class Filter(Protocol):
    """Restricts the nodes one task of `job` may use. Called per task group per placement
    attempt; returns a mask (True = allowed) or None for no restriction. Must not mutate."""

    name: str

    def mask(self, session: Session, job: Job, request: Resources) -> BoolArray | None: ...


class Score(Protocol):
    """Rates feasible nodes for one task of `request`. `nodes` are indices of feasible nodes;
    returns one raw value per node there, higher is better. Must not mutate the session. A
    score may also have `uniform(job) -> bool`: true only when it would give `job` the same
    value on every node (the combined score then adds what equal values add, uncomputed)."""

    name: str

    def score(
        self, session: Session, job: Job, request: Resources, nodes: IntArray
    ) -> FloatArray: ...


class ChooseGpu(Protocol):
    """A score that also picks which GPU of a node a task sharing one GPU goes to (the first
    such score in the policy decides). Called once per shared-GPU task after its node is chosen;
    `candidates` are the GPU indices with room for it (never empty); returns one of them. Must
    not mutate. Without one, placement takes the fullest GPU that fits (best fit)."""

    name: str

    def choose_gpu(
        self, session: Session, job: Job, request: Resources, node: int, candidates: IntArray
    ) -> int: ...


class SelectVictims(Protocol):
    """Ranks running jobs as preemption victims; lower keys are evicted first. Called while a
    preemption is being simulated; must not mutate. A selector may also have
    `keys(running, now) -> list[float]`, the key of each job in one pass, which must equal
    `key` job for job (`victim_keys` uses it)."""

    name: str

    def key(self, running: RunningJob, now: float) -> float: ...


@dataclass(frozen=True, slots=True)
class WeightedScore:
    plugin: Score
    weight: float


def order_key(
    orders: Sequence[JobOrder], job: Job, attained_gpu_s: float, estimate_s: float | None
) -> tuple[float | str, ...]:
    """Plugin keys in policy order, then `job.tie_break` (priority desc, submit time, id)."""
    return (*(o.key(job, attained_gpu_s, estimate_s) for o in orders), *job.tie_break)


def combined_score(
    scores: Sequence[WeightedScore],
    session: Session,
    job: Job,
    request: Resources,
    nodes: IntArray,
) -> FloatArray:
    """Weighted sum of scores, each normalised to 0–100 over `nodes`."""
    total = np.zeros(len(nodes), dtype=np.float64)
    if len(nodes) == 0:
        return total
    for ws in scores:
        uniform = getattr(ws.plugin, "uniform", None)
        if uniform is not None and uniform(job):  # what equal raw scores add, uncomputed
            total += ws.weight * 100.0
            continue
        raw = ws.plugin.score(session, job, request, nodes)
        lo, hi = float(raw.min()), float(raw.max())
        if hi > lo:
            total += ws.weight * (100.0 * _share_of_span(raw, lo, hi))
        else:
            total += ws.weight * 100.0
    return total


def _share_of_span(raw: FloatArray, lo: float, hi: float) -> FloatArray:
    """(raw - lo) / (hi - lo), each in [0, 1], for any finite scores: a plugin's argument (a
    GPU speed of 1e308) can make the span overflow, and inf / inf is NaN, which `argmax`
    would take for the best node. Halved, the span of two floats is always finite."""
    if hi - lo < inf:
        return (raw - lo) / (hi - lo)
    return (raw / 2 - lo / 2) / (hi / 2 - lo / 2)


def all_filters(
    filters: Sequence[Filter], session: Session, job: Job, request: Resources
) -> BoolArray | None:
    mask: BoolArray | None = None
    for f in filters:
        m = f.mask(session, job, request)
        if m is not None:
            mask = m if mask is None else (mask & m)
    return mask


def victim_key(
    victims: Sequence[SelectVictims], running: RunningJob, now: float
) -> tuple[float | str, ...]:
    keys: list[float | str] = [v.key(running, now) for v in victims]
    keys += (running.job.priority, -running.started_s, running.job.id)
    return tuple(keys)


def victim_keys(
    victims: Sequence[SelectVictims], running: Sequence[RunningJob], now: float
) -> list[tuple[float | str, ...]]:
    """`victim_key` of each of `running`, in one pass per selector rather than one call
    chain per job (a preemption walk keys hundreds of running jobs at a time)."""
    columns: list[list[float] | list[int] | list[str]] = []
    for v in victims:
        keys = getattr(v, "keys", None)  # the same keys in one pass (plugins/victims.py)
        columns.append(keys(running, now) if keys is not None else [v.key(r, now) for r in running])
    columns.append([r.job.priority for r in running])
    columns.append([-r.started_s for r in running])
    columns.append([r.job.id for r in running])
    return list(zip(*columns, strict=True))
