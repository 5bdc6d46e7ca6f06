"""`listeners.is_this_machines`: which addresses a connection reaches this machine at, where
another local user may be the one listening (the CLI then checks whose the listener is, on
that connection, before it sends a token). Not only the loopback's: any address of the
machine's own interfaces, the unspecified addresses (a connection to 0.0.0.0 is made to this
machine), and IPv4 written as IPv6. Asked of the address a connection was made to, not of a
name, which may resolve elsewhere the next time."""

from __future__ import annotations

import ipaddress
import socket

import psutil
import pytest

from aisched.service.listeners import is_loopback, is_this_machines


def _own_addresses() -> list[str]:
    return [
        a.address.split("%")[0]
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family in (socket.AF_INET, socket.AF_INET6)
    ]


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1", "127.0.0.2"]
)
def test_the_loopback_and_the_unspecified_addresses_are_this_machine(address: str) -> None:
    assert is_this_machines(address)


def test_every_address_of_the_machines_interfaces_is_this_machine() -> None:
    own = _own_addresses()
    assert own  # the loopback's at least
    for address in own:
        assert is_this_machines(address), address
        if ipaddress.ip_address(address).version == 4:
            assert is_this_machines(f"::ffff:{address}"), address


def test_an_address_of_no_interface_here_and_a_name_are_not() -> None:
    other = next(
        a for a in ("198.51.100.7", "203.0.113.9", "100.64.0.77") if a not in _own_addresses()
    )
    assert not is_this_machines(other)
    assert not is_this_machines("localhost")  # a name: its connection's address is asked


def test_ipv4_written_as_ipv6_is_the_loopback_it_names() -> None:
    assert is_loopback("::ffff:127.0.0.1") and not is_loopback("::ffff:198.51.100.7")
