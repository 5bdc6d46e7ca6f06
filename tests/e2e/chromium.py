"""A real headless Chromium for the dashboard's tests: Debian's `chromium` at /usr/bin/chromium
(`.ci/run` installs it), driven through Playwright (the dev extra). A module that uses it marks
itself `needs_chromium` (skipped, saying so, only where Chromium is absent) and asks for the
`browser` fixture (conftest.py offers it): one Chromium per module, in which each test opens a
context (a profile) of its own, so no cookie passes from one test to the next. Playwright is
imported by the fixture alone: the e2e conftest, so every e2e module, imports this one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser

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

needs_chromium = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"no Chromium at {CHROMIUM} (Debian: apt-get install -y chromium; .ci/run does)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()
