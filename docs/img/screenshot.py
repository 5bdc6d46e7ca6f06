"""Screenshot a page (a URL or an HTML file) in headless Chromium, as the browser test does.

python docs/img/screenshot.py out/report/index.html docs/img/sim-report.png
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main(source: str, out: str, width: int = 1000) -> None:
    url = source if "://" in source else Path(source).resolve().as_uri()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = browser.new_page(viewport={"width": width, "height": 800})
        page.goto(url)
        page.screenshot(path=out, full_page=True)
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
