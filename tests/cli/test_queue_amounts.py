"""The amounts of the queues and nodes tables (`aisched queues`, `aisched nodes`): memory as
every other size is said (`model.resources.describe_mib`), not `0.488 GiB` or `1.5e+03 GiB`."""

from __future__ import annotations

import pytest

from aisched.cli.cluster import _amount, _cap, _shows_borrowed
from aisched.model.resources import describe_mib_of


@pytest.mark.parametrize(
    ("amount", "shown"),
    [
        ({"gpus": 2, "cpus": 8, "mem_gib": 64}, "2 GPU, 8 CPU, 64 GiB"),
        ({"mem_gib": 500 / 1024}, "500 MiB"),
        ({"mem_gib": 1500}, "1500 GiB"),
        ({"mem_gib": 1536}, "1.5 TiB"),
        ({}, "-"),
    ],
)
def test_memory_is_said_as_every_size_is(amount: dict[str, float], shown: str) -> None:
    assert _amount(amount) == shown


@pytest.mark.parametrize(
    ("cap", "shown"),
    [
        ({"gpus": 0}, "0 GPU"),  # the queue may use no GPU: not "-", which is no limit
        ({"gpus": 2, "cpus": 0, "mem_gib": 0}, "2 GPU, 0 CPU, 0 MiB"),
        ({"mem_gib": 64}, "64 GiB"),
        ({}, "-"),
        (None, "-"),
    ],
)
def test_a_limit_shows_each_resource_it_caps_a_0_too(
    cap: dict[str, float] | None, shown: str
) -> None:
    assert _cap(cap) == shown


@pytest.mark.parametrize(
    ("free_mib", "mem_mib", "shown"),
    [
        (1500, 65536, "1500 MiB / 64 GiB"),  # was `1.5 / 64.0 GiB`
        (0, 1024**3, "0 MiB / 1 PiB"),  # was `0.0 / 1048576.0 GiB`
        (1536, 2048, "1.5 / 2 GiB"),
        (22057, 24105, "22057 / 24105 MiB"),  # a machine's memory: in two lines at 80 columns
    ],
)
def test_a_nodes_memory_is_said_as_every_size_is(free_mib: int, mem_mib: int, shown: str) -> None:
    assert describe_mib_of(free_mib, mem_mib) == shown


def test_the_borrowed_column_is_shown_only_while_reclaim_could_take_something_back() -> None:
    borrowing = {"guarantee": {}, "borrowed": {"gpus": 3}}
    guaranteed = {"guarantee": {"gpus": 4}, "borrowed": {}}
    assert _shows_borrowed([borrowing, guaranteed])
    # No queue has a guarantee (two plain queues): nothing can be reclaimed, so no column
    # squeezes an 80-column table.
    assert not _shows_borrowed([borrowing, {"guarantee": {}, "borrowed": {}}])
    assert not _shows_borrowed([guaranteed, {"guarantee": {}}])  # nobody borrows; an old server
