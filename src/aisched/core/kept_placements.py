"""Placements kept from one cycle to the next, by the exact free state they were worked out on.

A cycle that follows an arrival or a demotion (no capacity given back) tries, in allocate and in
preemption's what-ifs, the very placements the cycle before tried on the very same free state;
under `las` and `srtf-oracle` on a Philly week nine placements in ten had been worked out
before. Where a placement's outcome is a function of the free state, the job's shape and the
policy alone, the outcome found once is the outcome every time, so it is kept and read back.

When that holds (`kept_placements` says; None otherwise): the cluster is small enough for a
copy of its free state to be a cheap key (`MAX_NODES`), placement is judged per shape (no
per-node cap counts running tasks, no score draws per job), every feasible node is scored (no
sample, whose window moves with earlier placements), and every score and filter of the policy
reads only the free state, the cluster's arrays and the job's shape (`PURE_SCORES`,
`PURE_FILTERS`). A placement limited to some nodes (`allowed`) is not kept: the same mask
name may stand for other nodes in another cycle.

Invariants:
- An entry is keyed by the free state's full content (every array, byte for byte), the job's
  shape, the score-relevant job fields not in the shape (preferred GPU models), the names of
  its task groups (which the bindings and reasons carry, and the shape leaves out) and the
  caller's mask key; its value is what `place_job` returned there: a reason, or the bindings.
  Read back, it is exactly what placing that job afresh on that state would return.
- At most `MAX_STATES` free states are kept, the least recently used dropped first, so memory
  stays bounded however long the run.
- Kept in the cluster arrays' memo, one per policy (held, so its id cannot be reused), like the
  core's other cross-cycle caches; new arrays (nodes joined or left) start empty. Pure: no
  clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, cast

from aisched.core.decisions import TaskBinding
from aisched.core.session import ShapeBy
from aisched.core.snapshot import FreeState

if TYPE_CHECKING:
    from aisched.core.policy import Policy
    from aisched.core.session import Session

# Free states kept; recent ones recur (the state before and after a what-if's victims go).
MAX_STATES = 256
# A key is a copy of the free state, O(nodes) to make and to keep: past this many nodes a key
# per change would cost more than the placement it saves (whose cost grows slower than the
# cluster, `placement.sample_size`), and MAX_STATES of them too much memory (here at most
# about 40 MB at 8 GPUs a node), so nothing is kept.
MAX_NODES = 1024
# Plugins whose answers depend on nothing but the free state, the cluster's arrays and the
# job's shape (and, for `gpu-preference`, its preferred models, which the key holds).
PURE_SCORES = frozenset({"binpack", "spread", "topology", "gpu-preference"})
PURE_FILTERS = frozenset({"node-role"})

Outcome = tuple[TaskBinding, ...] | str


def free_state_key(free: FreeState) -> bytes:
    """The free state's whole content as one bytes value (the derived `whole` and `gpu_total`
    follow from `gpu_milli`, so they add nothing)."""
    parts = (free.cpu, free.mem, free.gpu_milli, free.gpu_mem, free.rdma)
    return b"".join([a.tobytes() for a in parts])


def current_key(session: Session) -> bytes:
    """`free_state_key` of the session's free state, worked out again only after a change:
    every change is logged (`FreeState.changed`, a new generation when the log starts over),
    so an unchanged log length and generation of the same object mean the same content. A
    walk tries several shapes on one state, and what-ifs come back to it."""
    free = session.free
    hit = cast("tuple[FreeState, int, int, bytes] | None", session.memo.get("free-state-key"))
    if hit is not None:
        held, generation, length, key = hit
        if held is free and generation == free.generation and length == len(free.changed):
            return key
    key = free_state_key(free)
    session.memo["free-state-key"] = (free, free.generation, len(free.changed), key)
    return key


class KeptPlacements:
    """Outcomes of `place_job` per free state (least recently used dropped past MAX_STATES)."""

    __slots__ = ("policy", "_states", "_last")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy  # held: the memo slot is keyed by its id
        self._states: OrderedDict[bytes, dict[Hashable, Outcome]] = OrderedDict()
        # The state asked last (the very key object) and its table: most recently used
        # already, so asked again (a walk tries several shapes on one state) it is read as is.
        self._last: tuple[bytes, dict[Hashable, Outcome]] | None = None

    def outcomes(self, state: bytes) -> dict[Hashable, Outcome]:
        """The outcomes kept for this free state (a new, empty table for a state not kept);
        the caller reads and adds to it."""
        last = self._last
        if last is not None and last[0] is state:
            return last[1]
        table = self._outcomes(state)
        self._last = (state, table)
        return table

    def _outcomes(self, state: bytes) -> dict[Hashable, Outcome]:
        states = self._states
        table = states.get(state)
        if table is None:
            table = states[state] = {}
            if len(states) > MAX_STATES:
                states.popitem(last=False)
        else:
            states.move_to_end(state)
        return table

    def states(self) -> int:
        """How many free states are kept."""
        return len(self._states)


def kept_placements(session: Session, sampled: bool) -> KeptPlacements | None:
    """The cross-cycle table for this session's policy and cluster, or None when placement
    is not a function of the free state and the shape alone (see the module). `sampled`:
    placement scores a sample of the feasible nodes. Decided once per cycle."""
    memo = session.memo
    if "kept-placements" not in memo:
        memo["kept-placements"] = _table(session, sampled)
    return memo["kept-placements"]  # type: ignore[return-value]


def _table(session: Session, sampled: bool) -> KeptPlacements | None:
    policy = session.policy
    if session.shape_by is not ShapeBy.SHAPE or sampled:
        return None
    if session.arrays.num_nodes > MAX_NODES:
        return None
    if any(ws.plugin.name not in PURE_SCORES for ws in policy.scores):
        return None
    if any(f.name not in PURE_FILTERS for f in policy.filters):
        return None
    arrays_memo = session.arrays.memo
    slot = ("kept-placements", id(policy))
    kept = arrays_memo.get(slot)
    if not (isinstance(kept, KeptPlacements) and kept.policy is policy):
        kept = arrays_memo[slot] = KeptPlacements(policy)
    return kept
