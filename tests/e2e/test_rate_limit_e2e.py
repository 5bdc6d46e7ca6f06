"""Per-caller request rate limits on a real `aisched up` as root: real local users (alice, bob)
on its Unix socket, and tokens over TCP.

The budgets are set so that nothing refills while a test runs (a rate of one request in 1000 s)
or so that one request refills in a few seconds, well past a CLI's start: every assertion
counts answers, none times them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import Service, local_service
from users import User

pytestmark = pytest.mark.usefixtures("local_users")

# Nothing refills during a test: 8 requests, 2 submissions, then 429s.
TIGHT = """
limits:
  request_rate: 0.001
  request_burst: 8
  submit_rate: 0.001
  submit_burst: 2
"""

# One request, then one more every 5 s.
SLOW = """
limits:
  request_rate: 0.2
  request_burst: 1
"""

# Run as a local user: N requests of PATH over the socket (or over TCP to a URL, with TOKEN),
# each answer as [status, Retry-After, error], as JSON.
FLOOD = """
import json, sys, httpx
where, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if where.startswith("http"):
    c = httpx.Client(base_url=where, timeout=30)
else:
    c = httpx.Client(transport=httpx.HTTPTransport(uds=where), base_url="http://x", timeout=30)
headers = {"Authorization": f"Bearer {sys.argv[4]}"} if len(sys.argv) > 4 else {}
out = []
for _ in range(n):
    r = c.get(path, headers=headers)
    out.append([r.status_code, r.headers.get("retry-after"), r.json().get("error")])
print(json.dumps(out))
"""


@pytest.fixture
def tight(tmp_path: Path) -> Iterator[Service]:
    tmp_path.chmod(0o755)  # the users reach the socket and run jobs in their homes
    with local_service(tmp_path, config=TIGHT) as svc:
        yield svc


def flood(
    svc: Service, user: User, n: int, path: str = "/v1/jobs", tcp_token: str = ""
) -> subprocess.Popen[str]:
    """`n` requests of `path` by `user`: on the socket, or over TCP with `tcp_token`."""
    where = [svc.url, tcp_token] if tcp_token else [str(svc.socket)]
    return subprocess.Popen(
        user.cmd(user.python, "-c", FLOOD, where[0], str(n), path, *where[1:]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def answers(proc: subprocess.Popen[str]) -> list[list[str | int | None]]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def statuses(got: list[list[str | int | None]]) -> list[int | str | None]:
    return [a[0] for a in got]


def limited(svc: Service, limit: str = "request") -> float:
    """How many requests the service has refused for `limit`, from its metrics (as root,
    who is never limited)."""
    for line in svc.api.get("/metrics").text.splitlines():
        if line.startswith(f'aisched_requests_rate_limited_total{{limit="{limit}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_one_users_flood_gets_429s_while_another_users_requests_succeed(
    tight: Service, local_users: dict[str, User]
) -> None:
    alice, bob = local_users["alice"], local_users["bob"]
    alice_flood = flood(tight, alice, 20)
    bob_reads = flood(tight, bob, 8)  # at the same moment, a budget of his own
    by_alice, by_bob = answers(alice_flood), answers(bob_reads)

    assert statuses(by_alice) == [200] * 8 + [429] * 12
    assert statuses(by_bob) == [200] * 8
    for _, retry_after, error in by_alice[8:]:
        assert retry_after is not None and int(retry_after) >= 1
        assert error == (
            "rate limit: aisalice sent more than 8 requests at once or 0.001 a second "
            f"(limits.request_rate, limits.request_burst); try again in {retry_after} s"
        )
    assert limited(tight) == 12

    # Health and readiness are never limited, even for a caller whose budget is spent.
    assert statuses(answers(flood(tight, alice, 10, "/v1/healthz"))) == [200] * 10
    assert 429 not in statuses(answers(flood(tight, alice, 10, "/v1/readyz")))
    # Root (an admin) is not limited: the service stays manageable under a flood.
    assert statuses(answers(flood(tight, alice, 1))) == [429]
    for _ in range(12):
        assert tight.cli("jobs", "--json").returncode == 0


def test_the_limit_is_one_budget_per_user_over_the_socket_and_a_token(
    tight: Service, local_users: dict[str, User]
) -> None:
    bob = local_users["bob"]
    token = tight.cli("token", "create", bob.name).stdout.strip()
    assert statuses(answers(flood(tight, bob, 3))) == [200] * 3
    as_bob = httpx.Client(base_url=tight.url, headers={"Authorization": f"Bearer {token}"})
    got = [as_bob.get("/v1/jobs") for _ in range(7)]
    assert [r.status_code for r in got] == [200] * 5 + [429] * 2
    assert int(got[-1].headers["retry-after"]) >= 1
    problem = got[-1].json()
    assert problem["problems"] == [] and problem["error"].startswith(
        "rate limit: aisbob sent more than 8 requests at once"
    )

    # The CLI: a read whose Retry-After is longer than it waits, and a change, each end with
    # the limit's one line.
    tcp = {**tight.env(), "AISCHED_SERVER": tight.url, "AISCHED_TOKEN": token}
    for args in (["jobs"], ["cancel", "999999"]):
        proc = subprocess.run(
            [sys.executable, "-m", "aisched", *args], capture_output=True, text=True, env=tcp
        )
        assert proc.returncode == 2, proc.stderr
        assert re.fullmatch(
            r"error: rate limit: aisbob sent more than 8 requests at once or 0\.001 a second "
            r"\(limits\.request_rate, limits\.request_burst\); try again in \d+ s\n",
            proc.stderr,
        ), proc.stderr

    # Without a valid token, callers are limited by who they are on this machine (the owner
    # of a loopback client's socket), apart from their user's own budget.
    forged = [
        httpx.get(f"{tight.url}/v1/jobs", headers={"Authorization": "Bearer ais_forged"})
        for _ in range(10)
    ]
    assert [r.status_code for r in forged] == [401] * 8 + [429] * 2
    assert forged[-1].json()["error"].startswith("rate limit: user root sent more than 8")
    # ...and so are the dashboard's login form and link, which check a token too.
    assert httpx.post(f"{tight.url}/login", data={"token": "ais_forged"}).status_code == 429
    assert httpx.get(f"{tight.url}/", params={"token": "ais_forged"}).status_code == 429
    # A valid token is charged to its user, not to the address the guesses came from.
    alice_token = tight.cli("token", "create", "aisalice").stdout.strip()
    as_alice = {"Authorization": f"Bearer {alice_token}"}
    assert httpx.get(f"{tight.url}/v1/jobs", headers=as_alice).status_code == 200


def test_submissions_have_a_smaller_budget_of_their_own(
    tight: Service, local_users: dict[str, User]
) -> None:
    alice = local_users["alice"]
    env = {"AISCHED_SERVER": f"unix:{tight.socket}"}
    for _ in range(2):
        assert alice.aisched("run", "--", "true", env=env).returncode == 0
    refused = alice.aisched("run", "--", "true", env=env)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().startswith(
        "error: rate limit: aisalice sent more than 2 submissions and bulk cancels at once or "
        "0.001 a second (limits.submit_rate, limits.submit_burst); try again in "
    )
    assert len(refused.stderr.strip().splitlines()) == 1
    assert limited(tight, "submit") == 1
    # Reads go on: only submissions and bulk cancels are spent.
    assert alice.aisched("jobs", env=env).returncode == 0


def test_the_cli_retries_a_read_after_a_429(tmp_path: Path) -> None:
    with local_service(tmp_path, config=SLOW) as svc:
        token = svc.cli("token", "create", "aisbob").stdout.strip()
        as_bob = httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {token}"})
        drained = [as_bob.get("/v1/jobs").status_code for _ in range(2)]
        assert drained == [200, 429]
        before = limited(svc)
        tcp = {**svc.env(), "AISCHED_SERVER": svc.url, "AISCHED_TOKEN": token}
        proc = subprocess.run(
            [sys.executable, "-m", "aisched", "jobs", "--json"],
            capture_output=True,
            text=True,
            env=tcp,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["jobs"] == []
        assert limited(svc) > before  # it was refused first, waited, and asked again


def test_guesses_of_local_users_over_tcp_are_limited_per_user(
    tight: Service, local_users: dict[str, User]
) -> None:
    """Requests without a valid token over the loopback are charged to the local user who
    owns the client's socket (the kernel's word, `listeners.ClientOwners`). Charged to the
    address, 127.0.0.1, every local user shared one budget: alice guessing tokens (or just
    sending requests without one) had bob's dashboard login refused."""
    alice, bob = local_users["alice"], local_users["bob"]
    by_alice = answers(flood(tight, alice, 10, tcp_token="ais_forged"))
    assert statuses(by_alice) == [401] * 8 + [429] * 2
    assert str(by_alice[-1][2]).startswith("rate limit: user aisalice sent more than 8 requests")
    assert statuses(answers(flood(tight, bob, 3, tcp_token="ais_forged"))) == [401] * 3
    assert httpx.post(f"{tight.url}/login", data={"token": "ais_forged"}).status_code == 401
    # Her own budget, by token or socket, is another: still whole.
    assert statuses(answers(flood(tight, alice, 1))) == [200]


def test_an_address_is_the_peers_own_never_one_a_header_names(tight: Service) -> None:
    """Requests without a valid token are charged to the peer they come from (the owner of
    its socket on the loopback, else its address), whatever `X-Forwarded-For` they claim: a
    local user could otherwise name a new address with each guess and never be limited
    (uvicorn believes that header from 127.0.0.1 by default)."""
    forged = [
        httpx.get(
            f"{tight.url}/v1/jobs",
            headers={"Authorization": "Bearer ais_forged", "X-Forwarded-For": f"10.0.0.{i}"},
        )
        for i in range(10)
    ]
    assert [r.status_code for r in forged] == [401] * 8 + [429] * 2
    assert forged[-1].json()["error"].startswith("rate limit: user root sent more than 8")
