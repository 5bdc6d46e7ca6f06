"""Hierarchical queues: weight, guarantee, limit and whether a queue may borrow.

A queue's usage includes its descendants'. `guarantee` is capacity the queue gets back (by
reclaim) when it needs it; above its guarantee a queue may borrow idle capacity if `borrowing`
is on, and what it borrowed can be reclaimed. `limit` is a hard ceiling (None: no ceiling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aisched.model.resources import Resources

ROOT_QUEUE = "root"
DEFAULT_QUEUE = "default"


@dataclass(frozen=True, slots=True)
class Queue:
    name: str
    parent: str | None = ROOT_QUEUE
    weight: float = 1.0
    guarantee: Resources = field(default_factory=Resources)
    limit: Resources | None = None
    borrowing: bool = True


@dataclass(frozen=True, slots=True)
class QueueTree:
    """All queues by name. The root is implicit; a job's unknown queue is an input error."""

    queues: tuple[Queue, ...] = (Queue(DEFAULT_QUEUE),)

    def __post_init__(self) -> None:
        names = {q.name for q in self.queues}
        if ROOT_QUEUE in names:
            raise ValueError(f"queue name {ROOT_QUEUE!r} is reserved for the implicit root")
        for q in self.queues:
            if q.parent not in (None, ROOT_QUEUE) and q.parent not in names:
                raise ValueError(f"queue {q.name}: parent {q.parent!r} is not a queue")
            if q.weight <= 0:
                raise ValueError(f"queue {q.name}: weight must be positive")
        for q in self.queues:  # reject cycles
            seen = {q.name}
            p = q.parent
            while p not in (None, ROOT_QUEUE):
                if p in seen:
                    raise ValueError(f"queue {q.name}: parent chain has a cycle")
                seen.add(p)
                p = self.get(p).parent

    def get(self, name: str) -> Queue:
        for q in self.queues:
            if q.name == name:
                return q
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(q.name == name for q in self.queues)

    def path(self, name: str) -> tuple[str, ...]:
        """Queue names from the top level down to `name` (the root left out)."""
        out: list[str] = []
        cur: str | None = name
        while cur not in (None, ROOT_QUEUE):
            out.append(cur)
            cur = self.get(cur).parent
        return tuple(reversed(out))

    def children(self, name: str | None) -> tuple[Queue, ...]:
        parent = name or ROOT_QUEUE
        return tuple(q for q in self.queues if (q.parent or ROOT_QUEUE) == parent)
