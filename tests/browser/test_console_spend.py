"""The console's spend page in real Chromium against a deployment: an approver sees the
tenant's spend against each cap of its signed price table (what governance settled and holds,
the limit, what is left), in English and French, with no axe-core violation at a desktop's
width and a 390 px phone's."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import httpx
import msgspec
import nats
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from playwright.async_api import expect

from libs import budget
from schemas import subjects
from schemas.governance import RegisterRun, RunRegistered
from services.governance.spend import Cap, ModelPrice, PriceTable, sign_prices
from tests.browser.test_console import _api, _console, _signed_in
from tests.e2e.test_http_api import auth
from tests.fixtures.axe import axe_violations
from writ.stack import POLICY_KEY_ID, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(600)]

AGENT = "billing-assistant"


def _install(stack: Stack, caps: list[Cap]) -> None:
    """Sign and install acme's price table: 10.00 per million tokens of the scripted model."""
    key = serialization.load_pem_private_key(
        (stack.secrets / "policy-signing.pem").read_bytes(), password=None
    )
    assert isinstance(key, Ed25519PrivateKey)
    table = PriceTable(
        tenant="acme",
        version=f"console-{len(caps)}",
        currency="EUR",
        models={"scripted/scripted": ModelPrice(input_per_mtok="10", output_per_mtok="10")},
        caps=caps,
    )
    folder = stack.policies / "prices"
    folder.mkdir(exist_ok=True)
    tmp = folder / ".acme.json.tmp"
    tmp.write_bytes(sign_prices(table, key, POLICY_KEY_ID))
    tmp.replace(folder / "acme.json")


def _spend(stack: Stack) -> httpx.Response:
    with _api(stack) as api:
        return api.get(
            "/spend", headers=auth(stack, principal="ops@acme.example", roles=["approver"])
        )


async def _caps_shown(stack: Stack, n: int) -> list[dict[str, Any]]:
    with anyio.fail_after(30):
        while len(got := _spend(stack).json()["spend"]) != n:
            await anyio.sleep(0.2)
    return got


async def _spent(stack: Stack) -> None:
    """A billing run's model call: 10,000 tokens held (0.10), then 5,000 settled (0.05)."""
    nc = await nats.connect(stack.nats_url, max_reconnect_attempts=-1)
    try:
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        register = RegisterRun(
            tenant="acme", run_id=run_id, principal="alice@acme.example", agent=AGENT
        )
        reply = await nc.request(subjects.REGISTER_RUN, msgspec.json.encode(register), timeout=10)
        assert msgspec.json.decode(reply.data, type=RunRegistered).run_id == run_id
        held = []
        for seq in (0, 1):
            held.append(
                await budget.reserve(
                    nc,
                    tenant="acme",
                    run_id=run_id,
                    step_key=f"{run_id}:{seq}:model",
                    provider_calls=1,
                    tokens=10_000,
                    model="scripted/scripted",
                )
            )
        await budget.settle(
            nc,
            tenant="acme",
            run_id=run_id,
            reservation_id=held[0].reservation_id,
            provider_calls=1,
            tokens=5_000,
        )
    finally:
        await nc.close()


async def test_an_approver_sees_spend_against_each_cap_with_no_axe_violation(
    browser: Any, stack: Stack
) -> None:
    _install(
        stack,
        [
            Cap(name="billing-day", window="day", limit="20", agent=AGENT),
            Cap(name="billing-month", window="month", limit="1500", agent=AGENT),
        ],
    )
    try:
        assert {c["used_micros"] for c in await _caps_shown(stack, 2)} == {0}
        await _spent(stack)
        # An approver of the tenant only: a token without the role is refused.
        with _api(stack) as api:
            refused = api.get("/spend", headers=auth(stack, principal="bob@acme.example"))
        assert refused.status_code == 403, refused.text
        for width in (1100, 390):
            context = await browser.new_context(viewport={"width": width, "height": 900})
            page = await context.new_page()
            await page.goto(stack.console_link())
            # The console's navigation leads an approver to the spend page, marked current.
            await expect(page.locator("#nav-inbox")).to_have_attribute("aria-current", "page")
            await page.locator("#nav-spend").click()
            await expect(page).to_have_url(_console(stack, "spend"))
            await expect(page.locator("#nav-spend")).to_have_attribute("aria-current", "page")
            day = page.locator('#spend tr[data-cap="billing-day"]')
            await expect(day).to_be_visible()
            cells = await day.locator("td").all_inner_texts()
            # Settled 0.05, held 0.10 (the open step's worst case), 19.85 left of 20.00.
            assert cells[2:] == ["0.05 EUR", "0.10 EUR", "20.00 EUR", "19.85 EUR", "0 %"], cells
            month = await page.locator('#spend tr[data-cap="billing-month"] td').all_inner_texts()
            assert month[5] == "1,499.85 EUR", month
            found = await axe_violations(page)
            assert found == [], f"the spend page at {width} px: " + "\n".join(found)
            await page.goto(_console(stack, "lang/fr?back=/console/spend"))
            await expect(page.locator("html")).to_have_attribute("lang", "fr")
            month = await page.locator('#spend tr[data-cap="billing-month"] td').all_inner_texts()
            assert month[5] == "1\u202f499,85\u00a0€", month
            assert await axe_violations(page) == []
            await context.close()
    finally:
        _install(stack, [])


async def test_the_spend_page_is_in_the_navigation_of_approvers_only(
    browser: Any, stack: Stack
) -> None:
    # An auditor reads the console but not the spend: no link to it, none violating axe-core.
    page = await _signed_in(browser, stack, principal="audit@acme.example", roles=("auditor",))
    await expect(page.locator("nav.pages #nav-inbox")).to_be_visible()
    await expect(page.locator("#nav-spend")).to_have_count(0)
    assert await axe_violations(page) == []
    await page.context.close()
    page = await _signed_in(browser, stack, principal="lead@acme.example", roles=("approver",))
    await expect(page.locator("nav.pages #nav-spend")).to_have_attribute("href", "/console/spend")
    assert await axe_violations(page) == []
    await page.context.close()
