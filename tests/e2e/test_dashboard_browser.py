"""The dashboard in a real headless Chromium, against the real service and the real CLI.

It needs Chromium and Playwright (see `chromium.py`); it is skipped, saying so, only when
Chromium is absent. The screenshot goes to the test's folder, and also to
`$AISCHED_SCREENSHOT_DIR` when that is set (how docs/img is made).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chromium import needs_chromium
from harness import Service, free_port, local_service, wait_for
from playwright.sync_api import Browser, Page, expect
from users import User

WAIT = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"
QUEUES = """
queues:
  - {name: research, guarantee: {gpus: 1}, borrowing: true}
  - {name: prod, guarantee: {gpus: 3}}
"""

pytestmark = needs_chromium


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    p = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    """The e2e service (4 declared GPUs) with two queues: research (guarantee 1 GPU, may
    borrow) and prod (guarantee 3)."""
    config = tmp_path / "aisched.yaml"
    config.write_text(QUEUES)
    work = tmp_path / "work"
    work.mkdir()
    args = ["--gpus", "4", "--cpus", "4", "--mem", "8G", "--config", str(config)]
    svc = Service(tmp_path / "home", free_port(), work, args)
    svc.home.mkdir()
    svc.start()
    try:
        yield svc
    finally:
        (work / "go").touch()  # every holding task ends; nothing outlives the test
        try:
            wait_for("every job to end", lambda: not svc.api.get("/v1/jobs").json()["jobs"])
        finally:
            svc.stop()


def hold(service: Service, *args: str) -> str:
    job_id = service.run(*args, "--", sys.executable, "-c", WAIT, "go")
    service.wait_state(job_id, "running")
    return job_id


def test_dashboard_shows_the_running_job_on_its_gpus_and_why_another_waits(
    service: Service, page: Page, tmp_path: Path
) -> None:
    done = service.run("--gpus", "1", "--queue", "research", "--name", "prep", "--", "true")
    service.wait_state(done, "succeeded")
    train = hold(service, "--gpus", "2", "--queue", "research", "--name", "train")
    serve_a = hold(service, "--gpus", "0.5", "--queue", "prod", "--name", "serve-a")
    serve_b = hold(service, "--gpus", "0.5", "--queue", "prod", "--name", "serve-b")
    evaluate = service.run("--gpus", "2", "--queue", "research", "--name", "eval", "--", "true")
    reason = wait_for("a reason for the waiting job", lambda: service.job(evaluate)["reason"])
    node = service.cli_json("nodes")["nodes"][0]
    users = {g["index"]: sorted(u["job"] for u in g["used_by"]) for g in node["gpus"]}
    assert sorted(users.values()) == sorted([[], sorted([serve_a, serve_b]), [train], [train]])

    # The link fills the login form in; the user signs in with it.
    page.goto(f"{service.url}/?token={service.admin_token()}")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("body[data-loaded=true]")).to_have_count(1)
    for index, jobs in users.items():
        cell = page.locator(f'.gpu[data-node="{node["name"]}"][data-gpu="{index}"]')
        if jobs == [train]:
            expect(cell).to_have_attribute("data-state", "used")
            expect(cell).to_contain_text(f"job {train}")
            expect(cell).to_contain_text("train")
        elif jobs:
            expect(cell).to_have_attribute("data-state", "shared")
            expect(cell).to_contain_text(f"job {serve_a}")
            expect(cell).to_contain_text(f"job {serve_b}")
        else:
            expect(cell).to_have_attribute("data-state", "free")
    row = page.locator(f'#pending tr[data-job="{evaluate}"]')
    expect(row).to_contain_text("eval")
    expect(row.locator("td.reason")).to_have_text(reason)
    research = page.locator('#queues tr[data-queue="research"] td')
    # used 2, guarantee 1, borrowed 1
    expect(research.nth(2)).to_have_text("2")
    expect(research.nth(4)).to_have_text("1")
    expect(page.locator(f'#timeline g[data-job="{train}"] rect.bar-running')).to_have_count(1)
    expect(page.locator(f'#timeline g[data-job="{done}"] rect.bar-succeeded')).to_have_count(1)
    expect(page.locator("#utilisation polyline.line-gpu")).to_have_count(1)

    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if out := os.environ.get("AISCHED_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(out) / "dashboard.png")


def test_dashboard_shows_each_users_holding_against_the_per_user_limit(
    page: Page, tmp_path: Path, local_users: dict[str, User]
) -> None:
    tmp_path.chmod(0o755)  # the users' jobs run in their homes; the service's files stay private
    config = (
        "queues:\n  - name: default\n  - {name: team, user_limit: {gpus: 2}, max_priority: 50}\n"
    )
    with local_service(tmp_path, config=config) as service:
        alice, bob = local_users["alice"], local_users["bob"]

        def run_as(user: User) -> str:
            env = {"AISCHED_SERVER": f"unix:{service.socket}"}
            args = ("run", "--json", "--queue", "team", "--gpus", "1", "--", "sleep", "300")
            proc = user.aisched(*args, env=env)
            assert proc.returncode == 0, proc.stderr
            return str(json.loads(proc.stdout)["id"])

        for jid in (run_as(alice), run_as(alice), run_as(bob)):
            service.wait_state(jid, "running")
        held = run_as(alice)
        wait_for("alice's third job held by her limit", lambda: service.job(held)["reason"])

        page.goto(f"{service.url}/?token={service.admin_token()}")
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("body[data-loaded=true]")).to_have_count(1)
        expect(page.locator('#queues tr[data-queue="team"] td.user-limit')).to_have_text("2 GPU")
        expect(page.locator('#queues tr[data-queue="default"] td.user-limit')).to_have_text("-")
        expect(page.locator('#queues tr[data-queue="team"] td.max-priority')).to_have_text("50")
        expect(page.locator('#queues tr[data-queue="default"] td.max-priority')).to_have_text("0")
        users = page.locator('#queues tr.queue-user[data-in-queue="team"]')
        expect(users).to_have_count(2)
        hers = users.and_(page.locator(f'[data-user="{alice.name}"]'))
        expect(hers).to_have_class("queue-user at-limit")
        expect(hers.locator("td.held")).to_have_text(
            "2 of 2 GPU (at the limit: their next job here waits)"
        )
        his = users.and_(page.locator(f'[data-user="{bob.name}"]'))
        expect(his).to_have_class("queue-user")
        expect(his.locator("td.held")).to_have_text("1 of 2 GPU")


def test_the_waiting_list_starts_with_the_longest_waiting_and_counts_the_rest(
    service: Service, page: Page
) -> None:
    hold(service, "--gpus", "4", "--queue", "research", "--name", "all")
    job = {"command": ["true"], "resources": {"gpus": 1}, "queue": "research"}
    waiting = [service.api.post("/v1/jobs", json=job).json()["id"] for _ in range(203)]
    try:
        page.goto(f"{service.url}/?token={service.admin_token()}")
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("#pending tr[data-job]")).to_have_count(200)
        expect(page.locator("#pending tr[data-job]").first).to_have_attribute(
            "data-job", waiting[0]
        )
        expect(page.locator("#pending tr.more")).to_have_text(
            "and 3 more waiting jobs, submitted later"
        )
    finally:
        service.api.post("/v1/jobs/cancel", json={"state": "pending"})


# Whether the last header cell of the table `selector` lies inside its card once scrolled to
# (in the card itself where it is wider than the card; never past the card's edge).
LAST_HEADER_IN_CARD = """(selector) => {
  const th = [...document.querySelectorAll(selector + " th")].at(-1);
  th.scrollIntoView({ block: "nearest", inline: "nearest" });
  const cell = th.getBoundingClientRect();
  const card = th.closest("section").getBoundingClientRect();
  return { cell: [cell.left, cell.right], card: [card.left, card.right] };
}"""


def test_every_column_of_the_queues_table_can_be_seen_inside_its_card(
    service: Service, page: Page
) -> None:
    # Ten columns with a bar of at least 140 px: at common widths the last ones ("max
    # priority", "per user") lay outside their card, past its edge or under the next card.
    page.goto(f"{service.url}/?token={service.admin_token()}")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("body[data-loaded=true]")).to_have_count(1)
    for width in (1280, 1600, 1920, 2400):
        page.set_viewport_size({"width": width, "height": 1000})
        for table in ("#queues", "#pending"):
            box = page.evaluate(LAST_HEADER_IN_CARD, table)
            (left, right), (card_left, card_right) = box["cell"], box["card"]
            assert card_left <= left and right <= card_right, (width, table, box)


def test_two_services_on_one_host_keep_their_dashboards_signed_in(
    service: Service, page: Page, tmp_path: Path
) -> None:
    # A browser keeps one cookie of a name per host, whatever the port: under one name,
    # signing in to the second service signed the browser out of the first.
    (tmp_path / "other").mkdir()
    with local_service(tmp_path / "other") as other:
        for svc in (service, other):
            page.goto(f"{svc.url}/?token={svc.admin_token()}")
            page.get_by_role("button", name="Sign in").click()
            expect(page.locator("body[data-loaded=true]")).to_have_count(1)
        for svc in (service, other):
            page.goto(f"{svc.url}/")
            expect(page.locator("body[data-loaded=true]")).to_have_count(1)
            assert page.request.get(f"{svc.url}/v1/dashboard").status == 200, svc.url
        names = sorted(c["name"] for c in page.context.cookies())
        assert names == sorted(f"aisched_token_{svc.port}" for svc in (service, other))


def test_the_pages_work_under_their_content_security_policy(service: Service, page: Page) -> None:
    # default-src 'self' refuses inline styles: the queue bars' widths and the login form's
    # layout must come through the stylesheet or the CSSOM, and the browser reports none refused.
    hold(service, "--gpus", "2", "--queue", "research", "--name", "train")
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Security Policy" in m.text else None)
    login = page.goto(f"{service.url}/?token={service.admin_token()}")
    assert login is not None
    policy = login.headers["content-security-policy"]
    assert policy.startswith("default-src 'self'") and "frame-ancestors 'none'" in policy
    assert login.headers["referrer-policy"] == "no-referrer"
    form = page.locator("main.login").bounding_box()
    assert form is not None and form["width"] <= 28 * 16
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("body[data-loaded=true]")).to_have_count(1)
    research = page.locator('#queues tr[data-queue="research"] .qbar')
    used, borrowed = research.locator(".used"), research.locator(".borrowed")
    expect(borrowed).to_have_count(1)  # 2 GPUs used, 1 guaranteed: 1 borrowed
    whole, within, over = (b.bounding_box() for b in (research, used, borrowed))
    assert whole and within and over
    assert within["width"] == pytest.approx(whole["width"] / 2, abs=2)
    assert over["x"] == pytest.approx(within["x"] + within["width"], abs=2)
    assert refused == []


def sign_in(service: Service, page: Page, token: str | None = None) -> None:
    page.goto(f"{service.url}/?token={token or service.admin_token()}")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("body[data-loaded=true]")).to_have_count(1)


def test_a_revoked_token_brings_the_login_form_back(service: Service, page: Page) -> None:
    # The page said "cannot reach the service: ...401" and kept the last data it had.
    token = service.cli("token", "create", "root", "--note", "wall").stdout.strip()
    sign_in(service, page, token)
    [made] = [
        t["id"]
        for t in json.loads(service.cli("token", "list", "--json").stdout)
        if t["note"] == "wall"
    ]
    service.cli("token", "revoke", made)
    expect(page.locator('input[name="token"]')).to_have_count(1, timeout=15_000)
    expect(page.locator("#queues")).to_have_count(0)


def test_an_estimated_start_on_another_day_shows_its_date(service: Service, page: Page) -> None:
    # It showed only a time of day ("22:34:31 (in 3.0d)"), which reads as today.
    hold(service, "--gpus", "4", "--queue", "research", "--estimate", "3d", "--name", "long")
    waiting = service.run("--gpus", "1", "--queue", "research", "--", "true")
    eta = wait_for("an estimated start", lambda: service.job(waiting)["eta"])
    sign_in(service, page)
    day = time.strftime("%Y-%m-%d", time.localtime(eta))
    estimated = page.locator(f'#pending tr[data-job="{waiting}"] td').nth(5)
    expect(estimated).to_have_text(re.compile(rf"^{day} \d\d:\d\d:\d\d \(in 3\.0d\)$"))
    service.cli("cancel", waiting)


def test_a_job_preempted_and_requeued_shows_its_run_as_running(
    service: Service, page: Page
) -> None:
    # From its first start on, a requeued job was drawn grey, as if it had never run.
    low = hold(service, "--gpus", "4", "--queue", "research", "--name", "low")
    high = service.run(
        "--gpus", "4", "--queue", "research", "--priority", "10", "--", sys.executable, "-c",
        WAIT, "go",
    )  # fmt: skip
    service.wait_state(high, "running")
    assert service.wait_state(low, "pending")["preemptions"] == 1
    sign_in(service, page)
    row = page.locator(f'#timeline g[data-job="{low}"]')
    expect(row.locator("rect.bar-running")).to_have_count(1)  # its first run
    waits = row.locator("rect.bar-wait")
    expect(waits).to_have_count(2)  # before it, and since
    ran, since = row.locator("rect.bar-running").bounding_box(), waits.nth(1).bounding_box()
    assert ran and since and since["x"] == pytest.approx(ran["x"] + ran["width"], abs=2)
