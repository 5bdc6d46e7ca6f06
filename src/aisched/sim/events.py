"""The kinds of the simulator's events, in the order they are handled at one instant."""

from __future__ import annotations

# Event kinds, in the order they are handled at one instant: capacity is released (and nodes
# join) before new work is seen, the cycle sees everything that happened at its instant, and an
# idle node is only removed after that cycle had its chance to use it.
FINISH = 0
JOIN = 1
ARRIVE = 2
RETRY = 3  # a failed job's backoff is over: pending again, in that instant's cycle
DEMOTE = 4  # a running job's rank drops (2D-LAS: its attained service crossed a threshold)
CYCLE = 5
IDLE = 6
GROW = 7
