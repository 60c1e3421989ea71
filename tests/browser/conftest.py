"""The approval console in a real browser: Debian's Chromium, driven by Playwright, against
the deployment the end-to-end tests use (the six services as real processes).

Playwright cannot download its own browsers here: it launches the distribution's
`/usr/bin/chromium` (`WRIT_CHROMIUM` names another). Without it these tests are skipped, and
the run says so in its summary, plainly."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import db, payments, stack  # noqa: F401  (the same deployment)

CHROMIUM = os.environ.get("WRIT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
MISSING = not Path(CHROMIUM).exists()
WHY = (f"BROWSER TESTS DID NOT RUN: no Chromium at {CHROMIUM} "
       "(install it with `apt-get install chromium`, as .ci/run does)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if MISSING:
        for item in items:
            if "tests/browser" in str(item.fspath):
                item.add_marker(pytest.mark.skip(reason=WHY))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if MISSING:
        terminalreporter.section("browser tests", sep="!", red=True, bold=True)
        terminalreporter.line(WHY, red=True, bold=True)


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    """One headless Chromium for the module."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                            args=["--no-sandbox", "--disable-gpu"])
        yield launched
        await launched.close()
