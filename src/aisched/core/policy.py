"""A scheduling policy: which actions run, in which order, with which plugins.

Built from a plain mapping (parsed from YAML at the edge) by `build_policy`, which checks every
name and argument and reports problems with their path (`actions[2].by: ...`). The named
presets are mappings too, so a preset and a file mean the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from aisched.core import registry
from aisched.core.actions.eta import EstimateStart
from aisched.core.errors import PolicyError
from aisched.core.framework import ChooseGpu, Filter, JobOrder, SelectVictims, WeightedScore

if TYPE_CHECKING:
    from aisched.core.session import Session


class Action(Protocol):
    """One step of the cycle. Called once per cycle, in policy order; may change the session
    (place, preempt, reserve) only through statements and the session's record methods."""

    name: str

    def execute(self, session: Session) -> None: ...


__all__ = ["ALLOWED_KEYS", "PRESETS", "Action", "Policy", "PolicyError", "build_policy", "preset"]


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    actions: tuple[Action, ...]
    order: tuple[JobOrder, ...]
    scores: tuple[WeightedScore, ...]
    filters: tuple[Filter, ...] = ()
    victims: tuple[SelectVictims, ...] = ()
    queue_depth: int | None = None
    # Feasible nodes scored per task group: None is automatic (a sample only on large
    # clusters, `placement.AUTO_SAMPLE_FROM_NODES`), 0 scores every node.
    node_sample: int | None = None

    # Constants of the policy, derived once here: the hot path asks them per pending job.
    fair_users: bool = field(init=False, repr=False, compare=False)
    """drf in the job order: interleave a queue's users by dominant share."""
    strict_order: bool = field(init=False, repr=False, compare=False)
    """With backfill configured, allocate stops at the first job that does not fit and leaves
    the rest to backfill, so that job's reservation is honoured."""
    per_job_placement: bool = field(init=False, repr=False, compare=False)
    """A score draws per job (`random`), not per shape: two jobs of one shape may be placed
    differently, so what placement learns is kept per job (`placement.placement_shape`)."""
    locality: bool = field(init=False, repr=False, compare=False)
    """The topology score is on: gangs try one node, then one rack, then one zone."""
    gpu_chooser: ChooseGpu | None = field(init=False, repr=False, compare=False)
    """The first score that also picks a shared task's GPU on its node, if any."""
    allocate_last: bool = field(init=False, repr=False, compare=False)
    """No action runs after allocate, so nothing reads the jobs it leaves blocked."""

    def __post_init__(self) -> None:
        chooser = next((ws.plugin for ws in self.scores if hasattr(ws.plugin, "choose_gpu")), None)
        derived = {
            "fair_users": any(o.name == "drf" for o in self.order),
            # With backfill configured, allocate stops at the first job that does not fit and
            # leaves the rest to backfill, so that job's reservation is honoured; with a strict
            # allocate (`fifo-strict`) it stops there too and the rest wait.
            "strict_order": any(
                a.name == "backfill" or (a.name == "allocate" and getattr(a, "strict", False))
                for a in self.actions
            ),
            "per_job_placement": any(getattr(ws.plugin, "per_job", False) for ws in self.scores),
            "locality": any(ws.plugin.name == "topology" for ws in self.scores),
            "gpu_chooser": chooser,
            "allocate_last": bool(self.actions) and self.actions[-1].name == "allocate",
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def action_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.actions)


# gpu-preference scores alike every node for a job without preferred models, so it changes
# nothing unless a job names some.
_BASE_SCORE: list[Any] = ["binpack", "topology", "gpu-preference"]
_VICTIMS: list[Any] = ["lowest-priority", "least-work-lost", "newest"]
# Filters of a policy that names none: node-role restricts nothing on a cluster without roles.
DEFAULT_FILTERS: list[Any] = ["node-role"]

PRESETS: dict[str, dict[str, Any]] = {
    "fifo": {
        "actions": ["enqueue", "allocate"],
        "order": ["fifo"],
        "score": _BASE_SCORE,
    },
    # First come, first served in the strict sense of Tiresias' and Helios' FIFO baseline: the
    # first job that does not fit blocks every later one. `fifo` is fit-first: later jobs that
    # fit start past a blocked one.
    "fifo-strict": {
        "actions": ["enqueue", {"name": "allocate", "strict": True}],
        "order": ["fifo"],
        "score": _BASE_SCORE,
    },
    "fifo-backfill": {
        "actions": ["enqueue", "allocate", {"name": "backfill", "reservations": 1}],
        "order": ["fifo"],
        "score": _BASE_SCORE,
    },
    "priority": {
        "actions": ["enqueue", "allocate", {"name": "preempt", "by": "priority"}, "reclaim"],
        "order": ["priority", "fifo"],
        "score": _BASE_SCORE,
        "victims": _VICTIMS,
    },
    "drf": {
        "actions": ["enqueue", "allocate", "reclaim"],
        "order": ["drf", "fifo"],
        "score": _BASE_SCORE,
        "victims": _VICTIMS,
    },
    "las": {
        "actions": [
            "enqueue",
            "allocate",
            {"name": "preempt", "by": "order", "scope": "cluster"},
        ],
        "order": [{"name": "las", "thresholds_gpu_s": [3600, 36000]}, "fifo"],
        "score": _BASE_SCORE,
        "victims": ["least-work-lost", "newest"],
    },
    "sjf": {
        "actions": ["enqueue", "allocate"],
        "order": ["sjf", "fifo"],
        "score": _BASE_SCORE,
    },
    # Helios' QSSF order (shortest predicted GPU-time first), made preemptive: a waiting job
    # evicts running work whose predicted remaining GPU-time, less the work it would lose since
    # its checkpoint and the restart's cost, is over twice its own, both sides judged by their
    # upper estimate, once that work has run one checkpoint interval (an hour without one).
    # The tail: a job that has waited over twice the median wait of the queue, or over the
    # backlog's drain time (the GPU-time still to do over the cluster's GPUs: fifo's wait for a
    # job arriving now), is overdue and goes first, oldest first. A gang of 16 GPUs or more
    # that has waited 12 h goes to the head and holds a reservation that later jobs may use
    # only if their upper estimate ends before it starts. The overdue bars and the pure order
    # (no aging term) were chosen on the tuning week of bench_holdout.py only (tune_qssf.py);
    # docs/policies.md, "Preemptive qssf".
    "qssf": {
        "actions": [
            {
                "name": "enqueue",
                "starving_after_s": 43200,
                "starving_min_gpus": 16,
                "due_after_median_waits": 2.0,
                "due_after_backlog": 1.0,
                "backlog_bound": "waited",
            },
            "allocate",
            {
                "name": "preempt",
                "by": "order",
                "scope": "cluster",
                "bound": "upper",
                "factor": 2.0,
                "min_run_s": 3600,
                "min_run_checkpoints": 1,
                "count_lost_work": True,
                "restart_cost_s": 60,
            },
        ],
        "order": ["qssf", "fifo"],
        "score": _BASE_SCORE,
        "victims": ["longest-remaining", "least-work-lost"],
    },
    # The order without preemption, with EASY backfill: the blocked head always holds a
    # reservation.
    "qssf-backfill": {
        "actions": [
            {"name": "enqueue", "starving_after_s": 43200, "starving_min_gpus": 16},
            "allocate",
            {"name": "backfill", "reservations": 1},
        ],
        "order": ["qssf", "fifo"],
        "score": _BASE_SCORE,
    },
    # Bounds for comparison, only in the simulator (which gives them the true durations):
    # shortest GPU-time first without preemption, and shortest remaining GPU-time first.
    "sjf-oracle": {
        "actions": ["enqueue", "allocate"],
        "order": ["qssf", "fifo"],
        "score": _BASE_SCORE,
    },
    "srtf-oracle": {
        "actions": ["enqueue", "allocate", {"name": "preempt", "by": "order", "scope": "cluster"}],
        "order": ["qssf", "fifo"],
        "score": _BASE_SCORE,
        "victims": ["longest-remaining", "least-work-lost"],
    },
    "default": {
        "actions": [
            "enqueue",
            "allocate",
            {"name": "preempt", "by": "priority"},
            "reclaim",
            {"name": "backfill", "reservations": 1},
            "eta",
        ],
        "order": ["priority", "fifo"],
        "score": _BASE_SCORE,
        "victims": _VICTIMS,
    },
}

# Placement studies (the FGD paper's experiment): first come first served, no preemption, and
# one placement score, so that the score alone makes the difference.
PLACEMENT_SCORES = ("fgd", "bestfit", "worstfit", "dotprod", "random")
PRESETS.update(
    {
        name: {"actions": ["enqueue", "allocate"], "order": ["fifo"], "score": [name]}
        for name in PLACEMENT_SCORES
    }
)

# fifo that also weighs GPU models: preferred models first, and fast models for long or large
# jobs (the speed table of `model.gpu_speed`).
PRESETS["hetero"] = {
    "actions": ["enqueue", "allocate"],
    "order": ["fifo"],
    "score": [*_BASE_SCORE, {"name": "hetero", "weight": 2.0}],
}

ALLOWED_KEYS = (
    "name",
    "actions",
    "order",
    "score",
    "filters",
    "victims",
    "queue_depth",
    "node_sample",
)


def with_eta(policy: Policy) -> Policy:
    """The policy with the `eta` action last (unchanged if it has one): every waiting job's
    status then carries an estimated start time. Decisions are the same."""
    if "eta" in policy.action_names():
        return policy
    eta: Action = EstimateStart()  # type: ignore[assignment]  # frozen name, as every action
    return replace(policy, actions=(*policy.actions, eta))


def preset(name: str) -> Policy:
    if name not in PRESETS:
        raise PolicyError(
            f"unknown policy {name!r}; presets: {', '.join(sorted(PRESETS))} (or a YAML file)"
        )
    return build_policy(PRESETS[name], name=name)


def build_policy(config: Mapping[str, Any], name: str | None = None) -> Policy:
    if not isinstance(config, Mapping):
        raise PolicyError("policy: expected a mapping")
    unknown = sorted(set(config) - set(ALLOWED_KEYS))
    if unknown:
        raise PolicyError(f"policy: unknown key {unknown[0]!r}; allowed: {', '.join(ALLOWED_KEYS)}")
    actions = config.get("actions")
    if not actions:
        raise PolicyError("policy.actions: at least one action is required")
    depth = config.get("queue_depth")
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 1):
        raise PolicyError("policy.queue_depth: expected a positive integer")
    sample = config.get("node_sample")
    if sample is not None and (
        not isinstance(sample, int) or isinstance(sample, bool) or not (sample == 0 or sample >= 8)
    ):
        raise PolicyError("policy.node_sample: expected 0 (score every node) or an integer >= 8")
    scores = config.get("score", _BASE_SCORE)
    built = tuple(
        registry.make("action", e, f"actions[{i}]") for i, e in enumerate(_seq(actions, "actions"))
    )
    _check_once(built)
    return Policy(
        name=str(name or config.get("name") or "custom"),
        actions=built,
        order=tuple(
            registry.make("order", e, f"order[{i}]")
            for i, e in enumerate(_seq(config.get("order", ["fifo"]), "order"))
        ),
        scores=tuple(
            registry.make_score(e, f"score[{i}]") for i, e in enumerate(_seq(scores, "score"))
        ),
        filters=tuple(
            registry.make("filter", e, f"filters[{i}]")
            for i, e in enumerate(_seq(config.get("filters", DEFAULT_FILTERS), "filters"))
        ),
        victims=tuple(
            registry.make("victims", e, f"victims[{i}]")
            for i, e in enumerate(_seq(config.get("victims", _VICTIMS), "victims"))
        ),
        queue_depth=depth,
        node_sample=sample,
    )


def _check_once(actions: Sequence[Action]) -> None:
    """`enqueue` once (without it no job is ever let in: nothing ran, without a word), and
    `allocate` at most once (twice, the second bound what the first had: an error mid-run)."""
    names = [a.name for a in actions]
    for once in ("enqueue", "allocate"):
        if names.count(once) > 1:
            second = names.index(once, names.index(once) + 1)
            raise PolicyError(
                f"policy.actions[{second}]: {once} is listed twice; it runs once per cycle"
            )
    if "enqueue" not in names:
        raise PolicyError(
            "policy.actions: enqueue is missing: it lets the waiting jobs in each cycle, and "
            "without it no job is ever scheduled"
        )


def _seq(value: Any, path: str) -> Sequence[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise PolicyError(f"policy.{path}: expected a list")
    return value


def load_policy(spec: str | Mapping[str, Any]) -> Policy:
    """A preset by name, or a policy mapping. Files are read at the edge
    (`aisched.spec.policy.load_policy_file`), never here."""
    if isinstance(spec, str):
        return preset(spec)
    return build_policy(spec)
