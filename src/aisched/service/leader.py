"""Who schedules: this instance's part in the leader election over the shared database.

Several `aisched up` instances may share one PostgreSQL database; the lease row
(`store.lease`) says which one leads. `Leadership` is this instance's side of it:

1. Start: on SQLite the instance leads at once (the data directory's lock already makes it the
   only one, so its writes need no fence; the term still moves on at each start). On
   PostgreSQL it tries once at start, and from then on a thread renews the lease every
   `renew_s` while it leads, or polls every `poll_s` while it stands by and takes the lease
   once it has expired (term + 1).
2. Elected: on a shared database the fence (holder, term) goes on the store before anything
   else, so that every write transaction from then on is checked against the lease row; then
   `on_elected` runs (recovery, the loop) in its own thread, so that a long recovery never
   delays a renewal.
3. Deposed: a renewal that finds the term moved on, or no renewal that succeeded for longer
   than the lease minus a margin (the database unreachable: a standby may be taking over),
   marks the store deposed (no write of this instance is tried again) and calls `on_deposed`
   once. A deposed instance never leads again in this process: it stops scheduling, and is
   restarted to stand by (`aisched up` exits with a line saying so, `then`).
   Starting as leader (recovery) that fails is a deposition too, unless the failure is the
   database's connection (lost, terminated, not answering: `step_errors.transient`): then
   nothing was scheduled yet, `on_given_back` forgets what the recovery had rebuilt, and the
   instance stands by again, letting its lease lapse, to try again once it is free.
   A standby that finds the database migrated past what this version reads (a newer aisched
   started beside it) never takes the lease: it stops, saying to upgrade it.
4. Stop: a leader that stops cleanly resigns (expires its lease) so a standby takes over at
   its next poll instead of after the lease.

The clock here is the monotonic one of this process; the lease's expiry is in the database's
clock, so the instances' clocks need not agree.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from aisched.service.step_errors import one_line, transient
from aisched.store.db import Store
from aisched.store.lease import Fence, Lease, read_lease, renew, resign, try_acquire
from aisched.store.migrate import newer_than_readable

log = logging.getLogger("aisched.leader")


# What a deposed instance's `aisched up` says became of it (`Leadership.then`): only a
# renewal or write that found the term moved on knows that another instance leads.
NEW_LEADER = "stopped (tasks go on under the new leader); start it again to stand by"
ADOPTED_LATER = (
    "stopped (tasks go on, for the next leader to adopt: a standby, if one can take over); "
    "start it again to stand by"
)
UPGRADE = "stopped; upgrade this instance's aisched, then start it again (docs/ha.md)"


class Role(Enum):
    STARTING = "starting"
    LEADER = "leader"
    STANDBY = "standby"
    DEPOSED = "deposed"


@dataclass(frozen=True, slots=True)
class LeaseTimes:
    """The lease's timing: renewed every `renew_s`, expired `ttl_s` after the last renewal;
    a standby looks every `poll_s`. A takeover after a crash takes at most about
    `ttl_s + poll_s` plus the recovery."""

    ttl_s: float = 8.0
    renew_s: float = 2.0
    poll_s: float = 1.0


class Leadership:
    """This instance's side of the election (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        on_elected: Callable[[], None],
        on_deposed: Callable[[str], None],
        on_given_back: Callable[[], None] = lambda: None,
        times: LeaseTimes = LeaseTimes(),
    ) -> None:
        self.store = store
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.on_given_back = on_given_back
        self.times = times
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.address = ""
        self.role = Role.STARTING
        self.term = 0
        self.takeovers = 0  # leases this instance took from another holder
        self.lease: Lease | None = None  # as last read or written
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewed_at = 0.0  # monotonic, the start of the last renewal that succeeded
        self._renew_error = ""  # why the last renewal or poll failed, in one line
        self._deposing = threading.Lock()
        # What became of this instance's work once deposed, said after why (`aisched up`).
        self.then = NEW_LEADER

    # --- what readers see ----------------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self.role == Role.LEADER

    def leader_address(self) -> str:
        """The leader's API address as last seen ("" when nobody holds a live lease)."""
        if self.leading:
            return self.address
        lease = self.lease
        if lease is None or not lease.live or lease.holder == self.holder:
            return ""
        return lease.address

    def seen_term(self) -> int:
        """Our term while we lead, else the lease's as last read."""
        return self.term if self.leading or self.lease is None else self.lease.term

    def problem(self) -> str | None:
        """Why the lease could not be renewed (a leader) or read (a standby) at the last try,
        else None: the database does not answer, whether or not anything else touches it."""
        why = self._renew_error
        if not why or self.role == Role.DEPOSED:
            return None
        return f"the lease could not be {'renewed' if self.leading else 'read'}: {why}"

    def describe(self) -> dict[str, object]:
        """role, term and leader address, as `/v1/healthz` shows them."""
        return {"role": self.role.value, "term": self.seen_term(), "leader": self.leader_address()}

    # --- running -------------------------------------------------------------------------

    def start(self, address: str) -> None:
        """Lead now if the lease is free (always on SQLite); on a shared database, go on
        renewing or standing by in a thread."""
        self.address = address
        if not self.store.shared:
            self._try_lead(force=True, in_thread=False)
            return
        self.role = Role.STANDBY
        try:
            self._try_lead(force=False, in_thread=False)
        except Exception as exc:
            if self.leading:  # elected, but starting as leader failed: the start's own error
                raise
            log.warning("cannot read the leader's lease yet: %s", exc)  # the thread tries on
        self._thread = threading.Thread(target=self._run, name="aisched-leader", daemon=True)
        self._thread.start()
        threading.Thread(target=self._watch, name="aisched-lease-watch", daemon=True).start()

    def alive(self) -> bool:
        """Whether this instance still takes part (its thread runs, or it leads on SQLite)."""
        if self.role == Role.DEPOSED:
            return False
        return self._thread.is_alive() if self._thread is not None else self.leading

    def stop(self) -> None:
        """Stop taking part; a leader resigns so that a standby need not wait for the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self.leading and self.store.shared:
            try:
                with self.store.lease_tx() as conn:
                    resign(conn, Fence(self.holder, self.term))
                log.info("resigned the lease of term %d", self.term)
            except Exception as exc:  # the lease then simply expires
                log.warning("could not resign the lease: %s", exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.leading:
                    self._renew()
                elif self.role == Role.STANDBY:
                    self._try_lead(force=False, in_thread=True)
                else:
                    return
            except Exception as exc:  # the database unreachable, for instance: `_watch`
                self._renew_error = one_line(exc)  # deposes by the deadline, saying why
                log.warning("lease: %s", self._renew_error)  # not the driver's page of text
            wait = self.times.renew_s if self.leading else self.times.poll_s
            self._stop.wait(wait)

    def _watch(self) -> None:
        """Depose a leader whose renewal has not come back by the deadline: renewals that
        fail, or a connection that hangs (a dead network path, a frozen server) and raises
        nothing, so that `_run`, blocked in it, could never check the time itself; else this
        instance would go on calling itself the leader (ready, taking changes it cannot
        store) while a standby leads."""
        # From its own start too: a recovery at start holds up the first renewal, and `_run`
        # renews (or finds the lease taken) as soon as it runs.
        began = time.monotonic()
        ticked = began
        while not self._stop.wait(self.times.renew_s / 2):
            if self.role == Role.DEPOSED:
                return
            now = time.monotonic()
            # This thread wakes every renew_s / 2: a wake far later than that means the whole
            # process stood still (SIGSTOP, a suspended VM), not only the database.
            stood_still = now - ticked
            ticked = now
            late = now - max(self._renewed_at, began)
            if self.leading and late > self._deadline_s():
                if stood_still > self._deadline_s():
                    why = f"this process itself did not run for {stood_still:.0f} s: paused?"
                else:
                    why = self._renew_error or "the database does not answer"
                self._depose(
                    f"no renewal of the lease came back for {late:.0f} s ({why}): a standby "
                    "may lead now",
                    then=ADOPTED_LATER,
                )
                return

    def _deadline_s(self) -> float:
        """How long a leader goes on without a renewal: the lease less a margin, so that it has
        stopped before a standby can see the lease expired."""
        return max(self.times.ttl_s - self.times.renew_s, self.times.renew_s)

    def _try_lead(self, *, force: bool, in_thread: bool) -> None:
        with self.store.lease_tx() as conn:
            newer = newer_than_readable(conn) if self.store.shared else None
            if newer is None:
                before, got, began = try_acquire(
                    conn, self.holder, self.address, self.times.ttl_s, force=force
                )
        if newer is not None:
            self._depose(newer, then=UPGRADE)
            return
        # The lease was read: an earlier poll's failure is past (a standby's readiness line),
        # and no reason of the leader's if this one takes it.
        self._renew_error = ""
        if got is None:
            self.lease = before
            return
        self._renewed_at = began
        self.lease = got
        self.term = got.term
        if before.holder and before.holder != self.holder and self.store.shared:
            self.takeovers += 1
            log.warning(
                "took over as leader in term %d (%s %s)",
                got.term,
                before.address or before.holder,
                # A leader that stopped cleanly resigned: its lease was expired at 0.
                "gave the lease back" if before.expires_at == 0.0 else "let its lease expire",
            )
        elif self.store.shared:  # alone on SQLite, leading is no news
            log.info("leading in term %d", got.term)
        if self.store.shared:  # on SQLite no other process can write: nothing to fence
            self.store.fence = Fence(self.holder, got.term)
        self.role = Role.LEADER
        if in_thread:
            threading.Thread(target=self._elected, name="aisched-elected", daemon=True).start()
        else:  # at start: a failure is the start's own (one line from `aisched up`)
            self.on_elected()

    def _elected(self) -> None:
        try:
            self.on_elected()
        except Exception as exc:
            if transient(exc):
                self._give_back(one_line(exc))
                return
            log.exception("starting as leader failed")
            self._depose(f"starting as leader failed: {exc}", then=ADOPTED_LATER)

    def _give_back(self, why: str) -> None:
        """Recovery met a failure of the database's connection: stand by again, to try again
        once the lease is free. It lapses (no renewal), rather than being resigned: the
        database may not answer now, and whoever takes it next (this instance too) waits that
        long, not a poll, before recovering anew."""
        self.on_given_back()  # while still leading: nothing can elect this instance meanwhile
        with self._deposing:
            if self.role != Role.LEADER:
                return
            self.store.fence = None
            self.role = Role.STANDBY
        log.warning(
            "starting as leader in term %d failed on the database (%s); standing by, to try "
            "again once the lease of that term has lapsed",
            self.term,
            why,
        )

    def _renew(self) -> None:
        started = time.monotonic()
        fence = Fence(self.holder, self.term)
        with self.store.lease_tx() as conn:
            ok = renew(conn, fence, self.times.ttl_s)
            lease = read_lease(conn)
        self.lease = lease
        if ok:
            if self._renew_error:  # else the log shows only the failures, as if none came back
                log.info(
                    "renewed the lease again, %.1f s after the last renewal (those between failed)",
                    started - self._renewed_at,
                )
            self._renewed_at = started
            self._renew_error = ""
            return
        self._depose(
            f"deposed: term {lease.term} belongs to {lease.address or lease.holder} "
            f"(this instance led term {self.term})"
        )

    def _depose(self, why: str, *, then: str = NEW_LEADER) -> None:
        with self._deposing:  # the renewal's thread and the watch may both come here
            if self.role == Role.DEPOSED:
                return
            self.role = Role.DEPOSED
            self.then = then
        self.store.deposed = why
        log.error("%s; this instance stops scheduling", why)
        self.on_deposed(why)

    def deposed_by_write(self, why: str) -> None:
        """The loop's write was refused (its term moved on): as a failed renewal."""
        self._depose(why)


class LeaderCollector(Collector):
    """aisched_leader, aisched_leader_term and aisched_takeovers_total for /metrics."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    def collect(self) -> Iterator[Metric]:
        lead = self.leadership
        yield GaugeMetricFamily(
            "aisched_leader", "1 while this instance leads (schedules), else 0.", int(lead.leading)
        )
        yield GaugeMetricFamily(
            "aisched_leader_term",
            "The leader's term as this instance last saw it (its own while it leads).",
            lead.seen_term(),
        )
        yield CounterMetricFamily(
            "aisched_takeovers",
            "Leases this instance took over from another instance whose lease had expired.",
            lead.takeovers,
        )
