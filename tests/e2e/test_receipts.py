"""Approval receipts through the real processes: admission signs each command's authority, the
dispatcher forwards it, and the CRM, the payment provider and the host check it.

The attacker here holds the dispatcher's provider credentials and has seen a genuine receipt
and its body: every fake refuses a missing, forged, expired or mismatched receipt and one
replayed under another operation id, and takes the approved bytes once.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from actions import ACTIONS
from libs.db import role_name, with_database
from libs.journal import DataKeys, Journal, SigningKey, read_entries
from schemas.base import Family
from schemas.host import CommandResult
from services.admission.receipts import ReceiptSigner
from services.dispatcher.store import DispatcherStore
from tests.e2e.conftest import Host, notes_for
from tests.e2e.test_boundaries import _connect_as
from writ import mcp, receipt_keys
from writ.stack import Stack
from writ_client.receipts import KeySet, verify

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


async def _receipt(db: asyncpg.Connection, operation_id: str) -> asyncpg.Record:
    with anyio.fail_after(30):
        while True:
            row = await db.fetchrow(
                "SELECT a.kid, a.token, c.action, c.arguments::text AS arguments "
                "FROM admission.authorizations a JOIN admission.commands c "
                "USING (tenant, operation_id) WHERE a.operation_id = $1",
                uuid.UUID(operation_id),
            )
            if row is not None:
                return row
            await anyio.sleep(0.05)


def _body(row: asyncpg.Record) -> bytes:
    """The exact bytes the dispatcher sent: the provider request admission signed."""
    contract = ACTIONS[row["action"]]
    call = contract.provider_call(contract.decode_arguments(json.loads(row["arguments"])))
    return call.body_bytes()


async def _settled(host: Host, request_id: str, timeout: float = 90) -> CommandResult:
    with anyio.fail_after(timeout):
        while True:
            for r in await host.results(request_id):
                if isinstance(r, CommandResult) and r.status not in (
                    "pending",
                    "dispatching",
                    "awaiting_human",
                ):
                    return r
            await anyio.sleep(0.2)


def _bad_receipts(stack: Stack, genuine: str) -> dict[str, str]:
    """A receipt signed by another key under Writ's key id, and one Writ's own key signed that
    has expired (as an operator holding that key could make)."""
    header, payload, _ = genuine.split(".")
    impostor = SigningKey.generate(_claims_kid(genuine))
    forged = f"{header}.{payload}." + (
        base64.urlsafe_b64encode(impostor.sign(f"{header}.{payload}".encode()))
        .rstrip(b"=")
        .decode()
    )
    real = ReceiptSigner.from_file(str(stack.secrets / receipt_keys.SIGNING))
    expired = real.sign({**_claims(genuine), "exp": int(time.time()) - 1})
    return {"forged": forged, "expired": expired}


def _claims_kid(token: str) -> str:
    header = token.split(".")[0]
    return str(json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))["kid"])


def _attack(
    stack: Stack,
    send: Callable[[str | None, bytes, str], httpx.Response],
    row: asyncpg.Record,
    operation_id: str,
    effects: Callable[[], int],
    *,
    again: int,
) -> dict[str, tuple[int, str | None]]:
    """Each bad receipt kind sent with the dispatcher's credential, then the approved bytes
    again under their own key; the status and reason of each. `effects` counts every effect
    the system holds (under any key): none of these adds one."""
    before = effects()
    genuine, body = row["token"], _body(row)
    own_key, other_key = f"acme:{operation_id}", f"acme:{uuid.uuid4()}"
    bad = _bad_receipts(stack, genuine)
    tried = {
        "missing": send(None, body, other_key),
        "forged": send(bad["forged"], body, own_key),
        "expired": send(bad["expired"], body, own_key),
        "body_mismatch": send(genuine, body.replace(b"7781", b"9999"), own_key),
        "operation_mismatch": send(genuine, body, other_key),
        "again": send(genuine, body, own_key),
    }
    assert effects() == before, "a refused or replayed write had an effect"
    answers = {}
    for kind, response in tried.items():
        reason = response.json().get("reason") if response.status_code == 403 else None
        answers[kind] = (response.status_code, reason)
    assert answers["again"][0] == again, tried["again"].text
    return answers


REFUSED = {
    "missing": (403, "missing"),
    "forged": (403, "forged"),
    "expired": (403, "expired"),
    "body_mismatch": (403, "body_mismatch"),
    "operation_mismatch": (403, "operation_mismatch"),
}


def _sender(
    base_url: str, path: str, token: str, key_header: str
) -> Callable[[str | None, bytes, str], httpx.Response]:
    def send(receipt: str | None, body: bytes, key: str) -> httpx.Response:
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            key_header: key,
        }
        if receipt is not None:
            headers["Writ-Authorization"] = receipt
        return httpx.post(base_url + path, content=body, headers=headers, timeout=10)

    return send


def _token(stack: Stack, name: str) -> str:
    return (stack.secrets / f"{name}.token").read_text().strip()


async def test_the_crm_takes_the_approved_bytes_once_and_refuses_each_bad_receipt(
    stack: Stack, host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    command = host.command(
        arguments={"customer_id": "ACME-42", "body": "Called back about order 7781."}
    )
    await host.submit(command)
    result = await host.wait_command(command.request_id, timeout=60)
    assert result.status == "succeeded", result
    operation_id = result.operation_id or ""
    row = await _receipt(db, operation_id)
    claims = _claims(row["token"])
    assert claims["authorized_by"]["kind"] == "policy"
    assert (claims["tenant"], claims["operation_id"]) == ("acme", operation_id)

    call = json.loads(_body(row))
    assert call == {"body": "Called back about order 7781."}
    answers = _attack(
        stack,
        _sender(
            stack.crm_url, "/v1/customers/ACME-42/notes", _token(stack, "crm"), "Idempotency-Key"
        ),
        row,
        operation_id,
        lambda: len(notes_for(crm)),
        again=200,  # the CRM dedupes its key: the first answer again, no second note
    )
    assert {k: v for k, v in answers.items() if k != "again"} == REFUSED


async def test_a_command_allowed_by_decide_has_its_receipt_from_its_admission(
    host: Host, db: asyncpg.Connection
) -> None:
    """Signed and stored in the statement that admitted it: the journal's `command.admitted`
    and `command.authorized` rows of the command share one transaction, so the relay has no
    receipt left to sign before it publishes."""
    command = host.command(arguments={"customer_id": "ACME-42", "body": "Receipt at admission."})
    await host.submit(command)
    result = await host.wait_command(command.request_id, timeout=60)
    assert result.status == "succeeded", result
    operation_id = result.operation_id or ""
    claims = _claims((await _receipt(db, operation_id))["token"])
    # Allowed without a person: the receipt names the `decide` line and policy version that
    # allowed it, as the command was frozen with them.
    frozen = await db.fetchrow(
        "SELECT decision_id::text AS decision_id, decision_line, policy_version "
        "FROM admission.commands WHERE operation_id = $1",
        uuid.UUID(operation_id),
    )
    assert frozen is not None and frozen["decision_line"] is not None, frozen
    assert frozen["policy_version"], frozen
    assert claims["authorized_by"] == {
        "kind": "policy",
        "decision_id": frozen["decision_id"],
        "line": frozen["decision_line"],
        "policy_version": frozen["policy_version"],
    }
    rows = await db.fetch(
        "SELECT kind, xid::text AS xid FROM admission.journal "
        "WHERE tenant = 'acme' AND subject = $1 "
        "AND kind IN ('command.admitted', 'command.authorized')",
        operation_id,
    )
    xids = {r["kind"]: r["xid"] for r in rows}
    assert set(xids) == {"command.admitted", "command.authorized"}, rows
    assert xids["command.admitted"] == xids["command.authorized"]


async def test_a_receipt_names_alice_as_her_token_said_and_payments_take_it_once(
    stack: Stack, host: Host, db: asyncpg.Connection, payments: httpx.Client
) -> None:
    command = host.command(
        action="payment.charge.create",
        agent="billing-assistant",
        principal="bob@acme.example",
        arguments={
            "customer_id": "ACME-42",
            "amount_cents": 4900,
            "currency": "EUR",
            "description": "Expedited shipping for order 7781",
        },
    )
    await host.submit(command)
    asked = await host.wait_command(command.request_id, timeout=60)
    assert asked.status == "awaiting_human" and asked.proposal is not None, asked
    # Alice approves; the words of her answer name someone else, and count for nothing.
    approved = await host.wait_approval(
        await host.approve(
            asked.proposal.proposal_id,
            principal="alice@acme.example",
            reason="approved by mallory@acme.example on behalf of root",
        )
    )
    assert approved.status == "claimed", approved
    done = await _settled(host, command.request_id)
    assert (done.status, done.outcome) == ("succeeded", "succeeded"), done
    operation_id = done.operation_id or ""
    row = await _receipt(db, operation_id)

    # Verified with the keys the HTTP API publishes, as a system of record would.
    async with httpx.AsyncClient(timeout=10) as client:
        jwks = await client.get(f"{stack.api_url}/receipts/keys")
    assert jwks.status_code == 200, jwks.text
    receipt = verify(
        row["token"],
        _body(row),
        KeySet.from_jwks(jwks.json()),
        tenant="acme",
        operation_id=operation_id,
    )
    assert receipt.authorized_by.kind == "person"
    assert receipt.authorized_by.principal == "alice@acme.example"
    assert receipt.on_behalf_of == "bob@acme.example"
    assert (receipt.action, receipt.path) == ("payment.charge.create", "/v1/charges")

    def charges() -> int:
        return len(payments.get("/_control/charges").json())

    answers = _attack(
        stack,
        _sender(stack.payments_url, "/v1/charges", _token(stack, "payments"), "Reference"),
        row,
        operation_id,
        charges,
        again=403,  # this provider does not dedupe: a receipt used once is not paid twice
    )
    assert answers == {**REFUSED, "again": (403, "replayed")}


async def _classify(stack: Stack) -> None:
    listing = await mcp.list_server(stack.nats_url, "acme", "helpdesk", quiet=True)
    assert listing.ok, listing.error
    classes: tuple[tuple[str, Family], ...] = (
        ("ticket.get", "read"),
        ("customer.get", "read_personal"),
    )
    for tool, family in classes:
        answer = await mcp.classify(
            stack.nats_url, "acme", "helpdesk", tool, family, "ops@acme.example", quiet=True
        )
        assert answer.ok, answer.message


async def test_the_host_takes_the_approved_bytes_once_and_refuses_each_bad_receipt(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    async with httpx.AsyncClient(base_url=stack.host_url, timeout=10) as helpdesk:
        (await helpdesk.post("/_control/reset")).raise_for_status()
        await _classify(stack)
        command = host.command(
            action="host.ticket.comment.create",
            agent="helpdesk-assistant",
            arguments={"ticket_id": "T-1002", "body": "Parcel 7781 left the depot."},
        )
        await host.submit(command)
        result = await host.wait_command(command.request_id, timeout=60)
        assert result.status == "succeeded", result
        operation_id = result.operation_id or ""
        row = await _receipt(db, operation_id)

        async def comments() -> int:
            state = (await helpdesk.get("/_control/state")).json()
            return len(
                [c for c in state["comments"] if c["idempotency_key"] == f"acme:{operation_id}"]
            )

        assert await comments() == 1

        def every_comment() -> int:
            state = httpx.get(f"{stack.host_url}/_control/state", timeout=10).json()
            return len(state["comments"])

        answers = await anyio.to_thread.run_sync(
            lambda: _attack(
                stack,
                _sender(
                    stack.host_url,
                    "/api/v1/tickets/T-1002/comments",
                    _token(stack, "host-rest"),
                    "Idempotency-Key",
                ),
                row,
                operation_id,
                every_comment,
                again=201,  # the host replays its first answer for the key
            )
        )
        assert {k: v for k, v in answers.items() if k != "again"} == REFUSED
        assert await comments() == 1


async def test_the_dispatcher_forwards_receipts_but_cannot_make_one(stack: Stack) -> None:
    # No signing key in its environment (admission's alone), and no write on the receipts.
    assert not any("RECEIPT" in name for name in stack.service_env("dispatcher"))
    assert stack.service_env("admission")["WRIT_RECEIPT_SIGNING_KEY_FILE"]
    conn = await _connect_as(stack, "dispatcher")
    try:
        await conn.fetchval("SELECT count(*) FROM admission.authorizations")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(
                "INSERT INTO admission.authorizations (tenant, operation_id, kid, token, "
                "expires_at) VALUES ('acme', gen_random_uuid(), 'receipts-1', 'x', now())"
            )
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE admission.authorizations SET token = 'x'")
    finally:
        await conn.close()


async def test_the_sweeper_leaves_an_unpublished_command_to_the_relay_that_signs_it(
    stack: Stack, host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    stack.stop_process("dispatcher")
    try:
        command = host.command(arguments={"customer_id": "ACME-42", "body": "Swept late."})
        await host.submit(command)
        operation_id = await _command(db, command.operation_key)
        await _receipt(db, operation_id)
        op = uuid.UUID(operation_id)
        with anyio.fail_after(30):
            while await db.fetchval(
                "SELECT count(*) FROM admission.outbox WHERE operation_id = $1", op
            ):
                await anyio.sleep(0.1)
        await db.execute(
            "UPDATE admission.commands SET updated_at = now() - interval '1 hour' "
            "WHERE operation_id = $1",
            op,
        )
        password = (stack.secrets / "pg-dispatcher.password").read_text().strip()
        dsn = with_database(
            stack.admin_dsn, stack.database, user=role_name(stack.database, "dispatcher")
        )
        async with asyncpg.create_pool(dsn, password=password, min_size=1, max_size=1) as pool:
            store = DispatcherStore(pool)
            # Published (its receipt signed first) and long pending: the sweeper's to re-drive.
            stale = await store.stale(pending_grace_s=60)
            assert operation_id in {c.operation_id for c in stale}
            # Still owed by the relay (its outbox row back, the relay stopped): not yet.
            stack.stop_process("admission")
            try:
                await db.execute(
                    "INSERT INTO admission.outbox (tenant, operation_id) VALUES ('acme', $1)", op
                )
                stale = await store.stale(pending_grace_s=60)
                assert operation_id not in {c.operation_id for c in stale}
            finally:
                stack.start_services(("admission",))
                await stack.wait_ready(("admission",))
    finally:
        stack.start_services(("dispatcher",))
        await stack.wait_ready(("dispatcher",))
    done = await host.wait_command(command.request_id, timeout=90)
    assert done.status == "succeeded", done
    assert len(notes_for(crm, f"acme:{operation_id}")) == 1


async def test_rotation_with_overlap_keeps_in_flight_commands_valid(
    stack: Stack, host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    stack.stop_process("dispatcher")
    try:
        before = host.command(arguments={"customer_id": "ACME-42", "body": "Signed before."})
        await host.submit(before)
        first = await _command(db, before.operation_key)
        old = (await _receipt(db, first))["kid"]

        new = receipt_keys.rotate(stack.secrets, stack.config)
        stack.stop_process("admission")
        stack.start_services(("admission",))
        await stack.wait_ready(("admission",))
        after = host.command(arguments={"customer_id": "ACME-42", "body": "Signed after."})
        await host.submit(after)
        second = await _command(db, after.operation_key)
        assert (await _receipt(db, second))["kid"] == new != old

        async with httpx.AsyncClient(timeout=10) as client:
            listed = (await client.get(f"{stack.api_url}/receipts/keys")).json()
        assert {k["kid"] for k in listed["keys"]} >= {old, new}
    finally:
        stack.start_services(("dispatcher",))
        await stack.wait_ready(("dispatcher",))

    # The command signed with the old key was in flight across the rotation: both are taken.
    for submitted in (before, after):
        done = await host.wait_command(submitted.request_id, timeout=90)
        assert done.status == "succeeded", done
    # Its receipt may be sent again until it expires: the old key is not retired before that.
    with anyio.fail_after(60):
        early = await anyio.run_process(
            [
                sys.executable,
                "-m",
                "writ.cli",
                "receipts",
                "retire",
                old,
                "--home",
                str(stack.home),
            ],
            check=False,
        )
    refused = early.stderr.decode()
    assert early.returncode != 0, early.stdout
    assert f"receipt(s) signed by {old} are valid until" in refused, refused
    listed = (stack.config / receipt_keys.PUBLIC).read_text()
    assert old in {k["kid"] for k in json.loads(listed)["keys"]}
    assert len(notes_for(crm, f"acme:{first}")) == 1
    assert len(notes_for(crm, f"acme:{second}")) == 1
    # The journal records which key signed each receipt: each entry, opened with admission's
    # data key file once sealed into the chain, names its receipt's key.
    assert await _journaled_kids(stack, db, [first, second]) == {first: old, second: new}


async def _journaled_kids(
    stack: Stack, db: asyncpg.Connection, operation_ids: list[str]
) -> dict[str, str]:
    """The key id each command's sealed `command.authorized` journal entry names."""
    keys = DataKeys.from_json((stack.secrets / "journal-admission-data.json").read_text())
    journal = Journal(service="admission", keys=keys)
    kids: dict[str, str] = {}
    with anyio.fail_after(30):
        while len(kids) < len(operation_ids):
            for operation_id in operation_ids:
                for _, row, payload in await read_entries(
                    db, journal, tenant="acme", subject=operation_id
                ):
                    if row["kind"] == "command.authorized":
                        kids[operation_id] = json.loads(payload)["kid"]
            await anyio.sleep(0.1)
    return kids


async def _command(db: asyncpg.Connection, operation_key: str) -> str:
    with anyio.fail_after(30):
        while True:
            found = await db.fetchval(
                "SELECT operation_id::text FROM admission.commands WHERE operation_key = $1",
                operation_key,
            )
            if found is not None:
                return str(found)
            await anyio.sleep(0.05)
