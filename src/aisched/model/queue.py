"""Hierarchical queues: weight, guarantee, limit and whether a queue may borrow.

A queue's usage includes its descendants'. `guarantee` is capacity the queue gets back (by
reclaim) when it needs it, for its own jobs and those of the queues under it; above its
guarantee a queue may borrow idle capacity if `borrowing` is on, and what it borrowed can be
reclaimed. `limit` is a hard ceiling (None: no ceiling).
`user_limit` is a ceiling per user: what the running jobs of one user in the queue (and the
queues under it) may hold together, as Slurm's QOS MaxTRESPerUser (None: no ceiling).

A limit caps the resources it names and no other: `{gpus: 0}` keeps a queue off GPUs and
leaves its CPUs and memory free. `Resources` cannot tell a 0 named from one left out, so the
resources named are kept beside it (`limit_named`); a guarantee guarantees what is above 0 in it.

Invariants, refused by `QueueTree` with the queue and the field named: no limit below its
queue's guarantee (the queue could never get what it is guaranteed), and no `borrowing: false`
without a guarantee (such a queue could run nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aisched.model.resources import DIM_NAMES, Dim, Resources, describe_mib

ROOT_QUEUE = "root"
TOPS = (None, ROOT_QUEUE)  # the parent of a top-level queue, unnamed or named
DEFAULT_QUEUE = "default"


@dataclass(frozen=True, slots=True)
class Queue:
    name: str
    parent: str | None = ROOT_QUEUE
    weight: float = 1.0
    guarantee: Resources = field(default_factory=Resources)
    limit: Resources | None = None
    borrowing: bool = True
    user_limit: Resources | None = None
    # The resources `limit` and `user_limit` name, a 0 among them (none of it may be used).
    # None: those above 0 in it, for a queue built in code (`Resources` has no "not named").
    limit_named: frozenset[Dim] | None = None
    user_limit_named: frozenset[Dim] | None = None

    def limit_caps(self) -> frozenset[Dim]:
        """The resources `limit` caps (none without one)."""
        return _named(self.limit, self.limit_named)

    def user_limit_caps(self) -> frozenset[Dim]:
        """The resources `user_limit` caps (none without one)."""
        return _named(self.user_limit, self.user_limit_named)

    def guarantees(self) -> frozenset[Dim]:
        """The resources `guarantee` holds some of (with `borrowing: false`, its caps)."""
        return _named(self.guarantee, None)


@dataclass(frozen=True, slots=True)
class QueueTree:
    """All queues by name. The root is implicit; a job's unknown queue is an input error."""

    queues: tuple[Queue, ...] = (Queue(DEFAULT_QUEUE),)
    _by_name: dict[str, Queue] = field(init=False, repr=False, compare=False)
    _paths: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    ungoverned: frozenset[str] = field(init=False, repr=False, compare=False)
    # Queues with a `user_limit`: the usage per user is kept for these along each path.
    user_limited: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = {q.name for q in self.queues}
        if len(names) != len(self.queues):
            raise ValueError("queue names must be unique")
        object.__setattr__(self, "_by_name", {q.name: q for q in self.queues})
        object.__setattr__(self, "_paths", {})
        if ROOT_QUEUE in names:
            raise ValueError(f"queue name {ROOT_QUEUE!r} is reserved for the implicit root")
        for q in self.queues:
            if q.parent not in (None, ROOT_QUEUE) and q.parent not in names:
                raise ValueError(f"queue {q.name}: parent {q.parent!r} is not a queue")
            if q.weight <= 0:
                raise ValueError(f"queue {q.name}: weight must be positive")
            _check_caps(q)
        for q in self.queues:  # reject cycles
            seen = {q.name}
            p = q.parent
            while p not in (None, ROOT_QUEUE):
                if p in seen:
                    raise ValueError(f"queue {q.name}: parent chain has a cycle")
                seen.add(p)
                p = self.get(p).parent
        # With a guarantee on a top-level queue, a job that may not be evicted is held off
        # the others' (core.queues.holds_others_guarantee): every queue's jobs are checked.
        guaranteed = any(q.guarantee != Resources() for q in self.queues if q.parent in TOPS)
        object.__setattr__(
            self,
            "ungoverned",
            frozenset(
                q.name
                for q in self.queues
                if not guaranteed and all(_unlimited(self.get(n)) for n in self.path(q.name))
            ),
        )
        object.__setattr__(
            self, "user_limited", frozenset(q.name for q in self.queues if q.user_limit is not None)
        )

    def get(self, name: str) -> Queue:
        return self._by_name[name]

    def has(self, name: str) -> bool:
        return name in self._by_name

    def weight_of(self, name: str) -> float:
        """`name`'s weight (1 for a queue not in the tree)."""
        q = self._by_name.get(name)
        return q.weight if q is not None else 1.0

    def path(self, name: str) -> tuple[str, ...]:
        """Queue names from the top level down to `name` (the root left out). An
        `ungoverned` queue has no limit (nor user limit) and allows borrowing all the way up
        its path."""
        hit = self._paths.get(name)
        if hit is not None:
            return hit
        out: list[str] = []
        cur: str | None = name
        while cur not in (None, ROOT_QUEUE):
            out.append(cur)
            cur = self.get(cur).parent
        path = tuple(reversed(out))
        self._paths[name] = path
        return path

    def children(self, name: str | None) -> tuple[Queue, ...]:
        parent = name or ROOT_QUEUE
        return tuple(q for q in self.queues if (q.parent or ROOT_QUEUE) == parent)

    def guarantees_beyond(self, capacity: Resources) -> list[str]:
        """Per resource, a warning where the top-level queues' guarantees add up to more than
        `capacity` (the cluster's now): reclaim cannot give every queue its guarantee at
        once. Not refused: a cluster that autoscales, or is overcommitted on purpose, may be
        configured so."""
        total = Resources()
        for q in self.children(None):
            total = total.plus(q.guarantee)
        have = capacity.per_dim()
        return [
            f"the top-level queues' guarantees add up to {_written(d, total.per_dim()[d])} "
            f"{DIM_NAMES[d]}, more than the cluster's {_written(d, have[d])} now: reclaim cannot "
            "give every queue its guarantee at once"
            for d in Dim
            if total.per_dim()[d] > have[d]
        ]


# How a config file names each resource (its amounts: `_written`).
_KEYS = {Dim.CPU: "cpus", Dim.MEMORY: "mem", Dim.GPU: "gpus"}


def _named(cap: Resources | None, named: frozenset[Dim] | None) -> frozenset[Dim]:
    """The resources `cap` governs: those `named`, else those above 0 in it."""
    if cap is None:
        return frozenset()
    if named is not None:
        return named
    return frozenset(d for d in Dim if cap.per_dim()[d] > 0)


def _written(dim: Dim, amount: int) -> str:
    """`amount` of `dim` as a config file writes it (`2`, `0.5`, `64 GiB`)."""
    return describe_mib(amount) if dim == Dim.MEMORY else f"{amount / 1000:g}"


def _check_caps(q: Queue) -> None:
    """Refuse caps that contradict the guarantee: a limit below it, or `borrowing: false`
    (capped at the guarantee) with none, which would let the queue run nothing at all."""
    if not q.borrowing and not q.guarantees():
        raise ValueError(
            f"queue {q.name}: borrowing: false keeps it within its guarantee, and it has none, "
            "so it could run nothing; give it a guarantee, or cap it with a limit instead "
            "(limit: {gpus: 0} keeps it off GPUs)"
        )
    if q.limit is None:
        return
    guarantee, limit = q.guarantee.per_dim(), q.limit.per_dim()
    for d in sorted(q.limit_caps()):
        if limit[d] < guarantee[d]:
            key = _KEYS[d]
            raise ValueError(
                f"queue {q.name}: limit.{key} ({_written(d, limit[d])}) is below "
                f"guarantee.{key} ({_written(d, guarantee[d])}): the queue could never hold "
                "what it is guaranteed"
            )


def _unlimited(q: Queue) -> bool:
    """True when nothing caps what `q` holds: no limit, no user limit, and it may borrow."""
    return q.limit is None and q.user_limit is None and q.borrowing
