"""Commands, proposals, pending decisions and reviews over the HTTP door, through the six real
processes: the same answers and effects as the NATS subjects give."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from tests.e2e.conftest import notes_for
from tests.e2e.test_http_api import auth, key
from tests.e2e.test_proposals import _payment, _refunds
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

APPROVER: dict[str, Any] = {"principal": "ops@acme.example", "roles": ["approver"]}


@pytest.fixture
def api(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.api_url, timeout=40) as client:
        yield client


async def _until(
    api: httpx.Client,
    path: str,
    headers: dict[str, str],
    field: str,
    value: Any,
    timeout: float = 30,
) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while True:
            response = api.get(path, headers=headers)
            if response.status_code == 200 and response.json()[field] == value:
                return response.json()
            await anyio.sleep(0.1)


async def test_a_command_over_http_runs_once_and_its_key_reads_it_back(
    stack: Stack, api: httpx.Client, crm: httpx.Client
) -> None:
    operation_key = f"op-{uuid.uuid4().hex[:12]}"
    body = {
        "agent": "crm-assistant",
        "operation_key": operation_key,
        "action": "crm.note.create",
        "arguments": {"customer_id": "ACME-42", "body": "Called back about order 7781."},
    }
    headers = {**auth(stack), **key()}
    done = api.post("/commands", json=body, headers=headers)
    assert done.status_code == 200, done.text
    result = done.json()
    assert (result["status"], result["operation_key"]) == ("succeeded", operation_key)
    again = api.post("/commands", json=body, headers=headers)
    assert again.json() == result
    other = api.post(
        "/commands",
        json={**body, "arguments": {"customer_id": "ACME-42", "body": "Something else."}},
        headers=headers,
    )
    assert (other.status_code, other.json()["code"]) == (409, "CONFLICT")
    read = api.get(f"/commands/{operation_key}", headers=auth(stack)).json()
    # The read carries what the POST reported, its outcome (what may be done next) included.
    told = ("status", "operation_id", "receipt", "outcome", "correlation_id", "error")
    assert result["outcome"] == "succeeded"
    assert {k: read.get(k) for k in told} == {k: result.get(k) for k in told}
    assert len(notes_for(crm, f"acme:{result['operation_id']}")) == 1
    unknown = api.get(
        f"/commands/{operation_key}", headers=auth(stack, "globex", "bob@globex.example")
    )
    assert (unknown.status_code, unknown.json()["code"]) == (404, "NOT_FOUND")


async def test_a_refund_waits_for_a_person_who_approves_it_by_id_over_http(
    stack: Stack, api: httpx.Client, payments: httpx.Client
) -> None:
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    payments.post("/_control/payments", json=_payment(payment_id)).raise_for_status()
    operation_key = f"refund-{uuid.uuid4().hex[:12]}"
    waiting = api.post(
        "/commands",
        headers={**auth(stack), **key()},
        json={
            "agent": "refund-assistant",
            "operation_key": operation_key,
            "action": "payment.refund",
            "arguments": {"payment_id": payment_id, "line_id": "L2"},
        },
    )
    assert waiting.status_code == 200, waiting.text
    assert waiting.json()["status"] == "awaiting_human"
    proposal_id = waiting.json()["proposal"]["proposal_id"]

    approver = auth(stack, **APPROVER)
    listed = api.get("/proposals", params={"state": "pending"}, headers=approver).json()
    assert proposal_id in [p["proposal_id"] for p in listed["proposals"]]
    detail = api.get(f"/proposals/{proposal_id}", headers=approver).json()
    assert (detail["state"], detail["action"]) == ("pending", "payment.refund")
    assert len(detail["request_hash"]) == 64 and detail["preview"] and detail["expires_at"]
    assert api.get(f"/proposals/{proposal_id}", headers=auth(stack)).status_code == 403
    unknown = api.get("/proposals/prop_nothing_under_this_id", headers=approver)
    assert (unknown.status_code, unknown.json()["detail"]) == (404, "no such proposal")
    french = api.get(
        "/proposals/prop_nothing_under_this_id", headers={**approver, "Accept-Language": "fr"}
    )
    assert french.json()["detail"] == "aucune proposition sous cet identifiant"

    no_role = api.post(
        f"/proposals/{proposal_id}/approve", json={}, headers={**auth(stack), **key()}
    )
    assert (no_role.status_code, no_role.json()["code"]) == (403, "FORBIDDEN")
    no_reason = api.post(f"/proposals/{proposal_id}/reject", json={}, headers={**approver, **key()})
    assert (no_reason.status_code, no_reason.json()["code"]) == (400, "INVALID_REQUEST")
    headers = {**approver, **key()}
    approved = api.post(f"/proposals/{proposal_id}/approve", json={}, headers=headers)
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "claimed"
    assert (
        api.post(f"/proposals/{proposal_id}/approve", json={}, headers=headers).json()
        == approved.json()
    )
    await _until(api, f"/commands/{operation_key}", auth(stack), "status", "succeeded")
    assert len(_refunds(payments, payment_id)) == 1


async def test_a_run_stopped_at_an_ask_is_answered_over_http(
    stack: Stack, api: httpx.Client, db: asyncpg.Connection, payments: httpx.Client
) -> None:
    started = api.post(
        "/runs",
        headers={**auth(stack), **key()},
        json={"agent": "billing-assistant", "input": "Refund order 7781"},
    )
    run_id = started.json()["run_id"]
    stopped = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
    assert stopped["status"] == "awaiting_human", stopped
    pending_id = stopped["pending_id"]
    # The run carries the proposal it waits on, with its frozen preview.
    proposal = stopped["proposal"]
    assert proposal is not None and proposal["action"] == "payment.charge.create", stopped
    assert api.get(f"/runs/{run_id}", headers=auth(stack)).json()["proposal"] == proposal
    approver = auth(stack, **APPROVER)
    listed = api.get("/pending-decisions", headers=approver).json()["decisions"]
    assert pending_id in [d["pending_id"] for d in listed]
    # An answer that does not name the proposal it concerns is refused, and changes nothing.
    blind = api.post(
        "/pending-decisions/decide",
        headers={**approver, **key()},
        json={"pending_id": pending_id, "answer": "once", "reason": "ok"},
    )
    assert blind.status_code == 200, blind.text
    assert (blind.json()["accepted"], blind.json()["code"]) == (False, "PROPOSAL_REQUIRED")
    answered = await db.fetchval(
        "SELECT answer FROM governance.pending WHERE pending_id = $1", uuid.UUID(pending_id)
    )
    assert answered is None
    decided = api.post(
        "/pending-decisions/decide",
        headers={**approver, **key()},
        json={
            "pending_id": pending_id,
            "answer": "once",
            "reason": "ok",
            "proposal_id": proposal["proposal_id"],
        },
    )
    assert decided.status_code == 200, decided.text
    assert decided.json()["accepted"] is True, decided.json()
    done = await _until(api, f"/runs/{run_id}", auth(stack), "status", "succeeded")
    assert done["proposal"]["proposal_id"] == proposal["proposal_id"]  # in every state
    finished = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
    assert finished["proposal"]["proposal_id"] == proposal["proposal_id"]
    answered = await db.fetchval(
        "SELECT answer FROM governance.pending WHERE pending_id = $1", uuid.UUID(pending_id)
    )
    assert answered == "once"


async def test_a_review_is_answered_over_http(stack: Stack, api: httpx.Client) -> None:
    started = api.post(
        "/runs",
        headers={**auth(stack), **key()},
        json={"agent": "review-assistant", "input": "Note the call about order 7781's delay."},
    )
    run_id = started.json()["run_id"]
    stopped = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
    assert stopped["pending_id"] == f"review-{run_id}-0", stopped
    answered = api.post(
        f"/reviews/review-{run_id}-0",
        json={"answer": "approve"},
        headers={**auth(stack, **APPROVER), **key()},
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["accepted"] is True
    await _until(api, f"/runs/{run_id}", auth(stack), "status", "succeeded")
    unknown = api.post(
        f"/reviews/review-{run_id}-0",
        json={"answer": "approve"},
        headers={**auth(stack, **APPROVER), **key()},
    )
    assert unknown.json()["accepted"] is False
