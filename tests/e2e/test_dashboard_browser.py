"""The dashboard in a real headless Chromium, against the real service and the real CLI.

It needs Debian's `chromium` at /usr/bin/chromium (`.ci/run` installs it) and Playwright from
the dev extra; it is skipped, saying so, only when Chromium is absent. The screenshot goes to the
test's folder, and also to `$AISCHED_SCREENSHOT_DIR` when that is set (how docs/img is made).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Service, wait_for
from playwright.sync_api import Browser, Page, expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"

pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"no Chromium at {CHROMIUM} (Debian: apt-get install -y chromium; .ci/run does)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    p = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        yield p
    finally:
        p.close()


def test_dashboard_shows_the_running_job_on_its_gpus_and_why_another_waits(
    service: Service, page: Page, tmp_path: Path
) -> None:
    done = service.run("--gpus", "1", "--name", "prep", "--", sys.executable, "-c", "pass")
    service.wait_state(done, "succeeded")
    train = service.run("--gpus", "3", "--name", "train", "--", sys.executable, "-c", WAIT, "go")
    service.wait_state(train, "running")
    evaluate = service.run("--gpus", "2", "--name", "eval", "--", sys.executable, "-c", "pass")
    reason = wait_for("a reason for the waiting job", lambda: service.job(evaluate)["reason"])
    node = service.cli_json("nodes")["nodes"][0]
    held = sorted(g["index"] for g in node["gpus"] if g["used_by"])
    assert len(held) == 3

    page.goto(f"{service.url}/")
    expect(page.locator("body[data-loaded=true]")).to_have_count(1)
    for gpu in node["gpus"]:
        cell = page.locator(f'.gpu[data-node="{node["name"]}"][data-gpu="{gpu["index"]}"]')
        if gpu["index"] in held:
            expect(cell).to_have_attribute("data-state", "used")
            expect(cell).to_contain_text(f"job {train}")
            expect(cell).to_contain_text("train")
        else:
            expect(cell).to_have_attribute("data-state", "free")
    row = page.locator(f'#pending tr[data-job="{evaluate}"]')
    expect(row).to_contain_text("eval")
    expect(row.locator("td.reason")).to_have_text(reason)
    expect(page.locator('#queues tr[data-queue="default"]')).to_contain_text("3")
    expect(page.locator(f'#timeline g[data-job="{train}"] rect.bar-running')).to_have_count(1)
    expect(page.locator(f'#timeline g[data-job="{done}"] rect.bar-succeeded')).to_have_count(1)
    expect(page.locator("#utilisation polyline.line-gpu")).to_have_count(1)

    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if out := os.environ.get("AISCHED_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(out) / "dashboard.png")
    (service.work / "go").touch()
    service.wait_state(train, "succeeded")
