"""The console in the approver's language, in real Chromium against the real deployment: a
browser that asks for French reads the proposal in French with its amounts written the French
way, and the language switch keeps its choice across pages."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import httpx
import pytest
from playwright.async_api import expect

from tests.browser.test_console import WAIT_MS, _api, _console, _propose_refund
from tests.e2e.test_http_api import auth, key
from tests.e2e.test_proposals import _refunds
from tests.fixtures.axe import axe_violations
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(300)]
expect.set_options(timeout=30_000)


async def test_a_french_browser_reads_the_proposal_in_french_and_the_switch_is_kept(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    payment_id, proposal_id = _propose_refund(stack, payments)
    context = await browser.new_context(locale="fr-FR", viewport={"width": 1100, "height": 900})
    page = await context.new_page()
    await page.goto(stack.console_link())
    await expect(page).to_have_url(_console(stack))
    await expect(page.locator("html")).to_have_attribute("lang", "fr")
    await expect(page.locator("h1")).to_have_text("À traiter")
    assert await axe_violations(page) == []

    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("html")).to_have_attribute("lang", "fr")
    # Playwright reads the no-break spaces French puts in amounts as spaces.
    amounts = {
        "Amount to refund": ("Montant à rembourser", "15,00 €"),
        "Current order total": ("Total actuel de la commande", "300,00 €"),
        "Resulting order total": ("Total de la commande après", "285,00 €"),
    }
    for field, (label, value) in amounts.items():
        cell = page.locator(f'#preview td[data-field="{field}"]')
        await expect(cell).to_have_text(value)
        assert "\u00a0€" in await cell.text_content()
        row = page.locator("#preview tr").filter(has=page.locator(f'td[data-field="{field}"]'))
        await expect(row.locator("th")).to_have_text(label)
    await expect(page.locator("#outcome-text")).to_contain_text("en attente d'un approbateur")
    await expect(page.locator("#approve")).to_have_text("Approuver exactement ceci")
    assert ".00" not in await page.locator("#preview").inner_text()
    # In French as in English, axe-core finds nothing to say (the page's language included).
    assert await axe_violations(page) == []

    # The switch: English, kept on the next page although the browser still asks for French.
    await page.locator("#lang-en").click()
    await expect(page).to_have_url(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("html")).to_have_attribute("lang", "en")
    await expect(page.locator('#preview td[data-field="Amount to refund"]')).to_have_text(
        "15.00 EUR"
    )
    await page.goto(_console(stack))
    await expect(page.locator("html")).to_have_attribute("lang", "en")
    await expect(page.locator("h1")).to_have_text("Inbox")
    # And back to French, where the answer is given and its outcome followed.
    await page.locator("#lang-fr").click()
    await expect(page.locator("h1")).to_have_text("À traiter")
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await page.locator("#approve").click()
    await expect(page.locator("#answered")).to_have_text(
        "Approuvée : l'unique exécution a commencé."
    )
    await expect(page.locator("#outcome-text")).to_contain_text(
        "résultat : réussie", timeout=WAIT_MS
    )
    [refund] = _refunds(payments, payment_id)
    assert refund["amount_cents"] == 1500
    await context.close()


async def test_the_switch_goes_back_only_to_a_console_page(browser: Any, stack: Stack) -> None:
    context = await browser.new_context()
    page = await context.new_page()
    sent = await page.request.get(
        _console(stack, "lang/fr?back=//elsewhere.example/x"), max_redirects=0
    )
    assert sent.status == 303 and sent.headers["location"] == "/console/"
    unknown = await page.request.get(_console(stack, "lang/de"), max_redirects=0)
    assert unknown.status == 404
    assert [c["name"] for c in await context.cookies()] == ["writ_lang"]
    await context.close()


async def test_a_french_approver_reads_refusals_and_reasons_in_french(
    browser: Any, stack: Stack, db: asyncpg.Connection
) -> None:
    tag = uuid.uuid4().hex[:8]
    early, barred, lead = (f"{who}-{tag}@acme.example" for who in ("early", "barred", "lead"))
    with _api(stack) as api:
        waiting = api.post(
            "/commands",
            headers={**auth(stack), **key()},
            json={
                "agent": "billing-assistant",
                "operation_key": f"charge-{tag}",
                "action": "payment.charge.create",
                "arguments": {
                    "customer_id": "ACME-42",
                    "amount_cents": 73000,
                    "currency": "EUR",
                    "description": "Refusals in French",
                },
            },
        )
    assert waiting.json()["status"] == "awaiting_human", waiting.text
    proposal_id = waiting.json()["proposal"]["proposal_id"]

    async def tab(principal: str) -> Any:
        context = await browser.new_context(locale="fr-FR", viewport={"width": 1100, "height": 900})
        page = await context.new_page()
        await page.goto(stack.console_link(principal=principal, roles=("approver",)))
        await page.goto(_console(stack, f"proposals/{proposal_id}"))
        await expect(page.locator("html")).to_have_attribute("lang", "fr")
        return page

    async def revoke(principal: str) -> None:
        await db.execute(
            "INSERT INTO governance.revocations (tenant, principal, revoked_by) "
            "VALUES ('acme', $1, 'admin@acme.example')",
            principal,
        )

    first = await tab(early)
    await first.locator("#approve").click()
    await expect(first.locator("#answered")).to_have_text(
        "Votre approbation est enregistrée : un autre approbateur doit aussi l'approuver."
    )
    await revoke(early)
    # A revoked approver's approval is refused, with its code, and why in French.
    refused = await tab(barred)
    await revoke(barred)
    await refused.locator("#approve").click()
    await expect(refused.locator("#answered")).to_have_text(
        "Non approuvée — FORBIDDEN : l'accès de l'approbateur a été révoqué"
    )
    # The approval that no longer counts is said so in French, from its code.
    page = await tab(lead)
    await expect(page.locator("#approvals")).to_contain_text("0 approbation(s) sur 2")
    await expect(page.locator(f'#approvals-given li[data-approver="{early}"]')).to_have_text(
        f"{early} — a approuvé, ne compte plus : "
        "l'accès de l'approbateur a été révoqué après son approbation"
    )
    assert await axe_violations(page) == []
    # A rejection's recorded reason: Writ's words in French, the approver's own as written.
    await page.locator("#reason").fill("montant à revoir")
    await page.locator("#reject").click()
    await expect(page.locator("#answered")).to_have_text("Rejetée.")
    await expect(page.locator("#outcome-text")).to_have_text(
        f"rejetée : rejetée par {lead} : montant à revoir", timeout=WAIT_MS
    )
    assert await axe_violations(page) == []
    for each in (first, refused, page):
        await each.context.close()
