"""`user_holdings`: what each user's running jobs hold against their queue's `user_limit`, as
the dashboard and the metrics show it, bounded per queue."""

from __future__ import annotations

from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Dim, Resources
from aisched.service.dashboard import _per_user
from aisched.service.user_limits import OTHERS, UserHolding, user_holdings

QUEUES = QueueTree(
    (
        Queue("default"),
        Queue("org", user_limit=Resources(gpu=4)),
        Queue("team", parent="org"),
        Queue("idle", user_limit=Resources(gpu=1)),
    )
)


def gpus(n: float) -> tuple[float, float, float]:
    return (1000.0 * n, 1024.0 * n, 1000.0 * n)


def test_a_user_limit_counts_the_queues_under_it_and_only_users_holding_something() -> None:
    usage = {
        ("org", "ann"): gpus(1),
        ("team", "ann"): gpus(2),
        ("team", "bo"): gpus(1),
        ("team", "cy"): gpus(0),  # nothing running: not shown
        ("default", "dee"): gpus(8),  # no user limit on its path
    }
    assert user_holdings(QUEUES, usage) == {
        "org": [UserHolding("ann", gpus(3)), UserHolding("bo", gpus(1))],
        "idle": [],
    }


def test_past_the_bound_the_users_holding_least_are_summed_as_others() -> None:
    usage = {("org", f"u{i}"): gpus(i) for i in range(1, 6)}
    assert user_holdings(QUEUES, usage, shown=2)["org"] == [
        UserHolding("u5", gpus(5)),
        UserHolding("u4", gpus(4)),
        UserHolding(OTHERS, gpus(1 + 2 + 3)),
    ]


def test_two_accounts_of_one_name_are_two_rows_that_say_which_is_the_former() -> None:
    usage = {
        ("team", "ann#1105"): gpus(1),
        ("team", "ann#1005"): gpus(2),
        ("team", "bo#7"): gpus(3),
    }
    held = user_holdings(QUEUES, usage, uid_now={"ann": 1105, "bo": 7}.get)["org"]
    assert held == [
        UserHolding("bo", gpus(3)),
        UserHolding("ann (former account, uid 1005)", gpus(2)),
        UserHolding("ann (uid 1105)", gpus(1)),
    ]


def test_a_per_user_limit_of_0_is_shown_as_0_and_is_no_share_to_fill() -> None:
    # `user_limit: {gpus: 0, cpus: 8}`: its GPUs shown at 0 (not left out, which is no cap),
    # and a user with CPU jobs there is not at the limit for holding no GPU.
    q = Queue(
        "team", user_limit=Resources(milli_cpu=8000), user_limit_named=frozenset({Dim.GPU, Dim.CPU})
    )
    shown = _per_user(q, [UserHolding("ann", (2000.0, 1024.0, 0.0))])
    assert shown == {
        "user_limit": {"gpus": 0.0, "cpus": 8.0},
        "users": [{"user": "ann", "others": False, "gpus": 0.0, "cpus": 2.0, "at_limit": False}],
    }
    assert _per_user(q, [UserHolding("bo", (8000.0, 0.0, 0.0))])["users"][0]["at_limit"]
