"""Which host names a loopback listener answers to besides the loopback's own: the machine's
name, only where it resolves to the loopback here."""

from __future__ import annotations

import socket

import pytest

from aisched.service.hosts import is_loopback_host, own_loopback_names


def test_the_machines_name_is_taken_where_it_resolves_to_the_loopback_only() -> None:
    if not own_loopback_names():
        pytest.skip(f"this machine's name {socket.gethostname()!r} is not the loopback here")
    name = socket.gethostname().lower()
    assert own_loopback_names() == frozenset({name})
    assert is_loopback_host(f"{name.upper()}:8470", own_loopback_names())
    assert not is_loopback_host(f"{name}:8470")


@pytest.mark.parametrize(
    "hostname",
    [
        "10.0.0.1",  # an address off the loopback
        "no-such-host.invalid",  # resolves to nothing (RFC 6761)
        "",
        "localhost",  # the loopback's own, taken anyway
        "127.0.1.1",
    ],
)
def test_a_name_that_is_not_only_the_loopback_is_not_added(hostname: str) -> None:
    assert own_loopback_names(hostname) == frozenset()
