"""What an operation key binds.

A host's key names one intent: tenant, principal, agent, action, arguments and expected
revision. The same key with any of them changed is `CONFLICT`, whether the command waits for a
person or ran already; the same key sent at once several times asks a person once; a replayed
answer carries what the first did; an agent no manifest declares is refused.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import asyncpg
import httpx
import msgspec
import pytest

from schemas.host import CommandResult
from tests.e2e.conftest import Host

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

AGENT = "refund-assistant"  # no grant: every refund asks a person


def _refund(host: Host, payments: httpx.Client, **fields: Any):
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    payments.post(
        "/_control/payments",
        json={
            "payment_id": payment_id,
            "customer_id": "ACME-42",
            "currency": "EUR",
            "status": "captured",
            "method": {"kind": "card", "last4": "4242", "usable": True},
            "lines": [
                {
                    "line_id": "L2",
                    "product": "Junior programme",
                    "participant": "Léo Martin",
                    "amount_cents": 12000,
                    "discount": {
                        "discount_id": "D-SIB",
                        "name": "Sibling discount",
                        "amount_cents": 1500,
                    },
                }
            ],
        },
    ).raise_for_status()
    return host.command(
        action="payment.refund",
        agent=AGENT,
        arguments={"payment_id": payment_id, "line_id": "L2"},
        **fields,
    )


def _again(command, **changes: object):
    """The same key (and whatever is not changed), under a new request id."""
    return msgspec.structs.replace(command, request_id=f"cmd-{uuid.uuid4().hex[:12]}", **changes)


async def test_a_replayed_awaiting_human_answer_carries_its_proposal(
    host: Host, payments: httpx.Client
) -> None:
    command = _refund(host, payments)
    await host.submit(command)
    first = await host.wait_command(command.request_id)
    assert first.status == "awaiting_human" and first.proposal is not None
    replay = _again(command)
    await host.submit(replay)
    again = await host.wait_command(replay.request_id)
    assert (again.status, again.pending_id, again.proposal) == (
        "awaiting_human",
        first.pending_id,
        first.proposal,
    )


async def test_anything_a_key_binds_changed_while_it_waits_is_a_conflict(
    host: Host, payments: httpx.Client
) -> None:
    command = _refund(host, payments)
    await host.submit(command)
    assert (await host.wait_command(command.request_id)).status == "awaiting_human"
    changed = [
        _again(command, expected_revision="r9"),
        _again(command, agent="crm-assistant"),
        _again(command, token=host.stack.token("acme", "bob@acme.example")),
    ]
    for other in changed:
        await host.submit(other)
    for other in changed:
        result = await host.wait_command(other.request_id)
        assert result.status == "conflict", (other, result)
        assert result.error is not None and result.error.code == "CONFLICT"


async def test_anything_a_key_binds_changed_after_it_ran_is_a_conflict(host: Host) -> None:
    command = host.command()  # crm-assistant's note: allowed by its standing grant
    await host.submit(command)
    assert (await host.wait_command(command.request_id)).status == "succeeded"
    changed = [
        _again(command, expected_revision="r9"),
        _again(command, agent="research-assistant"),  # granted too: only the key differs
        _again(command, token=host.stack.token("acme", "bob@acme.example")),
    ]
    for other in changed:
        await host.submit(other)
    for other in changed:
        result = await host.wait_command(other.request_id)
        assert result.status == "conflict", (other, result)


async def test_one_key_sent_at_once_asks_a_person_once(
    host: Host, payments: httpx.Client, db: asyncpg.Connection
) -> None:
    command = _refund(host, payments)
    copies = [_again(command) for _ in range(8)]
    async with anyio.create_task_group() as tg:
        for copy in copies:
            tg.start_soon(host.submit, copy)
    answers: list[CommandResult] = [await host.wait_command(c.request_id) for c in copies]
    assert {a.status for a in answers} == {"awaiting_human"}
    assert len({a.pending_id for a in answers}) == 1
    assert all(a.proposal is not None for a in answers)
    proposals = await db.fetch(
        "SELECT proposal_id::text FROM admission.proposals WHERE tenant = 'acme' "
        "AND operation_key = $1",
        command.operation_key,
    )
    assert len(proposals) == 1
    pending = await db.fetchval(
        "SELECT count(*) FROM governance.pending WHERE tenant = 'acme' AND proposal_id = $1",
        proposals[0]["proposal_id"],
    )
    assert pending == 1


async def test_a_command_for_an_agent_no_manifest_declares_is_refused(host: Host) -> None:
    command = host.command(agent="nobody-declares-me")
    await host.submit(command)
    result = await host.wait_command(command.request_id)
    assert result.status == "rejected"
    assert result.error is not None and result.error.code == "UNKNOWN_AGENT"
