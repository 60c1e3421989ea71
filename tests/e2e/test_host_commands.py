"""Hosts that know what they want submit commands under their own operation key:
replay, conflict, concurrent retries, redelivery of a terminal command, and the checks made
right before dispatch (revocation, expiry, resource revision)."""

from __future__ import annotations

import uuid

import anyio
import asyncpg
import httpx
import msgspec
import pytest

from schemas import subjects
from schemas.admission import DispatchCommand
from tests.e2e.conftest import Host, notes_for
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def _command_rows(db: asyncpg.Connection, operation_key: str) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT * FROM admission.commands WHERE operation_key = $1", operation_key
    )


async def test_a_host_command_executes_once_and_answers_with_its_receipt(
    host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    command = host.command()
    await host.submit(command)

    result = await host.wait_command(command.request_id)

    assert result.status == "succeeded", result
    rows = await _command_rows(db, command.operation_key)
    assert len(rows) == 1 and rows[0]["state"] == "succeeded" and rows[0]["origin"] == "host"
    assert str(rows[0]["operation_id"]) == result.operation_id
    notes = notes_for(crm, f"acme:{result.operation_id}")
    assert [n["note_id"] for n in notes] == [result.receipt]
    # No run and no planner step was involved.
    assert (
        await db.fetchval("SELECT count(*) FROM planner.runs WHERE run_id = $1", rows[0]["run_id"])
        == 0
    )


async def test_same_key_same_payload_is_a_replay_of_the_recorded_outcome(
    host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    first = host.command()
    await host.submit(first)
    done = await host.wait_command(first.request_id)

    again = msgspec.structs.replace(
        first,
        request_id=f"cmd-{uuid.uuid4().hex[:12]}",
        token=host.stack.token("acme", "alice@acme.example"),
    )
    await host.submit(again)
    replay = await host.wait_command(again.request_id)

    assert (replay.status, replay.operation_id, replay.receipt) == (
        "succeeded",
        done.operation_id,
        done.receipt,
    )
    assert len(await _command_rows(db, first.operation_key)) == 1
    assert len(notes_for(crm, f"acme:{done.operation_id}")) == 1
    attempts = await db.fetchval(
        "SELECT count(*) FROM dispatcher.attempts WHERE operation_id = $1",
        uuid.UUID(done.operation_id),
    )
    assert attempts == 1


async def test_same_key_other_payload_is_a_conflict_and_the_stored_command_is_untouched(
    host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    first = host.command()
    await host.submit(first)
    done = await host.wait_command(first.request_id)
    stored = (await _command_rows(db, first.operation_key))[0]

    other = host.command(
        operation_key=first.operation_key,
        arguments={"customer_id": "ACME-42", "body": "A different note"},
    )
    await host.submit(other)
    conflict = await host.wait_command(other.request_id)

    assert conflict.status == "conflict"
    assert conflict.error is not None and first.operation_key in conflict.error.message
    after = await _command_rows(db, first.operation_key)
    assert len(after) == 1
    assert (after[0]["arguments"], after[0]["request_hash"], after[0]["state"]) == (
        stored["arguments"],
        stored["request_hash"],
        "succeeded",
    )
    assert len(notes_for(crm, f"acme:{done.operation_id}")) == 1


async def test_concurrent_retries_with_one_key_admit_one_command_and_one_effect(
    host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    first = host.command()
    retries = [first] + [
        msgspec.structs.replace(first, request_id=f"cmd-{uuid.uuid4().hex[:12]}") for _ in range(9)
    ]
    async with anyio.create_task_group() as tg:
        for command in retries:
            tg.start_soon(host.submit, command)
    # Each retry is answered with the state recorded when it arrived; the one that admitted
    # the command is answered again with the outcome.
    results = [await host.wait_command(c.request_id, final=False) for c in retries]

    rows = await _command_rows(db, first.operation_key)
    assert len(rows) == 1
    assert {r.operation_id for r in results} == {str(rows[0]["operation_id"])}
    assert {r.status for r in results} <= {"pending", "dispatching", "succeeded"}
    admitting = await host.wait_command(rows[0]["request_id"])
    assert admitting.status == "succeeded"
    assert len(notes_for(crm, f"acme:{rows[0]['operation_id']}")) == 1


async def test_a_burst_of_new_replayed_conflicting_and_invalid_commands_each_get_their_answer(
    host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    # Submitted at once, so admission takes many of them in one fetched batch (one decide
    # request, one transaction): each still gets the answer it would get alone.
    fresh = [host.command() for _ in range(6)]
    replays = [
        msgspec.structs.replace(c, request_id=f"cmd-{uuid.uuid4().hex[:12]}") for c in fresh[:3]
    ]
    conflict = host.command(
        operation_key=fresh[3].operation_key,
        arguments={"customer_id": "ACME-42", "body": "Another note"},
    )
    invalid = host.command(arguments={"customer_id": "ACME-42"})  # no body
    burst = [*fresh, *replays, conflict, invalid]
    async with anyio.create_task_group() as tg:
        for command in burst:
            tg.start_soon(host.submit, command)
    answers = {c.request_id: await host.wait_command(c.request_id, final=False) for c in burst}

    assert answers[invalid.request_id].status == "rejected"
    assert await _command_rows(db, invalid.operation_key) == []
    # The conflict and the first of its key may arrive in either order: one of them admitted
    # the key, the other is the conflict, and the stored payload is the admitted one's.
    pair = {answers[fresh[3].request_id].status, answers[conflict.request_id].status}
    assert "conflict" in pair and pair - {"conflict"} <= {"pending", "dispatching", "succeeded"}
    for command in fresh:
        rows = await _command_rows(db, command.operation_key)
        assert len(rows) == 1
        admitting = await host.wait_command(rows[0]["request_id"])
        assert admitting.status == "succeeded", admitting
        assert len(notes_for(crm, f"acme:{rows[0]['operation_id']}")) == 1
    for replay, first in zip(replays, fresh[:3], strict=True):
        assert answers[replay.request_id].operation_id == (answers[first.request_id].operation_id)
        assert answers[replay.request_id].status in ("pending", "dispatching", "succeeded")


async def test_a_terminal_command_delivered_again_returns_its_outcome_and_does_nothing(
    host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    command = host.command()
    await host.submit(command)
    done = await host.wait_command(command.request_id)
    assert done.operation_id is not None
    operation_id = uuid.UUID(done.operation_id)

    # A late duplicate beyond the stream's duplicate window: a new Nats-Msg-Id.
    await host.js.publish(
        subjects.command("acme"),
        msgspec.json.encode(DispatchCommand(tenant="acme", operation_id=done.operation_id)),
        headers={"Nats-Msg-Id": f"late-{uuid.uuid4().hex}"},
    )
    await anyio.sleep(1.0)

    row = (await _command_rows(db, command.operation_key))[0]
    assert (row["state"], row["receipt"], row["lease_epoch"]) == ("succeeded", done.receipt, 1)
    assert (
        await db.fetchval(
            "SELECT count(*) FROM dispatcher.attempts WHERE operation_id = $1", operation_id
        )
        == 1
    )
    assert (
        await db.fetchval(
            "SELECT count(*) FROM admission.outbox WHERE operation_id = $1", operation_id
        )
        == 0
    )
    assert len(notes_for(crm, f"acme:{done.operation_id}")) == 1


async def test_an_invalid_command_is_rejected_before_anything_happens(
    host: Host, db: asyncpg.Connection
) -> None:
    command = host.command(arguments={"customer_id": "ACME-42", "body": "x", "cc": "evil"})
    await host.submit(command)
    result = await host.wait_command(command.request_id)
    assert result.status == "rejected"
    assert result.error is not None and "cc" in result.error.message
    assert await _command_rows(db, command.operation_key) == []


async def test_the_resource_revision_changed_ends_revision_required(
    host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    customer = f"REV-{uuid.uuid4().hex[:6].upper()}"
    crm.post("/_control/customers", json={"customer_id": customer, "name": "Rev Co"})
    first = host.command(
        arguments={"customer_id": customer, "body": "first"}, expected_revision="r1"
    )
    await host.submit(first)
    assert (await host.wait_command(first.request_id)).status == "succeeded"  # now at r2

    stale = host.command(
        arguments={"customer_id": customer, "body": "second"}, expected_revision="r1"
    )
    await host.submit(stale)
    result = await host.wait_command(stale.request_id)

    assert result.status == "revision_required"
    rows = await _command_rows(db, stale.operation_key)
    assert rows[0]["state"] == "revision_required"
    assert [n["body"] for n in notes_for(crm) if n["customer_id"] == customer] == ["first"]


@pytest.fixture
async def dispatcher_paused(stack: Stack):
    """Stop the dispatcher so commands queue; restart it when the test says so."""
    stack.stop_process("dispatcher")

    async def resume() -> None:
        stack.start_services(("dispatcher",))
        await stack.wait_ready(("dispatcher",))

    yield resume
    if "dispatcher" not in stack.procs:
        await resume()


async def _admitted(db: asyncpg.Connection, operation_key: str) -> asyncpg.Record:
    with anyio.fail_after(20):
        while True:
            rows = await _command_rows(db, operation_key)
            if rows:
                return rows[0]
            await anyio.sleep(0.05)


async def test_access_revoked_before_dispatch_stops_the_queued_action(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, dispatcher_paused
) -> None:
    principal = f"bob-{uuid.uuid4().hex[:6]}@acme.example"
    command = host.command(principal=principal)
    await host.submit(command)
    row = await _admitted(db, command.operation_key)
    await db.execute(
        "INSERT INTO governance.revocations (tenant, principal, revoked_by) "
        "VALUES ('acme', $1, 'security@acme.example')",
        principal,
    )

    await dispatcher_paused()
    result = await host.wait_command(command.request_id)

    assert result.status == "denied"
    assert result.error is not None and "revoked" in result.error.message
    assert notes_for(crm, f"acme:{row['operation_id']}") == []


async def test_an_unchanged_policy_lets_the_admission_allow_stand_as_the_recheck(
    host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    command = host.command()
    await host.submit(command)
    result = await host.wait_command(command.request_id)

    assert result.status == "succeeded", result
    row = (await _command_rows(db, command.operation_key))[0]
    assert row["policy_epoch"] is not None
    # One decision for the command: the admission's; the dispatcher asked no second one.
    assert (
        await db.fetchval(
            "SELECT count(*) FROM governance.decisions WHERE run_id = $1", row["run_id"]
        )
        == 1
    )
    assert len(notes_for(crm, f"acme:{result.operation_id}")) == 1


async def test_a_deny_rule_added_while_queued_stops_the_admitted_action(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, dispatcher_paused
) -> None:
    customer = f"DENY-{uuid.uuid4().hex[:6].upper()}"
    command = host.command(arguments={"customer_id": customer, "body": "Queued, then denied."})
    await host.submit(command)
    row = await _admitted(db, command.operation_key)
    rule = await db.fetchval(
        "INSERT INTO governance.rules (tenant, tool, arg_prefix, effect) "
        "VALUES ('acme', 'crm.note.create', $1, 'deny') RETURNING rule_id",
        customer,
    )
    try:
        await dispatcher_paused()
        result = await host.wait_command(command.request_id)
    finally:
        await db.execute("DELETE FROM governance.rules WHERE rule_id = $1", rule)

    assert result.status == "denied", result
    assert result.error is not None and "deny rule" in result.error.message
    assert notes_for(crm, f"acme:{row['operation_id']}") == []
    # The re-check asked decide again: the admission's allow and the dispatcher's deny.
    verdicts = await db.fetch(
        "SELECT verdict FROM governance.decisions WHERE run_id = $1 ORDER BY decided_at",
        row["run_id"],
    )
    assert [v["verdict"] for v in verdicts] == ["allow", "deny"]


async def test_an_approval_that_expires_while_queued_is_not_executed(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, dispatcher_paused
) -> None:
    command = host.command()
    await host.submit(command)
    row = await _admitted(db, command.operation_key)
    # Time passes while the command waits: its approval's expiry is now behind us.
    await db.execute(
        "UPDATE admission.commands SET expires_at = now() - interval '1 second' "
        "WHERE operation_id = $1",
        row["operation_id"],
    )

    await dispatcher_paused()
    result = await host.wait_command(command.request_id)

    assert result.status == "expired"
    assert notes_for(crm, f"acme:{row['operation_id']}") == []
