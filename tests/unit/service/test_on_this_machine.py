"""`listeners.on_this_machine`: which server names reach this machine, where another local
user may be the one listening (the CLI then checks whose the listener is before it sends a
token). Not only the loopback's names: any address of the machine's own interfaces, the
unspecified addresses (a connection to 0.0.0.0 is made to this machine), IPv4 written as
IPv6, and a host name that resolves to any of them."""

from __future__ import annotations

import ipaddress
import socket

import psutil
import pytest

from aisched.service.listeners import is_loopback, on_this_machine


def _own_addresses() -> list[str]:
    return [
        a.address.split("%")[0]
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family in (socket.AF_INET, socket.AF_INET6)
    ]


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1", "127.0.0.2"]
)
def test_the_loopback_and_the_unspecified_addresses_are_this_machine(host: str) -> None:
    assert on_this_machine(host)


def test_every_address_of_the_machines_interfaces_is_this_machine() -> None:
    own = _own_addresses()
    assert own  # the loopback's at least
    for address in own:
        assert on_this_machine(address), address
        if ipaddress.ip_address(address).version == 4:
            assert on_this_machine(f"::ffff:{address}"), address


def test_the_machines_own_name_is_this_machine() -> None:
    try:
        socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        pytest.skip("this machine's name does not resolve here")
    assert on_this_machine(socket.gethostname())


def test_an_address_of_no_interface_here_and_an_unknown_name_are_not() -> None:
    other = next(
        a for a in ("198.51.100.7", "203.0.113.9", "100.64.0.77") if a not in _own_addresses()
    )
    assert not on_this_machine(other)
    assert not on_this_machine("no-such-host.invalid")


def test_ipv4_written_as_ipv6_is_the_loopback_it_names() -> None:
    assert is_loopback("::ffff:127.0.0.1") and not is_loopback("::ffff:198.51.100.7")
