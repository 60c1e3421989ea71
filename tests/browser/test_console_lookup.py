"""The console finds a waiting proposal and a waiting review by its id, however many wait:
the reads they come from are filtered by that id, not scanned a page at a time."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest
from playwright.async_api import expect

from tests.browser.test_console import _api, _console
from tests.e2e.test_http_api import auth, key
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(600)]

CROWD = 510  # more than the 500 a page of either read holds


async def test_a_proposal_and_a_review_are_found_by_their_ids_past_the_first_page(
    browser: Any, stack: Stack, db: asyncpg.Connection
) -> None:
    tag = uuid.uuid4().hex[:8]
    approver = auth(stack, principal="ops@acme.example", roles=["approver"])
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
                    "description": f"Looked up {tag}",
                },
            },
        )
        assert waiting.json()["status"] == "awaiting_human", waiting.text
        proposal_id = waiting.json()["proposal"]["proposal_id"]
        decision_id = api.get(f"/proposals/{proposal_id}", headers=approver).json()["decision_id"]
        started = api.post(
            "/runs",
            headers={**auth(stack), **key()},
            json={"agent": "review-assistant", "input": "Note the call about order 7781."},
        )
        stopped = api.get(f"/runs/{started.json()['run_id']}/wait", headers=auth(stack)).json()
        assert stopped["status"] == "awaiting_human", stopped
        review_id = stopped["pending_id"]
    try:
        # Newer copies of each push the real ones past the first page of either read (plain:
        # a sealed payload names its own row, and a copy of it opens on no other).
        await db.execute(
            "INSERT INTO admission.proposals SELECT (jsonb_populate_record(p, jsonb_build_object("
            "'proposal_id', gen_random_uuid(), 'public_id', 'crowd-' || g || '-' || $2::text, "
            "'decision_id', gen_random_uuid(), 'sealed', NULL, "
            "'created_at', now() + make_interval(secs => g)))).* "
            "FROM admission.proposals p, generate_series(1, $3::int) g "
            "WHERE p.tenant = 'acme' AND p.public_id = $1",
            proposal_id,
            tag,
            CROWD,
        )
        await db.execute(
            "INSERT INTO planner.runs SELECT (jsonb_populate_record(r, jsonb_build_object("
            "'run_id', 'crowd-' || g || '-' || $2::text, "
            "'request_id', 'crowd-' || g || '-' || $2::text, "
            "'pending_id', 'review-crowd-' || g || '-' || $2::text, 'sealed', NULL, "
            "'updated_at', now() + make_interval(secs => g)))).* "
            "FROM planner.runs r, generate_series(1, $3::int) g WHERE r.run_id = $1",
            stopped["run_id"],
            tag,
            CROWD,
        )
        with _api(stack) as api:
            page = api.get(
                "/proposals", params={"state": "pending", "limit": 500}, headers=approver
            ).json()
            assert page["total"] > 500 and proposal_id not in {
                p["proposal_id"] for p in page["proposals"]
            }
            one = api.get(
                "/proposals", params={"decision_id": decision_id}, headers=approver
            ).json()
            assert [p["proposal_id"] for p in one["proposals"]] == [proposal_id]
            assert one["total"] == 1
            none = api.get(
                "/proposals", params={"decision_id": "not-a-decision"}, headers=approver
            ).json()
            assert none["proposals"] == [] and none["total"] == 0
            for path, name in (("/proposals", "decision_id"), ("/reviews", "pending_id")):
                bad = api.get(path, params={name: "no/such"}, headers=approver)
                assert bad.status_code == 400, (path, bad.text)
            reviews = api.get("/reviews", params={"limit": 500}, headers=approver).json()
            assert review_id not in {r["pending_id"] for r in reviews["reviews"]}
            found = api.get("/reviews", params={"pending_id": review_id}, headers=approver).json()
            assert [r["pending_id"] for r in found["reviews"]] == [review_id]
        tab = await (await browser.new_context(viewport={"width": 1100, "height": 900})).new_page()
        await tab.goto(stack.console_link(principal="ops@acme.example", roles=("approver",)))
        shown = await tab.goto(_console(stack, f"decisions/{decision_id}"))
        assert shown is not None and shown.status == 200
        assert tab.url.endswith(f"/console/proposals/{proposal_id}")
        await expect(tab.locator("main")).to_contain_text(f"Looked up {tag}")
        shown = await tab.goto(_console(stack, f"reviews/{review_id}"))
        assert shown is not None and shown.status == 200
        await expect(tab.locator("#review-prompt")).to_contain_text("order 7781")
        gone = await tab.goto(_console(stack, f"reviews/review-{uuid.uuid4().hex}"))
        assert gone is not None and gone.status == 404
        await tab.context.close()
    finally:
        await db.execute(
            "DELETE FROM admission.proposals WHERE public_id LIKE $1", f"crowd-%-{tag}"
        )
        await db.execute("DELETE FROM planner.runs WHERE run_id LIKE $1", f"crowd-%-{tag}")
