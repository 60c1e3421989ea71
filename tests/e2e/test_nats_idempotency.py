"""A request id over NATS answers again only the principal who first used it, as an
Idempotency-Key does over HTTP: another principal of the tenant re-sending it gets `CONFLICT`,
which says nothing of the first request, and nothing is handed on for it (no second run, no
registration naming the other principal, no replay of a command's outcome)."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any, TypeVar

import anyio
import asyncpg
import httpx
import msgspec
import pytest

from libs.provision import IDEMPOTENCY_BUCKET, OWNERS_BUCKET
from schemas import subjects
from schemas.governance import RegisterRun
from schemas.host import CommandResult, RunResult
from tests.e2e.conftest import Host, run_input
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

BOB = "bob@acme.example"
T = TypeVar("T", RunResult, CommandResult)


async def _publish_unmarked(host: Host, subject: str, message: msgspec.Struct) -> None:
    """Publish as acme's host without `Nats-Msg-Id` (it is optional), so the stream stores
    the re-send rather than dropping it as a duplicate within its window."""
    js = await host.tenant_js("acme")
    ack = await js.publish(subject, msgspec.json.encode(message))
    assert not ack.duplicate


async def _rejection(host: Host, request_id: str, kind: type[T], status: str = "rejected") -> T:
    with anyio.fail_after(60):
        while True:
            for result in await host.results(request_id):
                if isinstance(result, kind) and getattr(result, "status", "") == status:
                    return result
            await anyio.sleep(0.2)


async def test_another_principal_reusing_a_request_id_is_a_conflict_and_starts_nothing(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    first = host.request(text="Note the delayed shipment call for alice")
    await host.publish(first, msg_id=first.request_id)
    done = await host.wait_result(first.request_id, status="succeeded", timeout=60)
    assert done.run_id is not None

    registered: list[RegisterRun] = []

    async def seen(msg: Any) -> None:
        run = msgspec.json.decode(msg.data, type=RegisterRun)
        if run.run_id == done.run_id or run.principal == BOB:
            registered.append(run)

    watch = await host.nc.subscribe(subjects.REGISTER_RUN, cb=seen)
    try:
        again = host.request(
            principal=BOB, request_id=first.request_id, text="Bob's words, not alice's"
        )
        await _publish_unmarked(host, subjects.request("acme"), again)
        refused = await _rejection(host, first.request_id, RunResult)
        # The same id over HTTP, as bob: the same answer.
        with httpx.Client(base_url=stack.api_url, timeout=40) as api:
            over_http = api.post(
                "/runs",
                json={"agent": "crm-assistant", "input": "Bob's words, not alice's"},
                headers={
                    "Authorization": f"Bearer {stack.token('acme', BOB)}",
                    "Idempotency-Key": first.request_id,
                },
            )
        await anyio.sleep(1)  # a registration sent for bob's message would have come by now
        for_bob = list(registered)
        # Alice herself re-sending the id goes on as before (registered again, as alice).
        await _publish_unmarked(host, subjects.request("acme"), first)
        with anyio.fail_after(30):
            while not registered[len(for_bob) :]:
                await anyio.sleep(0.1)
    finally:
        await watch.unsubscribe()

    assert refused.error is not None and refused.error.code == "CONFLICT"
    assert refused.run_id is None and refused.actions == []
    assert done.run_id not in refused.error.message and "alice" not in refused.error.message
    assert (over_http.status_code, over_http.json()["code"]) == (409, "CONFLICT"), over_http.text
    assert done.run_id not in over_http.text
    assert for_bob == []
    assert [(r.run_id, r.principal) for r in registered] == [(done.run_id, "alice@acme.example")]
    rows = await db.fetch("SELECT run_id FROM planner.runs WHERE request_id = $1", first.request_id)
    assert [(r["run_id"], await run_input(db, stack, r["run_id"])) for r in rows] == [
        (done.run_id, first.input)
    ]
    recorded = await db.fetch(
        "SELECT principal FROM governance.runs WHERE run_id = $1", done.run_id
    )
    assert [r["principal"] for r in recorded] == ["alice@acme.example"]


async def test_another_principal_reusing_a_command_id_or_key_is_a_conflict(
    host: Host, db: asyncpg.Connection
) -> None:
    first = host.command()
    await host.submit(first)
    done = await host.wait_command(first.request_id)
    assert done.status == "succeeded" and done.operation_id is not None

    same_id = host.command(principal=BOB, request_id=first.request_id)
    await _publish_unmarked(host, subjects.command_request("acme"), same_id)
    same_key = host.command(principal=BOB, operation_key=first.operation_key)
    await host.submit(same_key)

    # A command's key conflict is the command contract's `conflict`, as any change it binds.
    for refused in (
        await _rejection(host, first.request_id, CommandResult, "conflict"),
        await _rejection(host, same_key.request_id, CommandResult, "conflict"),
    ):
        assert refused.error is not None and refused.error.code == "CONFLICT"
        assert refused.operation_id is None and refused.receipt is None
        assert done.operation_id not in refused.error.message
    assert [r for r in await host.results(same_key.request_id) if r.status != "conflict"] == []
    rows = await db.fetch(
        "SELECT principal FROM admission.commands WHERE operation_key = $1", first.operation_key
    )
    assert [r["principal"] for r in rows] == ["alice@acme.example"]


async def test_a_request_id_stays_its_first_principals_once_the_keys_day_is_over(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    """The Idempotency-Key bucket forgets every entry after 24 hours (purged here, as its
    TTL would): who first used an id is kept apart, with no expiry, so bob's reuse of
    alice's id a day later is still a conflict on both doors, and reaches nothing of hers.
    An owner an earlier version kept in the Idempotency-Key bucket counts as well."""
    owners = await host.js.key_value(OWNERS_BUCKET.bucket)
    assert (await owners.status()).ttl in (None, 0)  # kept as long as the runs it guards

    first = host.request(text="Note the delayed shipment call for alice")
    await host.publish(first, msg_id=first.request_id)
    done = await host.wait_result(first.request_id, status="succeeded", timeout=60)
    assert done.run_id is not None
    await host.js.purge_stream(f"KV_{IDEMPOTENCY_BUCKET.bucket}")  # the day is over

    # As an earlier version kept an owner: in the Idempotency-Key bucket alone.
    kept = f"kept-{uuid.uuid4().hex[:12]}"
    legacy = await host.js.key_value(IDEMPOTENCY_BUCKET.bucket)
    carol = b"carol@acme.example"
    await legacy.put(f"acme.id.{hashlib.sha256(kept.encode()).hexdigest()[:40]}", carol)

    with httpx.Client(base_url=stack.api_url, timeout=40) as api:
        answers = [
            api.post(
                "/runs",
                json={"agent": "crm-assistant", "input": "Bob's words, not alice's"},
                headers={
                    "Authorization": f"Bearer {stack.token('acme', BOB)}",
                    "Idempotency-Key": request_id,
                },
            )
            for request_id in (first.request_id, kept)
        ]
    for answer in answers:
        assert (answer.status_code, answer.json()["code"]) == (409, "CONFLICT"), answer.text
        assert done.run_id not in answer.text
    again = host.request(principal=BOB, request_id=first.request_id, text="Bob's words")
    await _publish_unmarked(host, subjects.request("acme"), again)
    refused = await _rejection(host, first.request_id, RunResult)
    assert refused.error is not None and refused.error.code == "CONFLICT"
    assert refused.run_id is None and refused.actions == []

    rows = await db.fetch(
        "SELECT run_id, principal FROM planner.runs WHERE request_id = ANY($1::text[])",
        [first.request_id, kept],
    )
    assert [(r["run_id"], r["principal"]) for r in rows] == [(done.run_id, "alice@acme.example")]
    # The earlier owner is the owner from now on, in the bucket that keeps owners.
    entry = await owners.get(f"acme.id.{hashlib.sha256(kept.encode()).hexdigest()[:40]}")
    assert entry.value == carol
