"""Cross-site requests against the dashboard's cookie, for real: the service as root, two real
local users, and a real Chromium. Alice has the dashboard open (her token swapped for its
cookie); Bob serves a page on another port of 127.0.0.1, which is the same site as the service
to the browser, so SameSite lets Alice's browser send her cookie with the requests his page
makes. The cookie must stand for nothing but the dashboard's own reads: his page may neither
submit a job (which would run as Alice) nor cancel hers.

It needs Chromium and Playwright (see `chromium.py`)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from chromium import needs_chromium
from harness import Service, free_port, local_service, wait_for
from playwright.sync_api import Browser, Page
from users import User

from aisched.service import tokens

# What Bob's page does in the visitor's browser: a job file as text/plain (a "simple" request,
# sent without asking the service first) and a cancel, both with the visitor's cookies.
EVIL_PAGE = """<!doctype html><title>loading</title><script>
const svc = "{url}";
const opts = {{method: "POST", mode: "no-cors", credentials: "include"}};
Promise.allSettled([
  fetch(svc + "/v1/jobs", {{...opts, headers: {{"Content-Type": "text/plain"}},
    body: "name: planted\\ncommand: [sleep, '60']\\n"}}),
  fetch(svc + "/v1/jobs/{job}/cancel", opts),
]).then(() => {{ document.title = "done"; }});
</script>"""

pytestmark = [pytest.mark.usefixtures("local_users"), needs_chromium]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    tmp_path.chmod(0o755)
    with local_service(tmp_path) as svc:
        yield svc


def test_a_page_another_user_serves_can_neither_submit_nor_cancel_with_the_dashboard_cookie(
    service: Service, browser: Browser, local_users: dict[str, User]
) -> None:
    alice, bob = local_users["alice"], local_users["bob"]
    token, mine = _token_and_job(service, alice)
    evil = EVIL_PAGE.format(url=service.url, job=mine)
    with _bobs_page(bob, evil) as bobs, browser.new_context() as context:
        page = context.new_page()
        _sign_in(page, service.url, token)  # Alice opens her dashboard
        page.goto(bobs)  # and then Bob's page
        page.wait_for_function("document.title === 'done'", timeout=30_000)
    jobs = service.api.get("/v1/jobs", params={"all": "true"}).json()["jobs"]
    assert [(j["id"], j["user"], j["state"]) for j in jobs] == [(mine, alice.name, "running")]


def test_a_link_another_user_sends_the_browser_to_does_not_sign_it_in(
    service: Service, browser: Browser, local_users: dict[str, User]
) -> None:
    # Bob's page sends the visitor to the dashboard with his token in the link: signed in by
    # it, Alice would see (and watch, or trust) Bob's view as if it were her own.
    alice, bob = local_users["alice"], local_users["bob"]
    hers = service.cli("token", "create", alice.name).stdout.strip()
    his = service.cli("token", "create", bob.name).stdout.strip()
    page_of_bob = LINK_PAGE.format(url=service.url, token=his)
    with _bobs_page(bob, page_of_bob) as bobs, browser.new_context() as context:
        page = context.new_page()
        page.goto(bobs)  # a browser signed in to nothing
        page.wait_for_url(lambda url: url.startswith(service.url))
        page.wait_for_load_state()
        assert not context.cookies(service.url), "Bob's link signed the browser in"
        assert f"signs you in as {bob.name}" in page.inner_text("#link-note")
        page.goto(f"{service.url}/")
        assert page.locator('input[name="token"]').count() == 1  # still the login form

        page.fill('input[name="token"]', hers)  # Alice signs in herself
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_selector("body[data-loaded=true]")
        page.goto(bobs)
        page.wait_for_url(lambda url: url.startswith(service.url))
        page.wait_for_selector("#link-note")
        page.goto(f"{service.url}/")
        page.wait_for_selector("body[data-loaded=true]")
        [held] = [c["value"] for c in context.cookies(service.url)]
        token_id = held.removeprefix(tokens.COOKIE_PREFIX).partition(".")[0]
        assert held == tokens.dashboard_cookie(hers, token_id)  # hers, not the token


LINK_PAGE = """<!doctype html><title>loading</title><script>
location.href = "{url}/?token={token}";
</script>"""


@contextmanager
def _bobs_page(bob: User, html: str) -> Iterator[str]:
    """Bob's page, served by Bob on a port of 127.0.0.1: its URL."""
    site = bob.home / "site"
    subprocess.run(bob.cmd("mkdir", "-p", str(site)), check=True)
    page_file = site / "index.html"
    subprocess.run(bob.cmd("sh", "-c", f"cat > {page_file}"), check=True, text=True, input=html)
    port = free_port()
    server = subprocess.Popen(
        bob.cmd("python3", "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(site)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for("Bob's page", lambda: _answers(f"http://127.0.0.1:{port}/"))
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        server.wait(10)


def _token_and_job(service: Service, user: User) -> tuple[str, str]:
    """A token of `user`'s, and a job submitted with it that runs until the test ends."""
    token = service.cli("token", "create", user.name).stdout.strip()
    as_user = {"Authorization": f"Bearer {token}"}
    r = httpx.post(f"{service.url}/v1/jobs", json={"command": ["sleep", "60"]}, headers=as_user)
    assert r.status_code == 201
    return token, str(r.json()["id"])


def _sign_in(page: Page, url: str, token: str) -> None:
    """The dashboard at `url` opened with `token` in its link, signed in by a click."""
    page.goto(f"{url}/?token={token}")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("body[data-loaded=true]")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# Bob's server on another port of 127.0.0.1: a page, and every Cookie header it is sent,
# one a line on its output.
COOKIE_JAR = r"""
import http.server, sys
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print(self.headers.get("Cookie", ""), flush=True)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<!doctype html><title>bob</title>")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Page).serve_forever()
"""


def test_the_cookie_another_users_page_is_sent_is_no_token(
    service: Service, browser: Browser, local_users: dict[str, User]
) -> None:
    """A browser sends the cookies of 127.0.0.1 to every port of it: Alice, signed in to the
    dashboard, who then opens a page Bob serves on another port sends him her cookie. It
    held her token, which Bob could send as his own (here, to cancel her job). It now stands
    only for the dashboard's reads, and is refused as a token."""
    alice, bob = local_users["alice"], local_users["bob"]
    token, mine = _token_and_job(service, alice)
    port = free_port()
    jar = subprocess.Popen(
        bob.cmd(bob.python, "-c", COOKIE_JAR, str(port)), stdout=subprocess.PIPE, text=True
    )
    try:
        wait_for("Bob's page", lambda: _answers(f"http://127.0.0.1:{port}/"))
        with browser.new_context() as context:
            page = context.new_page()
            _sign_in(page, service.url, token)  # Alice opens her dashboard
            page.goto(f"http://127.0.0.1:{port}/")  # and then Bob's page
            page.wait_for_load_state()
    finally:
        jar.kill()
        sent, _ = jar.communicate(timeout=10)
    cookies = [c.partition("=")[2] for line in sent.splitlines() for c in line.split("; ")]
    stolen = [c for c in cookies if c.startswith(("ais_", "aisd_"))]
    assert stolen, f"the browser sent Bob no cookie of the service: {sent!r}"
    for value in stolen:
        r = httpx.post(
            f"{service.url}/v1/jobs/{mine}/cancel", headers={"Authorization": f"Bearer {value}"}
        )
        assert r.status_code == 401
    assert service.job(mine)["state"] == "running"
