"""Identity and permissions over TCP, in process: tokens (401 without a valid one), owners and
admins (403), what others see of a job, the audit log, and the dashboard's login."""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Iterator

from clients import client_for, token_for
from fastapi.testclient import TestClient

from aisched.service import tokens
from aisched.service.app import Service
from aisched.service.identity import service_user
from aisched.testing.fakes import FakeExecutor

AsUser = Callable[[str], TestClient]
JOB = {"command": ["sleep", "100"], "resources": {"gpus": 1}, "env": {"KEY": "v"}}


def test_no_bad_revoked_or_expired_token_is_a_401_that_says_nothing_of_jobs(
    svc: Service, client: TestClient
) -> None:
    bare = TestClient(client.app)
    assert bare.get("/v1/healthz").status_code == 200
    expired, _ = tokens.create(
        svc.store, "ana", admin=False, created_by="t", now=time.time() - 10, expires_at=time.time()
    )
    revoked = token_for(svc, "ana")
    with svc.store.tx() as tx:
        rid = next(r["id"] for r in tx.list_tokens("ana") if r["expires_at"] is None)
        tx.revoke_token(rid, time.time())
    auths = ["", "Bearer nope", f"Bearer {expired}", f"Bearer {revoked}", "Basic eDp5"]
    for headers in [{"Authorization": a} if a else {} for a in auths]:
        for path in ("/v1/jobs/1", "/v1/jobs/999", "/v1/nodes", "/metrics"):
            r = bare.get(path, headers=headers)
            assert r.status_code == 401, (headers, path)
            assert r.headers["www-authenticate"] == "Bearer"
            assert "job" not in r.json()["error"]


def test_a_user_acts_on_their_own_jobs_and_admins_on_all(
    svc: Service, client: TestClient, client_as: AsUser
) -> None:
    admins_job = client.post("/v1/jobs", json=JOB).json()["id"]
    ana = client_as("ana")
    r = ana.post(f"/v1/jobs/{admins_job}/cancel")
    assert r.status_code == 403 and "belongs to" in r.json()["error"]
    assert ana.get(f"/v1/jobs/{admins_job}/logs").status_code == 403
    seen = ana.get(f"/v1/jobs/{admins_job}").json()
    assert (seen["env"], seen["events"], seen["groups"][0]["command"], seen["checkpoint_dir"]) == (
        None,
        [],
        [],
        "",
    )
    listed = ana.get("/v1/jobs").json()["jobs"]
    assert [(j["id"], j["groups"][0]["command"]) for j in listed] == [(admins_job, [])]
    mine = client.get(f"/v1/jobs/{admins_job}").json()
    assert (mine["env"], mine["groups"][0]["command"]) == ({"main": {"KEY": "v"}}, ["sleep", "100"])
    assert client.post(f"/v1/jobs/{admins_job}/cancel").status_code == 202
    audit = client.get("/v1/audit").json()
    assert [(a["action"], a["target"]) for a in audit] == [("cancel", f"job {admins_job}")]
    assert ana.get("/v1/audit").status_code == 403


def test_a_job_runs_as_its_submitter_and_no_one_else(client: TestClient, client_as: AsUser) -> None:
    r = client.post("/v1/jobs", json={**JOB, "user": "someone-else"})
    assert r.status_code == 403
    assert "jobs run as the user who submits them" in r.json()["problems"][0]
    nobody = client_as("no-such-account")
    r = nobody.post("/v1/jobs", json=JOB)
    assert (r.status_code, r.json()["problems"]) == (
        403,
        ["user no-such-account has no account on this machine, so no job can run as "
         "no-such-account"],
    )  # fmt: skip


def test_only_admins_make_tokens_and_users_see_and_revoke_their_own(
    client: TestClient, client_as: AsUser
) -> None:
    made = client.post("/v1/tokens", json={"user": "ana", "note": "laptop"}).json()
    assert made["token"].startswith("ais_") and made["user"] == "ana"
    ana = TestClient(client.app, headers={"Authorization": f"Bearer {made['token']}"})
    assert ana.get("/v1/info").json()["you"] == "ana"
    assert ana.post("/v1/tokens", json={"user": "ana"}).status_code == 403
    assert [t["id"] for t in ana.get("/v1/tokens").json()] == [made["id"]]
    assert "token" not in ana.get("/v1/tokens").json()[0]  # the secret is never shown again
    assert client_as("bo").post(f"/v1/tokens/{made['id']}/revoke").status_code == 403
    assert ana.post(f"/v1/tokens/{made['id']}/revoke").json()["revoked_at"] is not None
    assert ana.get("/v1/info").status_code == 401


def test_the_dashboard_asks_for_a_token_and_keeps_it_in_an_httponly_cookie(
    svc: Service, client: TestClient
) -> None:
    bare = TestClient(client.app)
    page = bare.get("/")
    assert page.status_code == 401 and 'name="token"' in page.text
    assert bare.get("/v1/dashboard").status_code == 401
    assert bare.post("/login", content="token=wrong").status_code == 401
    secret = token_for(svc, "ana")
    r = bare.post("/login", content=f"token={secret}", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/")
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert bare.get("/").status_code == 200 and "login" not in bare.get("/").text.lower()
    assert bare.get("/v1/dashboard").status_code == 200


def test_a_link_with_a_token_fills_in_the_login_form_and_never_signs_in_by_itself(
    svc: Service, client: TestClient
) -> None:
    # Any page can send a browser to such a link: signed in by it, the visitor would see
    # (and act in) the dashboard as whoever the link's token is (login CSRF).
    secret = token_for(svc, "ana")
    browser = TestClient(client.app)
    r = browser.get(f"/?token={secret}", follow_redirects=False)
    assert r.status_code == 200 and "set-cookie" not in r.headers
    assert f'value="{secret}"' in r.text and "signs you in as <b>ana</b>" in r.text
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["x-frame-options"] == "DENY"  # no other site frames it for a click
    assert browser.get("/v1/dashboard").status_code == 401
    assert browser.get("/").status_code == 401
    # A token the service refuses is said to be refused, and not written into the page.
    for bad in ("ais_unknown", 'ais_"><script>alert(1)</script>'):
        r = browser.get("/", params={"token": bad}, follow_redirects=False)
        assert r.status_code == 401 and "set-cookie" not in r.headers
        assert "refused" in r.text and "ais_" not in r.text
    # Signed in by the form, the same link (bookmarked) goes straight to the page.
    r = browser.post("/login", content=f"token={secret}", follow_redirects=False)
    assert r.status_code == 303
    r = browser.get(f"/?token={secret}", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/")
    assert "set-cookie" not in r.headers
    # Signed in as ana, a link with bo's token changes nothing until its form is sent.
    r = browser.get(f"/?token={token_for(svc, 'bo')}", follow_redirects=False)
    assert r.status_code == 200 and "signs you in as <b>bo</b>" in r.text
    assert "set-cookie" not in r.headers
    assert browser.get("/v1/dashboard").status_code == 200


def test_the_dashboard_cookie_reads_the_dashboard_and_acts_on_nothing(
    svc: Service, client: TestClient
) -> None:
    # Any page the browser opens sends the cookie, one on another port of this host too
    # (SameSite does not tell ports apart): it must not submit or cancel as its holder.
    mine = client.post("/v1/jobs", json=JOB).json()["id"]
    browser = TestClient(client.app)
    r = browser.post("/login", content=f"token={token_for(svc, 'ana')}", follow_redirects=False)
    assert r.status_code == 303
    assert browser.get("/v1/dashboard").status_code == 200
    forged = {"origin": "http://127.0.0.1:9999", "content-type": "text/plain"}
    assert browser.post("/v1/jobs", content="command: id\n", headers=forged).status_code == 401
    assert browser.post(f"/v1/jobs/{mine}/cancel", headers=forged).status_code == 401
    assert browser.get("/v1/jobs").status_code == 401
    assert browser.post("/v1/tokens", json={"user": "ana"}).status_code == 401
    assert client.get(f"/v1/jobs/{mine}").json()["state"] != "cancelled"


def test_no_cookie_the_service_takes_can_be_made_from_the_database(
    svc: Service, client: TestClient
) -> None:
    """The cookie's MAC was keyed with the token's digest, which the database holds: anyone
    who read the database made a working cookie for every token. Now each cookie is checked
    against what only the secret makes."""
    secret = token_for(svc, "ana")
    browser = TestClient(client.app)
    assert browser.post("/login", content=f"token={secret}").status_code == 200
    assert browser.get("/v1/dashboard").status_code == 200
    with svc.store.read() as tx:
        (row,) = tx.list_tokens("ana")
    name, real = next(iter(browser.cookies.items()))
    assert TestClient(client.app, cookies={name: real}).get("/v1/dashboard").status_code == 200
    # All that the database has of the token (the cookie's digest: from schema 7).
    for key in [k for k in (row["digest"], row.get("cookie_digest")) if k]:
        mac = hmac.new(key.encode(), b"aisched dashboard cookie", "sha256").hexdigest()
        for value in (mac, key):
            leaked = TestClient(client.app, cookies={name: f"aisd_{row['id']}.{value}"})
            assert leaked.get("/v1/dashboard").status_code == 401, (key, value)


def test_the_login_form_is_refused_from_another_page_and_the_cookie_is_secure_over_tls(
    svc: Service, client: TestClient
) -> None:
    secret = token_for(svc, "ana")
    browser = TestClient(client.app)
    for site in ("same-site", "cross-site"):
        r = browser.post("/login", content=f"token={secret}", headers={"sec-fetch-site": site})
        assert r.status_code == 403 and "set-cookie" not in r.headers, site
    r = browser.post(
        "/login",
        content=f"token={secret}",
        headers={"sec-fetch-site": "same-origin"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and "secure" not in r.headers["set-cookie"].lower()
    tls = TestClient(client.app, base_url="https://testserver")
    r = tls.post("/login", content=f"token={secret}", follow_redirects=False)
    assert r.status_code == 303 and "; secure" in r.headers["set-cookie"].lower()


def test_only_admins_see_where_the_state_database_is(
    svc: Service, client: TestClient, client_as: AsUser
) -> None:
    kind = svc.store.url.partition(":")[0]
    assert kind in ("sqlite", "postgresql+psycopg")
    assert client_as("ana").get("/v1/info").json()["database"] == kind
    assert client.get("/v1/info").json()["database"] == svc.store.url != kind


def test_odd_numbers_in_a_body_are_a_422_not_a_500(client: TestClient) -> None:
    huge = '{"command": "true", "priority": ' + "9" * 5000 + "}"
    r = client.post("/v1/jobs", content=huge, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["problems"][0].startswith(
        "request: not valid JSON: Exceeds the limit"
    )
    for odd in ("Infinity", "NaN", "-1", "1e12"):
        body = '{"user": "ana", "expires_in_s": ' + odd + "}"
        r = client.post("/v1/tokens", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422 and "expires_in_s: must be above 0" in r.text, odd
    # Nothing half-made: the listing still answers, with no token for ana.
    listed = client.get("/v1/tokens")
    assert listed.status_code == 200 and all(t["user"] != "ana" for t in listed.json())


def test_a_read_only_token_reads_everything_its_user_may_and_changes_nothing(
    svc: Service, client: TestClient
) -> None:
    mine = client.post("/v1/jobs", json=JOB).json()["id"]
    secret, row = tokens.create(
        svc.store, service_user(), admin=True, created_by="test", now=time.time(), read_only=True
    )
    watcher = TestClient(client.app, headers={"Authorization": f"Bearer {secret}"})
    reads = ("/v1/jobs", f"/v1/jobs/{mine}", "/v1/nodes", "/v1/audit", "/v1/tokens", "/metrics")
    for path in reads:
        assert watcher.get(path).status_code == 200, path
    refused = f"token {row['id']} is read-only: it may read (GET), not POST"
    for path, body in (
        ("/v1/jobs", JOB),
        (f"/v1/jobs/{mine}/cancel", None),
        ("/v1/jobs/cancel", {"mine": True}),
        (f"/v1/jobs/{mine}/metrics", {"rps": 1}),
        ("/v1/tokens", {"user": "ana"}),
        (f"/v1/tokens/{row['id']}/revoke", None),
    ):
        r = watcher.post(path, json=body)
        assert (r.status_code, r.json()["error"]) == (403, refused), path
    assert client.get(f"/v1/jobs/{mine}").json()["state"] != "cancelled"
    (listed,) = [t for t in client.get("/v1/tokens").json() if t["id"] == row["id"]]
    assert listed["read_only"] is True


def _volcano(spec: str, container: str = "") -> str:
    return (
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: v}\n"
        f"spec:\n{spec}  tasks:\n  - name: w\n    replicas: 1\n    template:\n      spec:\n"
        "        containers:\n        - name: c\n          command: [/bin/true]\n"
        f"{container}"
    )


def test_a_volcano_file_refused_at_submission_is_told_its_own_field_names(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    # Not the native names (queue, priority, tasks.0.workdir) of the job it was read into.
    svc = open_service(fx, queues=[{"name": "default"}, {"name": "team", "users": ["someone"]}])
    nobody = client_for(svc, "nobody")

    def problems(text: str) -> list[str]:
        r = nobody.post("/v1/jobs?source=v.yaml", content=text)
        assert r.status_code in (403, 422), r.text
        return list(r.json()["problems"])

    [queue] = problems(_volcano("  queue: team\n"))
    assert queue.startswith("v.yaml: spec.queue: queue 'team' accepts jobs only from user someone")
    [priority] = problems(_volcano("  priorityClassName: high\n"))
    assert priority.startswith("v.yaml: spec.priorityClassName: priority 100 is above the 0")
    [workdir] = problems(_volcano("", "          workingDir: /no/such/dir\n"))
    where = "spec.tasks.0.template.spec.containers.0.workingDir"
    assert workdir == f"v.yaml: {where}: no such directory: /no/such/dir"


def test_the_login_form_is_bounded_far_below_the_apis_body_limit(
    svc: Service, client: TestClient
) -> None:
    # The form has one field: a 1 MiB body of 262,000 fields, parsed on the event loop before
    # any charge, held every other request while it was parsed.
    secret = token_for(svc, "ana")
    browser = TestClient(client.app)
    padded = f"token={secret}&" + "a=b&" * 2000
    declared = browser.post("/login", content=padded)
    assert declared.status_code == 413
    assert declared.json() == {"error": "the login form is larger than 4096 bytes", "problems": []}

    def chunks() -> Iterator[bytes]:
        yield f"token={secret}&".encode()
        for _ in range(100):
            yield b"a=b&" * 20

    streamed = browser.post("/login", content=chunks())  # no Content-Length
    assert streamed.status_code == 413 and "set-cookie" not in streamed.headers
    fields = browser.post("/login", content=f"token={secret}&" + "a=b&" * 100)
    assert fields.status_code == 400
    assert fields.json() == {"error": "the login form has more than 4 fields", "problems": []}
    assert "set-cookie" not in fields.headers
    r = browser.post("/login", content=f"token={secret}", follow_redirects=False)
    assert r.status_code == 303 and "set-cookie" in r.headers


def test_without_sec_fetch_site_the_login_form_is_refused_from_another_origin(
    svc: Service, client: TestClient
) -> None:
    # A browser that does not send Sec-Fetch-Site still says where a form post comes from.
    secret = token_for(svc, "ana")
    browser = TestClient(client.app)
    for origin in ("http://evil.example", "http://testserver:8080", "https://testserver", "null"):
        r = browser.post("/login", content=f"token={secret}", headers={"origin": origin})
        assert r.status_code == 403 and "set-cookie" not in r.headers, origin
        assert r.json()["error"] == "the login form may be posted only from its own page"
    for origin in ("http://testserver", "http://testserver:80", "HTTP://TestServer"):
        r = browser.post(
            "/login", content=f"token={secret}", headers={"origin": origin}, follow_redirects=False
        )
        assert r.status_code == 303, origin
    # Said, Sec-Fetch-Site is what counts.
    r = browser.post(
        "/login",
        content=f"token={secret}",
        headers={"origin": "http://evil.example", "sec-fetch-site": "cross-site"},
    )
    assert r.status_code == 403


def test_every_answer_is_nosniff_and_the_pages_send_no_referrer(
    svc: Service, client: TestClient
) -> None:
    bare = TestClient(client.app)
    big = {"content-type": "application/json", "content-length": str(2**21)}
    answers = {
        "page": client.get("/"),
        "login form": bare.get("/"),
        "login link": bare.get(f"/?token={token_for(svc, 'ana')}"),
        "script": bare.get("/static/dashboard.js"),
        "no such file": bare.get("/static/nope.js"),
        "json": client.get("/v1/dashboard"),
        "401": bare.get("/v1/jobs"),
        "probe": bare.get("/v1/healthz"),
        "413 of the body limit": client.post("/v1/jobs", content=b"{}", headers=big),
        "login 403": bare.post(
            "/login", content="token=x", headers={"sec-fetch-site": "cross-site"}
        ),
    }
    assert answers["413 of the body limit"].status_code == 413
    for what, r in answers.items():
        assert r.headers.get("x-content-type-options") == "nosniff", what
    for what in ("page", "login form", "login link"):
        r = answers[what]
        assert r.headers["referrer-policy"] == "no-referrer", what
        assert r.headers["content-security-policy"] == (
            "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
        ), what
