"""The fault suite (the reference architecture's fault list): break Writ at its seams, for real, and
check that every accepted request still ends in one recorded outcome with at most the effects it may
have.

This module runs its own deployment — its own nats-server and PostgreSQL, which it kills and
restarts — with short leases so takeovers happen within seconds. Processes crash at named
points (libs/faults.py) with exit status 137, as if killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import msgspec
import nats
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from libs.faults import CRASH_STATUS
from schemas import subjects
from schemas.admission import DispatchCommand
from schemas.dispatcher import Reconcile, Reconciled
from schemas.host import CommandResult
from tests.e2e.conftest import Host, recorded_spans
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

LEASE_S = 3.0
DUPLICATE_WINDOW_S = 2.0


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="writ-faults-") as home:
        faults = Path(home) / "faults"
        faults.write_text("")
        deployment = Stack(
            Path(home),
            database="faults",
            durable_pg=False,
            extra_env={
                "*": {
                    "WRIT_FAULTS_FILE": str(faults),
                    "WRIT_DUPLICATE_WINDOW_S": str(DUPLICATE_WINDOW_S),
                    "WRIT_DRAIN_TIMEOUT_S": "2",
                    "WRIT_OTEL_SPANS_FILE": str(Path(home) / "spans"),
                },
                "dispatcher": {
                    "WRIT_LEASE_S": str(LEASE_S),
                    "WRIT_SWEEP_EVERY_S": "1",
                    "WRIT_PENDING_GRACE_S": "5",
                    "WRIT_CALL_TIMEOUT_S": "1.5",
                },
            },
        )
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()
            if os.environ.get("WRIT_TEST_KEEP_LOGS"):  # to read a failure's service logs
                keep = Path(os.environ["WRIT_TEST_KEEP_LOGS"])
                shutil.copytree(deployment.logs, keep, dirs_exist_ok=True)
                for server in ("nats/nats.log", "postgres/postgres.log"):
                    if (deployment.home / server).exists():
                        shutil.copy(deployment.home / server, keep)


class Faults:
    """Arms crash points and brings crashed processes back."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.file = Path(stack.extra_env["*"]["WRIT_FAULTS_FILE"])

    def arm(self, point: str) -> None:
        self.file.write_text(point)

    async def crashed(self, name: str, timeout: float = 20) -> None:
        proc = self.stack.procs[name]
        with anyio.fail_after(timeout):
            while proc.poll() is None:
                await anyio.sleep(0.05)
        assert proc.returncode == CRASH_STATUS, self.stack.log_tail(name)
        assert self.file.read_text().strip() == "", "the crash point was not taken"
        del self.stack.procs[name]

    async def restart(self, name: str, service: str | None = None) -> None:
        self.stack.stop_process(name)
        self.stack.start_instance(service or name, name)
        await self.stack.wait_ready((service or name,))


@pytest.fixture
def payments(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.payments_url, timeout=5) as client:
        yield client
        client.post("/_control/mode", json={"mode": "normal"})


@pytest.fixture
def faults(stack: Stack) -> Iterator[Faults]:
    f = Faults(stack)
    yield f
    f.file.write_text("")


def notes(crm: httpx.Client, operation_id: str | None) -> list[dict[str, Any]]:
    assert operation_id is not None, "the command was never admitted"
    return [
        n
        for n in crm.get("/_control/notes").json()
        if n["idempotency_key"] == f"acme:{operation_id}"
    ]


def charges(payments: httpx.Client, operation_id: str | None) -> list[dict[str, Any]]:
    assert operation_id is not None, "the command was never admitted"
    return [
        c
        for c in payments.get("/_control/charges").json()
        if c["reference"] == f"acme:{operation_id}"
    ]


async def command_row(
    db: asyncpg.Connection, operation_key: str, timeout: float = 20
) -> asyncpg.Record:
    with anyio.fail_after(timeout):
        while True:
            row = await db.fetchrow(
                "SELECT * FROM admission.commands WHERE operation_key = $1", operation_key
            )
            if row is not None:
                return row
            await anyio.sleep(0.05)


async def until_state(
    db: asyncpg.Connection, operation_key: str, state: str, timeout: float = 30
) -> None:
    with anyio.fail_after(timeout):
        while (await command_row(db, operation_key))["state"] != state:
            await anyio.sleep(0.05)


async def attempts(db: asyncpg.Connection, operation_id: Any) -> list[tuple[int, str | None]]:
    rows = await db.fetch(
        "SELECT lease_epoch, result FROM dispatcher.attempts "
        "WHERE operation_id = $1 ORDER BY attempt_id",
        operation_id,
    )
    return [(r["lease_epoch"], r["result"]) for r in rows]


async def submit_approved(host: Host, command: Any) -> None:
    """Submit a charge and approve it: it moves money, so no grant covers it and a person
    (not its requester) approves it every time."""
    await host.submit(command)
    waiting = await host.wait_command(command.request_id)
    assert waiting.status == "awaiting_human" and waiting.proposal is not None, waiting
    answered = await host.wait_approval(await host.approve(waiting.proposal.proposal_id))
    assert answered.status == "claimed", answered


async def charge_result(host: Host, request_id: str) -> Any:
    """The approved charge's result: the first after it stopped waiting for a person."""
    with anyio.fail_after(60):
        while True:
            for result in await host.results(request_id):
                if getattr(result, "status", None) not in (
                    None,
                    "pending",
                    "dispatching",
                    "awaiting_human",
                ) and hasattr(result, "operation_key"):
                    return result
            await anyio.sleep(0.1)


def charge(host: Host) -> Any:
    return host.command(
        action="payment.charge.create",
        arguments={
            "customer_id": "ACME-42",
            "amount_cents": 12_500,
            "currency": "EUR",
            "description": "Expedited shipping for order 7781",
        },
    )


# -- crashes at the admission and relay boundaries -------------------------------------------


async def test_crash_before_the_admission_commit_admits_nothing_until_the_retry(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    faults.arm("admission.before_commit")
    command = host.command()
    await host.submit(command)
    await faults.crashed("admission")
    assert (
        await db.fetchval(
            "SELECT count(*) FROM admission.commands WHERE operation_key = $1",
            command.operation_key,
        )
        == 0
    )

    await faults.restart("admission")
    result = await host.wait_command(command.request_id)

    assert result.status == "succeeded"
    assert len(notes(crm, result.operation_id)) == 1


async def test_crash_after_commit_before_publish_keeps_the_obligation(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    faults.arm("relay.before_publish")
    command = host.command()
    await host.submit(command)
    await faults.crashed("admission")
    row = await command_row(db, command.operation_key)
    assert row["state"] == "pending"
    assert (
        await db.fetchval(
            "SELECT count(*) FROM admission.outbox WHERE operation_id = $1", row["operation_id"]
        )
        == 1
    )

    await faults.restart("admission")
    result = await host.wait_command(command.request_id)

    assert result.status == "succeeded"
    assert len(notes(crm, result.operation_id)) == 1
    assert (
        await db.fetchval(
            "SELECT count(*) FROM admission.outbox WHERE operation_id = $1", row["operation_id"]
        )
        == 0
    )


async def test_crash_after_publish_before_the_outbox_row_is_cleared_dispatches_once(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    faults.arm("relay.after_publish")
    command = host.command()
    await host.submit(command)
    await faults.crashed("admission")
    await until_state(db, command.operation_key, "succeeded")  # the published message lived
    await faults.restart("admission")  # ... and the relay publishes the row again
    result = await host.wait_command(command.request_id)
    await anyio.sleep(1.0)

    row = await command_row(db, command.operation_key)
    assert result.status == "succeeded"
    assert len(notes(crm, result.operation_id)) == 1
    assert await attempts(db, row["operation_id"]) == [(1, "succeeded")]


async def test_relay_down_longer_than_the_duplicate_window_still_makes_one_effect(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    faults.arm("relay.after_publish")
    command = host.command()
    await host.submit(command)
    await faults.crashed("admission")
    await until_state(db, command.operation_key, "succeeded")
    await anyio.sleep(DUPLICATE_WINDOW_S + 1.5)  # JetStream has forgotten the Nats-Msg-Id
    await faults.restart("admission")
    result = await host.wait_command(command.request_id)

    deliveries = await _dispatch_messages(host, result.operation_id, expect=2)
    row = await command_row(db, command.operation_key)
    assert deliveries == 2  # the duplicate did get through the bus ...
    await anyio.sleep(1.0)
    assert len(notes(crm, result.operation_id)) == 1  # ... and the registry stopped it
    assert await attempts(db, row["operation_id"]) == [(1, "succeeded")]


async def _dispatch_messages(host: Host, operation_id: str | None, *, expect: int) -> int:
    assert operation_id is not None, "the command was never admitted"
    with anyio.fail_after(20):
        while True:
            count = 0
            sub = await host.js.subscribe(
                subjects.command("acme"),
                ordered_consumer=True,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
            )
            try:
                while True:
                    try:
                        msg = await sub.next_msg(timeout=0.5)
                    except nats.errors.TimeoutError:
                        break
                    body = msgspec.json.decode(msg.data, type=DispatchCommand)
                    count += body.operation_id == operation_id
                    if msg.metadata.num_pending == 0:
                        break
            finally:
                await sub.unsubscribe()
            if count >= expect:
                return count
            await anyio.sleep(0.2)


# -- crashes at the dispatcher's boundaries --------------------------------------------------


async def test_crash_after_publish_before_dispatch(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    faults.arm("dispatcher.before_claim")
    command = host.command()
    await host.submit(command)
    await faults.crashed("dispatcher")
    row = await command_row(db, command.operation_key)
    assert row["state"] == "pending" and notes(crm, str(row["operation_id"])) == []

    await faults.restart("dispatcher")
    result = await host.wait_command(command.request_id)

    assert result.status == "succeeded"
    assert len(notes(crm, result.operation_id)) == 1
    assert await attempts(db, row["operation_id"]) == [(1, "succeeded")]


async def test_crash_after_the_remote_write_replays_the_key_at_an_idempotent_provider(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    faults.arm("dispatcher.after_remote_write")
    command = host.command()
    await host.submit(command)
    await faults.crashed("dispatcher")
    row = await command_row(db, command.operation_key)
    operation_id = str(row["operation_id"])
    assert row["state"] == "dispatching"
    assert len(notes(crm, operation_id)) == 1  # the CRM acted; Writ did not record it

    await faults.restart("dispatcher")
    result = await host.wait_command(command.request_id)

    assert result.status == "succeeded"
    written = notes(crm, operation_id)
    assert len(written) == 1 and result.receipt == written[0]["note_id"]
    assert await attempts(db, row["operation_id"]) == [(1, None), (2, "succeeded")]
    # The new holder's dispatch span links to the crashed attempt's, whatever trace it was in.
    first = await db.fetchval(
        "SELECT traceparent FROM dispatcher.attempts WHERE operation_id = $1 AND lease_epoch = 1",
        row["operation_id"],
    )
    _, trace_id, span_id, _ = first.split("-")
    with anyio.fail_after(10):
        while not (
            linked := [
                s
                for s in recorded_spans(host.stack)
                if s["name"] in ("dispatch", "dispatch (re-driven)")
                and {
                    "trace_id": trace_id,
                    "span_id": span_id,
                    "attributes": {"writ.link": "earlier attempt"},
                }
                in s["links"]
            ]
        ):
            await anyio.sleep(0.1)
    assert linked[0]["attributes"]["writ.operation_id"] == operation_id


async def test_a_batch_crashed_after_its_remote_writes_replays_each_key_once(
    stack: Stack, host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    """Commands waiting in the stream are fetched as one batch: claimed together, their
    intents recorded together before any connector call, called, then the process dies before
    any outcome is recorded. The next holder replays each key: one note per command."""
    stack.stop_process("dispatcher")
    commands = [host.command() for _ in range(5)]
    for command in commands:
        await host.submit(command)
    rows = [await command_row(db, c.operation_key) for c in commands]
    with anyio.fail_after(20):  # relayed: all five wait in the stream for the dispatcher
        while await db.fetchval(
            "SELECT count(*) FROM admission.outbox WHERE operation_id = ANY($1::uuid[])",
            [r["operation_id"] for r in rows],
        ):
            await anyio.sleep(0.05)
    faults.arm("dispatcher.after_remote_write")
    stack.start_instance("dispatcher", "dispatcher")
    await faults.crashed("dispatcher")

    # The crash came after the whole batch's calls: every command acted once at the CRM and
    # has its intent, under its first lease, and none has an outcome.
    for row in rows:
        assert (await command_row(db, str(row["operation_key"])))["state"] == "dispatching"
        assert len(notes(crm, str(row["operation_id"]))) == 1
        assert await attempts(db, row["operation_id"]) == [(1, None)]

    await faults.restart("dispatcher")
    results = [await host.wait_command(c.request_id) for c in commands]
    assert {r.status for r in results} == {"succeeded"}
    for row, result in zip(rows, results, strict=True):
        written = notes(crm, str(row["operation_id"]))
        assert len(written) == 1 and result.receipt == written[0]["note_id"]
        assert await attempts(db, row["operation_id"]) == [(1, None), (2, "succeeded")]


async def test_crash_after_the_remote_write_at_a_provider_that_cannot_tell_ends_unknown(
    host: Host, db: asyncpg.Connection, payments: httpx.Client, faults: Faults
) -> None:
    faults.arm("dispatcher.after_remote_write")
    command = charge(host)
    await submit_approved(host, command)
    await faults.crashed("dispatcher")
    await faults.restart("dispatcher")
    result = await charge_result(host, command.request_id)

    assert result.status == "unknown"  # never an invented success
    assert len(charges(payments, result.operation_id)) == 1
    row = await command_row(db, command.operation_key)
    assert row["state"] == "unknown" and row["receipt"] is None

    # An operator reconciles it with the provider's evidence; no new key is ever made.
    assert result.operation_id is not None
    listed = _writ(host.stack, "reconcile", "list")
    assert listed.returncode == 0 and result.operation_id in listed.stdout
    charge_id = charges(payments, result.operation_id)[0]["charge_id"]
    resolved = _writ(
        host.stack,
        "reconcile",
        "resolve",
        result.operation_id,
        "--state",
        "succeeded",
        "--receipt",
        charge_id,
        "--evidence",
        f"provider dashboard shows {charge_id} captured",
        "--by",
        "ops@acme",
    )
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    row = await command_row(db, command.operation_key)
    assert (row["state"], row["receipt"]) == ("succeeded", charge_id)
    evidence = await db.fetchrow(
        "SELECT * FROM admission.reconciliations WHERE operation_id = $1", row["operation_id"]
    )
    assert evidence["resolved_by"] == "ops@acme" and charge_id in evidence["evidence"]
    again = await _request(
        host,
        subjects.RECONCILE,
        Reconcile(
            tenant="acme",
            operation_id=result.operation_id,
            state="failed",
            evidence="second thoughts",
            resolved_by="ops@acme",
        ),
        Reconciled,
    )
    assert not again.ok  # unknown is left once; a reconciled command stays reconciled
    assert result.operation_id not in _writ(host.stack, "reconcile", "list").stdout
    assert len(charges(payments, result.operation_id)) == 1
    # The host hears the reconciled outcome too.
    with anyio.fail_after(20):
        while not any(
            r.status == "succeeded"
            for r in await host.results(command.request_id)
            if isinstance(r, CommandResult)
        ):
            await anyio.sleep(0.1)


def _writ(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "writ.cli", args[0], "--nats-url", stack.nats_url, *args[1:]],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


async def _request(host: Host, subject: str, message: msgspec.Struct, answer: type) -> Any:
    reply = await host.nc.request(subject, msgspec.json.encode(message), timeout=5)
    return msgspec.json.decode(reply.data, type=answer)


async def test_a_queryable_provider_is_asked_instead_of_charged_twice(
    stack: Stack, host: Host, db: asyncpg.Connection, payments: httpx.Client, faults: Faults
) -> None:
    stack.extra_env["dispatcher"]["WRIT_PAYMENTS_QUERYABLE"] = "true"
    payments.post("/_control/queryable", json={"queryable": True})
    try:
        await faults.restart("dispatcher")
        faults.arm("dispatcher.after_remote_write")
        command = charge(host)
        await submit_approved(host, command)
        await faults.crashed("dispatcher")
        await faults.restart("dispatcher")
        result = await charge_result(host, command.request_id)
    finally:
        del stack.extra_env["dispatcher"]["WRIT_PAYMENTS_QUERYABLE"]
        payments.post("/_control/queryable", json={"queryable": False})
        await faults.restart("dispatcher")

    found = charges(payments, result.operation_id)
    assert result.status == "succeeded"
    assert len(found) == 1 and result.receipt == found[0]["charge_id"]
    row = await command_row(db, command.operation_key)
    assert await attempts(db, row["operation_id"]) == [(1, None), (2, "succeeded")]


async def test_crash_after_persistence_before_the_ack_does_nothing_more(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    faults.arm("dispatcher.before_ack")
    command = host.command()
    await host.submit(command)
    await faults.crashed("dispatcher")
    row = await command_row(db, command.operation_key)
    assert row["state"] == "succeeded"

    await faults.restart("dispatcher")
    await anyio.sleep(LEASE_S + 1.5)  # the unacked delivery comes back, finds it terminal

    result = await host.wait_command(command.request_id)
    assert result.status == "succeeded"
    assert len(notes(crm, result.operation_id)) == 1
    assert await attempts(db, row["operation_id"]) == [(1, "succeeded")]
    info = await host.js.consumer_info("WRIT_CMD", "dispatcher")
    assert info.num_ack_pending == 0


# -- lost responses ---------------------------------------------------------------------------


async def test_a_lost_response_at_the_idempotent_crm_is_replayed_to_one_note(
    host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    crm.post("/_control/mode", json={"mode": "lose_response", "count": 1})
    command = host.command()
    await host.submit(command)
    result = await host.wait_command(command.request_id)

    assert result.status == "succeeded"
    assert len(notes(crm, result.operation_id)) == 1
    row = await command_row(db, command.operation_key)
    assert await attempts(db, row["operation_id"]) == [(1, "lost"), (2, "succeeded")]


async def test_a_lost_response_at_the_non_idempotent_provider_ends_unknown(
    host: Host, db: asyncpg.Connection, payments: httpx.Client
) -> None:
    payments.post("/_control/mode", json={"mode": "lose_response", "count": 1})
    command = charge(host)
    await submit_approved(host, command)
    result = await charge_result(host, command.request_id)

    assert result.status == "unknown"
    assert len(charges(payments, result.operation_id)) == 1
    row = await command_row(db, command.operation_key)
    assert await attempts(db, row["operation_id"]) == [(1, "lost")]


# -- racing and paused workers ----------------------------------------------------------------


async def test_two_dispatchers_racing_make_one_effect_per_command(
    stack: Stack, host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    stack.start_instance("dispatcher", "dispatcher-2")
    try:
        await stack.wait_ready(("dispatcher",))
        commands = [host.command() for _ in range(20)]
        for command in commands:
            await host.submit(command)
        rows = [await command_row(db, c.operation_key) for c in commands]
        for row in rows:  # every command delivered twice more, past the dedupe window
            for _ in range(2):
                await host.js.publish(
                    subjects.command("acme"),
                    msgspec.json.encode(
                        DispatchCommand(tenant="acme", operation_id=str(row["operation_id"]))
                    ),
                    headers={"Nats-Msg-Id": uuid.uuid4().hex},
                )
        results = [await host.wait_command(c.request_id) for c in commands]
        await anyio.sleep(1.0)
    finally:
        stack.stop_process("dispatcher-2")

    assert [r for r in results if r.status != "succeeded"] == []
    for row in rows:
        assert len(notes(crm, str(row["operation_id"]))) == 1
        assert await attempts(db, row["operation_id"]) == [(1, "succeeded")]


async def test_a_worker_paused_past_its_lease_is_fenced_and_never_acks(
    stack: Stack, host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    crm.post("/_control/mode", json={"mode": "slow", "delay_s": 4.0, "count": 1})
    first = stack.procs["dispatcher"]
    calls = crm.get("/_control/calls").json()["calls"]  # the count runs over the module
    command = host.command()
    await host.submit(command)
    row = await command_row(db, command.operation_key)
    with anyio.fail_after(10):
        while (
            crm.get("/_control/calls").json()["calls"] == calls
            or (
                await db.fetchval(
                    "SELECT state FROM admission.commands WHERE operation_id = $1",
                    row["operation_id"],
                )
            )
            != "dispatching"
        ):
            await anyio.sleep(0.05)
    first.send_signal(signal.SIGSTOP)  # the holder freezes mid-call, lease and all
    try:
        stack.start_instance("dispatcher", "dispatcher-2")
        result = await host.wait_command(command.request_id, timeout=30)
    finally:
        first.send_signal(signal.SIGCONT)
    await anyio.sleep(5.0)  # the old holder wakes, its call returns, and it finds itself fenced
    try:
        fenced = _metric(
            stack,
            "dispatcher",
            'writ_messages_failed_total{consumer="dispatcher",outcome="fenced",service="dispatcher"}',
        )
    finally:
        stack.stop_process("dispatcher-2")

    final = await command_row(db, command.operation_key)
    assert result.status == "succeeded"
    assert (final["state"], final["lease_epoch"], final["lease_owner"]) == (
        "succeeded",
        2,
        "dispatcher-2",
    )
    assert len(notes(crm, result.operation_id)) == 1
    assert await attempts(db, row["operation_id"]) == [(1, None), (2, "succeeded")]
    assert fenced == 1.0


def _metric(stack: Stack, name: str, sample: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{stack.metrics_port(name)}/metrics").text
    for line in text.splitlines():
        if line.startswith(sample):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# -- the bus losing a message, and several relays ---------------------------------------------


async def test_a_command_whose_message_was_lost_is_re_driven_from_postgres(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    faults.arm("dispatcher.before_claim")
    command = host.command()
    await host.submit(command)
    await faults.crashed("dispatcher")
    # JetStream loses the admitted command (Jepsen found it can): purge it from the stream.
    await host.js.purge_stream("WRIT_CMD", subject=subjects.command("acme"))
    row = await command_row(db, command.operation_key)
    assert row["state"] == "pending"

    await faults.restart("dispatcher")
    result = await host.wait_command(command.request_id, timeout=30)  # the sweeper's doing

    assert result.status == "succeeded"
    assert len(notes(crm, result.operation_id)) == 1
    assert await attempts(db, row["operation_id"]) == [(1, "succeeded")]


async def test_several_relays_publish_each_outbox_row_once(
    stack: Stack, host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    stack.start_instance("admission", "admission-2")
    try:
        await stack.wait_ready(("admission",))
        commands = [host.command() for _ in range(30)]
        async with anyio.create_task_group() as tg:
            for command in commands:
                tg.start_soon(host.submit, command)
        results = [await host.wait_command(c.request_id) for c in commands]
    finally:
        stack.stop_process("admission-2")

    assert {r.status for r in results} == {"succeeded"}
    for result in results:
        assert len(notes(crm, result.operation_id)) == 1
        assert await _dispatch_messages(host, result.operation_id, expect=1) == 1
    assert await db.fetchval("SELECT count(*) FROM admission.outbox") == 0


async def test_sigterm_drains_in_flight_work_and_exits_cleanly(
    stack: Stack, host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    crm.post("/_control/mode", json={"mode": "slow", "delay_s": 1.0, "count": 1})
    calls = crm.get("/_control/calls").json()["calls"]  # the count runs over the module
    command = host.command()
    await host.submit(command)
    with anyio.fail_after(10):
        while crm.get("/_control/calls").json()["calls"] == calls:
            await anyio.sleep(0.02)
    # SIGTERM mid-call: the dispatcher stops fetching, finishes the call it holds, acks it.
    code = stack.stop_process("dispatcher")
    assert code == 0, stack.log_tail("dispatcher")
    row = await command_row(db, command.operation_key)  # finished before the process left
    assert row["state"] == "succeeded"
    assert await attempts(db, row["operation_id"]) == [(1, "succeeded")]
    await faults.restart("dispatcher")
    result = await host.wait_command(command.request_id)
    assert result.status == "succeeded"
    assert len(notes(crm, result.operation_id)) == 1
    info = await host.js.consumer_info("WRIT_CMD", "dispatcher")
    assert info.num_ack_pending == 0


async def test_a_retried_run_command_replays_the_persisted_command_never_the_planner(
    host: Host, db: asyncpg.Connection, crm: httpx.Client, faults: Faults
) -> None:
    faults.arm("dispatcher.after_remote_write")
    request = host.request()
    await host.publish(request, msg_id=request.request_id)
    await faults.crashed("dispatcher")
    await faults.restart("dispatcher")

    result = await host.wait_result(request.request_id)

    assert result.status == "succeeded"
    steps = await db.fetch(
        "SELECT seq, kind FROM planner.steps WHERE run_id = $1 ORDER BY seq", result.run_id
    )
    # One model decision proposed the note, one answered: the retry asked the model nothing.
    assert [(s["seq"], s["kind"]) for s in steps] == [
        (0, "decision"),
        (1, "observation"),
        (2, "decision"),
    ]
    commands = await db.fetch(
        "SELECT operation_id FROM admission.commands WHERE run_id = $1", result.run_id
    )
    assert len(commands) == 1
    assert len(notes(crm, str(commands[0]["operation_id"]))) == 1
    assert await attempts(db, commands[0]["operation_id"]) == [(1, None), (2, "succeeded")]
