"""The console's pages, checked: by axe-core inside real Chromium at a desktop's width and a
390 px phone's (every state an approver meets has no accessibility violation), and a
proposal's trail against the signed journals."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
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


async def _asked(stack: Stack, principal: str = "alice@acme.example") -> str:
    """A pending decision about a call no action contract describes (an unclassified tool):
    the decision page, not a proposal's, answers it."""
    nc = await nats.connect(stack.nats_url, max_reconnect_attempts=-1)
    try:
        ask = DecideRequest(
            tenant="acme",
            principal=principal,
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


async def test_the_trail_shows_every_step_checked_and_names_the_row_that_fails(
    browser: Any, stack: Stack, payments: httpx.Client, db: asyncpg.Connection
) -> None:
    _, proposal_id = _propose_refund(stack, payments)
    with _api(stack) as api:
        approved = api.post(
            f"/proposals/{proposal_id}/approve",
            json={},
            headers={**auth(stack, principal="lead@acme.example", roles=["approver"]), **key()},
        )
    assert approved.json()["status"] == "claimed", approved.text
    # An auditor reads it (read-only: no answer offered).
    context = await browser.new_context(viewport={"width": 1100, "height": 900})
    page = await context.new_page()
    await page.goto(stack.console_link(principal="audit@acme.example", roles=("auditor",)))
    verdict = page.locator("#trail-verdict")
    for _ in range(60):  # until the outcome is recorded and every row sealed
        await page.goto(_console(stack, f"proposals/{proposal_id}"))
        if "check out" in await verdict.inner_text() and (
            await page.locator('#trail tr[data-step="Outcome"]').count()
        ):
            break
        await page.wait_for_timeout(1000)
    await expect(verdict).to_contain_text("rows check out against the signed journals")
    steps = [
        (await r.get_attribute("data-step"), await r.locator("td").nth(1).inner_text())
        for r in await page.locator("#trail tbody tr").all()
    ]
    assert steps[0] == ("Proposed", "alice@acme.example"), steps
    assert ("Approved", "lead@acme.example") in steps and ("Answered", "lead@acme.example") in steps
    assert [s for s, _ in steps if s == "Decided"] and [s for s, _ in steps if s == "Attempt"]
    assert steps[-1][0] == "Outcome", steps
    await expect(page.locator('#trail tr[data-step="Outcome"]')).to_contain_text("succeeded")
    assert await page.locator("#approve").count() == 0
    await _clean(page, "a proposal's trail")
    # One journal row changed behind Writ's back: the page says which row fails, and why.
    entry_id = await db.fetchval(
        "SELECT id FROM admission.journal WHERE kind = 'proposal.approved' AND subject = $1",
        proposal_id,
    )
    flip = (
        "UPDATE admission.journal SET ciphertext = set_byte(ciphertext, 0, "
        "get_byte(ciphertext, 0) # 1) WHERE id = $1"
    )
    await db.execute(flip, entry_id)
    try:
        await page.goto(_console(stack, f"proposals/{proposal_id}"))
        await expect(verdict).to_contain_text("Approved (its payload is not authentic")
        # Approved, and the other rows of admission's chain it breaks: Proposed and the
        # approval receipt's signing.
        await expect(verdict).to_contain_text("3 of 7 rows failed verification")
        await expect(page.locator('#trail tr[data-step="Approved"]')).to_have_attribute(
            "data-verified", "false"
        )
        await expect(page.locator('#trail tr[data-step="Proposed"]')).to_have_attribute(
            "data-verified",
            "false",  # the chain it sits in no longer verifies either
        )
    finally:
        await db.execute(flip, entry_id)
    await context.close()


async def test_four_eyes_two_distinct_approvers_before_anything_runs(
    browser: Any, stack: Stack
) -> None:
    # 990.00 EUR: above the charge contract's four-eyes amount (500.00).
    with _api(stack) as api:
        waiting = api.post(
            "/commands",
            headers={**auth(stack), **key()},
            json={
                "agent": "billing-assistant",
                "operation_key": f"charge-{uuid.uuid4().hex[:12]}",
                "action": "payment.charge.create",
                "arguments": {
                    "customer_id": "ACME-42",
                    "amount_cents": 99000,
                    "currency": "EUR",
                    "description": "Annual plan",
                },
            },
        )
        assert waiting.json()["status"] == "awaiting_human", waiting.text
        proposal_id = waiting.json()["proposal"]["proposal_id"]

        def approve(principal: str) -> dict[str, Any]:
            got = api.post(
                f"/proposals/{proposal_id}/approve",
                json={},
                headers={**auth(stack, principal=principal, roles=["approver"]), **key()},
            )
            assert got.status_code == 200, got.text
            return dict(got.json())

        def state() -> tuple[str, Any, list[str]]:
            got = api.get(
                f"/proposals/{proposal_id}",
                headers=auth(stack, principal="ops@acme.example", roles=["approver"]),
            ).json()
            return got["state"], got["operation_id"], got["approvals"]

        first = approve("lead@acme.example")
        assert first["status"] == "approval_recorded", first
        assert "1 of 2 approvals" in first["reason"]
        assert state() == ("pending", None, ["lead@acme.example"])  # nothing was admitted
        # The same person again (whatever the case of their address), and the requester.
        again = approve("Lead@acme.example")
        assert (again["status"], again["code"]) == ("not_approvable", "ALREADY_APPROVED")
        own = approve("alice@acme.example")
        assert (own["status"], own["code"]) == ("not_approvable", "SEPARATION_OF_DUTIES")
        assert state() == ("pending", None, ["lead@acme.example"])

    # The first approver's console says so, and offers no second approval of theirs.
    context = await browser.new_context(viewport={"width": 1100, "height": 900})
    page = await context.new_page()
    await page.goto(stack.console_link(principal="lead@acme.example", roles=("approver",)))
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("#approvals")).to_contain_text(
        "1 of 2 approvals (by lead@acme.example)"
    )
    await expect(page.locator("#own-approval")).to_be_visible()
    assert await page.locator("#approve").count() == 0
    await context.close()
    # A second, distinct approver: now, and only now, it runs.
    page = await (await browser.new_context(viewport={"width": 390, "height": 900})).new_page()
    await page.goto(stack.console_link(principal="ops@acme.example", roles=("approver",)))
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("#approvals")).to_contain_text("1 of 2 approvals")
    await _clean(page, "a proposal with one of two approvals")
    await page.locator("#approve").click()
    await expect(page.locator("#outcome-text")).to_contain_text(
        "approved by ops@acme.example; outcome: succeeded", timeout=WAIT_MS
    )
    await page.context.close()


async def test_every_decision_is_reachable_a_page_at_a_time_and_counted(
    browser: Any, stack: Stack
) -> None:
    requester = f"many-{uuid.uuid4().hex[:8]}@acme.example"
    made = set(await asyncio.gather(*(_asked(stack, requester) for _ in range(60))))
    assert len(made) == 60
    approver = auth(stack, principal="ops@acme.example", roles=["approver"])
    with _api(stack) as api:
        query = {"about_proposal": "false", "requester": requester, "limit": "50"}
        first = api.get("/pending-decisions", params=query, headers=approver).json()
        assert first["total"] == 60 and len(first["decisions"]) == 50 and first["next_cursor"]
        rest = api.get(
            "/pending-decisions",
            params={**query, "cursor": first["next_cursor"]},
            headers=approver,
        ).json()
        assert len(rest["decisions"]) == 10 and rest["next_cursor"] is None
        assert {d["pending_id"] for d in first["decisions"] + rest["decisions"]} == made
    page = await (await browser.new_context(viewport={"width": 1100, "height": 900})).new_page()
    await page.goto(stack.console_link())
    # Everything's first page: the newest decisions, their count, and the way to all of them.
    await page.goto(_console(stack, f"?requester={requester}"))
    await expect(page.locator("#inbox-count")).to_contain_text("60 decisions")
    await page.locator("#all-decisions").click()
    seen: list[str] = []
    while True:
        rows = page.locator("#inbox-rows tr[data-kind=decision]")
        seen += [await r.get_attribute("data-id") or "" for r in await rows.all()]
        if await page.locator("#next-page").count() == 0:
            break
        await expect(page.locator("#next-page")).to_have_text("Older decisions")
        await page.locator("#next-page").click()
        await expect(page.locator("#first-page")).to_be_visible()
    assert len(seen) == len(set(seen)) == 60 and set(seen) == made
    await page.context.close()


async def test_an_approver_sends_a_proposal_back_for_a_revision_with_a_reason(
    browser: Any, stack: Stack, db: asyncpg.Connection
) -> None:
    with _api(stack) as api:
        started = api.post(
            "/runs",
            headers={**auth(stack), **key()},
            json={"agent": "billing-assistant", "input": "Charge the expedited shipping"},
        )
        run_id = started.json()["run_id"]
        stopped = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
        assert stopped["status"] == "awaiting_human", stopped
        proposal_id = stopped["proposal"]["proposal_id"]
        # Without a reason there is nothing to revise: refused, nothing changes.
        blind = api.post(
            f"/proposals/{proposal_id}/revise",
            json={"reason": ""},
            headers={**auth(stack, principal="ops@acme.example", roles=["approver"]), **key()},
        )
        assert blind.status_code == 400, blind.text
    page = await (await browser.new_context(viewport={"width": 390, "height": 900})).new_page()
    await page.goto(stack.console_link())
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await page.locator("#revise-reason").fill("Charge standard shipping, not expedited.")
    await page.locator("#revise").click()
    await expect(page.locator("#answered")).to_have_text(
        "Sent back for a revision: the agent gets your reason."
    )
    await expect(page.locator("#outcome-text")).to_contain_text(
        "revision asked by ops@acme.example: Charge standard shipping"
    )
    await _clean(page, "a proposal sent back for a revision")
    await page.context.close()
    # The same run goes on: the model's next call is given the reason to revise by (the demo's
    # script says it cannot revise, in its answer); nothing ran.
    with _api(stack) as api:
        done = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
    assert done["status"] == "succeeded", done
    assert "cannot revise" in done["answer"], done
    assert "Charge standard shipping, not expedited." in done["answer"]
    assert (
        await db.fetchval(
            "SELECT count(*) FROM admission.commands c JOIN admission.proposals p "
            "ON p.tenant = c.tenant AND p.proposal_id = c.proposal_id WHERE p.public_id = $1",
            proposal_id,
        )
        == 0
    )
    journaled = await db.fetch(
        "SELECT kind FROM admission.journal WHERE subject = $1 AND kind LIKE 'proposal.%' "
        "ORDER BY id",
        proposal_id,
    )
    assert [r["kind"] for r in journaled] == ["proposal.pending", "proposal.revision_asked"]


async def test_a_review_page_shows_what_the_agent_asks(browser: Any, stack: Stack) -> None:
    with _api(stack) as api:
        started = api.post(
            "/runs",
            headers={**auth(stack), **key()},
            json={"agent": "review-assistant", "input": "Note the call about order 7781."},
        )
        run_id = started.json()["run_id"]
        stopped = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
        assert stopped["status"] == "awaiting_human", stopped
        listed = api.get(
            "/reviews", headers=auth(stack, principal="ops@acme.example", roles=["approver"])
        ).json()["reviews"]
    asked = "Confirm the note about the delayed shipment of order 7781 before it is added."
    assert [r["prompt"] for r in listed if r["run_id"] == run_id] == [asked]
    page = await (await browser.new_context(viewport={"width": 390, "height": 900})).new_page()
    await page.goto(stack.console_link())
    await page.goto(_console(stack, f"reviews/{stopped['pending_id']}"))
    await expect(page.locator("#review-prompt")).to_have_text(asked)
    await _clean(page, "a review")
    await page.context.close()


async def test_a_decision_page_is_found_by_its_id_however_many_wait(
    browser: Any, stack: Stack, db: asyncpg.Connection
) -> None:
    requester = f"crowd-{uuid.uuid4().hex[:8]}@acme.example"
    nc = await nats.connect(stack.nats_url, max_reconnect_attempts=-1)

    async def ask(i: int) -> str:
        reply = await nc.request(
            subjects.DECIDE,
            msgspec.json.encode(
                DecideRequest(
                    tenant="acme",
                    principal=requester,
                    agent="crm-assistant",
                    run_id=f"run-{uuid.uuid4().hex[:8]}",
                    tool="lookup.weather",
                    first_argument=f"City {i}",
                )
            ),
            timeout=30,
        )
        decision = msgspec.json.decode(reply.data, type=Decision)
        assert decision.verdict == "ask" and decision.pending_id, decision
        return decision.pending_id

    try:
        made: list[str] = []
        for batch in range(0, 510, 30):
            made += await asyncio.gather(*(ask(i) for i in range(batch, min(batch + 30, 510))))
        newest = made[-1]
        approver = auth(stack, principal="ops@acme.example", roles=["approver"])
        with _api(stack) as api:
            oldest = api.get("/pending-decisions", headers=approver).json()
            assert oldest["total"] >= 510 and newest not in {
                d["pending_id"] for d in oldest["decisions"]
            }  # past the 500 a page holds
            one = api.get(
                "/pending-decisions", params={"pending_id": newest}, headers=approver
            ).json()
            assert [d["pending_id"] for d in one["decisions"]] == [newest] and one["total"] == 1
            bad = api.get("/pending-decisions", params={"pending_id": "no/such"}, headers=approver)
            assert bad.status_code == 400
        page = await (await browser.new_context(viewport={"width": 1100, "height": 900})).new_page()
        await page.goto(stack.console_link(principal="ops@acme.example", roles=("approver",)))
        shown = await page.goto(_console(stack, f"decisions/{newest}"))
        assert shown is not None and shown.status == 200
        await expect(page.locator("main")).to_contain_text("City 509")
        await page.locator("#answer-deny").click()
        await expect(page.locator("#answered")).to_have_text("Answered deny.")
        assert (
            await db.fetchval(
                "SELECT answer FROM governance.pending WHERE pending_id = $1", uuid.UUID(newest)
            )
            == "deny"
        )
        gone = await page.goto(_console(stack, f"decisions/{uuid.uuid4()}"))
        assert gone is not None and gone.status == 404
        await page.context.close()
    finally:
        await nc.close()
        await db.execute(
            "UPDATE governance.pending SET answer = 'deny', answered_by = 'nobody' "
            "WHERE principal = $1 AND answer IS NULL",
            requester,
        )


async def test_four_eyes_in_two_tabs_open_at_once_runs_once_after_the_second_approver(
    browser: Any, stack: Stack, db: asyncpg.Connection
) -> None:
    tag = uuid.uuid4().hex[:8]
    gone, lead, ops = (f"{who}-{tag}@acme.example" for who in ("gone", "lead", "ops"))
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
                    "amount_cents": 82000,
                    "currency": "EUR",
                    "description": "Two tabs",
                },
            },
        )
        assert waiting.json()["status"] == "awaiting_human", waiting.text
        proposal_id = waiting.json()["proposal"]["proposal_id"]

    async def tab(principal: str) -> Page:
        page = await (await browser.new_context(viewport={"width": 1100, "height": 900})).new_page()
        await page.goto(stack.console_link(principal=principal, roles=("approver",)))
        await page.goto(_console(stack, f"proposals/{proposal_id}"))
        await expect(page.locator("#approvals")).to_contain_text("0 of 2 approvals")
        return page

    # Three approvers' tabs open at once; one of them is revoked before answering.
    first, second, third = await tab(gone), await tab(lead), await tab(ops)
    await db.execute(
        "INSERT INTO governance.revocations (tenant, principal, revoked_by) "
        "VALUES ('acme', $1, 'admin@acme.example')",
        gone,
    )
    await first.locator("#approve").click()
    await expect(first.locator("#answered")).to_contain_text("revoked")
    await second.locator("#approve").click()
    await expect(second.locator("#answered")).to_contain_text("Your approval is recorded")
    await expect(second.locator("#approvals")).to_contain_text(f"1 of 2 approvals (by {lead})")
    await _clean(second, "the first of two approvals, from its own tab")
    # The third tab still shows none: its approval is the second, and the charge runs once.
    await third.locator("#approve").click()
    await expect(third.locator("#outcome-text")).to_contain_text(
        f"approved by {ops}; outcome: succeeded", timeout=WAIT_MS
    )
    await second.reload()
    await expect(second.locator("#outcome-text")).to_contain_text("outcome: succeeded")
    made = await db.fetchval(
        "SELECT count(*) FROM admission.commands c JOIN admission.proposals p "
        "ON p.tenant = c.tenant AND p.proposal_id = c.proposal_id WHERE p.public_id = $1",
        proposal_id,
    )
    assert made == 1
    with httpx.Client(base_url=stack.payments_url, timeout=5) as payments:
        charged = [
            c for c in payments.get("/_control/charges").json() if c["amount_cents"] == 82000
        ]
    assert len(charged) == 1, charged
    for page in (first, second, third):
        await page.context.close()


async def test_a_revoked_first_approval_is_struck_and_a_third_approver_completes_it(
    browser: Any, stack: Stack, db: asyncpg.Connection
) -> None:
    tag = uuid.uuid4().hex[:8]
    gone, lead, ops = (f"{who}-{tag}@acme.example" for who in ("gone", "lead", "ops"))
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
                    "amount_cents": 71000,
                    "currency": "EUR",
                    "description": "Revoked first approver",
                },
            },
        )
        assert waiting.json()["status"] == "awaiting_human", waiting.text
    proposal_id = waiting.json()["proposal"]["proposal_id"]

    def listed() -> dict[str, Any]:
        with _api(stack) as api:
            got = api.get(
                f"/proposals/{proposal_id}",
                headers=auth(stack, principal=f"audit-{tag}@acme.example", roles=["auditor"]),
            )
        return dict(got.json())

    async def tab(principal: str) -> Page:
        page = await (await browser.new_context(viewport={"width": 1100, "height": 900})).new_page()
        await page.goto(stack.console_link(principal=principal, roles=("approver",)))
        await page.goto(_console(stack, f"proposals/{proposal_id}"))
        return page

    # The first approver and the second have the page open at once.
    first, second = await tab(gone), await tab(lead)
    await first.locator("#approve").click()
    await expect(first.locator("#answered")).to_contain_text("Your approval is recorded")
    await expect(first.locator("#approvals")).to_contain_text(f"1 of 2 approvals (by {gone})")
    # The first approver's access is revoked: their approval is still shown, struck through
    # with why, and no longer counted, on the page as in the API.
    await db.execute(
        "INSERT INTO governance.revocations (tenant, principal, revoked_by) "
        "VALUES ('acme', $1, 'admin@acme.example')",
        gone,
    )
    await second.reload()
    await expect(second.locator("#approvals")).to_contain_text("0 of 2 approvals")
    struck = second.locator(f'#approvals-given li[data-approver="{gone}"]')
    await expect(struck).to_have_attribute("data-counts", "false")
    await expect(struck).to_contain_text("no longer counts")
    await expect(struck).to_contain_text("revoked")
    await expect(struck.locator("del")).to_have_text(gone)
    shown = listed()
    assert (shown["state"], shown["approvals"]) == ("pending", [])
    assert [(a["approver"], a["counts"], a["code"]) for a in shown["approvals_given"]] == [
        (gone, False, "APPROVER_REVOKED")
    ]
    await _clean(second, "a proposal whose one approval no longer counts")
    # The second approver's approval is then the only one that counts: it still waits.
    await second.locator("#approve").click()
    await expect(second.locator("#answered")).to_contain_text("Your approval is recorded")
    await expect(second.locator("#approvals")).to_contain_text(f"1 of 2 approvals (by {lead})")
    await expect(second.locator(f'#approvals-given li[data-approver="{lead}"]')).to_have_attribute(
        "data-counts", "true"
    )
    await expect(second.locator(f'#approvals-given li[data-approver="{gone}"] del')).to_be_visible()
    await expect(second.locator("#outcome-text")).to_contain_text("waiting for an approver")
    shown = listed()
    assert (shown["state"], shown["approvals"], shown["operation_id"]) == ("pending", [lead], None)
    await _clean(second, "a proposal with one approval that counts and one that does not")
    # A third approver completes the two that count: it runs, exactly once.
    third = await tab(ops)
    await expect(third.locator("#approvals")).to_contain_text("1 of 2 approvals")
    await third.locator("#approve").click()
    await expect(third.locator("#outcome-text")).to_contain_text(
        f"approved by {ops}; outcome: succeeded", timeout=WAIT_MS
    )
    made = await db.fetchval(
        "SELECT count(*) FROM admission.commands c JOIN admission.proposals p "
        "ON p.tenant = c.tenant AND p.proposal_id = c.proposal_id WHERE p.public_id = $1",
        proposal_id,
    )
    assert made == 1
    with httpx.Client(base_url=stack.payments_url, timeout=5) as payments:
        charged = [
            c for c in payments.get("/_control/charges").json() if c["amount_cents"] == 71000
        ]
    assert len(charged) == 1, charged
    for page in (first, second, third):
        await page.context.close()
