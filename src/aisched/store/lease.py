"""The leader's lease and its fencing term, in the `leader` row of the shared database.

One row (id 1) says who schedules: `holder` (an instance's random id), `address` (its API),
`term` and `expires_at` (Unix seconds in the database's own clock, so that the instances'
clocks never have to agree). The rules, each one statement in one transaction:

1. Acquire: the row is locked (`FOR UPDATE`); when its lease has expired (or `force`, for a
   database that only one process can open), the caller takes it with `term + 1`.
2. Renew: `UPDATE ... WHERE holder = me AND term = mine`; no row updated means deposed.
3. Fence: every write transaction of a leader first locks the row in share mode (`FOR
   SHARE`) and compares the term with its own (`check_fence`). The lock is held to the
   commit, so a takeover (1) waits for every write under way and every later write of the old
   leader sees the new term and is refused: a deposed leader's late writes never land,
   whatever its clock or its pauses. Share mode, because the leader's own writes (the loop's,
   the API threads') must not wait for each other on this row; only a change of the row
   (a takeover, a renewal) waits for them, and they for it.
4. Resign: a leader that stops cleanly expires its own lease, so a standby need not wait.

SQLite renders no `FOR UPDATE`; there a single process holds the database (the data
directory's lock), so the row's lock is not needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, select, text, update

from aisched.store.errors import Deposed
from aisched.store.schema import leader


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str
    address: str
    term: int
    expires_at: float
    now: float  # the database's clock when the row was read

    @property
    def live(self) -> bool:
        return bool(self.holder) and self.expires_at > self.now


@dataclass(frozen=True, slots=True)
class Fence:
    """What a leader's writes carry: who it is and the term it was elected in."""

    holder: str
    term: int


def db_now(conn: Connection) -> float:
    """The database's clock, in Unix seconds."""
    if conn.dialect.name == "postgresql":
        got = conn.execute(text("SELECT EXTRACT(EPOCH FROM clock_timestamp())")).scalar()
    else:
        got = conn.execute(text("SELECT (julianday('now') - 2440587.5) * 86400.0")).scalar()
    return float(got or 0.0)


def read_lease(conn: Connection, *, lock: bool = False) -> Lease:
    q = select(leader.c.holder, leader.c.address, leader.c.term, leader.c.expires_at).where(
        leader.c.id == 1
    )
    row = conn.execute(q.with_for_update() if lock else q).one()
    return Lease(
        str(row.holder), str(row.address), int(row.term), float(row.expires_at), db_now(conn)
    )


def try_acquire(
    conn: Connection,
    holder: str,
    address: str,
    ttl_s: float,
    *,
    force: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Lease, Lease | None, float]:
    """Take the lease when it has expired (or `force`): (the lease as it was, the new one
    with term + 1, the time by `clock` at which the new one's term began at the latest), the
    new one None when another instance holds a live lease.

    The lease runs from the database's clock read once the row is locked, and that time by
    `clock` is taken between the two: a holder that counts its lease from it never counts
    past the lease's end, however long the lock was waited for (another instance's write, a
    paused server). Counted from before the wait, a new leader found its fresh lease nearly
    spent and stood down at once."""
    cur = read_lease(conn, lock=True)
    if cur.live and not force:
        return cur, None, clock()
    began = clock()
    now = db_now(conn)
    new = Lease(holder, address, cur.term + 1, now + ttl_s, now)
    conn.execute(
        update(leader)
        .where(leader.c.id == 1)
        .values(holder=holder, address=address, term=new.term, expires_at=new.expires_at)
    )
    return cur, new, began


def renew(conn: Connection, fence: Fence, ttl_s: float) -> bool:
    """Extend a lease still ours; False when it is not (deposed)."""
    now = db_now(conn)
    done = conn.execute(
        update(leader)
        .where(leader.c.id == 1, leader.c.holder == fence.holder, leader.c.term == fence.term)
        .values(expires_at=now + ttl_s)
    )
    return done.rowcount == 1


def resign(conn: Connection, fence: Fence) -> None:
    """Expire our lease now (a clean stop), if it is still ours."""
    conn.execute(
        update(leader)
        .where(leader.c.id == 1, leader.c.holder == fence.holder, leader.c.term == fence.term)
        .values(expires_at=0.0)
    )


def check_fence(conn: Connection, fence: Fence) -> None:
    """Refuse (Deposed) a write transaction of a leader whose term has moved on; otherwise the
    lease row stays share-locked until the transaction ends (see the module docstring, 3)."""
    q = select(leader.c.holder, leader.c.address, leader.c.term).where(leader.c.id == 1)
    cur = conn.execute(q.with_for_update(read=True)).one()  # FOR SHARE; no clock needed
    if cur.term != fence.term or cur.holder != fence.holder:
        raise Deposed(
            f"this instance was deposed: it led in term {fence.term}, and term {cur.term} "
            f"belongs to {cur.address or cur.holder or 'nobody'}; its write was refused"
        )
