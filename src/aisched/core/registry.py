"""Names of actions and plugins, as used in policy files, mapped to their classes.

Arguments in a policy entry become constructor keyword arguments; lists become tuples. A bad
name or argument is a PolicyError that names the entry's path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from aisched.core.actions.allocate import Allocate
from aisched.core.actions.backfill import Backfill
from aisched.core.actions.enqueue import Enqueue
from aisched.core.actions.eta import EstimateStart
from aisched.core.actions.preempt import Preempt, Reclaim
from aisched.core.errors import PolicyError
from aisched.core.framework import WeightedScore
from aisched.core.plugins import fragmentation, hetero, order, packing, roles, score, victims

REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {
    "action": {
        "enqueue": Enqueue,
        "allocate": Allocate,
        "preempt": Preempt,
        "reclaim": Reclaim,
        "backfill": Backfill,
        "eta": EstimateStart,
    },
    "order": {
        "fifo": order.Fifo,
        "priority": order.Priority,
        "las": order.Las,
        "sjf": order.ShortestFirst,
        "qssf": order.PredictedGpuTime,
        "drf": order.DominantResourceFairness,
    },
    "score": {
        "binpack": score.BinPack,
        "spread": score.Spread,
        "topology": score.TopologyLocality,
        "fgd": fragmentation.Fragmentation,
        "bestfit": packing.BestFit,
        "worstfit": packing.WorstFit,
        "dotprod": packing.DotProduct,
        "random": packing.RandomFit,
        "hetero": hetero.Heterogeneity,
        "gpu-preference": hetero.PreferredModel,
    },
    "filter": {"node-role": roles.NodeRole},
    "victims": {
        "lowest-priority": victims.LowestPriority,
        "least-work-lost": victims.LeastWorkLost,
        "newest": victims.Newest,
        "longest-remaining": victims.LongestRemaining,
    },
}


def names(kind: str) -> tuple[str, ...]:
    return tuple(sorted(REGISTRY[kind]))


def _split(entry: Any, path: str) -> tuple[str, dict[str, Any]]:
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, Mapping):
        if "name" not in entry or not isinstance(entry["name"], str):
            raise PolicyError(f"policy.{path}.name: required (a plugin name)")
        args = {k: v for k, v in entry.items() if k != "name"}
        return entry["name"], args
    raise PolicyError(f"policy.{path}: expected a name or a mapping with 'name'")


def make(kind: str, entry: Any, path: str) -> Any:
    name, args = _split(entry, path)
    return _construct(kind, name, args, path)


# Scores are each normalised to 0-100 and weighed against each other: at a million to one the
# lesser only breaks ties, and a weight far past that would overflow the weighted sum.
MAX_SCORE_WEIGHT = 1e6


def make_score(entry: Any, path: str) -> WeightedScore:
    name, args = _split(entry, path)
    weight = args.pop("weight", 1.0)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not 0 <= weight <= MAX_SCORE_WEIGHT
    ):
        raise PolicyError(
            f"policy.{path}.weight: expected a number from 0 to {MAX_SCORE_WEIGHT:,.0f}, "
            f"got {weight!r}"
        )
    return WeightedScore(_construct("score", name, args, path), float(weight))


def _construct(kind: str, name: str, args: dict[str, Any], path: str) -> Any:
    table = REGISTRY[kind]
    cls = table.get(name)
    if cls is None:
        raise PolicyError(
            f"policy.{path}: unknown {kind} {name!r}; known: {', '.join(sorted(table)) or 'none'}"
        )
    # Fields a plugin derives itself (init=False) are not arguments.
    fields = (
        {f.name: f for f in dataclasses.fields(cls) if f.init}
        if dataclasses.is_dataclass(cls)
        else {}
    )
    for key, value in args.items():
        f = fields.get(key)
        if f is None or key == "name":
            allowed = ", ".join(k for k in fields if k != "name") or "none"
            raise PolicyError(f"policy.{path}.{key}: unknown argument; allowed: {allowed}")
        if isinstance(value, list):
            args[key] = tuple(value)
        default = f.default
        if default is not dataclasses.MISSING and not _same_kind(default, args[key]):
            raise PolicyError(
                f"policy.{path}.{key}: expected {type(default).__name__}, got {args[key]!r}"
            )
    try:
        return cls(**args)
    except (TypeError, ValueError) as e:
        raise PolicyError(f"policy.{path}: {e}") from None


def _same_kind(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, int):
        # A count or a seed: 1.5 reservations or seed 0.5 would reach the cycle, which counts
        # and hashes with them (a TypeError every cycle).
        return isinstance(value, int)
    if isinstance(default, float):
        return isinstance(value, int | float)
    if default is None:
        return True
    return isinstance(value, type(default))
