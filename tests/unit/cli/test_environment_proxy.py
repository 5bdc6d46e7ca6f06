"""Which proxy the CLI goes through for a server: the one httpx takes from the environment
(HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, less what NO_PROXY names), never one for a server named by
an address of this machine, whose owner the CLI checks on its own connection."""

from __future__ import annotations

import pytest

from aisched.cli.errors import CLIError
from aisched.cli.owned_connections import environment_proxy

ENV = {
    "HTTPS_PROXY": "http://user:secret@proxy.corp:3128",
    "HTTP_PROXY": "plain.corp:8080",
    "NO_PROXY": "internal.corp,10.1.2.3",
}


def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.mark.parametrize(
    ("server", "want"),
    [
        ("https://aisched.corp:8470", "the proxy http://proxy.corp:3128 (HTTPS_PROXY)"),
        ("http://aisched.corp:8470", "the proxy http://plain.corp:8080 (HTTP_PROXY)"),
        ("https://internal.corp:8470", None),  # NO_PROXY: the name
        ("https://gpu.internal.corp:8470", None),  # ... and under it
        ("https://10.1.2.3:8470", None),
        ("https://127.0.0.1:8470", None),  # this machine: always direct
        ("http://localhost:8470", None),
        ("https://[::1]:8470", None),
        ("http://0.0.0.0:8470", None),
    ],
)
def test_the_proxy_httpx_would_take_except_for_this_machine(
    server: str, want: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_proxies(monkeypatch)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    got = environment_proxy(server)
    assert (None if got is None else str(got)) == want
    if got is not None and server.startswith("https"):
        assert got.proxy.raw_auth == (b"user", b"secret")  # sent to the proxy, never printed


def test_no_proxy_star_and_a_socks_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    no_proxies(monkeypatch)
    monkeypatch.setenv("ALL_PROXY", "socks5://proxy.corp:1080")
    with pytest.raises(CLIError) as e:
        environment_proxy("https://aisched.corp:8470")
    assert str(e.value) == (
        "ALL_PROXY names a socks5 proxy, socks5://proxy.corp:1080: the CLI goes through "
        "HTTP(S) proxies only; NO_PROXY=aisched.corp connects directly"
    )
    monkeypatch.setenv("NO_PROXY", "*")
    assert environment_proxy("https://aisched.corp:8470") is None
