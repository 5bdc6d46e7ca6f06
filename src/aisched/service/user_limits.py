"""What each user's running jobs hold against their queue's `user_limit`, for the dashboard and
the metrics (the read side of the cap that `core/queues.py` enforces).

A user limit counts the user's jobs in the queue and in every queue under it, as the core
does (`limited_user_usage`), so the figures here are the ones a waiting job is judged by. Only
the resources a limit governs (those it names, `Queue.user_limit_caps`, a 0 among them) are
reported: a resource it does not name is not capped, and a ratio to it would mean nothing.

The users shown per queue are bounded (`USERS_SHOWN`, those holding the most), the rest summed
under `OTHERS`, which is no user's name: a queue shared by thousands of users gives a page
and a set of metric series of bounded size. Users with nothing running are not shown at all.

The usage is kept per account (`model.job.account_key`: a name and its uid), so that a
deleted account's jobs do not count against its name's next holder. A row names the user;
only where two accounts of one name hold something in one queue (an account deleted while its
jobs ran, its name given to another) do their rows say which is which, by uid, and which is
the former account (the name now names another uid, or none).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aisched.core.session import limited_user_usage
from aisched.core.snapshot import ZERO, Usage, add_usage
from aisched.model.job import split_account
from aisched.model.queue import QueueTree
from aisched.model.resources import Dim
from aisched.service.identity import local_uid

# Per queue: the users holding the most; at most (queues with a user limit) x (this + 1)
# users in the metrics, times three resources.
USERS_SHOWN = 50
# Not a user's name: parentheses are in no POSIX portable user name.
OTHERS = "(others)"
# Each governed resource: its name in the metrics (the unit in it, as in `aisched_allocated_*`),
# its name in the dashboard's JSON and its index in a usage vector.
RESOURCES = (("gpus", "gpus", 2), ("cpu_cores", "cpus", 0), ("memory_bytes", "mem_gib", 1))
_MIB = float(2**20)


@dataclass(frozen=True, slots=True)
class UserHolding:
    """What `user`'s running jobs hold in a queue with a user limit (the queues under it
    included), as a usage vector (milli-CPU, MiB, milli-GPU). `user` is the account's row as
    shown: its name, told apart from another account of that name by `_label`."""

    user: str
    usage: Usage


def governed(caps: frozenset[Dim]) -> list[tuple[str, str, int]]:
    """The entries of `RESOURCES` among `caps` (what a limit names), in that order."""
    return [r for r in RESOURCES if Dim(r[2]) in caps]


def in_unit(value: float, index: int, metric: bool) -> float:
    """A usage vector's `index`th figure in the unit of its metric (GPUs, cores, bytes), or of
    the dashboard (GPUs, CPUs, GiB)."""
    if index == 1:
        return value * _MIB if metric else value / 1024
    return value / 1000


def user_holdings(
    queues: QueueTree,
    usage: Mapping[tuple[str, str], Usage],
    shown: int = USERS_SHOWN,
    uid_now: Callable[[str], int | None] = local_uid,
) -> dict[str, list[UserHolding]]:
    """Per queue with a user limit (every one, in tree order, even with nobody running), the
    users with running jobs there, those holding the most first (GPUs, then CPUs, then memory;
    then by name), at most `shown` of them, the rest summed as `OTHERS` last. `usage` is the
    service's usage per (leaf queue, account key); `uid_now` says which uid a name names now
    (the user database's answer), asked only of names two accounts share."""
    by_user = limited_user_usage(queues, usage)
    out: dict[str, list[UserHolding]] = {
        q.name: [] for q in queues.queues if q.user_limit is not None
    }
    for (qname, account), vec in by_user.items():
        if qname in out and vec != ZERO:
            out[qname].append(UserHolding(account, vec))
    for qname, held in out.items():
        held.sort(key=lambda h: (-h.usage[2], -h.usage[0], -h.usage[1], h.user))
        names = Counter(split_account(h.user)[0] for h in held)
        held[:] = [UserHolding(_label(h.user, names, uid_now), h.usage) for h in held]
        if len(held) > shown:
            rest = ZERO
            for h in held[shown:]:
                rest = add_usage(rest, h.usage)
            out[qname] = [*held[:shown], UserHolding(OTHERS, rest)]
    return out


def _label(account: str, names: Counter[str], uid_now: Callable[[str], int | None]) -> str:
    """The row of the account key `account`: its user name, alone where no other account in
    the list has that name (`names` counts them); else with its uid, and for the account that
    no longer holds the name, saying so (a name's holdings from before uids were kept say
    that instead)."""
    user, uid = split_account(account)
    if names[user] < 2:
        return user
    if uid is None:
        return f"{user} (no uid recorded)"
    if uid_now(user) == uid:
        return f"{user} (uid {uid})"
    return f"{user} (former account, uid {uid})"
