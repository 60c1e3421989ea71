"""A note's path through the six real processes."""

from __future__ import annotations

import anyio
import asyncpg
import httpx
import msgspec
import pytest

from schemas.host import RunRequest
from tests.e2e.conftest import Host, notes_for, run_evidence

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def _run_rows(db: asyncpg.Connection, request_id: str) -> list[asyncpg.Record]:
    return await db.fetch("SELECT * FROM planner.runs WHERE request_id = $1", request_id)


async def _commands(db: asyncpg.Connection, run_id: str | None) -> list[asyncpg.Record]:
    assert run_id is not None, "the run has no id"
    return await db.fetch("SELECT * FROM admission.commands WHERE run_id = $1", run_id)


async def test_a_request_adds_exactly_one_note(
    host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    request = host.request()
    await host.publish(request, msg_id=request.request_id)

    result = await host.wait_result(request.request_id)

    assert result.status == "succeeded", result
    assert result.answer and "note" in result.answer
    runs = await _run_rows(db, request.request_id)
    assert [(r["tenant"], r["principal"], r["status"]) for r in runs] == [
        ("acme", "alice@acme.example", "succeeded")
    ]
    commands = await _commands(db, result.run_id)
    assert len(commands) == 1
    command = commands[0]
    assert command["state"] == "succeeded"
    assert command["action"] == "crm.note.create"
    assert command["decision_line"] == 5  # allowed by the demo agent's standing grant
    key = f"acme:{command['operation_id']}"
    notes = notes_for(crm, key)
    assert len(notes) == 1
    assert notes[0]["customer_id"] == "ACME-42"
    assert command["receipt"] == notes[0]["note_id"]
    assert [(a.operation_id, a.state, a.receipt) for a in result.actions] == [
        (str(command["operation_id"]), "succeeded", notes[0]["note_id"])
    ]
    attempts = await db.fetch(
        "SELECT * FROM dispatcher.attempts WHERE operation_id = $1", command["operation_id"]
    )
    assert [(a["result"], a["lease_epoch"]) for a in attempts] == [("succeeded", 1)]
    # Evidence came from the run's own tenant only, marked untrusted.
    steps = await db.fetch(
        "SELECT kind FROM planner.steps WHERE run_id = $1 ORDER BY seq", result.run_id
    )
    assert [s["kind"] for s in steps] == ["decision", "observation", "decision"]
    evidence = await run_evidence(db, host.stack, result.run_id or "")
    assert evidence and all(e["trust"] == "untrusted" for e in evidence)
    assert {e["document_id"] for e in evidence} <= {"customer-ACME-42", "call-2026-11-28"}

    await anyio.sleep(0.5)  # a second result, if one were coming, would be published by now
    assert len(await host.results(request.request_id)) == 1


@pytest.mark.parametrize("with_msg_id", [True, False], ids=["same-msg-id", "no-msg-id"])
async def test_the_same_request_twice_is_one_run_and_one_note(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, with_msg_id: bool
) -> None:
    request = host.request()
    msg_id = request.request_id if with_msg_id else None
    await host.publish(request, msg_id=msg_id)
    await host.publish(request, msg_id=msg_id)

    result = await host.wait_result(request.request_id)
    await anyio.sleep(1.0)  # let any duplicate travel the whole path

    assert result.status == "succeeded"
    assert len(await _run_rows(db, request.request_id)) == 1
    commands = await _commands(db, result.run_id)
    assert len(commands) == 1
    assert len(notes_for(crm, f"acme:{commands[0]['operation_id']}")) == 1
    assert len(await host.results(request.request_id)) == 1


def _too_large(host: Host) -> bytes:
    request = host.request()
    encoded = msgspec.json.encode(request)
    return encoded[:-1] + b', "padding": "' + b"x" * (70 * 1024) + b'"}'


def _unknown_field(host: Host) -> bytes:
    body = msgspec.to_builtins(host.request())
    body["tenant"] = "globex"  # tenant may only come from the token
    return msgspec.json.encode(body)


BAD_INPUTS = {
    "bad-signature": ("BAD_SIGNATURE", lambda h: h.request(token=_forged(h))),
    "expired": (
        "TOKEN_EXPIRED",
        lambda h: h.request(token=h.stack.token("acme", "alice@acme.example", ttl_s=-60)),
    ),
    "other-tenant": ("WRONG_TENANT", lambda h: h.request(token=_other_tenant(h))),
    "unknown-field": ("INVALID_REQUEST", _unknown_field),
    "oversized": ("TOO_LARGE", _too_large),
}


def _forged(h: Host) -> str:
    """A token claiming tenant acme, signed with globex's key."""
    from writ.stack import mint_token

    return mint_token(
        h.stack.host_key("globex"),
        issuer=h.stack.issuer("acme"),
        tenant="acme",
        principal="mallory@globex.example",
    )


def _other_tenant(h: Host) -> str:
    """A token validly signed by acme's key but issued for tenant globex."""
    from writ.stack import mint_token

    return mint_token(
        h.stack.host_key("acme"),
        issuer=h.stack.issuer("acme"),
        tenant="globex",
        principal="alice@acme.example",
    )


@pytest.mark.parametrize("case", list(BAD_INPUTS))
async def test_bad_input_gets_its_error_and_changes_nothing(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, case: str
) -> None:
    code, make = BAD_INPUTS[case]
    body = make(host)
    if isinstance(body, RunRequest):
        request_id, data = body.request_id, msgspec.json.encode(body)
    else:
        request_id, data = msgspec.json.decode(body)["request_id"], body
    runs_before = await db.fetchval("SELECT count(*) FROM planner.runs")
    commands_before = await db.fetchval("SELECT count(*) FROM admission.commands")
    notes_before = len(notes_for(crm))

    await host.publish(data, msg_id=request_id)
    result = await host.wait_result(request_id)

    assert result.status == "rejected"
    assert result.error is not None and result.error.code == code, result.error
    assert result.run_id is None
    await anyio.sleep(0.5)
    assert await db.fetchval("SELECT count(*) FROM planner.runs") == runs_before
    assert await db.fetchval("SELECT count(*) FROM admission.commands") == commands_before
    assert len(notes_for(crm)) == notes_before
    assert len(await host.results(request_id)) == 1
