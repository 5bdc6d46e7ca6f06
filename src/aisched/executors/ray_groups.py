"""Removing Ray placement groups without leaking what a node prepared for them.

Ray leaks the resources a node has prepared for a placement group that is removed while its
placement is in flight, between the prepare and the commit of its bundles (ray-project/ray
issue 64693, open for Ray 2.60): the node holds them for ever, in no group, and no sweep can
find them. A gang's rest, re-reserved when one of its tasks ended, is such a group when the
rest ends a moment later; so is a gang cancelled as it is being placed.

So a group is removed at once only when Ray says it is placed (or gone). Any other is removed
once it is placed, or after `SETTLE_S`: a group still not placed by then waits in Ray's queue
for room, and placing is attempted only when room frees up, a far narrower window. Those
waits are checked by the executor's watcher (`step`), so no caller blocks on them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group_table

log = logging.getLogger(__name__)

NODE_ID_LABEL = "ray.io/node-id"
# Placing a group takes Ray milliseconds (one prepare and one commit call per node); a group
# not placed after this long is queued for room rather than being placed.
SETTLE_S = 2.0


def reserve(name: str, bundles: list[dict[str, float]], node_ids: list[str]) -> PlacementGroup:
    """A detached placement group of `bundles`, each held to its node."""
    group: PlacementGroup = ray.util.placement_group(
        bundles,
        strategy="PACK",
        name=name,
        lifetime="detached",
        bundle_label_selector=[{NODE_ID_LABEL: n} for n in node_ids],
    )
    return group


def group_state(group: PlacementGroup) -> str:
    """Ray's state of `group`: PENDING, PREPARED, CREATED, REMOVED or RESCHEDULING; REMOVED
    for one Ray does not know."""
    try:
        return str(placement_group_table(group).get("state") or "REMOVED")
    except Exception as e:  # the GCS does not answer: treated as not placed, checked again
        log.debug("placement group state: %s", e)
        return "PENDING"


def remove_now(group: PlacementGroup) -> None:
    try:
        ray.util.remove_placement_group(group)
    except Exception as e:  # already removed
        log.debug("remove placement group: %s", e)


@dataclass
class _Waiting:
    group: PlacementGroup
    deadline: float


class GroupRemovals:
    """Placement groups to remove, each once Ray has placed it or at its deadline."""

    def __init__(
        self, settle_s: float = SETTLE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settle_s = settle_s
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: list[_Waiting] = []

    def remove(self, group: PlacementGroup) -> None:
        """Removes `group` now when it is placed, else leaves it to `step`."""
        state = group_state(group)
        if state == "CREATED":
            remove_now(group)
        elif state != "REMOVED":
            with self._lock:
                self._waiting.append(_Waiting(group, self._clock() + self._settle_s))

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def step(self) -> None:
        """Removes the waiting groups that are placed now or past their deadline."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
        later = []
        for w in waiting:
            if self._clock() >= w.deadline or group_state(w.group) in ("CREATED", "REMOVED"):
                remove_now(w.group)
            else:
                later.append(w)
        with self._lock:
            self._waiting[:0] = later

    def drain(self, poll_s: float = 0.05) -> None:
        """Removes every waiting group, each by its deadline at the latest (at close)."""
        while self.waiting():
            self.step()
            if self.waiting():
                time.sleep(poll_s)
