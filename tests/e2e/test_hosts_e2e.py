"""The Host header on the real service's TCP port: a listener on the loopback answers only to
loopback names (a page of another site that points a DNS name of its own at 127.0.0.1 reads
nothing: DNS rebinding); a listener on other addresses takes any."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import Service, free_port

from aisched.service.hosts import own_loopback_names


@pytest.fixture
def on_all_addresses(tmp_path: Path) -> Iterator[Service]:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    svc = Service(home, free_port(), work, ["--gpus", "1", "--host", "0.0.0.0", "--insecure"])
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


def readyz(svc: Service, host: str) -> httpx.Response:
    return httpx.get(f"{svc.url}/v1/readyz", headers={"Host": host}, timeout=10)


def test_a_loopback_listener_refuses_a_host_that_is_not_a_loopback_name(
    service: Service,
) -> None:
    own = "".join(f" (or {name})" for name in own_loopback_names())
    for host in ("attacker.example", f"attacker.example:{service.port}", "10.0.0.1", "[::2]"):
        r = readyz(service, host)
        assert r.status_code == 400, host
        assert r.json()["error"].startswith(
            "this service listens on the loopback only and answers only to localhost, "
            f"127.0.0.1 or [::1]{own}, not to host {host!r}"
        )
        assert str(service.home) not in r.text
    r = httpx.post(
        f"{service.url}/login", data={"token": "x"}, headers={"Host": "attacker.example"}
    )
    assert r.status_code == 400
    for host in (
        f"127.0.0.1:{service.port}",
        f"localhost:{service.port}",
        "LocalHost",
        "127.0.0.2",
        f"[::1]:{service.port}",
    ):
        assert readyz(service, host).status_code == 200, host
    # The Unix socket's requests name whatever host their client wrote.
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(service.socket))) as local:
        assert local.get("http://attacker.example/v1/readyz").status_code == 200
    assert service.cli("jobs").returncode == 0


def test_a_loopback_listener_answers_to_the_machines_own_name_where_it_is_the_loopback(
    service: Service,
) -> None:
    name = socket.gethostname()
    if not own_loopback_names():
        pytest.skip(f"this machine's name {name!r} does not resolve to the loopback here")
    for host in (f"{name}:{service.port}", name.upper(), f"{name}."):
        assert readyz(service, host).status_code == 200, host


def test_a_listener_on_every_address_takes_any_host(on_all_addresses: Service) -> None:
    assert readyz(on_all_addresses, "aisched.example:8470").status_code == 200
