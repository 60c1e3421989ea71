"""The console's pages, checked by axe-core inside real Chromium at a desktop's width and a
390 px phone's: every state an approver meets has no accessibility violation."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import msgspec
import nats
import pytest
from playwright.async_api import Page, expect

from schemas import subjects
from schemas.governance import DecideRequest, Decision
from tests.browser.test_console import WAIT_MS, _api, _console, _propose_refund
from tests.e2e.test_http_api import auth, key
from tests.fixtures.axe import axe_violations
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(600)]

WIDTHS = (1100, 390)


async def _asked(stack: Stack) -> str:
    """A pending decision about a call no action contract describes (an unclassified tool):
    the decision page, not a proposal's, answers it."""
    nc = await nats.connect(stack.nats_url, max_reconnect_attempts=-1)
    try:
        ask = DecideRequest(
            tenant="acme",
            principal="alice@acme.example",
            agent="crm-assistant",
            run_id=f"run-{uuid.uuid4().hex[:8]}",
            tool="lookup.weather",
            first_argument="Lyon",
        )
        reply = await nc.request(subjects.DECIDE, msgspec.json.encode(ask), timeout=10)
    finally:
        await nc.close()
    decision = msgspec.json.decode(reply.data, type=Decision)
    assert decision.verdict == "ask" and decision.pending_id, decision
    return decision.pending_id


async def _clean(page: Page, where: str) -> None:
    found = await axe_violations(page)
    assert found == [], f"{where}: " + "\n".join(found)


async def test_every_page_an_approver_meets_has_no_axe_violation(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    _, proposal_id = _propose_refund(stack, payments)
    _, rejected_id = _propose_refund(stack, payments)
    pending_id = await _asked(stack)
    with _api(stack) as api:
        refused = api.post(
            f"/proposals/{rejected_id}/reject",
            json={"reason": "Not this line."},
            headers={**auth(stack, principal="lead@acme.example", roles=["approver"]), **key()},
        )
    assert refused.status_code == 200, refused.text
    for width in WIDTHS:
        context = await browser.new_context(viewport={"width": width, "height": 900})
        page = await context.new_page()
        await page.goto(stack.console_link())
        await expect(page.locator(f'#inbox-rows tr[data-id="{proposal_id}"]')).to_be_visible()
        await _clean(page, f"the inbox at {width} px")
        await page.goto(_console(stack, f"proposals/{proposal_id}"))
        await expect(page.locator("#preview")).to_be_visible()
        await _clean(page, f"a pending proposal at {width} px")
        await page.goto(_console(stack, f"proposals/{rejected_id}"))
        await expect(page.locator("#outcome-text")).to_contain_text("rejected")
        await _clean(page, f"a rejected proposal at {width} px")
        await page.goto(_console(stack, f"decisions/{pending_id}"))
        await expect(page.locator("h1")).to_be_visible()
        await _clean(page, f"a decision at {width} px")
        await context.close()
    # An answer's pages too: the approved proposal with its outcome, the answered decision.
    page = await (await browser.new_context(viewport={"width": 390, "height": 900})).new_page()
    await page.goto(stack.console_link())
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await page.locator("#approve").click()
    await expect(page.locator("#outcome-text")).to_contain_text(
        "outcome: succeeded", timeout=WAIT_MS
    )
    await _clean(page, "an approved proposal")
    await page.goto(_console(stack, f"decisions/{pending_id}"))
    await page.locator('button[value="deny"]').click()
    await expect(page.locator("#answered")).to_be_visible()
    await _clean(page, "an answered decision")
    await page.context.close()
