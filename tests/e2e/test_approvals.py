"""Approvals through the real processes: money is never covered by "always", and a decision
about a call that has an action contract is answered only on its proposal, where its frozen
preview is shown (an approval means something only if Writ can say exactly what was
approved; no standing grant covers a code executor, nor here a payment)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from schemas.host import CommandResult
from tests.e2e.conftest import Host
from tests.e2e.test_http_api import auth, key
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

AGENT = "billing-assistant"


@pytest.fixture
def payments(stack: Stack) -> Any:
    with httpx.Client(base_url=stack.payments_url, timeout=5) as client:
        yield client


def _charges(payments: httpx.Client, operation_id: str) -> list[dict[str, Any]]:
    return [
        c
        for c in payments.get("/_control/charges").json()
        if c["reference"].endswith(f":{operation_id}")
    ]


async def _charge(host: Host, cents: int, principal: str) -> CommandResult:
    """A host asks for a charge on behalf of `principal`; the first result it gets back."""
    command = host.command(
        action="payment.charge.create",
        agent=AGENT,
        principal=principal,
        arguments={
            "customer_id": "ACME-42",
            "amount_cents": cents,
            "currency": "EUR",
            "description": "Expedited shipping for order 7781",
        },
    )
    await host.submit(command)
    return await host.wait_command(command.request_id)


async def _settled(host: Host, request_id: str) -> CommandResult:
    with anyio.fail_after(60):
        while True:
            for r in await host.results(request_id):
                if isinstance(r, CommandResult) and r.status not in (
                    "pending",
                    "dispatching",
                    "awaiting_human",
                ):
                    return r
            await anyio.sleep(0.1)


async def _grants(db: asyncpg.Connection) -> list[tuple[str, str]]:
    rows = await db.fetch(
        "SELECT agent, family FROM governance.standing_grants WHERE tenant = 'acme' AND agent = $1",
        AGENT,
    )
    return [(r["agent"], r["family"]) for r in rows]


async def _pending_answer(db: asyncpg.Connection, pending_id: str) -> Any:
    return await db.fetchval(
        "SELECT answer FROM governance.pending WHERE pending_id = $1", uuid.UUID(pending_id)
    )


async def test_a_charge_approved_once_leaves_the_next_charge_by_another_principal_asking(
    host: Host, db: asyncpg.Connection, payments: httpx.Client
) -> None:
    first = await _charge(host, 4900, "alice@acme.example")
    assert first.status == "awaiting_human" and first.proposal is not None, first
    assert first.pending_id is not None
    options = await db.fetchval(
        "SELECT options FROM governance.pending WHERE pending_id = $1",
        uuid.UUID(first.pending_id),
    )
    assert list(options) == ["once", "deny"]  # money: never "always"

    # "always" is refused on the proposal too, and writes no grant.
    refused = await host.wait_approval(
        await host.approve(first.proposal.proposal_id, grant="always")
    )
    assert (refused.status, refused.code) == ("not_approvable", "INVALID_ANSWER"), refused
    assert await _grants(db) == []
    assert await _pending_answer(db, first.pending_id) is None

    # Once, answered where the preview is shown: the 49.00 EUR charge runs, once.
    taken = await host.decide(first.pending_id, "once", proposal_id=first.proposal.proposal_id)
    assert taken.accepted, taken
    done = await _settled(host, first.request_id)
    assert (done.status, done.outcome) == ("succeeded", "succeeded"), done
    [made] = _charges(payments, done.operation_id or "")
    assert made["amount_cents"] == 4900
    assert await _grants(db) == []

    # A 990.00 EUR charge by another principal asks again; nothing is charged meanwhile.
    second = await _charge(host, 99000, "bob@acme.example")
    assert second.status == "awaiting_human" and second.proposal is not None, second
    assert second.pending_id not in (None, first.pending_id)
    await anyio.sleep(1.0)
    assert not [c for c in payments.get("/_control/charges").json() if c["amount_cents"] == 99000]


async def test_a_standing_grant_for_the_family_does_not_cover_a_charge(
    host: Host, db: asyncpg.Connection
) -> None:
    await db.execute(
        "INSERT INTO governance.standing_grants (tenant, agent, family, granted_by) "
        "VALUES ('acme', $1, 'write_delete', 'admin@acme.example') ON CONFLICT DO NOTHING",
        AGENT,
    )
    try:
        asked = await _charge(host, 4900, "alice@acme.example")
        assert asked.status == "awaiting_human", asked
        line = await db.fetchval(
            "SELECT line FROM governance.decisions WHERE decision_id = $1",
            uuid.UUID(asked.pending_id or ""),
        )
        assert line == 5
    finally:
        await db.execute(
            "DELETE FROM governance.standing_grants WHERE tenant = 'acme' AND agent = $1", AGENT
        )


async def test_a_decision_about_a_proposal_is_refused_without_its_proposal(
    host: Host, db: asyncpg.Connection
) -> None:
    asked = await _charge(host, 4900, "alice@acme.example")
    other = await _charge(host, 5100, "alice@acme.example")
    assert asked.pending_id and asked.proposal and other.proposal

    for answer in ("once", "always", "deny"):
        blind = await host.decide(asked.pending_id, answer)
        assert (blind.accepted, blind.code) == (False, "PROPOSAL_REQUIRED"), blind
    wrong = await host.decide(asked.pending_id, "once", proposal_id=other.proposal.proposal_id)
    assert (wrong.accepted, wrong.code) == (False, "PROPOSAL_MISMATCH"), wrong
    always = await host.decide(asked.pending_id, "always", proposal_id=asked.proposal.proposal_id)
    assert (always.accepted, always.code) == (False, "INVALID_ANSWER"), always
    assert await _pending_answer(db, asked.pending_id) is None
    assert await _grants(db) == []

    denied = await host.decide(
        asked.pending_id, "deny", proposal_id=asked.proposal.proposal_id, reason="not agreed"
    )
    assert denied.accepted, denied
    assert await _pending_answer(db, asked.pending_id) == "deny"
    state = await db.fetchval(
        "SELECT state FROM admission.proposals WHERE public_id = $1", asked.proposal.proposal_id
    )
    assert state == "rejected"


async def test_maker_checker_compares_canonical_principals(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    # The demo tenants' issuer declares e-mail principals: one person whatever the case.
    asked = await _charge(host, 4900, "alice@acme.example")
    assert asked.proposal is not None
    shouted = stack.token("acme", "Alice@ACME.example", roles=["approver"])
    refused = await host.wait_approval(
        await host.approve(asked.proposal.proposal_id, token=shouted)
    )
    assert (refused.status, refused.code) == ("not_approvable", "SEPARATION_OF_DUTIES"), refused
    answered = await host.decide(
        asked.pending_id or "", "once", token=shouted, proposal_id=asked.proposal.proposal_id
    )
    assert (answered.accepted, answered.code) == (False, "SEPARATION_OF_DUTIES"), answered
    assert await _pending_answer(db, asked.pending_id or "") is None
    # And a run requested as `ALICE@acme.example` is recorded as alice's.
    principal = await db.fetchval(
        "SELECT principal FROM admission.proposals WHERE public_id = $1",
        asked.proposal.proposal_id,
    )
    assert principal == "alice@acme.example"
    shouting = await _charge(host, 5000, "ALICE@acme.example")
    assert shouting.proposal is not None
    assert (
        await db.fetchval(
            "SELECT principal FROM admission.proposals WHERE public_id = $1",
            shouting.proposal.proposal_id,
        )
        == "alice@acme.example"
    )


def _proposals(stack: Stack, state: str) -> list[str]:
    with httpx.Client(base_url=stack.api_url, timeout=40) as api:
        got = api.get(
            "/proposals",
            params={"state": state, "limit": 500},
            headers=auth(stack, principal="ops@acme.example", roles=["approver"]),
        )
    assert got.status_code == 200, got.text
    return [p["proposal_id"] for p in got.json()["proposals"]]


async def test_a_finished_proposal_is_listed_completed(
    stack: Stack, host: Host, payments: httpx.Client
) -> None:
    asked = await _charge(host, 4900, "alice@acme.example")
    assert asked.proposal is not None and asked.pending_id is not None
    proposal_id = asked.proposal.proposal_id
    assert proposal_id in _proposals(stack, "pending")
    taken = await host.decide(asked.pending_id, "once", proposal_id=proposal_id)
    assert taken.accepted, taken
    done = await _settled(host, asked.request_id)
    assert done.status == "succeeded", done
    assert proposal_id in _proposals(stack, "completed")
    # Auditors read it (and answer nothing); a token with neither role is refused.
    with httpx.Client(base_url=stack.api_url, timeout=40) as api:
        read = api.get(
            f"/proposals/{proposal_id}",
            headers=auth(stack, principal="audit@acme.example", roles=["auditor"]),
        )
        assert (read.status_code, read.json()["state"]) == (200, "completed"), read.text
        assert read.json()["approved_by"] == "ops@acme.example" and read.json()["approved_at"]
        refused = api.get(f"/proposals/{proposal_id}", headers=auth(stack))
        assert refused.status_code == 403
    assert proposal_id not in _proposals(stack, "executing")
    assert proposal_id not in _proposals(stack, "pending")


async def test_an_expired_proposal_closes_its_decision(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    asked = await _charge(host, 4900, "alice@acme.example")
    assert asked.proposal is not None and asked.pending_id is not None
    deadline = await db.fetchval(
        "SELECT deadline FROM governance.pending WHERE pending_id = $1",
        uuid.UUID(asked.pending_id),
    )
    assert deadline is not None  # it closes when the proposal expires, not never
    # Its time passes.
    await db.execute(
        "UPDATE admission.proposals SET expires_at = now() - interval '2 seconds' "
        "WHERE public_id = $1",
        asked.proposal.proposal_id,
    )
    await db.execute(
        "UPDATE governance.pending SET deadline = now() - interval '1 second' "
        "WHERE pending_id = $1",
        uuid.UUID(asked.pending_id),
    )
    with anyio.fail_after(30):
        while await _pending_answer(db, asked.pending_id) is None:
            await anyio.sleep(0.2)
    row = await db.fetchrow(
        "SELECT answer, answered_by, answer_reason FROM governance.pending WHERE pending_id = $1",
        uuid.UUID(asked.pending_id),
    )
    assert (row["answer"], row["answered_by"]) == ("deny", "nobody")
    with anyio.fail_after(30):
        while (
            await db.fetchval(
                "SELECT state FROM admission.proposals WHERE public_id = $1",
                asked.proposal.proposal_id,
            )
            != "expired"
        ):
            await anyio.sleep(0.2)
    final = await _settled(host, asked.request_id)
    assert final.status == "rejected" and "expired" in (final.error.message if final.error else "")
    assert asked.proposal.proposal_id in _proposals(stack, "expired")
    # Nothing is left to answer, through either door.
    late = await host.decide(asked.pending_id, "once", proposal_id=asked.proposal.proposal_id)
    assert not late.accepted
    with httpx.Client(base_url=stack.api_url, timeout=40) as api:
        listed = api.get(
            "/pending-decisions",
            headers=auth(stack, principal="ops@acme.example", roles=["approver"]),
        ).json()["decisions"]
    assert asked.pending_id not in [d["pending_id"] for d in listed]


async def test_250_pending_proposals_are_all_reachable_by_paging_and_filtering(
    stack: Stack,
) -> None:
    agent = "scoped-assistant"  # asks for every note: no grant
    headers = auth(stack)
    approver = auth(stack, principal="ops@acme.example", roles=["approver"])
    made: list[str] = []

    async def note(i: int, api: httpx.AsyncClient) -> None:
        got = await api.post(
            "/commands",
            headers={**headers, "Idempotency-Key": f"page-{uuid.uuid4().hex[:12]}"},
            json={
                "agent": agent,
                "operation_key": f"page-{uuid.uuid4().hex[:12]}",
                "action": "crm.note.create",
                "arguments": {"customer_id": "ACME-42", "body": f"Note {i}"},
            },
        )
        assert got.status_code == 200 and got.json()["status"] == "awaiting_human", got.text
        made.append(got.json()["proposal"]["proposal_id"])

    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as api:
        limiter = anyio.Semaphore(8)

        async def one(i: int) -> None:
            async with limiter:
                await note(i, api)

        async with anyio.create_task_group() as tg:
            for i in range(250):
                tg.start_soon(one, i)
        assert len(made) == 250

        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params: dict[str, Any] = {"state": "pending", "agent": agent, "limit": 40}
            if cursor:
                params["cursor"] = cursor
            page = (await api.get("/proposals", params=params, headers=approver)).json()
            assert page["total"] == 250
            seen += [p["proposal_id"] for p in page["proposals"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
    assert pages == 7 and len(seen) == len(set(seen)) == 250
    assert set(seen) == set(made)
    with httpx.Client(base_url=stack.api_url, timeout=40) as sync:
        by_action = sync.get(
            "/proposals",
            params={"state": "pending", "agent": agent, "action": "payment.refund"},
            headers=approver,
        ).json()
        assert by_action["total"] == 0 and by_action["proposals"] == []
        mine = sync.get(
            "/proposals",
            params={"state": "pending", "agent": agent, "requester": "alice@acme.example"},
            headers=approver,
        ).json()
        assert mine["total"] == 250
        none_yet = sync.get(
            "/proposals",
            params={"state": "pending", "agent": agent, "older_than_s": 86400},
            headers=approver,
        ).json()
        assert none_yet["total"] == 0


async def _revoke(db: asyncpg.Connection, principal: str) -> None:
    await db.execute(
        "INSERT INTO governance.revocations (tenant, principal, revoked_by) "
        "VALUES ('acme', $1, 'admin@acme.example')",
        principal,
    )


async def _approvals(db: asyncpg.Connection, proposal_id: str) -> list[str]:
    rows = await db.fetch(
        "SELECT a.approver FROM admission.proposal_approvals a JOIN admission.proposals p "
        "USING (tenant, proposal_id) WHERE p.public_id = $1 ORDER BY a.approved_at",
        proposal_id,
    )
    return [r["approver"] for r in rows]


async def test_four_eyes_on_the_host_door_checks_every_approval_with_governance(
    host: Host, db: asyncpg.Connection, payments: httpx.Client
) -> None:
    tag = uuid.uuid4().hex[:8]
    early, gone, lead, ops = (
        f"{who}-{tag}@acme.example" for who in ("early", "gone", "lead", "ops")
    )
    asked = await _charge(host, 99000, "alice@acme.example")  # 990.00 EUR: two approvers
    assert asked.proposal is not None and asked.pending_id is not None, asked
    proposal_id, pending_id = asked.proposal.proposal_id, asked.pending_id

    charged = len(payments.get("/_control/charges").json())

    async def decide(principal: str) -> Any:
        return await host.decide(pending_id, "once", principal=principal, proposal_id=proposal_id)

    # A revoked approver's first approval is refused by governance, and is not recorded.
    await _revoke(db, gone)
    refused = await decide(gone)
    assert (refused.accepted, refused.code) == (False, "FORBIDDEN"), refused
    assert "revoked" in refused.message
    assert await _approvals(db, proposal_id) == []

    # A first approval, taken; then its approver is revoked: it no longer counts.
    first = await decide(early)
    assert first.accepted and first.message.startswith("1 of 2 approvals"), first
    await _revoke(db, early)
    second = await decide(lead)
    assert second.accepted and second.message.startswith("1 of 2 approvals"), second
    assert await _pending_answer(db, pending_id) is None
    assert await _approvals(db, proposal_id) == [early, lead]

    # The same person again; the requester.
    again = await decide(lead)
    assert (again.accepted, again.code) == (False, "ALREADY_APPROVED"), again
    own = await decide("alice@acme.example")
    assert (own.accepted, own.code) == (False, "SEPARATION_OF_DUTIES"), own
    await anyio.sleep(0.5)
    assert len(payments.get("/_control/charges").json()) == charged  # nothing ran
    assert await _pending_answer(db, pending_id) is None

    # A second distinct approver who still counts: it runs, exactly once.
    done_by_ops = await decide(ops)
    assert (done_by_ops.accepted, done_by_ops.message) == (True, "answered once"), done_by_ops
    done = await _settled(host, asked.request_id)
    assert (done.status, done.outcome) == ("succeeded", "succeeded"), done
    [made] = _charges(payments, done.operation_id or "")
    assert made["amount_cents"] == 99000
    late = await decide(f"late-{tag}@acme.example")
    assert not late.accepted, late
    assert len(_charges(payments, done.operation_id or "")) == 1
    assert await _pending_answer(db, pending_id) == "once"


async def test_four_eyes_over_http_refuses_a_revoked_first_approver(
    stack: Stack, host: Host, db: asyncpg.Connection, payments: httpx.Client
) -> None:
    tag = uuid.uuid4().hex[:8]
    gone, lead, ops = (f"{who}-{tag}@acme.example" for who in ("gone", "lead", "ops"))
    asked = await _charge(host, 75000, "alice@acme.example")
    assert asked.proposal is not None, asked
    proposal_id = asked.proposal.proposal_id
    await _revoke(db, gone)

    with httpx.Client(base_url=stack.api_url, timeout=40) as api:

        def approve(principal: str) -> dict[str, Any]:
            got = api.post(
                f"/proposals/{proposal_id}/approve",
                json={},
                headers={**auth(stack, principal=principal, roles=["approver"]), **key()},
            )
            assert got.status_code == 200, got.text
            return dict(got.json())

        refused = approve(gone)
        assert (refused["status"], refused["code"]) == ("not_approvable", "FORBIDDEN"), refused
        first = approve(lead)
        assert first["status"] == "approval_recorded", first
        assert first["reason"].startswith("1 of 2 approvals"), first
        again = approve(lead)
        assert (again["status"], again["code"]) == ("not_approvable", "ALREADY_APPROVED")
        own = approve("alice@acme.example")
        assert (own["status"], own["code"]) == ("not_approvable", "SEPARATION_OF_DUTIES")
        assert await _approvals(db, proposal_id) == [lead]
        claimed = approve(ops)
        assert claimed["status"] in ("claimed", "already_completed"), claimed
    done = await _settled(host, asked.request_id)
    assert done.status == "succeeded", done
    assert len(_charges(payments, done.operation_id or "")) == 1


async def test_a_revoked_first_approval_is_listed_apart_and_a_third_approver_completes_it(
    stack: Stack, host: Host, db: asyncpg.Connection, payments: httpx.Client
) -> None:
    tag = uuid.uuid4().hex[:8]
    first, second, third = (f"{who}-{tag}@acme.example" for who in ("first", "second", "third"))
    asked = await _charge(host, 64000, "alice@acme.example")
    assert asked.proposal is not None, asked
    proposal_id = asked.proposal.proposal_id

    with httpx.Client(base_url=stack.api_url, timeout=40) as api:

        def approve(principal: str) -> dict[str, Any]:
            got = api.post(
                f"/proposals/{proposal_id}/approve",
                json={},
                headers={**auth(stack, principal=principal, roles=["approver"]), **key()},
            )
            assert got.status_code == 200, got.text
            return dict(got.json())

        def shown() -> dict[str, Any]:
            got = api.get(
                f"/proposals/{proposal_id}",
                headers=auth(stack, principal=f"auditor-{tag}@acme.example", roles=["auditor"]),
            )
            assert got.status_code == 200, got.text
            return dict(got.json())

        recorded = approve(first)
        assert recorded["status"] == "approval_recorded", recorded
        assert [a["approver"] for a in shown()["approvals_given"]] == [first]
        assert shown()["approvals"] == [first]

        # The first approver loses their access: their approval is still listed, as one that
        # no longer counts, and it is not among those that count.
        await _revoke(db, first)
        view = shown()
        assert (view["state"], view["approvals_needed"], view["approvals"]) == ("pending", 2, [])
        [gone] = view["approvals_given"]
        assert (gone["approver"], gone["counts"], gone["code"]) == (
            first,
            False,
            "APPROVER_REVOKED",
        )
        assert "revoked" in gone["reason"]

        # A second approver's approval is the only one that counts: the charge still waits.
        still = approve(second)
        assert still["status"] == "approval_recorded", still
        assert still["reason"].startswith("1 of 2 approvals"), still
        view = shown()
        assert (view["state"], view["approvals"]) == ("pending", [second])
        assert [(a["approver"], a["counts"]) for a in view["approvals_given"]] == [
            (first, False),
            (second, True),
        ]
        await anyio.sleep(0.5)
        assert not [
            c for c in payments.get("/_control/charges").json() if c["amount_cents"] == 64000
        ]

        # A third approver completes the two that count: it runs, exactly once.
        claimed = approve(third)
        assert claimed["status"] == "claimed", claimed
    done = await _settled(host, asked.request_id)
    assert (done.status, done.outcome) == ("succeeded", "succeeded"), done
    assert len(_charges(payments, done.operation_id or "")) == 1
    assert (
        await db.fetchval(
            "SELECT approved_by FROM admission.proposals WHERE public_id = $1", proposal_id
        )
        == third
    )


async def test_a_problem_speaks_the_language_accept_language_asks_for(stack: Stack) -> None:
    no_role = auth(stack, principal="nobody@acme.example", roles=[])
    with httpx.Client(base_url=stack.api_url, timeout=40) as api:
        english = api.get("/proposals", headers=no_role)
        french = api.get("/proposals", headers={**no_role, "Accept-Language": "fr-FR, en;q=0.5"})
        other = api.get("/proposals", headers={**no_role, "Accept-Language": "de"})
    for got in (english, french, other):
        assert got.status_code == 403, got.text
        assert got.headers["content-type"] == "application/problem+json"
        assert got.json()["code"] == "FORBIDDEN"
    assert (english.json()["title"], english.json()["detail"]) == (
        "forbidden",
        "this needs the approver role",
    )
    assert (french.json()["title"], french.json()["detail"]) == (
        "Interdit",
        "il faut pour cela le rôle approver",
    )
    assert french.headers["content-language"] == "fr"
    assert other.json() == english.json()  # a language Writ does not speak: English
