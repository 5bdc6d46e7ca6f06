"""The amounts of the queues table (`aisched queues`): memory as every other size is said
(`model.resources.describe_mib`), not `0.488 GiB` or `1.5e+03 GiB`."""

from __future__ import annotations

import pytest

from aisched.cli.cluster import _amount


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
