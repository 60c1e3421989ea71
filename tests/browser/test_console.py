"""An approver at the console, in real Chromium, against the real deployment: what they read is
the frozen proposal, what they send is its id, and what happens is one execution."""

from __future__ import annotations

import asyncio
import functools
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from playwright.async_api import Page, expect

from tests.e2e.test_http_api import auth, key
from tests.e2e.test_proposals import _payment, _refunds
from writ.stack import Stack

# A loaded machine (six engineers' suites at once) slows Chromium and the services alike; the
# first test also starts the deployment.
pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(300)]

# The docs' screenshots: rewritten in docs/ with WRIT_UPDATE_SCREENSHOTS=1, else taken
# into a scratch folder (a test run leaves the work tree as it found it).
DOCS = (
    Path(__file__).resolve().parents[2] / "docs"
    if os.environ.get("WRIT_UPDATE_SCREENSHOTS")
    else Path(tempfile.mkdtemp(prefix="writ-console-shots-"))
)
WAIT_MS = 60_000  # how long an effect may take to show, at most (not a speed assertion)
# Every other expectation waits as long as a page may take to come on a loaded machine.
expect.set_options(timeout=30_000)


def _api(stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=stack.api_url, timeout=40)


def _propose_refund(
    stack: Stack, payments: httpx.Client, *, principal: str = "alice@acme.example", **claims: Any
) -> tuple[str, str]:
    """A host's refund of line L2 of a new payment, waiting for a person: (payment, proposal)."""
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    payments.post("/_control/payments", json=_payment(payment_id)).raise_for_status()
    with _api(stack) as api:
        waiting = api.post(
            "/commands",
            headers={**auth(stack, principal=principal, **claims), **key()},
            json={
                "agent": "refund-assistant",
                "operation_key": f"refund-{uuid.uuid4().hex[:12]}",
                "action": "payment.refund",
                "arguments": {"payment_id": payment_id, "line_id": "L2"},
            },
        )
    assert waiting.status_code == 200 and waiting.json()["status"] == "awaiting_human", waiting.text
    return payment_id, waiting.json()["proposal"]["proposal_id"]


def _proposal(stack: Stack, proposal_id: str) -> dict[str, Any]:
    with _api(stack) as api:
        got = api.get(
            f"/proposals/{proposal_id}",
            headers=auth(stack, principal="ops@acme.example", roles=["approver"]),
        )
    assert got.status_code == 200, got.text
    return got.json()


async def _signed_in(
    browser: Any,
    stack: Stack,
    *,
    tenant: str = "acme",
    principal: str = "ops@acme.example",
    roles: tuple[str, ...] = ("approver", "auditor"),
) -> Page:
    context = await browser.new_context(viewport={"width": 1100, "height": 900})
    page = await context.new_page()
    await page.goto(stack.console_link(tenant=tenant, principal=principal, roles=roles))
    await expect(page).to_have_url(f"{stack.api_url.removesuffix('/api/v1')}/console/")
    return page


async def _csrf(page: Page) -> str:
    value = await page.locator("input[name=csrf]").first.get_attribute("value")
    assert value
    return value


def _console(stack: Stack, path: str = "") -> str:
    return f"{stack.api_url.removesuffix('/api/v1')}/console/{path}"


async def test_an_approver_signs_in_reads_every_field_of_a_refund_approves_it_and_sees_it_done(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    payment_id, proposal_id = _propose_refund(stack, payments)
    link = stack.console_link()
    context = await browser.new_context(viewport={"width": 1100, "height": 900})
    page = await context.new_page()
    landed = await page.goto(link)
    assert landed is not None
    await expect(page).to_have_url(_console(stack))
    headers = await landed.all_headers()
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "default-src 'none'" in headers["content-security-policy"]
    [cookie] = await context.cookies()
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/console")
    token = link.split("token=")[1]
    import jwt

    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    assert abs(cookie["expires"] - exp) <= 5  # the session ends with its token

    # One-time: the same link again, in another browser, is refused.
    other = await (await browser.new_context()).new_page()
    again = await other.goto(link)
    assert again is not None and again.status == 401
    await expect(other.locator("#message")).to_contain_text("used already")

    row = page.locator(f'tr[data-id="{proposal_id}"]')
    await expect(row).to_contain_text("payment.refund")
    await expect(row).to_contain_text("alice@acme.example")
    await expect(row).to_contain_text("refund-assistant")
    await expect(page.locator("#who")).to_contain_text("ops@acme.example")
    shot = await page.screenshot(path=str(DOCS / "console-inbox.png"))
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"

    await row.locator("a").click()
    await expect(page).to_have_url(_console(stack, f"proposals/{proposal_id}"))
    fields = {
        "Participant": "Léo Martin",
        "Product": "Junior programme",
        "Discount": "Sibling discount",
        "Payment": payment_id,
        "Payment method": "card ending 4242",
        "Amount to refund": "15.00 EUR",
        "Destination": "card ending 4242",
        "Current order total": "300.00 EUR",
        "Resulting order total": "285.00 EUR",
        "Currency": "EUR",
    }
    for label, value in fields.items():
        await expect(page.locator(f'#preview td[data-field="{label}"]')).to_have_text(value)
    assert await page.locator("#preview tr").count() == len(fields)
    detail = _proposal(stack, proposal_id)
    await expect(page.locator("#request-hash")).to_have_text(detail["request_hash"])
    await expect(page.locator("#requester")).to_have_text("alice@acme.example")
    await expect(page.locator("#outcome")).to_contain_text("waiting for an approver")
    await expect(page.locator("#decision")).to_have_text(
        # A refund moves money: line 5 asks every time, whatever grants there are.
        f"{detail['decision_id']} — line 5 of decide, policy {detail['policy_version']}"
    )
    await expect(page.locator("#facts-read")).to_contain_text(f"Read at {detail['facts_read_at']}")
    await expect(page.locator("#facts")).to_contain_text(payment_id)
    await expect(page.locator("#facts")).to_contain_text("captured")
    assert "{" not in await page.locator("#preview").inner_text()  # words, never JSON
    await page.screenshot(path=str(DOCS / "console-refund.png"), full_page=True)

    await page.locator("#approve").click()
    await expect(page.locator("#answered")).to_have_text("Approved: the one execution started.")
    await expect(page.locator("#outcome-text")).to_contain_text(
        "outcome: succeeded", timeout=WAIT_MS
    )
    [refund] = _refunds(payments, payment_id)
    assert refund["amount_cents"] == 1500
    await expect(page.locator("#outcome-text")).to_contain_text(refund["refund_id"])
    assert await page.locator("form.answer").count() == 0
    await context.close()


async def test_a_rejection_with_its_reason_fails_the_run_rejected(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    with _api(stack) as api:
        started = api.post(
            "/runs",
            headers={**auth(stack), **key()},
            json={
                "agent": "refund-assistant",
                "input": "Léo's sibling discount is missing; refund it.",
            },
        )
        run_id = started.json()["run_id"]
        stopped = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
    assert stopped["status"] == "awaiting_human", stopped
    proposal_id = stopped["proposal"]["proposal_id"]
    page = await _signed_in(browser, stack)
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("#run-state")).to_have_text("The run is awaiting_human.")
    await expect(page.locator("#evidence")).to_contain_text("untrusted")
    await page.locator("#reason").fill("The discount was applied on the next invoice.")
    await page.locator("#reject").click()
    await expect(page.locator("#answered")).to_have_text("Rejected.")
    await expect(page.locator("#outcome")).to_contain_text(
        "rejected by ops@acme.example: The discount was applied on the next invoice."
    )

    await page.locator("#run-link").click()
    await expect(page.locator("#run-status")).to_contain_text("failed", timeout=WAIT_MS)
    await expect(page.locator("#run-error")).to_contain_text("REJECTED")
    await expect(page.locator("#run-error")).to_contain_text(
        "The discount was applied on the next invoice."
    )
    with _api(stack) as api:
        run = api.get(f"/runs/{run_id}", headers=auth(stack)).json()
    assert (run["status"], run["error"]["code"]) == ("failed", "REJECTED")
    assert "The discount was applied on the next invoice." in run["error"]["message"]
    assert _refunds(payments, "pay_7781") == []
    # An auditor (no approver role: no inbox) opens the run by its id: its timeline, its
    # journal verified, and a replay.
    await page.context.close()
    page = await _signed_in(browser, stack, principal="audit@acme.example", roles=("auditor",))
    await expect(page.locator("main")).to_contain_text("Only approvers have an inbox")
    await page.locator("#run-id").fill(run_id)
    await page.locator("#find-run button").click()
    await expect(page.locator("#run-error")).to_contain_text("REJECTED")
    assert await page.locator("#timeline tbody tr").count() >= 1
    await expect(page.locator("#journal")).to_have_text("verified")
    await page.locator("#replay").click()
    await expect(page.locator("#replay-verdict")).to_contain_text("identical")
    await page.context.close()


async def test_two_tabs_and_two_approvers_approving_at_once_execute_once_and_agree(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    payment_id, proposal_id = _propose_refund(stack, payments)
    first = await _signed_in(browser, stack)
    second = await first.context.new_page()  # a second tab of the same approver
    third = await _signed_in(browser, stack, principal="lead@acme.example", roles=("approver",))
    tabs = [first, second, third]
    for tab in tabs:
        await tab.goto(_console(stack, f"proposals/{proposal_id}"))
    # All three press Approve in the same instant (a click through the page's own button,
    # before any of them could learn of the others' answer).
    await asyncio.gather(
        *(tab.evaluate("document.getElementById('approve').click()") for tab in tabs)
    )
    for tab in tabs:
        await expect(tab.locator("#outcome-text")).to_contain_text(
            "outcome: succeeded", timeout=WAIT_MS
        )
    [refund] = _refunds(payments, payment_id)
    texts = {await tab.locator("#outcome-text").inner_text() for tab in tabs}
    assert len(texts) == 1 and refund["refund_id"] in texts.pop()
    said = {await tab.locator("#answered").inner_text() for tab in tabs}
    assert "Approved: the one execution started." in said, said
    for tab in (first, third):
        await tab.context.close()


async def test_an_expired_proposal_cannot_be_approved_and_says_why(
    browser: Any, stack: Stack, payments: httpx.Client, db: asyncpg.Connection
) -> None:
    payment_id, proposal_id = _propose_refund(stack, payments)
    # Its day passes.
    await db.execute(
        "UPDATE admission.proposals SET expires_at = now() - interval '1 second' "
        "WHERE public_id = $1",
        proposal_id,
    )
    page = await _signed_in(browser, stack)
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("#expired")).to_contain_text("can no longer be approved")
    assert await page.locator("#approve").count() == 0
    # A hand-made POST (with the right CSRF token) is refused by the server all the same.
    sent = await page.request.post(
        _console(stack, f"proposals/{proposal_id}/approve"), form={"csrf": await _csrf(page)}
    )
    assert "Not approved — EXPIRED" in await sent.text()
    assert _proposal(stack, proposal_id)["state"] == "expired"
    assert _refunds(payments, payment_id) == []
    await page.context.close()


async def test_the_requester_cannot_approve_their_own_proposal(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    payment_id, proposal_id = _propose_refund(
        stack, payments, principal="lead@acme.example", roles=["approver"]
    )
    page = await _signed_in(browser, stack, principal="lead@acme.example", roles=("approver",))
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("#own-request")).to_contain_text("another approver must")
    assert await page.locator("#approve").count() == 0
    sent = await page.request.post(
        _console(stack, f"proposals/{proposal_id}/approve"), form={"csrf": await _csrf(page)}
    )
    assert "Not approved — SEPARATION_OF_DUTIES" in await sent.text()
    # Nor through the other door, answering the decision that asked for the proposal.
    pending_id = _proposal(stack, proposal_id)["decision_id"]
    with _api(stack) as api:
        answered = api.post(
            "/pending-decisions/decide",
            json={"pending_id": pending_id, "answer": "once", "proposal_id": proposal_id},
            headers={**auth(stack, principal="lead@acme.example", roles=["approver"]), **key()},
        )
    assert answered.status_code == 200, answered.text
    assert (answered.json()["accepted"], answered.json()["code"]) == (False, "SEPARATION_OF_DUTIES")
    assert _proposal(stack, proposal_id)["state"] == "pending"
    assert _refunds(payments, payment_id) == []
    # Another approver may.
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    other = await _signed_in(browser, stack)
    await other.goto(_console(stack, f"proposals/{proposal_id}"))
    await other.locator("#approve").click()
    await expect(other.locator("#outcome-text")).to_contain_text(
        "outcome: succeeded", timeout=WAIT_MS
    )
    await expect(page.locator("#outcome-text")).to_contain_text(
        "outcome: succeeded", timeout=WAIT_MS
    )
    assert len(_refunds(payments, payment_id)) == 1
    await page.context.close()
    await other.context.close()


async def test_another_tenant_or_a_token_without_the_role_sees_nothing(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    _, proposal_id = _propose_refund(stack, payments)
    globex = await _signed_in(browser, stack, tenant="globex", principal="ops@globex.example")
    await expect(globex.locator("#inbox-rows")).to_be_visible()
    assert await globex.locator(f'tr[data-id="{proposal_id}"]').count() == 0
    assert "acme" not in await globex.locator("main").inner_text()
    shown = await globex.goto(_console(stack, f"proposals/{proposal_id}"))
    assert shown is not None and shown.status == 404
    await expect(globex.locator("#message")).to_contain_text("no proposal of your tenant")
    await globex.context.close()

    page = await (await browser.new_context()).new_page()
    refused = await page.goto(stack.console_link(principal="alice@acme.example", roles=()))
    assert refused is not None and refused.status == 403
    await expect(page.locator("#message")).to_contain_text("for approvers and auditors")
    inbox = await page.goto(_console(stack))
    assert inbox is not None and inbox.status == 401
    assert await page.locator("#inbox-rows").count() == 0
    await page.context.close()


async def test_a_forged_post_without_the_csrf_token_is_refused_and_changes_nothing(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    payment_id, proposal_id = _propose_refund(stack, payments)
    page = await _signed_in(browser, stack)
    forms: tuple[dict[str, str | float | bool], ...] = ({}, {"csrf": "0" * 64})
    for form in forms:
        sent = await page.request.post(
            _console(stack, f"proposals/{proposal_id}/approve"), form=form
        )
        assert sent.status == 403
        assert "CSRF token is missing or wrong" in await sent.text()
    assert _proposal(stack, proposal_id)["state"] == "pending"
    assert _refunds(payments, payment_id) == []
    await page.context.close()


@contextmanager
def _attacker_site(pages: dict[str, str]) -> Iterator[int]:
    """Another web site, on its own port: it serves `pages` (name -> HTML)."""
    with tempfile.TemporaryDirectory(prefix="writ-attacker-") as root:
        for name, body in pages.items():
            (Path(root) / name).write_text(body)
        server = ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=root)
        )
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server.server_address[1]
        finally:
            server.shutdown()
            server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


async def test_a_page_of_another_site_cannot_make_the_approvers_browser_approve(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    payment_id, proposal_id = _propose_refund(stack, payments)
    target = _console(stack, f"proposals/{proposal_id}/approve")
    forged = (
        f'<form id="f" method="post" action="{target}"><input name="csrf" value="guess">'
        '</form><script>document.getElementById("f").submit()</script>'
    )
    page = await _signed_in(browser, stack)
    with _attacker_site({"same-site.html": forged}) as port:
        # Another port of the same host is the same site: the cookie goes along, and the
        # CSRF token (which that page cannot read) is what refuses it.
        async with page.expect_navigation(url=target):
            await page.goto(f"http://127.0.0.1:{port}/same-site.html")
        await expect(page.locator("#message")).to_contain_text("CSRF token is missing or wrong")
        # Another site (localhost is not 127.0.0.1's site): SameSite=Strict keeps the cookie.
        async with page.expect_navigation(url=target):
            await page.goto(f"http://localhost:{port}/same-site.html")
        await expect(page.locator("#message")).to_contain_text("not signed in")
    assert _proposal(stack, proposal_id)["state"] == "pending"
    assert _refunds(payments, payment_id) == []
    await page.context.close()


async def test_behind_an_identity_aware_proxy_the_bearer_token_is_the_identity(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    _, proposal_id = _propose_refund(stack, payments)
    token = stack.token("acme", "ops@acme.example", roles=["approver"])
    context = await browser.new_context(extra_http_headers={"Authorization": f"Bearer {token}"})
    page = await context.new_page()
    await page.goto(_console(stack))
    await expect(page.locator(f'tr[data-id="{proposal_id}"]')).to_be_visible()
    await expect(page.locator("#who")).to_contain_text("ops@acme.example · acme · approver")
    assert await context.cookies() == []  # no session: the proxy's header on every request
    await context.close()


async def test_a_proposal_id_tampered_in_the_url_is_not_found_like_any_unknown_id(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    _, proposal_id = _propose_refund(stack, payments)
    page = await _signed_in(browser, stack)
    tampered = proposal_id[:-1] + ("0" if proposal_id[-1] != "0" else "1")
    texts = []
    for wrong in (tampered, "no-such-proposal", proposal_id + "x"):
        shown = await page.goto(_console(stack, f"proposals/{wrong}"))
        assert shown is not None and shown.status == 404
        texts.append(await page.locator("#message").inner_text())
    assert len(set(texts)) == 1
    await page.context.close()


async def test_the_inbox_shows_a_new_proposal_without_a_reload(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    page = await _signed_in(browser, stack)
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    payment_id, proposal_id = _propose_refund(stack, payments)
    row = page.locator(f'tr[data-id="{proposal_id}"]')
    await expect(row).to_be_visible(timeout=WAIT_MS)
    assert navigations == []  # it came by itself
    # Answered elsewhere (another approver, over the API), while the provider loses its
    # answer: the row goes by itself, and the proposal's page says nobody knows yet.
    payments.post("/_control/mode", json={"mode": "lose_response", "count": 1})
    with _api(stack) as api:
        approved = api.post(
            f"/proposals/{proposal_id}/approve",
            json={},
            headers={**auth(stack, principal="lead@acme.example", roles=["approver"]), **key()},
        )
    assert approved.json()["status"] == "claimed", approved.text
    await expect(row).to_have_count(0, timeout=WAIT_MS)
    assert navigations == []
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("#outcome-text")).to_contain_text(
        "outcome: needs_reconciliation", timeout=WAIT_MS
    )
    assert len(_refunds(payments, payment_id)) == 1  # it did happen; nobody was told
    await page.context.close()


def _stopped_run(stack: Stack, agent: str, text: str) -> dict[str, Any]:
    with _api(stack) as api:
        started = api.post(
            "/runs", headers={**auth(stack), **key()}, json={"agent": agent, "input": text}
        )
        run_id = started.json()["run_id"]
        stopped = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
    assert stopped["status"] == "awaiting_human", stopped
    return stopped


async def test_a_decision_offers_only_the_answers_its_case_allows_and_its_answer_resumes_the_run(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    stopped = _stopped_run(stack, "billing-assistant", "Refund order 7781")
    pending_id, run_id = stopped["pending_id"], stopped["run_id"]
    with _api(stack) as api:
        listed = api.get(
            "/pending-decisions",
            headers=auth(stack, principal="ops@acme.example", roles=["approver"]),
        ).json()["decisions"]
    [offered] = [d["options"] for d in listed if d["pending_id"] == pending_id]
    _propose_refund(stack, payments)  # another agent's proposal, for the filters
    page = await _signed_in(browser, stack)
    # The charge waits as a proposal (its decision is answered through it, by its id) ...
    proposal_id = stopped["proposal"]["proposal_id"]
    await page.locator("#agent").select_option("billing-assistant")
    await page.locator("#filter").click()
    await expect(page.locator(f'tr[data-id="{proposal_id}"]')).to_be_visible()
    agents = {
        await r.locator("td").nth(1).inner_text()
        for r in await page.locator("#inbox-rows tr").all()
    }
    assert agents == {"billing-assistant"}
    await page.locator("#kind").select_option("decision")
    await page.locator("#filter").click()
    assert await page.locator('#inbox-rows tr[data-kind="proposal"]').count() == 0
    # ... and its decision is never a row of its own: it is answered on the proposal.
    assert await page.locator(f'#inbox-rows tr[data-id="{pending_id}"]').count() == 0
    # The decision's own address is the proposal, beside its preview, with the answers
    # governance offers: a charge moves money, so once or deny, never always.
    await page.goto(_console(stack, f"decisions/{pending_id}"))
    await expect(page).to_have_url(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("#preview")).to_contain_text("49.00 EUR")
    assert offered == ["once", "deny"]
    assert await page.locator("#approve-always").count() == 0
    await page.locator("#approve").click()
    await expect(page.locator("#outcome-text")).to_contain_text(
        "outcome: succeeded", timeout=WAIT_MS
    )
    await page.goto(_console(stack, f"runs/{run_id}"))
    await expect(page.locator("#run-status")).to_contain_text("succeeded", timeout=WAIT_MS)
    await page.context.close()


async def test_a_review_is_answered_with_a_comment_from_its_run_page(
    browser: Any, stack: Stack
) -> None:
    stopped = _stopped_run(stack, "review-assistant", "Note the call about order 7781's delay.")
    run_id = stopped["run_id"]
    page = await _signed_in(browser, stack)
    row = page.locator(f'tr[data-id="review-{run_id}-0"]')
    await expect(row).to_contain_text("review-assistant")
    await expect(row).to_contain_text("alice@acme.example")
    # A made-up id is not found, and offers no form to answer.
    made_up = await page.goto(_console(stack, f"reviews/review-{run_id}-9"))
    assert made_up is not None and made_up.status == 404
    assert await page.locator("#review-approve").count() == 0
    await page.goto(_console(stack, f"runs/{run_id}"))
    await page.locator(f'a[href="/console/reviews/review-{run_id}-0"]').click()
    await page.locator("textarea[name=comment]").fill("Checked against the call notes.")
    await page.locator("#review-approve").click()
    await expect(page.locator("#answered")).to_have_text("Answered approve.")
    await page.goto(_console(stack, f"runs/{run_id}"))
    await expect(page.locator("#run-status")).to_contain_text("succeeded", timeout=WAIT_MS)
    await page.context.close()


async def test_the_decision_door_of_a_charge_shows_its_preview_and_no_always(
    browser: Any, stack: Stack
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
    pending_id, proposal_id = stopped["pending_id"], stopped["proposal"]["proposal_id"]

    page = await _signed_in(browser, stack)
    # From the run, "Waiting for a person" leads to the proposal: the preview beside the answer.
    await page.goto(_console(stack, f"runs/{run_id}"))
    await page.get_by_role("link", name=pending_id).click()
    await expect(page).to_have_url(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("#preview")).to_contain_text("ACME-42")
    await expect(page.locator("#approve")).to_be_visible()
    assert await page.locator("#approve-always").count() == 0  # money: never "always"
    await expect(page.locator("#preview")).to_contain_text("49.00 EUR")
    await page.screenshot(path=str(DOCS / "console-charge.png"), full_page=True)
    # The decision's own address is the same door.
    await page.goto(_console(stack, f"decisions/{pending_id}"))
    await expect(page).to_have_url(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("#preview")).to_be_visible()
    assert await page.locator("#approve-always").count() == 0
    # Sending "always" anyway is refused by governance, and grants nothing.
    sent = await page.request.post(
        _console(stack, f"proposals/{proposal_id}/approve"),
        form={"csrf": await _csrf(page), "grant": "always"},
    )
    assert "Not approved — INVALID_ANSWER" in await sent.text()
    assert _proposal(stack, proposal_id)["state"] == "pending"
    await page.locator("#approve").click()
    await expect(page.locator("#outcome-text")).to_contain_text(
        "outcome: succeeded", timeout=WAIT_MS
    )
    await page.context.close()


async def test_always_is_offered_beside_the_preview_where_a_grant_may_cover_the_action(
    browser: Any, stack: Stack
) -> None:
    with _api(stack) as api:
        waiting = api.post(
            "/commands",
            headers={**auth(stack), **key()},
            json={
                "agent": "review-assistant",
                "operation_key": f"note-{uuid.uuid4().hex[:12]}",
                "action": "crm.note.create",
                "arguments": {"customer_id": "ACME-42", "body": "Called back about 7781."},
            },
        )
    assert waiting.json()["status"] == "awaiting_human", waiting.text
    proposal_id = waiting.json()["proposal"]["proposal_id"]
    page = await _signed_in(browser, stack)
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("#preview")).to_contain_text("Called back about 7781.")
    await expect(page.locator("#approve-always")).to_contain_text("always allow")
    await page.context.close()


async def test_250_pending_proposals_are_all_reachable_in_the_inbox(
    browser: Any, stack: Stack
) -> None:
    agent = "scoped-assistant"  # asks for every note: no grant

    def note(i: int) -> str:
        with _api(stack) as api:
            got = api.post(
                "/commands",
                headers={**auth(stack), **key()},
                json={
                    "agent": agent,
                    "operation_key": f"inbox-{uuid.uuid4().hex[:12]}",
                    "action": "crm.note.create",
                    "arguments": {"customer_id": "ACME-42", "body": f"Note {i}"},
                },
            )
        assert got.json()["status"] == "awaiting_human", got.text
        return str(got.json()["proposal"]["proposal_id"])

    loop = asyncio.get_running_loop()
    made = set(await asyncio.gather(*(loop.run_in_executor(None, note, i) for i in range(250))))
    assert len(made) == 250

    page = await _signed_in(browser, stack)
    await page.goto(_console(stack, f"?kind=proposal&agent={agent}"))
    await expect(page.locator("#inbox-count")).to_contain_text("250 proposals")
    seen: list[str] = []
    while True:
        rows = page.locator("#inbox-rows tr[data-kind=proposal]")
        seen += [await r.get_attribute("data-id") or "" for r in await rows.all()]
        if await page.locator("#next-page").count() == 0:
            break
        await page.locator("#next-page").click()
        await expect(page.locator("#first-page")).to_be_visible()
    assert len(seen) == len(set(seen)) == 250 and set(seen) == made
    # Filtering by action and requester narrows the same list.
    await page.goto(_console(stack, f"?kind=proposal&agent={agent}&action=payment.refund"))
    await expect(page.locator("#inbox-count")).to_contain_text("0 proposals")
    await expect(page.locator("#inbox-rows")).to_contain_text("Nothing is waiting")
    await page.goto(_console(stack, f"?kind=proposal&agent={agent}&requester=alice%40acme.example"))
    await expect(page.locator("#inbox-count")).to_contain_text("250 proposals")
    await page.context.close()


async def test_keyboard_only_approval_still_works_after_a_live_update(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    payment_id, proposal_id = _propose_refund(stack, payments)
    page = await _signed_in(browser, stack)
    link = page.locator(f'#inbox-rows tr[data-id="{proposal_id}"] a')
    await link.focus()
    before = await page.locator("#inbox-count").inner_text()
    proposals = int(before.split(" proposals")[0].rsplit(" ", 1)[-1])
    # Something else comes in: the rows are replaced by the next poll, the count with them.
    _, newer = _propose_refund(stack, payments)
    await expect(page.locator(f'#inbox-rows tr[data-id="{newer}"]')).to_be_visible()
    await expect(page.locator("#inbox-count")).to_contain_text(f"{proposals + 1} proposals")
    focused = await page.evaluate("document.activeElement.getAttribute('href')")
    assert focused == f"/console/proposals/{proposal_id}"
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(_console(stack, f"proposals/{proposal_id}"))
    await page.locator("#approve").focus()
    await page.keyboard.press("Enter")
    await expect(page.locator("#outcome-text")).to_contain_text(
        "outcome: succeeded", timeout=WAIT_MS
    )
    # Changes of the outcome are said in a live region that outlives the box it speaks for.
    assert await page.locator("#announce[aria-live=polite]").count() == 1
    assert len(_refunds(payments, payment_id)) == 1
    await page.context.close()


async def test_the_inbox_fits_a_390_px_phone(
    browser: Any, stack: Stack, payments: httpx.Client
) -> None:
    _, proposal_id = _propose_refund(stack, payments)
    context = await browser.new_context(viewport={"width": 390, "height": 844})
    page = await context.new_page()
    await page.goto(stack.console_link())
    await expect(page.locator(f'#inbox-rows tr[data-id="{proposal_id}"]')).to_be_visible()
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, width
    await page.goto(_console(stack, f"proposals/{proposal_id}"))
    await expect(page.locator("#preview")).to_be_visible()
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, width
    await page.screenshot(path=str(DOCS / "console-phone.png"), full_page=False)
    await context.close()
