"""The approval console in a real browser: Debian's Chromium, driven by Playwright, against
the deployment the end-to-end tests use (the six services as real processes).

Playwright cannot download its own browsers here: it launches the distribution's
`/usr/bin/chromium` (`WRIT_CHROMIUM` names another). Without it these tests are skipped, and
the run says so in its summary, plainly."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import db, payments, service_violations  # noqa: F401
from writ.stack import Stack

CHROMIUM = os.environ.get("WRIT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
MISSING = not Path(CHROMIUM).exists()
WHY = (
    f"BROWSER TESTS DID NOT RUN: no Chromium at {CHROMIUM} "
    "(install it with `apt-get install chromium`, as .ci/run does)"
)


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
def stack(admin_dsn: str) -> Iterator[Stack]:
    """A deployment like the end-to-end tests' (the six services as real processes, every one
    as its own NATS user), for this module only: stopped before the next module starts."""
    with tempfile.TemporaryDirectory(prefix="writ-browser-") as home:
        deployment = Stack(
            Path(home),
            nats_url=os.environ.get("WRIT_TEST_NATS_URL") or None,
            admin_dsn=admin_dsn,
            database=f"browser_{uuid.uuid4().hex[:8]}",
        )
        try:
            deployment.start_all()
            yield deployment
            assert service_violations(deployment) == [], service_violations(deployment)
        finally:
            deployment.stop()


@pytest.fixture(scope="module")
async def browser(stack: Stack) -> AsyncIterator[Any]:
    """One headless Chromium for the module (after its deployment: starting one runs its own
    event loop, which cannot start inside the tests' once that runs)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        yield launched
        await launched.close()
