"""Proposals a person approves by their id, through the six real processes (the approval-contracts
note).

The refund's amount and destination are computed by code, shown in the preview, frozen, and
proved again at execution; an approval names the proposal and nothing else; approving twice, or
at the same time, executes once; a lost response from the non-idempotent provider ends in
`needs_reconciliation`; a local operation commits its change with its outcome.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from schemas.host import CommandResult
from tests.e2e.conftest import Host
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

AGENT = "refund-assistant"  # no grant for write_delete: every refund asks a person


def _payment(
    payment_id: str, *, discount_cents: int = 1500, last4: str = "4242", status: str = "captured"
) -> dict[str, Any]:
    return {
        "payment_id": payment_id,
        "customer_id": "ACME-42",
        "currency": "EUR",
        "status": status,
        "method": {"kind": "card", "last4": last4, "usable": True},
        "lines": [
            {
                "line_id": "L1",
                "product": "League fee",
                "participant": "Ada Martin",
                "amount_cents": 18000,
                "discount": None,
            },
            {
                "line_id": "L2",
                "product": "Junior programme",
                "participant": "Léo Martin",
                "amount_cents": 12000,
                "discount": {
                    "discount_id": "D-SIB",
                    "name": "Sibling discount",
                    "amount_cents": discount_cents,
                },
            },
        ],
    }


def _refunds(payments: httpx.Client, payment_id: str) -> list[dict[str, Any]]:
    return [r for r in payments.get("/_control/refunds").json() if r["payment_id"] == payment_id]


async def _propose_refund(
    host: Host, payments: httpx.Client, **payment: Any
) -> tuple[str, CommandResult]:
    """A host asks for a refund of line L2 of a new payment; it waits for a person."""
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    payments.post("/_control/payments", json=_payment(payment_id, **payment)).raise_for_status()
    command = host.command(
        action="payment.refund", agent=AGENT, arguments={"payment_id": payment_id, "line_id": "L2"}
    )
    await host.submit(command)
    result = await host.wait_command(command.request_id)
    assert result.status == "awaiting_human", result
    assert result.proposal is not None
    return payment_id, result


async def test_a_refund_run_waits_with_its_preview_and_runs_once_when_approved(
    stack: Stack, host: Host, payments: httpx.Client
) -> None:
    request = host.request(agent=AGENT, text="Léo's sibling discount is missing; refund it.")
    await host.publish(request)

    waiting = await host.wait_result(request.request_id)
    assert waiting.status == "awaiting_human"
    proposal = waiting.proposal
    assert proposal is not None and proposal.proposal_id.startswith("prop_")
    assert proposal.action == "payment.refund"
    # Computed by code from the provider's state: the model named only the payment and line.
    assert proposal.preview == {
        "participant": "Léo Martin",
        "product": "Junior programme",
        "discount": "Sibling discount",
        "payment_method": "card ending 4242",
        "amount_cents": 1500,
        "currency": "EUR",
        "current_total_cents": 30000,
        "resulting_total_cents": 28500,
        "destination": "card ending 4242",
        "payment": "pay_7781",
    }
    assert _refunds(payments, "pay_7781") == []

    # `writ approve <id>`, as an operator would type it.
    approved = await _writ(stack, "approve", proposal.proposal_id)
    assert "claimed" in approved

    done = await _final_run_result(host, request.request_id)
    assert done.status == "succeeded"
    [action] = done.actions
    assert (action.action, action.state, action.outcome) == (
        "payment.refund",
        "succeeded",
        "succeeded",
    )
    [refund] = _refunds(payments, "pay_7781")
    assert refund["amount_cents"] == 1500
    assert refund["destination"] == {"kind": "original_method", "last4": "4242"}
    assert refund["reference"] == f"acme:{action.operation_id}"
    assert refund["refund_id"] == action.receipt

    # Approving a finished proposal returns its recorded outcome; nothing runs again.
    again = await host.wait_approval(await host.approve(proposal.proposal_id))
    assert (again.status, again.outcome, again.receipt) == (
        "already_completed",
        "succeeded",
        refund["refund_id"],
    )
    assert len(_refunds(payments, "pay_7781")) == 1


async def _settled(host: Host, request_id: str, timeout: float = 30) -> CommandResult:
    """The host command's result once it no longer waits for anything."""
    with anyio.fail_after(timeout):
        while True:
            for result in await host.results(request_id):
                if isinstance(result, CommandResult) and result.status not in (
                    "pending",
                    "dispatching",
                    "awaiting_human",
                ):
                    return result
            await anyio.sleep(0.1)


async def _writ(stack: Stack, *args: str) -> str:
    """Run the `writ` command as an operator would; its output, after a zero exit."""
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [
                sys.executable,
                "-m",
                "writ.cli",
                args[0],
                "--home",
                str(stack.home),
                "--nats-url",
                stack.nats_url,
                *args[1:],
            ],
            check=False,
        )
    output = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, output
    return output


async def _final_run_result(host: Host, request_id: str, timeout: float = 30) -> Any:
    with anyio.fail_after(timeout):
        while True:
            finished = [
                r
                for r in await host.results(request_id)
                if getattr(r, "status", None) in ("succeeded", "failed")
            ]
            if finished:
                return finished[0]
            await anyio.sleep(0.1)


async def test_concurrent_and_repeated_approvals_execute_exactly_once(
    host: Host, payments: httpx.Client, db: asyncpg.Connection
) -> None:
    payment_id, waiting = await _propose_refund(host, payments)
    assert waiting.proposal is not None
    proposal_id = waiting.proposal.proposal_id

    request_ids = [await host.approve(proposal_id) for _ in range(6)]
    answers = [await host.wait_approval(r) for r in request_ids]

    assert sorted(a.status for a in answers).count("claimed") == 1
    assert {a.status for a in answers} <= {"claimed", "already_completed"}
    final = await _settled(host, waiting.request_id)
    assert (final.status, final.outcome) == ("succeeded", "succeeded")
    assert len(_refunds(payments, payment_id)) == 1
    commands = await db.fetchval(
        "SELECT count(*) FROM admission.commands c JOIN admission.proposals p "
        "USING (tenant, proposal_id) WHERE p.public_id = $1",
        proposal_id,
    )
    assert commands == 1


async def test_only_an_approver_of_the_proposals_tenant_can_approve_it(
    stack: Stack, host: Host, payments: httpx.Client, db: asyncpg.Connection
) -> None:
    payment_id, waiting = await _propose_refund(host, payments)
    assert waiting.proposal is not None
    proposal_id = waiting.proposal.proposal_id

    without_role = await host.wait_approval(
        await host.approve(proposal_id, token=stack.token("acme", "alice@acme.example"))
    )
    other_tenant = await host.wait_approval(
        await host.approve(proposal_id, tenant="globex", principal="ops@globex.example"),
        tenant="globex",
    )
    tampered = await host.wait_approval(await host.approve(proposal_id[:-2] + "xx"))
    unknown = await host.wait_approval(await host.approve(f"prop_{uuid.uuid4().hex}"))

    assert without_role.status == "not_approvable"
    assert "FORBIDDEN" in (without_role.reason or "")
    for refused in (other_tenant, tampered, unknown):
        assert (refused.status, refused.reason) == ("not_approvable", "no such proposal")
    assert _refunds(payments, payment_id) == []
    state = await db.fetchval(
        "SELECT state FROM admission.proposals WHERE public_id = $1", proposal_id
    )
    assert state == "pending"

    rejected = await host.wait_approval(
        await host.approve(proposal_id, answer="reject", reason="wrong line")
    )
    assert rejected.status == "rejected"
    final = await _settled(host, waiting.request_id)
    assert final.status == "rejected"
    assert "wrong line" in (final.error.message if final.error else "")
    assert _refunds(payments, payment_id) == []


async def test_an_expired_proposal_cannot_be_approved(
    host: Host, payments: httpx.Client, db: asyncpg.Connection
) -> None:
    payment_id, waiting = await _propose_refund(host, payments)
    assert waiting.proposal is not None
    await db.execute(
        "UPDATE admission.proposals SET expires_at = now() - interval '1 second' "
        "WHERE public_id = $1",
        waiting.proposal.proposal_id,
    )

    answer = await host.wait_approval(await host.approve(waiting.proposal.proposal_id))

    assert (answer.status, answer.reason) == ("not_approvable", "the proposal expired")
    assert (
        await db.fetchval(
            "SELECT state FROM admission.proposals WHERE public_id = $1",
            waiting.proposal.proposal_id,
        )
        == "expired"
    )
    assert _refunds(payments, payment_id) == []


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"discount_cents": 1200}, "1200 cents, not the 1500 approved"),
        ({"last4": "1881"}, "method changed"),
        ({"status": "disputed"}, "is disputed"),
    ],
    ids=["amount", "destination", "status"],
)
async def test_a_fact_the_preview_stated_that_changed_requires_a_revision(
    host: Host, payments: httpx.Client, change: dict[str, Any], reason: str
) -> None:
    payment_id, waiting = await _propose_refund(host, payments)
    assert waiting.proposal is not None
    payments.post("/_control/payments", json=_payment(payment_id, **change)).raise_for_status()

    claimed = await host.wait_approval(await host.approve(waiting.proposal.proposal_id))
    assert claimed.status == "claimed"
    final = await _settled(host, waiting.request_id)

    assert (final.status, final.outcome) == ("revision_required", "revision_required")
    assert final.error is not None and reason in final.error.message
    assert _refunds(payments, payment_id) == []


async def test_a_lost_refund_response_needs_reconciliation_and_is_never_retried(
    stack: Stack, host: Host, payments: httpx.Client
) -> None:
    payment_id, waiting = await _propose_refund(host, payments)
    assert waiting.proposal is not None
    payments.post("/_control/mode", json={"mode": "lose_response", "count": 1})

    await host.wait_approval(await host.approve(waiting.proposal.proposal_id))
    final = await _settled(host, waiting.request_id, timeout=60)

    assert (final.status, final.outcome) == ("unknown", "needs_reconciliation")
    assert len(_refunds(payments, payment_id)) == 1  # it happened; nobody could tell
    listed = await _writ(stack, "reconcile", "list")
    assert final.operation_id is not None and final.operation_id in listed


async def test_a_model_may_not_choose_the_amount(
    host: Host, payments: httpx.Client, db: asyncpg.Connection
) -> None:
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    payments.post("/_control/payments", json=_payment(payment_id)).raise_for_status()
    before = await db.fetchval("SELECT count(*) FROM admission.proposals")
    command = host.command(
        action="payment.refund",
        agent=AGENT,
        arguments={"payment_id": payment_id, "line_id": "L2", "amount_cents": 99_900},
    )

    await host.submit(command)
    result = await host.wait_command(command.request_id)

    assert result.status == "rejected"
    assert result.error is not None and "amount_cents" in result.error.message
    assert await db.fetchval("SELECT count(*) FROM admission.proposals") == before


async def _seed_draft(db: asyncpg.Connection, audience: int) -> str:
    draft_id = f"draft-{uuid.uuid4().hex[:8]}"
    await db.execute(
        "INSERT INTO dispatcher.mail_drafts (tenant, draft_id, subject, body, segment) "
        "VALUES ('acme', $1, 'Spring bonspiel', 'Sign up by March 1.', $1)",
        draft_id,
    )
    await db.executemany(
        "INSERT INTO dispatcher.mail_audience (tenant, segment, address) VALUES ('acme', $1, $2)",
        [(draft_id, f"m{i}@example.com") for i in range(audience)],
    )
    return draft_id


async def _propose_draft(host: Host, draft_id: str) -> CommandResult:
    command = host.command(
        action="email.draft.apply", agent="mail-assistant", arguments={"draft_id": draft_id}
    )
    await host.submit(command)
    waiting = await host.wait_command(command.request_id)
    assert waiting.status == "awaiting_human" and waiting.proposal is not None
    return waiting


async def test_applying_a_draft_commits_the_form_with_its_outcome(
    host: Host, db: asyncpg.Connection
) -> None:
    draft_id = await _seed_draft(db, audience=3)
    waiting = await _propose_draft(host, draft_id)
    assert waiting.proposal is not None
    assert waiting.proposal.preview["recipients"] == 3

    await host.wait_approval(await host.approve(waiting.proposal.proposal_id))
    final = await _settled(host, waiting.request_id)

    assert (final.status, final.outcome) == ("succeeded", "succeeded")
    forms = await db.fetch(
        "SELECT form_id, recipients, subject FROM dispatcher.mail_forms "
        "WHERE tenant = 'acme' AND draft_id = $1",
        draft_id,
    )
    assert [(f["recipients"], f["subject"]) for f in forms] == [(3, "Spring bonspiel")]
    assert final.receipt == f"form-{forms[0]['form_id']}"


async def test_a_changed_audience_needs_a_new_proposal(host: Host, db: asyncpg.Connection) -> None:
    draft_id = await _seed_draft(db, audience=3)
    waiting = await _propose_draft(host, draft_id)
    assert waiting.proposal is not None
    await db.execute(
        "INSERT INTO dispatcher.mail_audience (tenant, segment, address) "
        "VALUES ('acme', $1, 'late@example.com')",
        draft_id,
    )

    await host.wait_approval(await host.approve(waiting.proposal.proposal_id))
    final = await _settled(host, waiting.request_id)

    assert (final.status, final.outcome) == ("revision_required", "revision_required")
    assert final.error is not None and "3 recipients when proposed, 4 now" in final.error.message
    assert (
        await db.fetchval(
            "SELECT count(*) FROM dispatcher.mail_forms WHERE tenant = 'acme' AND draft_id = $1",
            draft_id,
        )
        == 0
    )


async def test_a_revoked_approver_cannot_approve_and_writ_reject_refuses_it(
    stack: Stack, host: Host, payments: httpx.Client, db: asyncpg.Connection
) -> None:
    payment_id, waiting = await _propose_refund(host, payments)
    assert waiting.proposal is not None
    await db.execute(
        "INSERT INTO governance.revocations (tenant, principal, revoked_by) "
        "VALUES ('acme', 'gone@acme.example', 'admin@acme.example')"
    )

    revoked = await host.wait_approval(
        await host.approve(waiting.proposal.proposal_id, principal="gone@acme.example")
    )

    assert (revoked.status, revoked.reason) == (
        "not_approvable",
        "the approver's access was revoked",
    )
    assert _refunds(payments, payment_id) == []
    # `writ reject <id> --reason`, as an operator would type it.
    said = await _writ(stack, "reject", waiting.proposal.proposal_id, "--reason", "not this one")
    assert "rejected" in said
    final = await _settled(host, waiting.request_id)
    assert final.status == "rejected" and final.error is not None
    assert "not this one" in final.error.message
    assert (
        await db.fetchval(
            "SELECT state FROM admission.proposals WHERE public_id = $1",
            waiting.proposal.proposal_id,
        )
        == "rejected"
    )
    assert _refunds(payments, payment_id) == []
